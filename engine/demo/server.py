"""A uvicorn server in a daemon thread, on a socket bound before it starts.

Binding first means the port is known (and can go into an Agent Card) before the first request.
The server runs in its own thread and event loop and installs no signal handlers, so the caller
keeps control of Ctrl-C and SIGTERM.

With `ServerTls` it serves HTTPS instead, optionally verifying client certificates; each request
of a TLS connection then carries the ASGI TLS extension (``scope["extensions"]["tls"]``), whose
``client_cert_chain`` holds the client certificate the handshake verified (empty when none was
presented), since uvicorn itself does not expose it. Under TLS, HTTP/1.1 is served by uvicorn's
h11 protocol whatever else is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ServerThread", "ServerTls", "bind"]


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free port)."""
    # IPPROTO_TCP named explicitly: asyncio only sets TCP_NODELAY on sockets whose protocol says
    # TCP, and without it every response body waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(frozen=True, slots=True)
class ServerTls:
    """HTTPS for a `ServerThread`: the server's certificate and key (PEM files) and, to verify
    client certificates, the CA file they must chain to and ``cert_reqs``: ``CERT_OPTIONAL``
    (a client may present one; an invalid one fails the handshake) or ``CERT_REQUIRED`` (a
    connection without one fails the handshake)."""

    certfile: str
    keyfile: str
    ca_certs: str | None = None
    cert_reqs: ssl.VerifyMode = ssl.CERT_NONE


_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
_RDN_KEYS = {  # RFC 4514 names of the attributes ssl spells out
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
}


def _tls_extension(ssl_object: ssl.SSLObject) -> dict[str, Any]:
    """The ASGI TLS extension for one connection (cipher suites are not known by number here)."""
    der = ssl_object.getpeercert(binary_form=True)
    peer = ssl_object.getpeercert() or {}
    subject = ",".join(
        f"{_RDN_KEYS.get(key, key)}={value}"
        for rdn in reversed(peer.get("subject", ()))
        for key, value in rdn
    )
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": subject or None,
        "client_cert_error": None,
        "tls_version": _TLS_VERSIONS.get(ssl_object.version() or ""),
        "cipher_suite": None,
    }


class _WithTlsExtension:
    def __init__(self, app: Any, tls: dict[str, Any]) -> None:
        self._app = app
        self._tls = tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            extensions = dict(scope.get("extensions") or {})
            extensions["tls"] = self._tls
            scope = {**scope, "extensions": extensions}
        await self._app(scope, receive, send)


class _TlsAwareProtocol(H11Protocol):
    """uvicorn's h11 protocol, with the TLS extension added to every request of the connection
    (asyncio makes the connection once the handshake, client certificate included, is done)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.app = _WithTlsExtension(self.app, _tls_extension(ssl_object))


class ServerThread:
    """Serve an ASGI app with uvicorn on ``host:port`` (default 127.0.0.1, any free port) from a
    daemon thread.

    ``extra_hosts`` are further loopback addresses bound on the same port when they are free
    (``bound_hosts`` says which were). Binding ``port`` may raise :class:`OSError` (in use).
    ``tls`` (settable until `start`, like ``app``) serves HTTPS; `base_url` follows it.
    """

    def __init__(
        self,
        app: ASGIApp | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_hosts: Iterable[str] = (),
        graceful_timeout: int = 1,
        tls: ServerTls | None = None,
    ) -> None:
        self.app = app  # may be set after construction, once `port` is known
        self.tls = tls  # likewise
        self._host = host
        self._graceful_timeout = graceful_timeout
        self._sockets: list[socket.socket] = [bind(host, port)]
        self.port: int = self._sockets[0].getsockname()[1]
        self.bound_hosts: list[str] = [host]
        for extra in extra_hosts:
            try:
                self._sockets.append(bind(extra, self.port))
                self.bound_hosts.append(extra)
            except OSError:
                pass
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_start: list[Callable[[], None]] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._on_stopping: list[Callable[[], None]] = []

    @property
    def base_url(self) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{self._host}:{self.port}"

    def on_start(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the server loop before uvicorn starts serving."""
        self._on_start.append(callback)

    def on_stopping(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the server loop as soon as `stop` is called."""
        self._on_stopping.append(callback)

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await ``callback`` in the server loop after uvicorn has shut down."""
        self._on_stop.append(callback)

    def start(self, timeout: float = 10.0) -> None:
        if self.app is None:
            raise RuntimeError("ServerThread.app is not set")
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {
                "ssl_certfile": self.tls.certfile,
                "ssl_keyfile": self.tls.keyfile,
                "ssl_ca_certs": self.tls.ca_certs,
                "ssl_cert_reqs": self.tls.cert_reqs,
                "http": _TlsAwareProtocol,
            }
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            interface="asgi3",
            timeout_graceful_shutdown=self._graceful_timeout,
            **tls,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start on {self.base_url}")
            time.sleep(0.005)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        for starting in self._on_start:
            starting()
        assert self._server is not None
        try:
            await self._server.serve(sockets=self._sockets)
        finally:
            for cleanup in self._on_stop:
                with contextlib.suppress(Exception):  # one failing cleanup must not skip the rest
                    await cleanup()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; returns when the server thread has ended."""
        loop, server, thread = self._loop, self._server, self._thread
        if loop is not None and not loop.is_closed():
            for callback in self._on_stopping:
                try:
                    loop.call_soon_threadsafe(callback)
                except RuntimeError:  # loop already closed
                    break
        if server is not None:
            server.should_exit = True
        if thread is not None and thread.is_alive():
            thread.join(timeout)
        for sock in self._sockets:
            sock.close()
