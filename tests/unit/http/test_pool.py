"""The HTTP pool (engine/http/pool.py): the exact bounds and messages, the TLS context and limits
each origin's pool is made with, what the connection backend and its streams pass on (timeouts,
local address, socket options), and the two ways a kept-alive connection can end under a request (a
FIN or a reset), each told apart from a new connection's end. Against real sockets on 127.0.0.1; the
replay itself is in tests/integration/test_pool.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
import pytest
from support import TlsFiles, make_tls
from support.keepalive import ClosingUnderRequests, OkServer, Unread

from cardfence.engine.errors import EndpointUnreachableError, UsageError
from cardfence.engine.http.pool import (
    REPLAYABLE,
    AnswerlessClose,
    EngineTransport,
    NetworkBackend,
    RequestSlots,
    SocketStream,
    engine_client,
    replayable,
    tls_context,
)

# -- bounds and words ------------------------------------------------------------------------------


def test_an_answerless_close_says_what_the_server_did() -> None:
    assert str(AnswerlessClose()) == (
        "the server closed a kept-alive connection without answering the request sent on it"
    )


async def _slots_granted(slots: RequestSlots, urls: list[str]) -> int:
    """How many of ``urls`` get a slot at once (each held until the count is made)."""
    granted = 0
    async with contextlib.AsyncExitStack() as held:
        for url in urls:
            try:
                await asyncio.wait_for(held.enter_async_context(slots.held(url)), 0.05)
            except TimeoutError:
                break
            granted += 1
    return granted


async def test_request_slots_default_to_eight_per_agent_and_thirty_two_in_all() -> None:
    one_agent = ["http://agent.example/rpc"] * 12
    many_agents = [f"http://agent-{i}.example/rpc" for i in range(40)]
    assert await _slots_granted(RequestSlots(), one_agent) == 8
    assert await _slots_granted(RequestSlots(), many_agents) == 32


async def test_one_request_in_flight_is_the_least_request_slots_allow() -> None:
    slots = RequestSlots(total=1, per_origin=1)
    assert await _slots_granted(slots, ["http://a.example/", "http://b.example/"]) == 1


@pytest.mark.parametrize(("total", "per_origin"), [(0, 8), (32, 0)])
def test_request_slots_refuse_a_bound_below_one(total: int, per_origin: int) -> None:
    with pytest.raises(UsageError) as refused:
        RequestSlots(total=total, per_origin=per_origin)
    assert str(refused.value) == (
        f"requests in flight must be at least 1 (in all {total}, per agent {per_origin}): "
        "no engine was made"
    )


@pytest.mark.parametrize(
    ("method", "extensions", "expected"),
    [
        (b"GET", {}, True),
        (b"HEAD", {}, True),
        (b"POST", {}, False),
        (b"POST", {REPLAYABLE: True}, True),
        (b"POST", {REPLAYABLE: False}, False),
        (b"head", {}, False),  # methods are case-sensitive (RFC 9110)
    ],
)
def test_which_requests_are_safe_to_ask_twice(
    method: bytes, extensions: dict[str, Any], expected: bool
) -> None:
    request = httpcore.Request(method, "http://agent.example/", extensions=extensions)
    assert replayable(request) is expected


# -- TLS and limits --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pool-tls"))


async def test_the_client_verifies_with_the_context_it_is_given_and_only_it(
    tls_files: TlsFiles,
) -> None:
    async with OkServer(close_after=False, tls=tls_files.server_context()) as server:
        async with engine_client(tls_context(str(tls_files.ca))) as trusting:
            assert (await trusting.get(server.url)).text == "ok"  # the CA given, every origin
        async with engine_client() as system:  # the system's trust store: not this CA
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await system.get(server.url)


async def test_a_certificate_for_other_names_is_refused_even_from_the_ca_given(
    tls_files: TlsFiles,
) -> None:
    # The server's certificate names 127.0.0.1, 127.0.0.2 and localhost, not 127.0.0.3.
    server = OkServer(close_after=False, tls=tls_files.server_context(), host="127.0.0.3")
    async with server, engine_client(tls_context(str(tls_files.ca))) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(server.url)
    assert server.connections == 0  # the handshake failed: no request was ever sent


async def test_a_tls_handshake_never_answered_ends_at_the_connect_timeout(
    tls_files: TlsFiles,
) -> None:
    async with Unread() as server, engine_client(tls_context(str(tls_files.ca))) as client:
        url = f"https://127.0.0.1:{server.port}/"
        async with asyncio.timeout(10):
            with pytest.raises(httpx.ConnectTimeout):
                await client.get(url, timeout=httpx.Timeout(5.0, connect=0.3))


def test_a_ca_file_replaces_the_system_trust_store(tls_files: TlsFiles) -> None:
    authorities = tls_context(str(tls_files.ca)).get_ca_certs()
    assert [dict(a[0] for a in ca["subject"])["commonName"] for ca in authorities] == [
        "cardfence test CA"
    ]


async def test_an_origins_pool_keeps_the_connection_limits_it_was_given() -> None:
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=1, keepalive_expiry=5.0)
    transport = EngineTransport(tls_context(), limits)
    async with (
        OkServer(close_after=False, delay=0.1) as server,
        httpx.AsyncClient(transport=transport) as client,
    ):
        answers = await asyncio.gather(*(client.get(server.url) for _ in range(4)))
        assert [answer.text for answer in answers] == ["ok"] * 4
        (origin,) = transport.origins()
        assert server.most_open == 2  # at most two at once
        assert len(origin.pool.connections) == 1  # one of them kept alive


# -- the backend and its streams -------------------------------------------------------------------


async def test_the_backend_connects_from_the_local_address_and_with_the_socket_options_given() -> (
    None
):
    async with OkServer(close_after=False) as server:
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        stream = await NetworkBackend().connect_tcp(
            "127.0.0.1", server.port, timeout=5.0, local_address="127.0.0.2",
            socket_options=options,
        )  # fmt: skip
        try:
            sock = stream.get_extra_info("socket")
            assert sock.getsockname()[0] == "127.0.0.2"
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        finally:
            await stream.aclose()


@contextlib.contextmanager
def _full_backlog() -> Iterator[int]:
    """A listener whose queue of connections waiting to be accepted is full: a new connection's
    handshake is not answered. Its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    waiting: list[socket.socket] = []
    try:
        while True:
            client = socket.socket()
            client.settimeout(0.2)
            try:
                client.connect(("127.0.0.1", port))
            except OSError:
                client.close()
                break
            waiting.append(client)
        yield port
    finally:
        for client in waiting:
            client.close()
        listener.close()


async def test_the_backend_gives_up_connecting_after_the_timeout_given() -> None:
    with _full_backlog() as port:
        started = time.monotonic()
        async with asyncio.timeout(10):
            with pytest.raises(httpcore.ConnectTimeout):
                await NetworkBackend().connect_tcp("127.0.0.1", port, timeout=0.3)
        assert time.monotonic() - started < 5


async def test_the_backend_sleeps_as_long_as_asked() -> None:
    started = time.monotonic()
    await NetworkBackend().sleep(0.05)
    assert time.monotonic() - started >= 0.05


async def test_an_answer_that_never_comes_ends_at_the_read_timeout() -> None:
    async with Unread() as server, engine_client() as client:
        async with asyncio.timeout(10):
            with pytest.raises(httpx.ReadTimeout):
                await client.get(server.url, timeout=httpx.Timeout(5.0, read=0.3))


async def test_a_request_the_server_never_reads_ends_at_the_write_timeout() -> None:
    body = bytes(64 * 1024 * 1024)  # more than the socket buffers on both sides hold
    async with Unread() as server, engine_client() as client:
        async with asyncio.timeout(10):
            with pytest.raises(httpx.WriteTimeout):
                await client.post(server.url, content=body, timeout=httpx.Timeout(5.0, write=0.3))


class _Inner(httpcore.AsyncNetworkStream):
    """A stream whose extra information is its socket, or else names what was asked."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asked: list[str] = []

    def get_extra_info(self, info: str) -> Any:
        self.asked.append(info)
        return self.sock if info == "socket" else f"inner {info}"


def test_a_stream_answers_is_readable_from_its_socket_and_passes_the_rest_on() -> None:
    left, right = socket.socketpair()
    try:
        inner = _Inner(left)
        stream = SocketStream(inner)
        assert stream.get_extra_info("is_readable") is False
        right.close()
        assert stream.get_extra_info("is_readable") is True
        assert stream.get_extra_info("server_addr") == "inner server_addr"
        assert inner.asked == ["socket", "server_addr"]  # is_readable never asked of it
    finally:
        left.close()


# -- a kept-alive connection's end, by a reset -----------------------------------------------------


async def test_a_read_whose_kept_alive_connection_is_reset_under_it_is_asked_again() -> None:
    async with ClosingUnderRequests(resets=True) as agent, engine_client() as client:
        transport = agent.transport(client)
        await transport.get_task("t-1")
        task = await transport.get_task("t-1")  # reset under it: asked again
    assert task.state == "working"
    assert agent.methods == ["GetTask"] * 3


async def test_a_new_connection_reset_unanswered_is_not_asked_again() -> None:
    async with ClosingUnderRequests(answered=0, resets=True) as agent, engine_client() as client:
        with pytest.raises(EndpointUnreachableError):
            await agent.transport(client).get_task("t-1")
    assert agent.methods == ["GetTask"]  # a broken server, not a kept-alive connection's end
