"""A real A2A v1.0 agent on 127.0.0.1, built from a2a-sdk 1.3's own server pieces.

`DemoAgent` runs ``DefaultRequestHandler``, ``InMemoryTaskStore``,
``InMemoryPushNotificationConfigStore``, ``BasePushNotificationSender``, ``create_jsonrpc_routes``
and ``create_rest_routes`` inside the calling process (tasks follow `ScriptedExecutor`'s scripts),
with what a stock agent lacks for playing the incidents of ``docs/rules.md``:

- The Agent Card is served from our own route, from a plain JSON dict that may change at any time
  (`DemoAgent.mutate_card`) and can answer 503 (`DemoAgent.set_card_fault`). The A2A handler keeps
  the card it was built with, so -- like the agent in incident 001 -- withdrawing
  ``pushNotifications`` from the served card does not stop it accepting registrations.
- Push deliveries silently dropped while registrations are still accepted (incident 001,
  `DemoAgent.set_push_dropped`); an endpoint that answers a plain HTTP 404 with no A2A body, as a
  retired or moved one does (incident 002, `DemoAgent.set_endpoint_gone`); ``slow`` tasks held past
  their time until released (`DemoAgent.hold`), so an incident can be staged while a task is live.
- A log of the A2A calls received (`DemoAgent.calls`) and of the card reads (`card_log`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Self

import httpx
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    PushNotificationSender,
)
from a2a.server.tasks.push_notification_sender import PushNotificationEvent
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from cardfence.engine.demo.executor import Hold, ScriptedExecutor
from cardfence.engine.demo.server import ServerThread

__all__ = [
    "AGENT_CARD_PATH",
    "BINDINGS",
    "CARD_FAULTS",
    "JSONRPC_PATH",
    "LEGACY_CARD_PATH",
    "REST_PREFIX",
    "CallLog",
    "CardHit",
    "DemoAgent",
    "card_etag",
]

AGENT_CARD_PATH = "/.well-known/agent-card.json"
LEGACY_CARD_PATH = "/.well-known/agent.json"  # A2A 0.2/0.3 well-known path
JSONRPC_PATH = "/a2a/jsonrpc"
REST_PREFIX = "/a2a/rest"
BINDINGS = ("JSONRPC", "HTTP+JSON")
CARD_FAULTS = frozenset({"503"})
CARD_CACHE_CONTROL = "max-age=60"


# --------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------


def card_etag(card: dict[str, Any]) -> str:
    """The weak ETag the agent sends for ``card`` (same recipe as a2a-sdk 1.3)."""
    unsigned = {k: v for k, v in card.items() if k != "signatures"}
    body = json.dumps(unsigned, sort_keys=True, separators=(",", ":"))
    return f'W/"{hashlib.sha256(body.encode()).hexdigest()}"'


def _if_none_match_hits(header: str, etag: str) -> bool:
    candidates = [c.strip() for c in header.split(",")]
    return "*" in candidates or any(
        c.removeprefix("W/") == etag.removeprefix("W/") for c in candidates
    )


class CardHit(NamedTuple):
    """One GET on a card path, as the agent saw it."""

    path: str
    host: str  # the local address the connection reached
    if_none_match: str | None
    fault: str | None


def _skills(tags: list[str]) -> list[AgentSkill]:
    def skill(skill_id: str, name: str, description: str, example: str) -> AgentSkill:
        return AgentSkill(
            id=skill_id,
            name=name,
            description=description,
            tags=tags,
            examples=[example],
            input_modes=["text/plain"],
            output_modes=["text/plain"],
        )

    return [
        skill("echo", "Echo", "Completes at once with an artifact echoing the text.", "echo hi"),
        skill("ask", "Ask", "Asks a question (input-required); the reply completes it.", "ask"),
        skill(
            "authorize",
            "Authorize",
            "Asks for a sign-in (auth-required); the reply completes it.",
            "authorize",
        ),
        skill("slow", "Slow", "Works for N seconds, then completes; cancellable.", "slow 2"),
        skill("fail", "Fail", "Fails with no diagnostic message.", "fail"),
        skill(
            "write",
            "Write",
            "Sends the text back word by word, one artifact in chunks, then completes.",
            "write one two three",
        ),
    ]


# --------------------------------------------------------------------------------------
# Push sender that can drop deliveries (incident 001)
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


def _jsonrpc_call(body: bytes) -> tuple[str, str]:
    """A JSON-RPC request's method and the tenant its params name ("" when none)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return "<invalid json>", ""
    if not isinstance(parsed, dict):
        return "<no method>", ""
    method, params = parsed.get("method"), parsed.get("params")
    tenant = params.get("tenant") if isinstance(params, dict) else None
    return (
        method if isinstance(method, str) else "<no method>",
        tenant if isinstance(tenant, str) else "",
    )


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


class CallLog:
    """Logs A2A calls (binding, method) and answers a bare 404 where the endpoint is gone."""

    def __init__(self, app: ASGIApp, agent: DemoAgent) -> None:
        self._app = app
        self._agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        rest_at = path.find(REST_PREFIX + "/")  # a2a-sdk also mounts /{tenant}/a2a/rest/...
        if path == JSONRPC_PATH or rest_at >= 0:
            named = [v for k, v in scope.get("headers", ()) if k.lower() == b"a2a-extensions"]
            self._agent.extension_headers.append(b", ".join(named).decode("latin-1"))
        if path == JSONRPC_PATH:
            body, extra = await _read_body(receive)
            receive = _replay(body, extra, receive)
            method, tenant = _jsonrpc_call(body)
            self._agent.calls.append(("JSONRPC", method))
            self._agent.tenants.append(tenant)
            binding = "JSONRPC"
        elif rest_at >= 0:
            suffix = path[rest_at + len(REST_PREFIX) :]
            self._agent.calls.append(("REST", _rest_method(scope["method"], suffix)))
            self._agent.tenants.append(None)
            binding = "HTTP+JSON"
        else:
            await self._app(scope, receive, send)
            return
        if binding in self._agent.gone_bindings:
            await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
            return
        await self._app(scope, receive, send)


# --------------------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------------------


class DemoAgent:
    """A real a2a-sdk 1.3 agent on 127.0.0.1; use as ``with DemoAgent() as agent:``.

    The port (``port=0``: any free one) is bound at construction, so the URLs are valid before
    `start`. An agent starts once; make a new one to start again. The server runs in its own
    thread and event loop; the setters and `mutate_card` are safe to call from any thread.

    Attributes:
        port, base_url, card_url, jsonrpc_url, rest_url: where it listens.
        agent_card: the protobuf card the A2A handler was built with (static).
        handler: the a2a-sdk ``DefaultRequestHandler``.
        calls: ``(binding, method)`` per A2A request received, binding "JSONRPC" or "REST",
            method the A2A name (e.g. "SendMessage"); recorded even while the endpoint is gone.
        tenants: the tenant each of those requests named (JSON-RPC ``params.tenant``, "" when
            none; ``None`` for REST), in the same order.
        extension_headers: the ``A2A-Extensions`` header of each of those requests ("" when
            none), in the same order.
        card_requests: GETs on any card path (faulty and 304 ones too).
        card_log: one `CardHit` per such GET.
        gone_bindings: the bindings whose endpoint answers a bare 404 (`set_endpoint_gone`).
    """

    card_paths: tuple[str, ...] = (AGENT_CARD_PATH, LEGACY_CARD_PATH)
    card_faults: frozenset[str] = CARD_FAULTS

    def __init__(
        self,
        *,
        name: str = "cardfence-demo",
        version: str = "1.0.0",
        description: str = "Scripted A2A agent for the cardfence demo (a2a-sdk 1.3).",
        tags: Iterable[str] = ("cardfence", "demo"),
        port: int = 0,
        extra_hosts: Iterable[str] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._card_fault: str | None = None
        self.gone_bindings: frozenset[str] = frozenset()
        self.card_requests = 0
        self.card_log: list[CardHit] = []
        self.calls: list[tuple[str, str]] = []
        self.tenants: list[str | None] = []
        self.extension_headers: list[str] = []
        self.holding = Hold()

        self._server = ServerThread(port=port, extra_hosts=extra_hosts)
        self.port: int = self._server.port
        self.base_url: str = self._server.base_url
        self.card_url: str = self.base_url + AGENT_CARD_PATH
        self.jsonrpc_url: str = self.base_url + JSONRPC_PATH
        self.rest_url: str = self.base_url + REST_PREFIX

        agent_card = AgentCard(
            name=name,
            description=description,
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
            skills=_skills(list(tags)),
        )
        self.agent_card: AgentCard = agent_card
        self._card: dict[str, Any] = agent_card_to_dict(agent_card)

        self._push_client = httpx.AsyncClient(timeout=5.0)
        push_store = InMemoryPushNotificationConfigStore()
        self._push_sender = _SwitchablePushSender(
            BasePushNotificationSender(self._push_client, push_store), push_store
        )
        self.executor = ScriptedExecutor(self.holding)
        self.handler = DefaultRequestHandler(
            agent_executor=self.executor,
            task_store=InMemoryTaskStore(),
            agent_card=agent_card,
            push_config_store=push_store,
            push_sender=self._push_sender,
        )
        routes: list[BaseRoute] = [
            Route(path, self._card_endpoint, methods=["GET"]) for path in self.card_paths
        ]
        routes.extend(create_jsonrpc_routes(self.handler, rpc_url=JSONRPC_PATH))
        routes.extend(create_rest_routes(self.handler, path_prefix=REST_PREFIX))
        self._server.app = CallLog(Starlette(routes=routes), self)
        self._server.on_stop(self._close)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self.holding.release()  # held tasks finish rather than wait for the loop to end
        self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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

    def skills(self) -> list[tuple[str, str]]:
        """``(id, description)`` of each skill the served card lists."""
        with self._lock:
            return [(str(s.get("id")), str(s.get("description", ""))) for s in self._card["skills"]]

    @property
    def card_fault(self) -> str | None:
        return self._card_fault

    def set_card_fault(self, kind: str | None) -> None:
        """Make card GETs misbehave; ``None`` restores normal service. Kinds: `card_faults`
        ("503": Service Unavailable, no card, as during a redeploy)."""
        if kind is not None and kind not in self.card_faults:
            expected = sorted(self.card_faults)
            raise ValueError(f"unknown card fault {kind!r}; expected one of {expected}")
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
        return await self._answer_card(request, path, host, fault)

    async def _answer_card(
        self, request: Request, path: str, host: str, fault: str | None
    ) -> Response:
        """The answer to one card GET; subclasses add faults of their own."""
        if fault == "503":
            return PlainTextResponse(
                "Service Unavailable", status_code=503, headers={"Retry-After": "1"}
            )
        if fault is None and path == AGENT_CARD_PATH:
            return self._card_response(request)
        return PlainTextResponse("Not Found", status_code=404)

    # -- A2A endpoint switches -----------------------------------------------------------

    @property
    def push_dropped(self) -> bool:
        return self._push_sender.dropped

    def set_push_dropped(self, dropped: bool) -> None:
        """Silently drop push deliveries; registrations are still accepted (incident 001)."""
        self._push_sender.dropped = dropped

    @property
    def pushes_dropped(self) -> int:
        """Deliveries (event x registered config) swallowed while push was dropped."""
        return self._push_sender.drops

    @property
    def endpoint_gone(self) -> bool:
        return bool(self.gone_bindings)

    def set_endpoint_gone(self, gone: bool, binding: str | None = None) -> None:
        """Answer the A2A endpoint of ``binding`` ("JSONRPC" or "HTTP+JSON"; both when None)
        with a plain HTTP 404, no A2A body, as a retired endpoint does (incident 002)."""
        if binding is not None and binding not in BINDINGS:
            raise ValueError(f"unknown binding {binding!r}; expected one of {list(BINDINGS)}")
        named = frozenset(BINDINGS if binding is None else (binding,))
        self.gone_bindings = self.gone_bindings | named if gone else self.gone_bindings - named

    def hold(self) -> None:
        """Keep ``slow`` tasks working past their N seconds until `release` (or `reset`)."""
        self.holding.hold()

    def release(self) -> None:
        self.holding.release()

    def reset(self) -> None:
        """Back to normal service and zeroed counters; tasks and card are kept."""
        self.set_card_fault(None)
        self.set_push_dropped(False)
        self.set_endpoint_gone(False)
        self.release()
        self.card_requests = 0
        self.card_log.clear()
        self.calls.clear()
        self.tenants.clear()
        self.extension_headers.clear()
        self._push_sender.drops = 0
