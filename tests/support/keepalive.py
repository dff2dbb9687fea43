"""Raw HTTP/1.1 servers on 127.0.0.1 or another loopback address (asyncio, the test's own
loop) for the engine's client (``engine.http.pool``): one that answers ``ok`` and keeps or ends its
connections, one that ends kept-alive connections under their next request (closing or
resetting them), and one that accepts and then never reads a byte. Each counts its
connections."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
from typing import Self

import httpx

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC, V10
from cardfence.engine.wire.transport import A2ATransport

__all__ = ["ClosingUnderRequests", "Listening", "OkServer", "Unread", "reset"]

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"


def reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a TCP reset (``SO_LINGER`` 0), not a FIN: the peer's read fails
    with ``ECONNRESET`` instead of finding the stream ended."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Listening:
    """A server on 127.0.0.1 (any free port) for the block, counting its connections."""

    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.connections = 0
        self.port = 0
        self.tls = tls
        self.host = host
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class OkServer(Listening):
    """Answers each request ``ok`` (or ``answer``: a whole HTTP/1.1 response; after ``delay``
    seconds) and then, if ``close_after``,
    closes the connection without saying so (no ``Connection: close``): a keep-alive that
    ended. Over TLS when given a server context."""

    def __init__(
        self,
        close_after: bool,
        *,
        delay: float = 0.0,
        tls: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
        answer: bytes = _OK,
    ) -> None:
        super().__init__(tls, host)
        self.close_after = close_after
        self.delay = delay
        self.answer = answer
        self.open = 0
        self.most_open = 0  # connections open at once, at most

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await asyncio.sleep(self.delay)
                writer.write(self.answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
        writer.close()


class Unread(Listening):
    """Accepts connections and never reads from them nor answers: a request's write fills the
    socket buffers and stalls, and its answer never comes."""

    def __init__(self) -> None:
        super().__init__()
        self._held: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.transport.pause_reading()
        self._held.append(writer)

    async def __aexit__(self, *_: object) -> None:
        for writer in self._held:
            writer.transport.abort()
        await super().__aexit__()


class ClosingUnderRequests(Listening):
    """A JSON-RPC agent whose connections answer their first ``answered`` requests (a GetTask
    result echoing the request's id), then read the next one and end without a byte of answer
    (a FIN, or a reset with ``resets``): a server ending a kept-alive connection just as a
    request arrives, every time. With ``answered=0`` not even a new connection is answered.
    ``methods`` lists what each request asked, answered or not."""

    def __init__(self, answered: int = 1, *, resets: bool = False) -> None:
        super().__init__()
        self.answered = answered
        self.resets = resets
        self.methods: list[str] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for served in range(self.answered + 1):
                head = await reader.readuntil(b"\r\n\r\n")
                first = head.split(b"\r\n", 1)[0].decode()
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length)) if length else {}
                self.methods.append(body.get("method", first))
                if served == self.answered:
                    break  # read, and ended unanswered
                writer.write(self._answer(body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if self.resets:
            reset(writer)
        else:
            writer.close()

    @staticmethod
    def _answer(request: dict[str, object]) -> bytes:
        """A working task (GetTask), or an event stream of one completed task (SubscribeToTask),
        its length given: the connection stays open for the next request."""
        task = {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_WORKING"}}
        kind, ending = b"application/json", b""
        if request.get("method") == "SubscribeToTask":
            task["status"] = {"state": "TASK_STATE_COMPLETED"}
            kind, ending = b"text/event-stream", b"\n\n"
        result = task if kind == b"application/json" else {"task": task}
        answer = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": result}).encode()
        if ending:
            answer = b"data: " + answer + ending
        return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            kind,
            len(answer),
            answer,
        )

    def transport(self, client: httpx.AsyncClient) -> A2ATransport:
        interface = Interface(f"http://127.0.0.1:{self.port}/rpc", JSONRPC, V10)
        return A2ATransport(client, interface, timeout=5.0)
