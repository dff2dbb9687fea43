"""The HTTP client an engine makes for itself, and the bound on its requests in flight: httpx,
with pools sized and checked for many tasks at once.

httpcore (httpx's pool) walks every pooled connection each time a request starts or ends: for
each idle one it counts the pool's connections again, and asks whether the server has closed it.
That question is right -- a connection the server closed must not carry the next request -- but
anyio answers it by rebuilding the stream's attribute table (a ``getpeername`` and a dozen
closures) before one ``poll(2)``. At 200 tasks in flight on one agent, with 32 requests at once,
that walk was half of an engine's CPU. Three changes keep it small:

- :class:`RequestSlots`: at most ``per_origin`` requests in flight to one agent (8, a browser's
  habit), and ``total`` for the engine; the others wait their turn in a semaphore, not in
  httpcore's queue (which it also walks, once per queued request);
- :class:`EngineTransport`: one pool per origin, so one agent's connections are never walked for
  another's requests;
- :class:`SocketStream` keeps the socket it was opened on and polls it directly: the same question,
  the same answer.

The limits keep every connection alive (:data:`POOL_LIMITS`): httpcore closes an idle connection
whenever the pool holds more connections than its keep-alive count, so httpx's default (20 of
100) closed and reopened connections under a few dozen tasks at once.

An agent closes a connection it has kept idle for a while: 5 s under uvicorn (a2a-sdk's servers),
hypercorn and Node. A request sent on it just as the server closes it meets the close, not an
answer: httpx's own expiry was those same 5 s, so the two timers raced. Two answers:

- a connection idle for :data:`KEEPALIVE_SECONDS` (4 s) is closed here first;
- a request that is safe to ask twice (a ``GET``, or a read the caller marks :data:`REPLAYABLE`:
  ``GetTask``, ``ListTasks``, ``GetExtendedAgentCard``, ``SubscribeToTask``) is asked again on
  another connection when the one it went out on had carried an earlier exchange and was closed
  without a byte of answer, at most :data:`REPLAYS` times. Anything else (``SendMessage``,
  ``CancelTask``, a push registration) is never sent twice: it fails as the close it met
  (:class:`AnswerlessClose`), since the server may have read it before closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Any, Final

import httpcore
import httpx

from cardfence.engine.errors import UsageError

USER_AGENT: Final = "cardfence/0.1"  # every request cardfence makes says who it is

# An idle connection is closed here after 4 s: before an agent on uvicorn, hypercorn or Node (5 s)
# closes it under a request.
KEEPALIVE_SECONDS: Final = 4.0

# Per origin, one connection per request or stream in flight, all kept alive: room for the
# requests RequestSlots lets through (8) beside the streams serve follows (64).
POOL_LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_SECONDS
)

# The request extension that marks a request safe to ask twice (a read): give it as
# ``client.stream(..., extensions={REPLAYABLE: True})``. A GET or HEAD is replayable unmarked.
REPLAYABLE: Final = "cardfence.replayable"

# How many times a replayable request is asked again after meeting an answerless close.
REPLAYS: Final = 2


class AnswerlessClose(httpcore.RemoteProtocolError):
    """A connection that had carried an earlier exchange was closed without a byte of answer
    to the next request: the server ended a kept-alive connection as the request arrived (or
    read it and failed: from here the two look alike)."""

    def __init__(self) -> None:
        super().__init__(
            "the server closed a kept-alive connection without answering the request sent on it"
        )


class RequestSlots:
    """At most ``per_origin`` requests in flight to any one origin and ``total`` in all, for
    every transport (and card read) sharing this. Streams are not requests: they are bounded
    where they are followed."""

    def __init__(self, total: int = 32, per_origin: int = 8) -> None:
        if total < 1 or per_origin < 1:
            raise UsageError(
                f"requests in flight must be at least 1 (in all {total}, per agent {per_origin}): "
                "no engine was made"
            )
        self._total = asyncio.Semaphore(total)
        self._per_origin = per_origin
        self._origins: dict[tuple[str, str, int | None], asyncio.Semaphore] = {}

    @contextlib.asynccontextmanager
    async def held(self, url: str) -> AsyncIterator[None]:
        """A slot for one request to ``url``, held for the block."""
        parsed = httpx.URL(url)
        key = (parsed.scheme, parsed.host, parsed.port)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = asyncio.Semaphore(self._per_origin)
        async with origin, self._total:
            yield


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The system's trust store, or only ``ca_file``'s authorities when given (they replace
    it). Raises ``OSError`` or ``ssl.SSLError`` when the file cannot be loaded."""
    return ssl.create_default_context(cafile=ca_file)


def engine_client(context: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` on :class:`EngineTransport`, verifying with ``context`` (by
    default :func:`tls_context`). Proxies named by the environment are honoured as httpx honours
    them, through its own transports."""
    return httpx.AsyncClient(transport=EngineTransport(context or tls_context()))


class EngineTransport(httpx.AsyncBaseTransport):
    """One :class:`_OriginTransport` per origin (scheme, host, port), made on first use."""

    def __init__(self, context: ssl.SSLContext, limits: httpx.Limits = POOL_LIMITS) -> None:
        self._context = context
        self._limits = limits
        self._origins: dict[tuple[bytes, bytes, int | None], _OriginTransport] = {}

    def origins(self) -> list[_OriginTransport]:
        return list(self._origins.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (url.raw_scheme, url.raw_host, url.port)
        transport = self._origins.get(key)
        if transport is None:
            transport = self._origins[key] = _OriginTransport(self._context, self._limits)
        return await transport.handle_async_request(request)

    async def aclose(self) -> None:
        transports, self._origins = list(self._origins.values()), {}
        for transport in transports:
            await transport.aclose()


class _OriginTransport(httpx.AsyncHTTPTransport):
    """httpx's transport on a pool of :data:`POOL_LIMITS` whose streams are
    :class:`SocketStream`."""

    def __init__(self, context: ssl.SSLContext, limits: httpx.Limits = POOL_LIMITS) -> None:
        super().__init__(verify=context, limits=limits)
        # The pool httpx would make, the same arguments, its connections opened through
        # NetworkBackend.
        self._pool = _Pool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=NetworkBackend(),
        )

    @property
    def pool(self) -> httpcore.AsyncConnectionPool:
        return self._pool


class _Pool(httpcore.AsyncConnectionPool):
    """httpcore's pool, asking a replayable request again after an :class:`AnswerlessClose`."""

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        replays = REPLAYS if replayable(request) else 0
        while True:
            try:
                return await super().handle_async_request(request)
            except AnswerlessClose:
                if replays == 0:
                    raise
                replays -= 1  # the closed connection is gone: another one, or a new one


def replayable(request: httpcore.Request) -> bool:
    """Whether ``request`` is safe to ask twice: a GET or HEAD, or marked :data:`REPLAYABLE`."""
    return request.method in (b"GET", b"HEAD") or bool(request.extensions.get(REPLAYABLE))


class NetworkBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend (anyio), its streams wrapped in :class:`SocketStream`. TCP only: the
    engine's transports are never given a Unix socket."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return SocketStream(inner)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class SocketStream(httpcore.AsyncNetworkStream):
    """A connection's stream that answers ``is_readable`` from the socket it keeps, and tells an
    :class:`AnswerlessClose` from any other end: HTTP/1.1 writes a request, then reads its
    answer, so a write after a read starts a request on a reused connection, and a read that
    finds the stream ended (or broken) before any byte of its answer met the server's close."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")
        self._reading = False  # a read since the last write: the next write starts a request
        self._reused = False  # the request being sent is not the connection's first
        self._answered = False  # a byte of its answer has been read

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data = await self._inner.read(max_bytes, timeout)
        except httpcore.ReadError as error:
            if self._reused and not self._answered:
                raise AnswerlessClose() from error
            raise
        if not data and self._reused and not self._answered:
            raise AnswerlessClose()
        self._reading = self._answered = True
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._reading:
            self._reading, self._reused, self._answered = False, True, False
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return SocketStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return readable(self._socket)
        return self._inner.get_extra_info(info)


def readable(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has something to read now, without waiting. For an idle HTTP/1.1
    connection that means the server closed it (or broke the protocol): either way it is done.
    A socket already closed here counts as readable, as httpcore counts it."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
