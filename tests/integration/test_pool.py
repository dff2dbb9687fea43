"""The engine's own HTTP client (engine.pool): one pool per origin, idle connections a server
closed are never reused, a read that meets a kept-alive connection's close is asked again (and
nothing else is), and requests wait for their origin's slots, against real sockets on
127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpcore
import httpx
import pytest
import uvicorn
from support.keepalive import ClosingUnderRequests, OkServer

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC, V10
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.errors import EndpointUnreachableError
from cardfence.engine.http.pool import (
    KEEPALIVE_SECONDS,
    POOL_LIMITS,
    REPLAYS,
    EngineTransport,
    RequestSlots,
    engine_client,
    readable,
    tls_context,
)
from cardfence.engine.wire.transport import A2ATransport


async def test_a_read_that_meets_a_kept_alive_connections_close_is_asked_again() -> None:
    async with ClosingUnderRequests() as agent, engine_client() as client:
        transport = agent.transport(client)
        await transport.get_task("t-1")
        task = await transport.get_task("t-1")  # its connection closes under it: asked again
    assert task.state == "working"
    assert agent.methods == ["GetTask"] * 3
    assert agent.connections == 2


async def test_a_get_and_a_task_subscription_are_asked_again_too() -> None:
    async with ClosingUnderRequests() as agent, engine_client() as client:
        url = f"http://127.0.0.1:{agent.port}/.well-known/agent-card.json"
        for _ in range(2):
            assert (await client.get(url)).status_code == 200  # a GET: replayable unmarked
        transport = agent.transport(client)
        for _ in range(2):
            async with transport.subscribe("t-1") as updates:
                states = [update.task.state async for update in updates if update.task]
            assert states == ["completed"]
    get = "GET /.well-known/agent-card.json HTTP/1.1"
    assert agent.methods == [get] * 3 + ["SubscribeToTask"] * 3
    assert agent.connections == 4


async def test_a_send_that_meets_a_kept_alive_connections_close_is_never_sent_twice() -> None:
    async with ClosingUnderRequests() as agent, engine_client() as client:
        transport = agent.transport(client)
        await transport.get_task("t-1")
        with pytest.raises(EndpointUnreachableError, match="closed a kept-alive connection"):
            await transport.send_message(text="hi", message_id="m-1", context_id="c-1")
    assert agent.methods == ["GetTask", "SendMessage"]  # the send, once


async def test_a_new_connection_closed_unanswered_is_not_asked_again() -> None:
    async with ClosingUnderRequests(answered=0) as agent, engine_client() as client:
        with pytest.raises(EndpointUnreachableError, match="without sending a response"):
            await agent.transport(client).get_task("t-1")
    assert agent.methods == ["GetTask"]  # a broken server, not a kept-alive connection's end


async def test_a_read_is_asked_again_at_most_replays_times() -> None:
    async with ClosingUnderRequests() as agent, engine_client() as client:
        transport = agent.transport(client)
        warm = REPLAYS + 2  # idle connections, each of which closes under its next request
        await asyncio.gather(*(transport.get_task("t-1") for _ in range(warm)))
        assert agent.connections == warm
        with pytest.raises(EndpointUnreachableError, match="closed a kept-alive connection"):
            await transport.get_task("t-1")
    assert len(agent.methods) == warm + 1 + REPLAYS


def test_an_idle_connection_expires_here_before_a_uvicorn_agent_closes_it() -> None:
    agent_keep_alive = uvicorn.Config(app=None).timeout_keep_alive  # a2a-sdk's servers run on it
    assert POOL_LIMITS.keepalive_expiry == KEEPALIVE_SECONDS
    assert agent_keep_alive - KEEPALIVE_SECONDS >= 1


async def test_the_origin_pools_expire_idle_connections_as_the_limits_say() -> None:
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=10, keepalive_expiry=0.2)
    transport = EngineTransport(tls_context(), limits)
    async with (
        OkServer(close_after=False) as server,
        httpx.AsyncClient(transport=transport) as client,
    ):
        assert (await client.get(server.url)).text == "ok"
        assert (await client.get(server.url)).text == "ok"
        await asyncio.sleep(0.4)
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 2  # kept alive within 0.2 s, closed here after it


@pytest.fixture
async def closing_server() -> AsyncIterator[OkServer]:
    async with OkServer(close_after=True) as server:
        yield server


async def test_an_idle_connection_the_server_closed_is_not_reused(closing_server: OkServer) -> None:
    async with engine_client() as client:
        for _ in range(3):
            response = await client.get(closing_server.url)
            assert response.text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches our socket
    assert closing_server.connections == 3  # each request on a fresh connection, none failed


async def test_a_kept_alive_connection_carries_the_next_request() -> None:
    async with OkServer(close_after=False) as server, engine_client() as client:
        for _ in range(3):
            assert (await client.get(server.url)).text == "ok"
    assert server.connections == 1


async def test_each_origin_has_a_pool_of_its_own() -> None:
    async with (
        OkServer(close_after=False) as one,
        OkServer(close_after=False) as two,
        engine_client() as client,
    ):
        for server in (one, two, one):
            assert (await client.get(server.url)).text == "ok"
        transport = client._transport
        assert isinstance(transport, EngineTransport)
        pools = [origin.pool for origin in transport.origins()]
        assert [len(pool.connections) for pool in pools] == [1, 1]
        for pool, server in zip(pools, (one, two), strict=True):
            origin = httpcore.Origin(b"http", b"127.0.0.1", server.port)
            assert pool.connections[0].can_handle_request(origin)


def test_readable_says_whether_a_socket_has_news() -> None:
    left, right = socket.socketpair()
    try:
        assert not readable(left)  # idle: nothing to read
        right.close()
        assert readable(left)  # the peer closed it
    finally:
        left.close()
    assert readable(left)  # closed here
    assert readable(None)


async def test_requests_wait_for_their_origins_slots_and_the_engines() -> None:
    slots = RequestSlots(total=3, per_origin=2)
    in_flight: dict[str, int] = {"a": 0, "b": 0, "all": 0}
    most: dict[str, int] = {"a": 0, "b": 0, "all": 0}

    async def one(origin: str) -> None:
        async with slots.held(f"http://{origin}.example:80/rpc"):
            for key in (origin, "all"):
                in_flight[key] += 1
                most[key] = max(most[key], in_flight[key])
            await asyncio.sleep(0.01)
            for key in (origin, "all"):
                in_flight[key] -= 1

    await asyncio.gather(*(one(origin) for origin in "ab" * 5))
    assert most == {"a": 2, "b": 2, "all": 3}


async def test_engine_connect_makes_its_client_on_the_engines_transport(
    tmp_path: object,
) -> None:
    async with Engine.connect(f"sqlite:///{tmp_path}/pool.db", config=EngineConfig()) as engine:
        assert isinstance(engine.client._transport, EngineTransport)


async def test_a_request_that_never_got_a_slot_says_it_was_not_sent() -> None:
    slots = RequestSlots(total=4, per_origin=1)
    async with OkServer(close_after=False) as server, engine_client() as client:
        interface = Interface(server.url + "rpc", JSONRPC, V10)
        transport = A2ATransport(client, interface, timeout=0.2, slots=slots)
        async with slots.held(server.url):  # the one request this origin may have in flight
            with pytest.raises(EndpointUnreachableError, match=r"left no slot .*\(not sent\)"):
                await transport.get_task("t-1")
    assert server.connections == 0
