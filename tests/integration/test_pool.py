"""The engine's own HTTP client (engine.pool): one pool per origin, idle connections a server
closed are never reused, and requests wait for their origin's slots, against real sockets on
127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpcore
import pytest

from cardfence.engine.cards.interfaces import JSONRPC, V10
from cardfence.engine.cards.model import Interface
from cardfence.engine.engine import Engine, EngineConfig
from cardfence.engine.errors import EndpointUnreachableError
from cardfence.engine.pool import EngineTransport, RequestSlots, engine_client, readable
from cardfence.engine.transport import A2ATransport

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"


class Server:
    """An HTTP/1.1 server that answers each request ``ok`` and then, if ``close_after``, closes
    the connection without saying so (no ``Connection: close``): a keep-alive that ended."""

    def __init__(self, close_after: bool) -> None:
        self.close_after = close_after
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(_OK)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


@pytest.fixture
async def closing_server() -> AsyncIterator[Server]:
    async with Server(close_after=True) as server:
        yield server


async def test_an_idle_connection_the_server_closed_is_not_reused(closing_server: Server) -> None:
    async with engine_client() as client:
        for _ in range(3):
            response = await client.get(closing_server.url)
            assert response.text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches our socket
    assert closing_server.connections == 3  # each request on a fresh connection, none failed


async def test_a_kept_alive_connection_carries_the_next_request() -> None:
    async with Server(close_after=False) as server, engine_client() as client:
        for _ in range(3):
            assert (await client.get(server.url)).text == "ok"
    assert server.connections == 1


async def test_each_origin_has_a_pool_of_its_own() -> None:
    async with (
        Server(close_after=False) as one,
        Server(close_after=False) as two,
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


async def test_engine_open_makes_its_client_on_the_engines_transport(tmp_path: object) -> None:
    engine = Engine.open(f"sqlite:///{tmp_path}/pool.db", config=EngineConfig())
    try:
        assert isinstance(engine.client._transport, EngineTransport)
    finally:
        await engine.aclose()


async def test_a_request_that_never_got_a_slot_says_it_was_not_sent() -> None:
    slots = RequestSlots(total=4, per_origin=1)
    async with Server(close_after=False) as server, engine_client() as client:
        interface = Interface(server.url + "rpc", JSONRPC, V10)
        transport = A2ATransport(client, interface, timeout=0.2, slots=slots)
        async with slots.held(server.url):  # the one request this origin may have in flight
            with pytest.raises(EndpointUnreachableError, match=r"left no slot .*\(not sent\)"):
                await transport.get_task("t-1")
    assert server.connections == 0
