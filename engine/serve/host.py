"""``cardfence serve``: the webhook app and the driver in one process, under uvicorn; and the
driver alone inside a host application (:func:`serving`).

:func:`serve_app` is the ASGI application: the webhook ingress of
:mod:`cardfence.engine.serve.ingress`
(``POST /webhook``) plus a lifespan that runs a :class:`~cardfence.engine.serve.driver.Driver` over
the
engine's store. :func:`serve` runs it until SIGTERM or SIGINT: the listening socket closes, the
deliveries and polls in flight finish (each append commits or rolls back whole), the engine
closes, and the call returns -- the command exits 0.

Every decision is one log line (:class:`~cardfence.engine.serve.decision_log.JsonLines`): the task,
the event
recorded and its reason, written by a thread of its own
(:mod:`cardfence.engine.serve.decision_log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from uvicorn.protocols.http.h11_impl import H11Protocol

from cardfence.engine.client.engine import Engine
from cardfence.engine.serve.driver import Driver
from cardfence.engine.serve.ingress import webhook_app
from cardfence.engine.wire.push import IngressLimits

__all__ = ["Server", "head_bounded_h11", "listen", "serve", "serve_app", "serving"]

_log = logging.getLogger("cardfence.serve")


def serve_app(
    engine: Engine,
    driver: Driver | None = None,
    *,
    limits: IngressLimits | None = None,
    metrics: bool = False,
) -> Starlette:
    """The webhook app (taking at most what ``limits`` allow; ``GET /metrics`` with the
    driver's counts too when ``metrics``) with ``driver`` (if any) run by its lifespan; the
    engine is closed when the app shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            async with contextlib.nullcontext() if driver is None else _running(driver):
                yield
        finally:
            await engine.aclose()

    sources = ([] if driver is None else [driver]) if metrics else None
    ingress = webhook_app(engine, limits=limits, metrics=sources)
    return Starlette(routes=[Mount("/", app=ingress)], lifespan=lifespan)


@contextlib.asynccontextmanager
async def serving(
    engine: Engine,
    *,
    workers: int = 32,
    lease_ttl: float = 15.0,
    scan_interval: float = 0.5,
) -> AsyncIterator[Driver]:
    """``async with serving(engine):`` keeps every live task of the engine's store moving, as
    ``cardfence serve`` does, inside a host application: the tasks it starts and those other
    processes started (each leased to one driver at a time), polled, streamed and re-checked,
    until the block ends; the steps in flight then finish. The engine stays open: its owner
    closes it. ``workers``: polls in flight at once, at most; ``lease_ttl``: how long a claim
    on a task holds unrenewed; ``scan_interval``: how often the log is read for new tasks.
    Pushes reach the engine through the host's own mount of :func:`webhook_app`."""
    driver = Driver(engine, workers=workers, lease_ttl=lease_ttl, scan_interval=scan_interval)
    async with _running(driver):
        yield driver


@contextlib.asynccontextmanager
async def _running(driver: Driver) -> AsyncIterator[Driver]:
    """``driver`` run until the block ends, once it is following the live tasks (a store that
    cannot be read fails here)."""
    job = asyncio.create_task(driver.run())
    ready = asyncio.ensure_future(driver.ready())
    await asyncio.wait({job, ready}, return_when=asyncio.FIRST_COMPLETED)
    if job.done():
        ready.cancel()
        job.result()  # its failure, raised
    try:
        yield driver
    finally:
        driver.stop()
        await asyncio.gather(job, return_exceptions=True)


class Server(uvicorn.Server):
    """uvicorn, except that SIGTERM and SIGINT end :meth:`serve` cleanly instead of being raised
    again once it returns (which would end the process with the signal, not exit 0); and that
    over HTTPS a stop does not wait for idle clients to answer the TLS close."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[str], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ending = asyncio.create_task(self._end_closed_connections())
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    async def _end_closed_connections(self) -> None:
        """A connection closed at the stop (idle, or its last answer written) still waits for
        the client's TLS ``close_notify``, which a client idle in its pool never sends (up to
        30 s): once everything written has gone out, nothing is left to wait for."""
        while True:
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if (
                    isinstance(transport, asyncio.Transport)
                    and transport.is_closing()
                    and _written_out(transport)
                ):
                    transport.abort()
            await asyncio.sleep(0.05)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def handle(signum: int, _frame: FrameType | None) -> None:
            self._on_signal(signal.Signals(signum).name)
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for connections
            self.should_exit = True

        for sig in previous:
            signal.signal(sig, handle)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _written_out(transport: asyncio.Transport) -> bool:
    """Whether ``transport`` has handed everything written to the kernel: its own buffer is
    empty and, over TLS, so is the TCP transport's under it (an abort drops both). asyncio's TLS
    transport shows the one under it only as ``_ssl_protocol._transport``; a loop that hides it
    (uvloop) is judged by the TLS layer's buffer alone."""
    layer: object = transport
    while isinstance(layer, asyncio.WriteTransport):
        if layer.get_write_buffer_size():
            return False
        layer = getattr(getattr(layer, "_ssl_protocol", None), "_transport", None)
    return True


def head_bounded_h11(seconds: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, except that each request's head (request line and headers)
    must arrive within ``seconds`` of the connection opening or of the previous answer, or the
    connection is closed. uvicorn waits for a head forever: a client sending one byte now and
    then (or nothing) would hold its connection, and enough of them every file descriptor the
    process has -- its database connections and its polls included."""

    class HeadBounded(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()

        def handle_events(self) -> None:
            super().handle_events()
            if self._head_timer is not None and not self._between_requests():
                self._head_timer.cancel()  # a head arrived: its body is the app's to time
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._between_requests():
                self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _await_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_too_slow)

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self._between_requests():
                self.transport.close()

    return HeadBounded


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: any free one); :class:`OSError` says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY on every accepted connection (without it
    # each answer on a kept-alive connection waits out Nagle's delay, ~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    engine: Engine,
    sock: socket.socket,
    *,
    driver: Driver | None = None,
    limits: IngressLimits | None = None,
    metrics: bool = False,
    tls: tuple[str, str] | None = None,
    started: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``POST /webhook`` on ``sock`` (see :func:`listen`; at most what ``limits`` allow
    at once; ``GET /metrics`` when ``metrics``) and drive every live task until SIGTERM or
    SIGINT; then the requests and polls in flight finish, the engine closes and this returns.
    ``tls``: the certificate and key files (PEM) to serve HTTPS with. ``started`` is called
    with the webhook URL once the app is up; setting ``stop`` ends it as a signal does (a host
    application, tests)."""
    driver = driver if driver is not None else Driver(engine)
    await driver.load()  # a store that cannot be read fails here, before anything listens
    limits = limits or IngressLimits()
    config = uvicorn.Config(
        serve_app(engine, driver, limits=limits, metrics=metrics),
        http=head_bounded_h11(limits.body_seconds),
        # An idle connection is ended by the head timer (``body_seconds``, 10 s by default), not
        # by uvicorn's 5 s: a2a-sdk agents push through httpx, which reuses a connection for up
        # to 5 s, so a push made at that moment would meet serve's close and be lost.
        timeout_keep_alive=math.ceil(limits.body_seconds) + 1,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(max(engine.config.request_timeout, 5.0)),
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )

    def on_signal(name: str) -> None:
        _log.info(f"{name} received: stopping", extra={"event": "Stopping", "reason": name})

    server = Server(config, on_signal)
    address = sock.getsockname()
    url = f"{'https' if tls else 'http'}://{address[0]}:{address[1]}/webhook"
    watchers = [asyncio.create_task(_announce(server, url, started))] if started else []
    if stop is not None:
        watchers.append(asyncio.create_task(_stop_when(server, stop)))
    try:
        await server.serve(sockets=[sock])
    finally:
        for watcher in watchers:
            watcher.cancel()


async def _stop_when(server: uvicorn.Server, stop: asyncio.Event) -> None:
    await stop.wait()
    server.should_exit = True


async def _announce(server: uvicorn.Server, url: str, started: Callable[[str], None]) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    _log.info(f"listening on {url}", extra={"event": "Listening"})
    started(url)
