"""A real remote A2A v1.0 agent for integration tests, demos and benchmarks.

`Peer` runs the official a2a-sdk 1.3 server pieces (``DefaultRequestHandler``,
``InMemoryTaskStore``, ``InMemoryPushNotificationConfigStore``,
``BasePushNotificationSender``, ``create_jsonrpc_routes``, ``create_rest_routes``)
on 127.0.0.1 inside the calling process, with three things a stock agent lacks:

- The Agent Card is served from our own route, from a plain JSON dict that tests
  may change at any time (`Peer.mutate_card`) and that can be made to misbehave
  (`Peer.set_card_fault`). The A2A handler keeps the card it was built with, so
  -- like the peer in seed 001 -- withdrawing ``pushNotifications`` from the
  served card does not stop the endpoints from accepting registrations.
- Switches for two incidents: push deliveries silently dropped while
  registrations are still accepted (seed 001, `Peer.set_push_dropped`), and the
  A2A endpoints answering a plain HTTP 404 with no A2A body (seed 002,
  `Peer.set_endpoint_gone`).
- A log of the A2A calls it received (`Peer.calls`) and card counters.

Skill selection (A2A v1.0 has no skill field on a message): the executor reads
``metadata["skillId"]`` from the message, then from the SendMessage request;
if neither is set, the first word of the message text names the script when it
is one of `SCRIPTS`, and anything else is echoed. The script's argument is the
text after the script name (the whole text when the skill came from metadata
and the text does not start with the skill name). A ``skillId`` that names no
script fails the task with no diagnostic, like the gateway in seed 002.

Scripts: ``echo TEXT`` completes at once with an artifact holding TEXT;
``ask`` goes working, then input-required with a question, and the next
message on that task (same ``taskId``) completes it with an artifact;
``slow N`` goes working and completes after N seconds (float, default 1),
cancellable meanwhile; ``fail`` fails with no status message; ``fail-diag``
fails with a status message; ``reject`` is rejected with a status message.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple, Self

import httpx
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    PushNotificationSender,
    TaskUpdater,
)
from a2a.server.tasks.push_notification_sender import PushNotificationEvent
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

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

AGENT_CARD_PATH = "/.well-known/agent-card.json"
LEGACY_CARD_PATH = "/.well-known/agent.json"  # A2A 0.2/0.3 well-known path
MOVED_CARD_PATH = "/moved/agent-card.json"  # target of the same-origin redirect
JSONRPC_PATH = "/a2a/jsonrpc"
REST_PREFIX = "/a2a/rest"
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
CARD_CACHE_CONTROL = "max-age=60"
INVALID_CARD_BODY = b'{"name": "cardfence-peer", "skills": ['  # truncated JSON

SCRIPTS = ("echo", "ask", "slow", "fail", "fail-diag", "reject")
SKILL_METADATA_KEY = "skillId"

# --------------------------------------------------------------------------------------
# A uvicorn server in a daemon thread
# --------------------------------------------------------------------------------------


def _bind(host: str, port: int) -> socket.socket:
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


class ServerThread:
    """Serve an ASGI app with uvicorn on 127.0.0.1 from a daemon thread.

    The socket is bound before the server starts, so `port` is known (and can go
    into an Agent Card) before the first request. ``extra_hosts`` are further
    loopback addresses bound on the same port when they are free.
    """

    def __init__(
        self,
        app: ASGIApp | None = None,
        *,
        host: str = "127.0.0.1",
        extra_hosts: Iterable[str] = (),
        graceful_timeout: int = 1,
    ) -> None:
        self.app = app  # may be set after construction, once `port` is known
        self._host = host
        self._extra_hosts = tuple(extra_hosts)
        self._graceful_timeout = graceful_timeout
        self._sockets: list[socket.socket] = [_bind(host, 0)]
        self.port: int = self._sockets[0].getsockname()[1]
        self.bound_hosts: list[str] = [host]
        for extra in self._extra_hosts:
            try:
                self._sockets.append(_bind(extra, self.port))
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
        return f"http://{self._host}:{self.port}"

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
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            interface="asgi3",
            timeout_graceful_shutdown=self._graceful_timeout,
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


# --------------------------------------------------------------------------------------
# The scripted agent
# --------------------------------------------------------------------------------------


def select_script(message: Message | None, request_metadata: dict[str, Any]) -> tuple[str, str]:
    """Return ``(script, argument)`` for a message (see the module docstring).

    ``script`` is ``"unknown"`` when a ``skillId`` in metadata names no script.
    """
    text = ""
    skill: Any = None
    if message is not None:
        text = "\n".join(part.text for part in message.parts if part.HasField("text")).strip()
        skill = MessageToDict(message.metadata).get(SKILL_METADATA_KEY)
    if skill is None:
        skill = request_metadata.get(SKILL_METADATA_KEY)
    first, _, rest = text.partition(" ")
    if skill is not None:
        skill = str(skill)
        argument = rest.strip() if first == skill else text
        return (skill if skill in SCRIPTS else "unknown"), argument
    if first in SCRIPTS:
        return first, rest.strip()
    return "echo", text


def _text(updater: TaskUpdater, text: str) -> Message:
    return updater.new_agent_message([Part(text=text)])


class ScriptedExecutor(AgentExecutor):
    """Drives each task through the script its first message selects."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id, context.context_id
        assert task_id is not None
        assert context_id is not None
        updater = TaskUpdater(event_queue, task_id, context_id)
        current = context.current_task
        script, argument = select_script(context.message, context.metadata)

        if current is None:
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            status.timestamp.FromDatetime(datetime.now(UTC))
            task = Task(id=task_id, context_id=context_id, status=status)
            if context.message is not None:
                task.history.append(context.message)
            await event_queue.enqueue_event(task)
        elif current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            # The reply to `ask`.
            reply = context.get_user_input().strip()
            await updater.start_work()
            await updater.add_artifact([Part(text=f"answer: {reply}")], name="answer")
            await updater.complete()
            return

        if script == "echo":
            await updater.add_artifact([Part(text=argument)], name="echo")
            await updater.complete()
        elif script == "ask":
            await updater.start_work()
            await updater.requires_input(_text(updater, "What is your answer?"))
        elif script == "slow":
            seconds = _seconds(argument)
            await updater.start_work()
            await asyncio.sleep(seconds)
            await updater.add_artifact([Part(text=f"slept {seconds:g}s")], name="slow")
            await updater.complete()
        elif script == "fail":
            await updater.start_work()
            await updater.failed()
        elif script == "fail-diag":
            await updater.start_work()
            await updater.failed(_text(updater, f"scripted failure: {argument or 'fail-diag'}"))
        elif script == "reject":
            await updater.reject(_text(updater, f"scripted rejection: {argument or 'reject'}"))
        else:  # a skillId in metadata that names no script (seed 002's gateway)
            await updater.failed()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def _seconds(argument: str) -> float:
    try:
        return max(0.0, float(argument.split()[0]))
    except (IndexError, ValueError):
        return 1.0


# --------------------------------------------------------------------------------------
# Push sender that can drop deliveries (seed 001)
# --------------------------------------------------------------------------------------


class _SwitchablePushSender(PushNotificationSender):
    """Delegates to the SDK sender, or drops every delivery while `dropped` is set."""

    def __init__(
        self, inner: PushNotificationSender, store: InMemoryPushNotificationConfigStore
    ) -> None:
        self.inner = inner
        self.store = store
        self.dropped = False
        self.drops = 0

    async def send_notification(self, task_id: str, event: PushNotificationEvent) -> None:
        if self.dropped:
            # The handler calls this for every event; count only deliveries that had a target.
            self.drops += len(await self.store.get_info_for_dispatch(task_id))
            return
        await self.inner.send_notification(task_id, event)


# --------------------------------------------------------------------------------------
# Card helpers and responses
# --------------------------------------------------------------------------------------


def card_etag(card: dict[str, Any]) -> str:
    """The weak ETag the peer sends for ``card`` (same recipe as a2a-sdk 1.3)."""
    unsigned = {k: v for k, v in card.items() if k != "signatures"}
    body = json.dumps(unsigned, sort_keys=True, separators=(",", ":"))
    return f'W/"{hashlib.sha256(body.encode()).hexdigest()}"'


def _if_none_match_hits(header: str, etag: str) -> bool:
    candidates = [c.strip() for c in header.split(",")]
    return "*" in candidates or any(
        c.removeprefix("W/") == etag.removeprefix("W/") for c in candidates
    )


class CardHit(NamedTuple):
    """One GET on a card path, as the peer saw it."""

    path: str
    host: str  # the local address the connection reached (127.0.0.1 or 127.0.0.2)
    if_none_match: str | None
    fault: str | None


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


# --------------------------------------------------------------------------------------
# The call log middleware
# --------------------------------------------------------------------------------------

_REST_METHODS: tuple[tuple[frozenset[str], re.Pattern[str], str], ...] = tuple(
    (frozenset(verbs.split()), re.compile(pattern), name)
    for verbs, pattern, name in (
        ("POST", r"/message:send$", "SendMessage"),
        ("POST", r"/message:stream$", "SendStreamingMessage"),
        ("POST", r"/tasks/[^/]+:cancel$", "CancelTask"),
        ("GET POST", r"/tasks/[^/]+:subscribe$", "SubscribeToTask"),
        ("GET", r"/tasks/[^/]+/pushNotificationConfigs/[^/]+$", "GetTaskPushNotificationConfig"),
        (
            "DELETE",
            r"/tasks/[^/]+/pushNotificationConfigs/[^/]+$",
            "DeleteTaskPushNotificationConfig",
        ),
        ("POST", r"/tasks/[^/]+/pushNotificationConfigs$", "CreateTaskPushNotificationConfig"),
        ("GET", r"/tasks/[^/]+/pushNotificationConfigs$", "ListTaskPushNotificationConfigs"),
        ("GET", r"/tasks/[^/]+$", "GetTask"),
        ("GET", r"/tasks$", "ListTasks"),
        ("GET", r"/extendedAgentCard$", "GetExtendedAgentCard"),
    )
)


def _rest_method(verb: str, path: str) -> str:
    for verbs, pattern, name in _REST_METHODS:
        if verb in verbs and pattern.search(path):
            return name
    return f"{verb} {path}"


async def _read_body(receive: Receive) -> tuple[bytes, list[ASGIMessage]]:
    chunks: list[bytes] = []
    extra: list[ASGIMessage] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            extra.append(message)
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), extra


def _replay(body: bytes, extra: list[ASGIMessage], receive: Receive) -> Receive:
    pending: list[ASGIMessage] = [
        {"type": "http.request", "body": body, "more_body": False},
        *extra,
    ]

    async def replayed() -> ASGIMessage:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class _PeerMiddleware:
    """Logs A2A calls (binding, method) and answers 404 when the endpoint is gone."""

    def __init__(self, app: ASGIApp, peer: Peer) -> None:
        self._app = app
        self._peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        rest_at = path.find(REST_PREFIX + "/")  # a2a-sdk also mounts /{tenant}/a2a/rest/...
        if path == JSONRPC_PATH:
            body, extra = await _read_body(receive)
            receive = _replay(body, extra, receive)
            self._peer.calls.append(("JSONRPC", _jsonrpc_method(body)))
        elif rest_at >= 0:
            suffix = path[rest_at + len(REST_PREFIX) :]
            self._peer.calls.append(("REST", _rest_method(scope["method"], suffix)))
        else:
            await self._app(scope, receive, send)
            return
        if self._peer.endpoint_gone:
            await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
            return
        await self._app(scope, receive, send)


def _jsonrpc_method(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return "<invalid json>"
    method = parsed.get("method") if isinstance(parsed, dict) else None
    return method if isinstance(method, str) else "<no method>"


# --------------------------------------------------------------------------------------
# The peer
# --------------------------------------------------------------------------------------


def _skills() -> list[AgentSkill]:
    def skill(skill_id: str, name: str, description: str, example: str) -> AgentSkill:
        return AgentSkill(
            id=skill_id,
            name=name,
            description=description,
            tags=["cardfence", "test"],
            examples=[example],
            input_modes=["text/plain"],
            output_modes=["text/plain"],
        )

    return [
        skill("echo", "Echo", "Completes at once with an artifact echoing the text.", "echo hi"),
        skill("ask", "Ask", "Asks a question (input-required); the reply completes it.", "ask"),
        skill("slow", "Slow", "Works for N seconds, then completes; cancellable.", "slow 2"),
        skill("fail", "Fail", "Fails with no diagnostic message.", "fail"),
    ]


class Peer:
    """A real a2a-sdk 1.3 agent on 127.0.0.1; use as ``with Peer() as peer:``.

    The port is bound at construction, so the URLs are valid before `start`.
    A Peer starts once; make a new one to start again. The server runs in its
    own thread and event loop; the setters and `mutate_card` are safe to call
    from the test thread.

    Attributes:
        port, base_url, card_url, jsonrpc_url, rest_url: where it listens.
        agent_card: the protobuf card the A2A handler was built with (static).
        handler: the a2a-sdk ``DefaultRequestHandler``.
        calls: ``(binding, method)`` per A2A request received, binding "JSONRPC"
            or "REST", method the A2A name (e.g. "SendMessage"); recorded even
            while the endpoint is gone.
        card_requests: GETs on any card path (faulty, 304 and redirected ones too).
        card_log: one `CardHit` per such GET.
        cross_origin_requests: card GETs that reached 127.0.0.2.
        huge_bytes_sent: bytes of the last "huge" card body handed to the socket.
        endpoint_gone: see `set_endpoint_gone`.
    """

    def __init__(self, *, name: str = "cardfence-peer", version: str = "1.0.0") -> None:
        self._lock = threading.Lock()
        self._card_fault: str | None = None
        self._stopping: asyncio.Event | None = None
        self._stopping_flag = False
        self.endpoint_gone = False
        self.card_requests = 0
        self.cross_origin_requests = 0
        self.huge_bytes_sent = 0
        self.card_log: list[CardHit] = []
        self.calls: list[tuple[str, str]] = []

        self._server = ServerThread(extra_hosts=[CROSS_ORIGIN_HOST])
        self.port: int = self._server.port
        self.base_url: str = self._server.base_url
        self.card_url: str = self.base_url + AGENT_CARD_PATH
        self.jsonrpc_url: str = self.base_url + JSONRPC_PATH
        self.rest_url: str = self.base_url + REST_PREFIX

        agent_card = AgentCard(
            name=name,
            description="Scripted A2A agent for cardfence tests (a2a-sdk 1.3).",
            version=version,
            supported_interfaces=[
                AgentInterface(
                    url=self.jsonrpc_url, protocol_binding="JSONRPC", protocol_version="1.0"
                ),
                AgentInterface(
                    url=self.rest_url, protocol_binding="HTTP+JSON", protocol_version="1.0"
                ),
            ],
            capabilities=AgentCapabilities(streaming=True, push_notifications=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=_skills(),
        )
        self.agent_card: AgentCard = agent_card
        self._card: dict[str, Any] = agent_card_to_dict(agent_card)

        self._push_client = httpx.AsyncClient(timeout=5.0)
        push_store = InMemoryPushNotificationConfigStore()
        self._push_sender = _SwitchablePushSender(
            BasePushNotificationSender(self._push_client, push_store), push_store
        )
        self.handler = DefaultRequestHandler(
            agent_executor=ScriptedExecutor(),
            task_store=InMemoryTaskStore(),
            agent_card=agent_card,
            push_config_store=push_store,
            push_sender=self._push_sender,
        )
        routes: list[BaseRoute] = [
            Route(path, self._card_endpoint, methods=["GET"])
            for path in (AGENT_CARD_PATH, LEGACY_CARD_PATH, MOVED_CARD_PATH)
        ]
        routes.extend(create_jsonrpc_routes(self.handler, rpc_url=JSONRPC_PATH))
        routes.extend(create_rest_routes(self.handler, path_prefix=REST_PREFIX))
        self._server.app = _PeerMiddleware(Starlette(routes=routes), self)

        self._server.on_start(self._make_stopping_event)
        self._server.on_stopping(self._signal_stopping)
        self._server.on_stop(self._close)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping_flag = True
        self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _make_stopping_event(self) -> None:
        self._stopping = asyncio.Event()

    def _signal_stopping(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    async def _close(self) -> None:
        await self.handler.aclose()
        await self._push_client.aclose()

    # -- card --------------------------------------------------------------------------

    @property
    def card(self) -> dict[str, Any]:
        """The live card dict (A2A v1.0 JSON). Prefer `mutate_card` while serving."""
        return self._card

    @card.setter
    def card(self, value: dict[str, Any]) -> None:
        with self._lock:
            self._card = value

    @property
    def card_etag(self) -> str:
        """The ETag the card route sends for the current card."""
        with self._lock:
            return card_etag(self._card)

    def mutate_card(self, fn: Callable[[dict[str, Any]], object]) -> None:
        """Apply ``fn`` to the card dict, in place; its return value is ignored (so
        ``lambda c: c["skills"].pop()`` is fine). Assign ``card`` to replace the card whole.

        Nothing is bumped automatically: change ``version`` yourself if you want.
        """
        with self._lock:
            fn(self._card)

    @property
    def cross_origin_served(self) -> bool:
        """Whether 127.0.0.2:PORT could be bound, so a followed cross-origin redirect lands."""
        return CROSS_ORIGIN_HOST in self._server.bound_hosts

    @property
    def card_fault(self) -> str | None:
        return self._card_fault

    def set_card_fault(self, kind: str | None) -> None:
        """Make card GETs misbehave; ``None`` restores normal service.

        Kinds: "503"; "hang" (until the peer stops); "invalid_json"; "huge" (5 MiB,
        chunked, paced, see `huge_bytes_sent`); "redirect_cross_origin" (302 to
        http://127.0.0.2:PORT/.well-known/agent-card.json, which serves the card
        and counts `cross_origin_requests`); "redirect_same_origin" (302 to
        /moved/agent-card.json); "not_found_new_path" (404 on the v1.0 path, card
        on /.well-known/agent.json); "404" (both well-known paths 404).
        """
        if kind is not None and kind not in CARD_FAULTS:
            raise ValueError(f"unknown card fault {kind!r}; expected one of {sorted(CARD_FAULTS)}")
        self._card_fault = kind

    def _card_snapshot(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._card)

    def _card_response(self, request: Request) -> Response:
        card = self._card_snapshot()
        headers = {"ETag": card_etag(card), "Cache-Control": CARD_CACHE_CONTROL}
        if_none_match = request.headers.get("if-none-match")
        if if_none_match and _if_none_match_hits(if_none_match, headers["ETag"]):
            return Response(status_code=304, headers=headers)
        return JSONResponse(card, headers=headers)

    async def _card_endpoint(self, request: Request) -> Response:
        path = request.url.path
        server = request.scope.get("server") or ("", 0)
        host = str(server[0])
        fault = self._card_fault
        self.card_requests += 1
        self.card_log.append(CardHit(path, host, request.headers.get("if-none-match"), fault))

        if host == CROSS_ORIGIN_HOST:
            self.cross_origin_requests += 1
            return self._card_response(request)
        if path == MOVED_CARD_PATH:
            return self._card_response(request)
        not_found = PlainTextResponse("Not Found", status_code=404)
        if fault is None:
            return self._card_response(request) if path == AGENT_CARD_PATH else not_found
        if fault == "503":
            return PlainTextResponse(
                "Service Unavailable", status_code=503, headers={"Retry-After": "1"}
            )
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

    # -- A2A endpoint switches -----------------------------------------------------------

    @property
    def push_dropped(self) -> bool:
        return self._push_sender.dropped

    def set_push_dropped(self, dropped: bool) -> None:
        """Silently drop push deliveries; registrations are still accepted (seed 001)."""
        self._push_sender.dropped = dropped

    @property
    def pushes_dropped(self) -> int:
        """Deliveries (event x registered config) swallowed while push was dropped."""
        return self._push_sender.drops

    def set_endpoint_gone(self, gone: bool) -> None:
        """Answer every A2A endpoint with a plain HTTP 404, no A2A body (seed 002)."""
        self.endpoint_gone = gone

    def reset(self) -> None:
        """Back to normal service and zeroed counters; tasks and card are kept."""
        self.set_card_fault(None)
        self.set_push_dropped(False)
        self.set_endpoint_gone(False)
        self.card_requests = 0
        self.cross_origin_requests = 0
        self.huge_bytes_sent = 0
        self.card_log.clear()
        self.calls.clear()
        self._push_sender.drops = 0
