"""The test agent: the demo's agent (``cardfence.engine.demo``) with hostile card faults on top.

`Peer` is `cardfence.engine.demo.agent.DemoAgent` -- the official a2a-sdk 1.3 server pieces on
127.0.0.1 in the calling process, a live card dict (`Peer.mutate_card`), card 503, push deliveries
dropped (incident 001), endpoints gone (incident 002), held ``slow`` tasks, the call log -- plus
faults only tests need (`Peer.set_card_fault`): a card request that hangs, an invalid body, a 5 MiB
body, redirects (same origin, and cross-origin to 127.0.0.2, also bound when free), the card only
at the 0.2/0.3 well-known path, and 404 on both paths. Scripts and skill selection are
`cardfence.engine.demo.executor`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from cardfence.engine.demo.agent import (
    AGENT_CARD_PATH,
    JSONRPC_PATH,
    LEGACY_CARD_PATH,
    REST_PREFIX,
    CardHit,
    DemoAgent,
    card_etag,
)
from cardfence.engine.demo.executor import SCRIPTS, ScriptedExecutor, select_script
from cardfence.engine.demo.server import ServerThread

__all__ = [
    "AGENT_CARD_PATH",
    "CARD_FAULTS",
    "HUGE_CARD_BYTES",
    "JSONRPC_PATH",
    "LEGACY_CARD_PATH",
    "MOVED_CARD_PATH",
    "REST_PREFIX",
    "SCRIPTS",
    "CardHit",
    "Peer",
    "ScriptedExecutor",
    "ServerThread",
    "card_etag",
    "select_script",
]

MOVED_CARD_PATH = "/moved/agent-card.json"  # target of the same-origin redirect
CROSS_ORIGIN_HOST = "127.0.0.2"

CARD_FAULTS = frozenset(
    {
        "503",
        "hang",
        "invalid_json",
        "huge",
        "redirect_cross_origin",
        "redirect_same_origin",
        "not_found_new_path",
        "404",
    }
)
HUGE_CARD_BYTES = 5 * 1024 * 1024
HUGE_CHUNK_BYTES = 64 * 1024
HUGE_CHUNK_PAUSE = 0.01  # paced, so a client that stops reading is noticed early
HANG_SECONDS = 3600.0
INVALID_CARD_BODY = b'{"name": "cardfence-peer", "skills": ['  # truncated JSON


class Peer(DemoAgent):
    """The demo agent with the test-only card faults; use as ``with Peer() as peer:``.

    Attributes beyond `DemoAgent`'s:
        cross_origin_requests: card GETs that reached 127.0.0.2.
        huge_bytes_sent: bytes of the last "huge" card body handed to the socket.
    """

    card_paths = (AGENT_CARD_PATH, LEGACY_CARD_PATH, MOVED_CARD_PATH)
    card_faults = CARD_FAULTS

    def __init__(self, *, name: str = "cardfence-peer", version: str = "1.0.0") -> None:
        super().__init__(
            name=name,
            version=version,
            description="Scripted A2A agent for cardfence tests (a2a-sdk 1.3).",
            tags=("cardfence", "test"),
            extra_hosts=[CROSS_ORIGIN_HOST],
        )
        self._stopping: asyncio.Event | None = None
        self._stopping_flag = False
        self.cross_origin_requests = 0
        self.huge_bytes_sent = 0
        self._server.on_start(self._make_stopping_event)
        self._server.on_stopping(self._signal_stopping)

    def stop(self) -> None:
        self._stopping_flag = True
        super().stop()

    def _make_stopping_event(self) -> None:
        self._stopping = asyncio.Event()

    def _signal_stopping(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    @property
    def cross_origin_served(self) -> bool:
        """Whether 127.0.0.2:PORT could be bound, so a followed cross-origin redirect lands."""
        return CROSS_ORIGIN_HOST in self._server.bound_hosts

    def set_card_fault(self, kind: str | None) -> None:
        """Make card GETs misbehave; ``None`` restores normal service.

        Kinds: "503"; "hang" (until the peer stops); "invalid_json"; "huge" (5 MiB,
        chunked, paced, see `huge_bytes_sent`); "redirect_cross_origin" (302 to
        http://127.0.0.2:PORT/.well-known/agent-card.json, which serves the card
        and counts `cross_origin_requests`); "redirect_same_origin" (302 to
        /moved/agent-card.json); "not_found_new_path" (404 on the v1.0 path, card
        on /.well-known/agent.json); "404" (both well-known paths 404).
        """
        super().set_card_fault(kind)

    async def _answer_card(
        self, request: Request, path: str, host: str, fault: str | None
    ) -> Response:
        if host == CROSS_ORIGIN_HOST:
            self.cross_origin_requests += 1
            return self._card_response(request)
        if path == MOVED_CARD_PATH:
            return self._card_response(request)
        not_found = PlainTextResponse("Not Found", status_code=404)
        if fault in (None, "503"):
            return await super()._answer_card(request, path, host, fault)
        if fault == "hang":
            assert self._stopping is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), HANG_SECONDS)
            return PlainTextResponse("Service Unavailable", status_code=503)
        if fault == "invalid_json":
            return Response(INVALID_CARD_BODY, media_type="application/json")
        if fault == "huge":
            return _HugeCardResponse(self, self._card_snapshot())
        if fault == "redirect_cross_origin":
            if path != AGENT_CARD_PATH:
                return not_found
            target = f"http://{CROSS_ORIGIN_HOST}:{self.port}{AGENT_CARD_PATH}"
            return RedirectResponse(target, status_code=302)
        if fault == "redirect_same_origin":
            return RedirectResponse(self.base_url + MOVED_CARD_PATH, status_code=302)
        if fault == "not_found_new_path":
            return self._card_response(request) if path == LEGACY_CARD_PATH else not_found
        return not_found  # "404"

    def validate_input_modes(self, on: bool = True) -> None:
        """Make the a2a-sdk handler refuse a message part whose media type the card it was built
        with (not the served one, which tests mutate) declares nowhere: a real -32005
        ContentTypeNotSupported. a2a-sdk 1.3 keeps its ``validate_input_modes`` flag there."""
        self.handler._validate_input_modes = on

    def reset(self) -> None:
        """Back to normal service and zeroed counters; tasks and card are kept."""
        super().reset()
        self.validate_input_modes(False)
        self.cross_origin_requests = 0
        self.huge_bytes_sent = 0


class _HugeCardResponse(Response):
    """A 5 MiB card body streamed in paced chunks with no Content-Length.

    The body is valid JSON (the card plus a ``padding`` member), so only a size
    limit can protect a client. Stops when the client disconnects or the peer stops.
    """

    def __init__(self, peer: Peer, card: dict[str, Any]) -> None:
        super().__init__(status_code=200)
        self._peer = peer
        rest = json.dumps(card, separators=(",", ":"))[1:]  # without the opening brace
        head = b'{"padding":"'
        tail = b'",' + rest.encode()
        self._head, self._tail = head, tail
        self._padding = max(0, HUGE_CARD_BYTES - len(head) - len(tail))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = self._peer
        peer.huge_bytes_sent = 0
        disconnected = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            for chunk in self._chunks():
                if disconnected.is_set() or peer._stopping_flag:
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                peer.huge_bytes_sent += len(chunk)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(disconnected.wait(), HUGE_CHUNK_PAUSE)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    def _chunks(self) -> Iterable[bytes]:
        yield self._head
        remaining = self._padding
        while remaining > 0:
            size = min(HUGE_CHUNK_BYTES, remaining)
            yield b"x" * size
            remaining -= size
        yield self._tail
