"""Hostile remotes for the R16 bound tests: a raw HTTP/1.1 server that answers as a minimal A2A
agent unless told to misbehave (stacked encodings, compression bombs, bodies that drip forever),
an agent whose event streams are scripted (`StreamingAgent`: huge events, streams cut, silent or
about another task), a TCP listener that accepts connections and never says a word, and a port
nobody listens on.

All run on 127.0.0.1, port 0, in a thread of their own, so the code under test (an engine, or the
command line with its own ``asyncio.run``) can run in the test's thread.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import socket
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Self
from urllib.parse import quote, quote_plus, unquote, unquote_plus

SKILL = "echo"
RPC_PATH = "/rpc"
CARD_PATH = "/.well-known/agent-card.json"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def rpc_method(self) -> str:
        try:
            return str(json.loads(self.body).get("method", ""))
        except ValueError:
            return ""


@dataclass(frozen=True)
class Reply:
    """An answer. ``drip``: seconds between chunks; the body is sent chunked, ``chunk`` bytes at a
    time (one by default), and then whitespace follows forever, as much at a time. ``chunks``:
    the body sent chunked, one chunk per item (a float is a pause of that many seconds), then
    ``end``: ``done`` (the last chunk, as it should be), ``cut`` (the connection closed with no
    last chunk) or ``hang`` (silence until the server stops)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    drip: float | None = None
    chunk: int = 1
    chunks: Iterable[bytes | float] | None = None
    end: Literal["done", "cut", "hang"] = "done"


def gzip_layers(data: bytes, layers: int) -> bytes:
    for _ in range(layers):
        data = zlib.compress(data, 9, wbits=31)
    return data


@functools.cache
def zeros_gzip(size: int, layers: int = 1) -> bytes:
    """``size`` zero bytes, gzipped ``layers`` times, built without holding them (1 GiB: 1 MB
    once, about 1.8 KB twice)."""
    if layers > 1:
        return gzip_layers(zeros_gzip(size), layers - 1)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(min(size, 1 << 20))
    parts, left = [], size
    while left > 0:
        parts.append(packer.compress(block[: min(left, len(block))]))
        left -= len(block)
    parts.append(packer.flush())
    return b"".join(parts)


class HostileServer:
    """``answer(request) -> Reply`` for each request; ``requests`` keeps what came in."""

    def __init__(self, answer: Callable[[Request], Reply]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("hostile server did not start")
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {
                name.strip().lower(): value.strip()
                for name, value in (line.split(":", 1) for line in head[1:] if ":" in line)
            }
            length = int(headers.get("content-length", "0") or 0)
            body = await reader.readexactly(length) if length else b""
            request = Request(method, path, headers, body)
            self.requests.append(request)
            await self._send(writer, self.answer(request))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(me)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        if reply.chunks is not None:
            await self._send_chunks(writer, reply)
            return
        framing = (
            f"Content-Length: {len(reply.body)}"
            if reply.drip is None
            else "Transfer-Encoding: chunked"
        )
        lines = [f"HTTP/1.1 {reply.status} Hostile"]
        lines += [f"{name}: {value}" for name, value in reply.headers.items()]
        lines += [framing, "Connection: close"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if reply.drip is None:
            writer.write(reply.body)
            await writer.drain()
            return
        size = reply.chunk
        for index in range(0, len(reply.body), size):
            piece = reply.body[index : index + size]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(reply.drip)
        blank = b"%x\r\n%s\r\n" % (size, b" " * size)
        while True:  # never done: JSON may carry any amount of trailing whitespace
            writer.write(blank)
            await writer.drain()
            await asyncio.sleep(reply.drip)

    async def _send_chunks(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        assert reply.chunks is not None
        lines = [f"HTTP/1.1 {reply.status} Hostile"]
        lines += [f"{name}: {value}" for name, value in reply.headers.items()]
        lines += ["Transfer-Encoding: chunked", "Connection: close"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        for chunk in reply.chunks:
            if isinstance(chunk, float):
                await asyncio.sleep(chunk)
                continue
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        if reply.end == "done":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        elif reply.end == "hang":
            await asyncio.Event().wait()  # until the server stops (the handler is cancelled)


Answer = Reply | Callable[[Request], Reply]


class RoutedServer(HostileServer):
    """Answers ``routes[path]`` (a Reply, or a function of the request); 404 elsewhere."""

    def __init__(self) -> None:
        super().__init__(self._route)
        self.routes: dict[str, Answer] = {}

    def _route(self, request: Request) -> Reply:
        answer = self.routes.get(request.path)
        if answer is None:
            return Reply(status=404, body=b"not here", headers={"Content-Type": "text/plain"})
        return answer(request) if callable(answer) else answer

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


class HostileAgent(HostileServer):
    """A minimal A2A 1.0 agent (JSON-RPC, one skill) whose card and methods tests replace:
    ``card`` (a Reply, or None for the honest card) and ``rpc[method]`` (a Reply factory given
    the JSON-RPC id)."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.card: Reply | None = None
        self.interfaces: list[str] | None = None  # None: this server's own /rpc
        self.rpc: dict[str, Callable[[object], Reply]] = {}

    @property
    def rpc_url(self) -> str:
        return self.url + RPC_PATH

    def card_document(self) -> dict[str, Any]:
        urls = [self.rpc_url] if self.interfaces is None else self.interfaces
        return {
            "name": "hostile-agent",
            "description": "an A2A agent that misbehaves on request",
            "version": "1.0.0",
            "supportedInterfaces": [
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"} for url in urls
            ],
            "capabilities": {"streaming": False, "pushNotifications": True},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": SKILL, "name": "Echo", "description": "echo", "tags": []}],
        }

    def posts(self, method: str) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.rpc_method == method]

    def _answer(self, request: Request) -> Reply:
        if request.method == "GET" and request.path.startswith("/.well-known/"):
            if self.card is not None:
                return self.card
            return Reply(body=json.dumps(self.card_document()).encode())
        if request.method == "POST" and request.path == RPC_PATH:
            envelope = json.loads(request.body)
            rid, method = envelope.get("id"), envelope.get("method")
            if method in self.rpc:
                return self.rpc[method](rid)
            task = {
                "id": "t-1",
                "contextId": envelope.get("params", {}).get("message", {}).get("contextId", "c"),
                "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:00Z"},
            }
            result: dict[str, Any] = {"task": task} if method == "SendMessage" else task
            return Reply(body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())
        return Reply(status=404, body=b"not here", headers={"Content-Type": "text/plain"})


class SilentListener:
    """Accepts TCP connections on 127.0.0.1 and never answers (a port that hangs)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._closed = False

    def __enter__(self) -> SilentListener:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._closed = True
        self._socket.close()
        for connection in self._accepted:
            connection.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self._accepted.append(connection)  # kept open, never read, never written


REST_PATH = "/rest"
Frame = Callable[[dict[str, Any]], bytes]


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound a moment, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def working_event(task_id: str = "t-1") -> dict[str, Any]:
    """A StreamResponse: the task ``working`` (a stream's first event, as a2a-sdk sends it)."""
    status = {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:00Z"}
    return {"task": {"id": task_id, "contextId": "c-1", "status": status}}


def completed_event(task_id: str = "t-1") -> dict[str, Any]:
    """A StreamResponse: a status update to ``completed`` (a stream's last event)."""
    return status_update(task_id, "completed", "2026-01-01T00:00:01Z")


def status_update(
    task_id: str, state: str, timestamp: str, context_id: str = "c-1"
) -> dict[str, Any]:
    """A 1.0 StreamResponse status update of the task to ``state`` (a lifecycle name such as
    ``input-required``), as a stream event or as a2a-sdk's push sender posts it."""
    wire = "TASK_STATE_" + state.upper().replace("-", "_")
    status = {"state": wire, "timestamp": timestamp}
    return {"statusUpdate": {"taskId": task_id, "contextId": context_id, "status": status}}


def sse(data: str | bytes, *, event: str = "") -> bytes:
    """One server-sent event with one ``data`` line, its lines ended as sse-starlette ends them."""
    raw = data.encode() if isinstance(data, str) else data
    head = f"event: {event}\r\n".encode() if event else b""
    return head + b"data: " + raw + b"\r\n\r\n"


class StreamingAgent(HostileServer):
    """An A2A agent whose event streams a test scripts, on both bindings: JSON-RPC at ``/rpc``
    (SubscribeToTask, SendStreamingMessage) and HTTP+JSON under ``/rest``
    (``GET /tasks/{id}:subscribe``, ``POST /message:stream``).

    ``script(frame) -> Reply`` answers each stream request; ``frame(result)`` is one SSE event
    carrying a StreamResponse as that binding sends it (JSON-RPC: in a response echoing the
    request id; REST: bare). Other requests are a bare 404."""

    def __init__(self, script: Callable[[Frame], Reply] | None = None) -> None:
        super().__init__(self._answer)
        self.script: Callable[[Frame], Reply] = script or (lambda frame: Reply(chunks=()))

    @property
    def rpc_url(self) -> str:
        return self.url + RPC_PATH

    @property
    def rest_url(self) -> str:
        return self.url + REST_PATH

    def _answer(self, request: Request) -> Reply:
        frame: Frame
        if request.method == "POST" and request.path == RPC_PATH:
            rid = json.loads(request.body).get("id")

            def frame(result: dict[str, Any]) -> bytes:
                return sse(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}))

        elif request.path.startswith(REST_PATH + "/"):

            def frame(result: dict[str, Any]) -> bytes:
                return sse(json.dumps(result))

        else:
            return Reply(status=404, body=b"not here", headers={"Content-Type": "text/plain"})
        return self.script(frame)


# -- an agent that repeats the request's secrets ---------------------------------------------------


def echoed(request: Request) -> str:
    """What ``request`` carried that a careless agent repeats, in every form it may take: the
    ``Authorization`` header and its credentials as sent, in base64 and percent-encoded, the
    query string decoded and not, and the body (a registration's webhook token and
    authorization, a token request's form)."""
    authorization = request.headers.get("authorization", "")
    credentials = authorization.partition(" ")[2]
    query = request.path.partition("?")[2]
    decoded = (
        base64.b64decode(credentials + "==").decode("latin-1") if "Basic" in authorization else ""
    )
    pieces = [
        authorization,
        credentials,
        decoded,
        base64.b64encode(credentials.encode()).decode(),
        base64.urlsafe_b64encode(credentials.encode()).decode().rstrip("="),
        quote(credentials, safe=""),
        quote(credentials, safe="").lower(),
        query,
        unquote(query),
        quote_plus(unquote(query)),
        request.body.decode("utf-8", "replace"),
        unquote_plus(request.body.decode("utf-8", "replace")),
    ]
    return "you sent: " + " | ".join(piece for piece in pieces if piece)


def escaped(text: str) -> bytes:
    """``text`` as a JSON string whose every character is a ``\\u`` escape (valid JSON that no
    search for the plain text finds)."""
    return b'"' + "".join(f"\\u{ord(c):04X}" for c in text).encode() + b'"'


class EchoingAgent(HostileAgent):
    """:class:`HostileAgent` whose card requires a bearer token and an API key in the query (or,
    with ``token_url`` set, an OAuth 2.0 client-credentials token from there), and which repeats
    what each request carried (:func:`echoed`) in its answers: to the JSON-RPC methods in
    ``refusing`` as an error whose message holds the echo with every character escaped and whose
    data holds it plain; to a GetTask (unless refused) as the status message of a task in
    ``state``."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing: set[str] = set()
        self.state = "TASK_STATE_WORKING"
        self.token_url: str | None = None

    def card_document(self) -> dict[str, Any]:
        card = super().card_document()
        if self.token_url is not None:
            flow = {"clientCredentials": {"tokenUrl": self.token_url, "scopes": {}}}
            card["securitySchemes"] = {"oauth": {"oauth2SecurityScheme": {"flows": flow}}}
            card["securityRequirements"] = [{"schemes": {"oauth": {"list": []}}}]
            return card
        card["securitySchemes"] = {
            "bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}},
            "key": {"apiKeySecurityScheme": {"location": "query", "name": "agent_key"}},
        }
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}, "key": {"list": []}}}]
        return card

    def _answer(self, request: Request) -> Reply:
        if request.method != "POST" or request.path.partition("?")[0] != RPC_PATH:
            return super()._answer(request)
        envelope = json.loads(request.body)
        rid, method = envelope.get("id"), envelope.get("method")
        echo = echoed(request)
        if method in self.refusing:
            data = json.dumps({"echo": echo}).encode()
            error = b'{"code":-32603,"message":' + escaped(echo) + b',"data":' + data + b"}"
            head = b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
            return Reply(body=head + b',"error":' + error + b"}")
        if method != "GetTask":
            return super()._answer(replace(request, path=RPC_PATH))
        message = {"messageId": "m-echo", "role": "ROLE_AGENT", "parts": [{"text": echo}]}
        status = {"state": self.state, "timestamp": "2026-01-01T00:00:01Z", "message": message}
        task = {"id": "t-1", "contextId": "c", "status": status}
        return Reply(body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": task}).encode())
