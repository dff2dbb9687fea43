"""A real A2A 0.3 agent on 127.0.0.1, built from the official a2a-sdk 0.3.26 server pieces.

Runs in ``.venv-a2a03`` (``scripts/venv03.sh``), never in cardfence's venv: a2a-sdk 0.3 and 1.3
cannot be installed side by side. `tests/support/peer03.py` starts it as a subprocess::

    .venv-a2a03/bin/python tests/support/agent03/server.py --port 0 --ready-file PATH

``--preferred-transport HTTP+JSON`` serves a card whose main ``url`` is the HTTP+JSON endpoint
(``preferredTransport: "HTTP+JSON"``, both endpoints still listed in ``additionalInterfaces``), so
a client taking the card's preference talks HTTP+JSON; the default is JSON-RPC first.

Once serving it writes ``{"pid", "port", "base_url", "card_url", "jsonrpc_url", "rest_url"}``
to PATH (atomically). Built from ``DefaultRequestHandler`` (with one SDK race closed: see
`Handler03`), ``InMemoryTaskStore``,
``InMemoryPushNotificationConfigStore``, ``BasePushNotificationSender``,
``A2AStarletteApplication`` (JSON-RPC at ``/a2a/jsonrpc``) and ``A2ARESTFastAPIApplication``
(HTTP+JSON under ``/a2a/rest``: ``/a2a/rest/v1/message:send`` ...). Tasks follow the scripts of
cardfence's demo executor (``engine/demo/executor.py``), rewritten for the 0.3 types:

- the skill is ``metadata["skillId"]`` of the message, then of the request; else the first word of
  the text when it names a script; else ``echo``. A ``skillId`` naming no script fails the task;
- ``echo TEXT`` completes at once with an artifact holding TEXT; ``ask`` goes working, then
  input-required (``final: true``, as 0.3 agents end the stream there), and the next message on
  the task completes it with an artifact ``answer: REPLY``; ``authorize`` the same with
  auth-required; ``slow N`` works N seconds (default 1; longer while held), then completes,
  cancellable meanwhile; ``fail`` fails with no status message, ``fail-diag`` with one;
  ``reject`` is rejected with a status message; ``parts`` completes with an artifact ``parts``
  holding every part of the message as it came and an artifact ``request`` holding, as a data
  part, the message's ``metadata`` and ``referenceTaskIds`` and the ``acceptedOutputModes``.

The card is served from a plain JSON dict at ``/.well-known/agent-card.json`` and, as a2a-sdk
0.3 does, at ``/.well-known/agent.json`` -- without ETag or Cache-Control, as a2a-sdk 0.3 sends
none. The A2A handlers keep the card they were built with, so a mutated served card does not
change what the agent accepts (incident 001).

Test control, under ``/_test/`` (never logged as A2A calls):

- ``GET /_test/calls``: ``[{"binding": "JSONRPC"|"REST", "method": v1.0 name, "wire": ...,
  "extensions": its X-A2A-Extensions header or ""}]``
  per A2A request, ``method`` named as cardfence's 1.3 demo agent names it ("SendMessage" ...),
  ``wire`` the 0.3 JSON-RPC method or ``"VERB /v1/..."`` (a JSON-RPC method 0.3 does not have is
  logged as ``"unknown:NAME"``, so a v1.0 ``SendMessage`` is told from a 0.3 ``message/send``;
  a REST path it does not have as ``"VERB /path"``); recorded even while the endpoint is gone;
- ``GET /_test/state``: card reads, card fault, gone bindings, push switch and drops, hold;
- ``GET /_test/card``, ``POST /_test/card`` (body: the new card JSON, served from then on);
- ``POST /_test/card_fault`` ``{"fault": null | "503" | "404" | "hang" | "invalid_json" |
  "huge"}``: a 503 (``Retry-After: 1``), a 404, no answer (until the client goes away), a
  truncated JSON body, a 5 MiB body (chunked, paced);
- ``POST /_test/endpoint_gone`` ``{"gone": bool, "binding": null | "JSONRPC" | "HTTP+JSON"}``:
  the endpoint answers a bare HTTP 404 (incident 002);
- ``POST /_test/push_dropped`` ``{"dropped": bool}``: deliveries silently dropped while
  registrations are still accepted (incident 001);
- ``POST /_test/hold``, ``POST /_test/release``: ``slow`` tasks stay working until released;
- ``POST /_test/reset``: normal service, logs cleared; tasks and card kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.apps import A2ARESTFastAPIApplication, A2AStarletteApplication
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    PushNotificationSender,
    TaskUpdater,
)
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    DataPart,
    Message,
    Part,
    Task,
    TaskState,
    TaskStatus,
    TextPart,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

AGENT_CARD_PATH = "/.well-known/agent-card.json"
LEGACY_CARD_PATH = "/.well-known/agent.json"
JSONRPC_PATH = "/a2a/jsonrpc"
REST_PREFIX = "/a2a/rest"
TEST_PREFIX = "/_test"
BINDINGS = ("JSONRPC", "HTTP+JSON")
CARD_FAULTS = ("503", "404", "hang", "invalid_json", "huge")
HANG_SECONDS = 3600.0  # "hang": no answer for this long, or until the client goes away
INVALID_CARD_BODY = b'{"name": "cardfence-peer03", "skills": ['  # truncated JSON
HUGE_CARD_BYTES = 5 * 1024 * 1024  # "huge": chunked, no Content-Length, paced
HUGE_CHUNK_BYTES = 64 * 1024
HUGE_CHUNK_PAUSE = 0.01
SCRIPTS = ("echo", "ask", "authorize", "slow", "fail", "fail-diag", "reject", "write", "parts")
SKILL_METADATA_KEY = "skillId"
FORM = {  # what `ask form` asks to be filled, as the demo agent asks it
    "type": "object",
    "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
    "required": ["answer"],
}

# -- the scripts (engine/demo/executor.py, on the 0.3 types) -------------------------------------


def _text_of(message: Message | None) -> str:
    if message is None:
        return ""
    texts = [part.root.text for part in message.parts if isinstance(part.root, TextPart)]
    return "\n".join(texts).strip()


def select_script(message: Message | None, request_metadata: dict[str, Any]) -> tuple[str, str]:
    """``(script, argument)`` as cardfence's demo executor chooses them."""
    text = _text_of(message)
    skill: Any = (message.metadata or {}).get(SKILL_METADATA_KEY) if message else None
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


class Hold:
    """Keeps ``slow`` tasks working past their N seconds until released (one event loop)."""

    def __init__(self) -> None:
        self._released = asyncio.Event()
        self._released.set()

    @property
    def held(self) -> bool:
        return not self._released.is_set()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def passed(self) -> None:
        await self._released.wait()


def _seconds(argument: str) -> float:
    try:
        return max(0.0, float(argument.split()[0]))
    except (IndexError, ValueError):
        return 1.0


def _parts(text: str) -> list[Part]:
    return [Part(root=TextPart(text=text))]


class ScriptedExecutor(AgentExecutor):
    """Drives each task through the script its first message selects."""

    def __init__(self, hold: Hold) -> None:
        self.hold = hold
        self.extensions: list[list[str]] = []  # what each execution's request activated

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.extensions.append(sorted(context.requested_extensions))
        task_id, context_id = context.task_id, context.context_id
        assert task_id is not None
        assert context_id is not None
        updater = TaskUpdater(event_queue, task_id, context_id)
        current = context.current_task
        script, argument = select_script(context.message, context.metadata)

        if current is None:
            history = [context.message] if context.message is not None else None
            task = Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.submitted),
                history=history,
            )
            await event_queue.enqueue_event(task)
        elif current.status.state in (TaskState.input_required, TaskState.auth_required):
            # The reply to `ask` or `authorize`.
            reply = context.get_user_input().strip()
            await updater.start_work()
            await updater.add_artifact(_parts(f"answer: {reply}"), name="answer")
            await updater.complete()
            return

        if script == "echo":
            await updater.add_artifact(_parts(argument), name="echo")
            await updater.complete()
        elif script == "parts":  # every part as it came, and the message's metadata
            message = context.message
            await updater.add_artifact(list(message.parts) if message else [], name="parts")
            configuration = context.configuration
            request = {
                "metadata": dict(message.metadata or {}) if message else {},
                "referenceTaskIds": list(message.reference_task_ids or []) if message else [],
                "acceptedOutputModes": list(
                    (configuration.accepted_output_modes if configuration else None) or []
                ),
            }
            await updater.add_artifact([Part(root=DataPart(data=request))], name="request")
            await updater.complete()
        elif script == "ask":
            await updater.start_work()
            asked = _parts("What is your answer?")
            if argument == "form":  # the question carries a form to fill (a data part)
                asked.append(Part(root=DataPart(data=FORM)))
            question = updater.new_agent_message(asked)
            await updater.requires_input(question, final=True)
        elif script == "authorize":
            await updater.start_work()
            sign_in = updater.new_agent_message(_parts("Sign in at https://id.example/device"))
            await updater.requires_auth(sign_in, final=True)
        elif script == "slow":
            seconds = _seconds(argument)
            await updater.start_work()
            await asyncio.sleep(seconds)
            await self.hold.passed()
            await updater.add_artifact(_parts(f"slept {seconds:g}s"), name="slow")
            await updater.complete()
        elif script == "write":
            await updater.start_work()
            words = argument.split(" ")
            for number, word in enumerate(words):
                last = number == len(words) - 1
                await asyncio.sleep(0.02)  # each chunk its own stream event
                if number == 2:
                    await self.hold.passed()  # held: two words sent, the rest once released
                await updater.add_artifact(
                    _parts(word if last else word + " "),
                    artifact_id="text",
                    name="text",
                    append=number > 0,
                    last_chunk=last,
                )
            await updater.complete()
        elif script == "fail":
            await updater.start_work()
            await updater.failed()
        elif script == "fail-diag":
            await updater.start_work()
            diagnostic = f"scripted failure: {argument or 'fail-diag'}"
            await updater.failed(updater.new_agent_message(_parts(diagnostic)))
        elif script == "reject":
            rejection = f"scripted rejection: {argument or 'reject'}"
            await updater.reject(updater.new_agent_message(_parts(rejection)))
        else:  # a skillId in metadata that names no script
            await updater.failed()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


# -- the card -----------------------------------------------------------------------------------


def build_card(
    name: str, version: str, jsonrpc_url: str, rest_url: str, preferred: str = "JSONRPC"
) -> AgentCard:
    def skill(
        skill_id: str, title: str, description: str, example: str, modes: list[str]
    ) -> AgentSkill:
        return AgentSkill(
            id=skill_id,
            name=title,
            description=description,
            tags=["cardfence", "test", "a2a-0.3"],
            examples=[example],
            input_modes=modes,
            output_modes=modes,
        )

    plain = ["text/plain"]
    return AgentCard(
        name=name,
        description="Scripted A2A 0.3 agent for cardfence tests (a2a-sdk 0.3.26).",
        version=version,
        protocol_version="0.3.0",
        url=rest_url if preferred == "HTTP+JSON" else jsonrpc_url,
        preferred_transport=preferred,
        additional_interfaces=[
            AgentInterface(url=jsonrpc_url, transport="JSONRPC"),
            AgentInterface(url=rest_url, transport="HTTP+JSON"),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=plain,
        default_output_modes=plain,
        skills=[
            skill("echo", "Echo", "Completes at once with an artifact echoing the text.",
                  "echo hi", plain),
            # A bare word mode, as many 0.3 agents declare.
            skill("ask", "Ask", "Asks a question (input-required); the reply completes it.",
                  "ask", ["text"]),
            skill("authorize", "Authorize",
                  "Asks for a sign-in (auth-required); the reply completes it.",
                  "authorize", plain),
            skill("slow", "Slow", "Works for N seconds, then completes; cancellable.",
                  "slow 2", plain),
            skill("fail", "Fail", "Fails with no diagnostic message.", "fail", plain),
            skill("write", "Write",
                  "Sends the text back word by word, one artifact in chunks, then completes.",
                  "write one two three", plain),
        ],
    )  # fmt: skip


# -- the handler ---------------------------------------------------------------------------------

REPLY_STATES = (TaskState.input_required, TaskState.auth_required)
CLEANUP_WAIT_SECONDS = 5.0


class Handler03(DefaultRequestHandler):
    """a2a-sdk 0.3.26's handler, with one race closed so replies are deterministic.

    When a ``message/send`` returns before its run ends (auth-required always, input-required
    when not blocking -- the HTTP+JSON default), the SDK closes that run's event queue in the
    background. A reply arriving meanwhile taps the closing queue and gets -32603 (``NoTaskQueue``
    in the log) or loses its events. Before a message to a task that awaits a reply, this waits
    (at most 5 s) until the previous run is cleaned up; nothing else changes.
    """

    async def _setup_message_execution(self, params: Any, context: Any = None) -> Any:
        task_id = params.message.task_id
        if task_id and task_id in self._running_agents:
            task = await self.task_store.get(task_id, context)
            if task is not None and task.status.state in REPLY_STATES:
                deadline = asyncio.get_running_loop().time() + CLEANUP_WAIT_SECONDS
                while (
                    task_id in self._running_agents and asyncio.get_running_loop().time() < deadline
                ):
                    await asyncio.sleep(0.005)
        return await super()._setup_message_execution(params, context)


# -- push deliveries that can be dropped (incident 001) -----------------------------------------


class SwitchablePushSender(PushNotificationSender):
    """Delegates to the SDK's sender, or drops every delivery while `dropped` is set."""

    def __init__(self, inner: PushNotificationSender, store: InMemoryPushNotificationConfigStore):
        self.inner = inner
        self.store = store
        self.dropped = False
        self.drops = 0

    async def send_notification(self, task: Task) -> None:
        if self.dropped:
            self.drops += len(await self.store.get_info(task.id))
            return
        await self.inner.send_notification(task)


# -- the call log and the "endpoint gone" switch --------------------------------------------------

_REST_METHODS: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (verb, re.compile(pattern), name)
    for verb, pattern, name in (
        ("POST", r"^/v1/message:send$", "SendMessage"),
        ("POST", r"^/v1/message:stream$", "SendStreamingMessage"),
        ("POST", r"^/v1/tasks/[^/]+:cancel$", "CancelTask"),
        ("GET", r"^/v1/tasks/[^/]+:subscribe$", "SubscribeToTask"),
        ("GET", r"^/v1/tasks/[^/]+/pushNotificationConfigs/[^/]+$",
         "GetTaskPushNotificationConfig"),
        ("POST", r"^/v1/tasks/[^/]+/pushNotificationConfigs$", "CreateTaskPushNotificationConfig"),
        ("GET", r"^/v1/tasks/[^/]+/pushNotificationConfigs$", "ListTaskPushNotificationConfigs"),
        ("GET", r"^/v1/tasks/[^/:]+$", "GetTask"),
        ("GET", r"^/v1/tasks$", "ListTasks"),
        ("GET", r"^/v1/card$", "GetExtendedAgentCard"),
    )
)  # fmt: skip

# The 0.3 JSON-RPC methods, named as cardfence's 1.3 demo agent logs them.
JSONRPC_METHODS = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}


def _rest_method(verb: str, suffix: str) -> str:
    for method_verb, pattern, name in _REST_METHODS:
        if verb == method_verb and pattern.search(suffix):
            return name
    return f"{verb} {suffix}"


def _jsonrpc_method(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return "<invalid json>"
    method = parsed.get("method") if isinstance(parsed, dict) else None
    return method if isinstance(method, str) else "<no method>"


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
    """Logs A2A calls and answers a bare 404 where the endpoint is gone."""

    def __init__(self, app: ASGIApp, agent: Agent03) -> None:
        self._app = app
        self._agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        if path == JSONRPC_PATH and scope["method"] == "POST":
            body, extra = await _read_body(receive)
            receive = _replay(body, extra, receive)
            wire = _jsonrpc_method(body)
            method = JSONRPC_METHODS.get(wire) or f"unknown:{wire}"
            binding, logged = "JSONRPC", "JSONRPC"
        elif path.startswith(REST_PREFIX + "/"):
            suffix = path[len(REST_PREFIX) :]
            wire = f"{scope['method']} {suffix}"
            method = _rest_method(scope["method"], suffix)
            binding, logged = "HTTP+JSON", "REST"
        else:
            await self._app(scope, receive, send)
            return
        named = dict(scope["headers"]).get(b"x-a2a-extensions", b"").decode("latin-1")
        self._agent.calls.append(
            {"binding": logged, "method": method, "wire": wire, "extensions": named}
        )
        if binding in self._agent.gone_bindings:
            await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
            return
        await self._app(scope, receive, send)


# -- the agent ----------------------------------------------------------------------------------


class Agent03:
    """The app and its switches; `app` is the ASGI app to serve."""

    def __init__(
        self, *, host: str, port: int, name: str, version: str, preferred: str = "JSONRPC"
    ) -> None:
        self.base_url = f"http://{host}:{port}"
        self.urls = {
            "port": port,
            "base_url": self.base_url,
            "card_url": self.base_url + AGENT_CARD_PATH,
            "jsonrpc_url": self.base_url + JSONRPC_PATH,
            "rest_url": self.base_url + REST_PREFIX,
        }
        self.calls: list[dict[str, str]] = []
        self.card_log: list[dict[str, Any]] = []
        self.card_fault: str | None = None
        self.gone_bindings: set[str] = set()
        self.holding = Hold()

        self.agent_card = build_card(
            name, version, self.urls["jsonrpc_url"], self.urls["rest_url"], preferred
        )
        self.card: dict[str, Any] = self.agent_card.model_dump(
            mode="json", exclude_none=True, by_alias=True
        )

        self.push_client = httpx.AsyncClient(timeout=5.0)
        push_store = InMemoryPushNotificationConfigStore()
        self.push_sender = SwitchablePushSender(
            BasePushNotificationSender(self.push_client, push_store), push_store
        )
        self.executor = ScriptedExecutor(self.holding)
        self.handler = Handler03(
            agent_executor=self.executor,
            task_store=InMemoryTaskStore(),
            push_config_store=push_store,
            push_sender=self.push_sender,
        )
        jsonrpc_routes = [
            route
            for route in A2AStarletteApplication(self.agent_card, self.handler).routes(
                rpc_url=JSONRPC_PATH
            )
            if route.name == "a2a_handler"  # the card is served from our own routes
        ]
        app = A2ARESTFastAPIApplication(self.agent_card, self.handler).build(
            rpc_url=REST_PREFIX, docs_url=None, redoc_url=None, openapi_url=None
        )
        app.router.routes[:] = [
            route
            for route in app.router.routes
            if not getattr(route, "path", "").endswith(AGENT_CARD_PATH)
        ]
        own: list[BaseRoute] = [
            Route(AGENT_CARD_PATH, self._card_endpoint, methods=["GET"]),
            Route(LEGACY_CARD_PATH, self._card_endpoint, methods=["GET"]),
            *jsonrpc_routes,
            *self._test_routes(),
        ]
        app.router.routes[0:0] = own
        self.app: ASGIApp = CallLog(app, self)

    async def aclose(self) -> None:
        self.holding.release()
        await self.push_client.aclose()

    # -- the card ---------------------------------------------------------------------------

    async def _card_endpoint(self, request: Request) -> Response:
        self.card_log.append(
            {
                "path": request.url.path,
                "host": str((request.scope.get("server") or ("", 0))[0]),
                "if_none_match": request.headers.get("if-none-match"),
                "fault": self.card_fault,
            }
        )
        if self.card_fault == "503":
            return PlainTextResponse(
                "Service Unavailable", status_code=503, headers={"Retry-After": "1"}
            )
        if self.card_fault == "404":
            return PlainTextResponse("Not Found", status_code=404)
        if self.card_fault == "hang":
            deadline = asyncio.get_running_loop().time() + HANG_SECONDS
            while asyncio.get_running_loop().time() < deadline:
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.05)
            return PlainTextResponse("Service Unavailable", status_code=503)
        if self.card_fault == "invalid_json":
            return Response(INVALID_CARD_BODY, media_type="application/json")
        if self.card_fault == "huge":
            return StreamingResponse(_huge_card(self.card), media_type="application/json")
        return JSONResponse(copy.deepcopy(self.card))

    # -- test control -----------------------------------------------------------------------

    def _test_routes(self) -> list[BaseRoute]:
        def route(
            path: str, endpoint: Callable[[Request], Awaitable[Response]], method: str
        ) -> Route:
            return Route(TEST_PREFIX + path, endpoint, methods=[method])

        return [
            route("/calls", self._get_calls, "GET"),
            route("/state", self._get_state, "GET"),
            route("/card", self._get_card, "GET"),
            route("/card", self._set_card, "POST"),
            route("/card_fault", self._set_card_fault, "POST"),
            route("/endpoint_gone", self._set_endpoint_gone, "POST"),
            route("/push_dropped", self._set_push_dropped, "POST"),
            route("/hold", self._hold, "POST"),
            route("/release", self._release, "POST"),
            route("/reset", self._reset, "POST"),
        ]

    def state(self) -> dict[str, Any]:
        return {
            "card_requests": len(self.card_log),
            "card_log": self.card_log,
            "card_fault": self.card_fault,
            "gone_bindings": sorted(self.gone_bindings),
            "push_dropped": self.push_sender.dropped,
            "pushes_dropped": self.push_sender.drops,
            "held": self.holding.held,
            "executed_extensions": self.executor.extensions,
        }

    async def _get_calls(self, request: Request) -> Response:
        return JSONResponse(self.calls)

    async def _get_state(self, request: Request) -> Response:
        return JSONResponse(self.state())

    async def _get_card(self, request: Request) -> Response:
        return JSONResponse(self.card)

    async def _set_card(self, request: Request) -> Response:
        card = await request.json()
        if not isinstance(card, dict):
            return JSONResponse({"error": "the card must be a JSON object"}, status_code=400)
        self.card = card
        return JSONResponse(self.card)

    async def _set_card_fault(self, request: Request) -> Response:
        fault = (await request.json()).get("fault")
        if fault is not None and fault not in CARD_FAULTS:
            return JSONResponse({"error": f"unknown card fault {fault!r}"}, status_code=400)
        self.card_fault = fault
        return JSONResponse(self.state())

    async def _set_endpoint_gone(self, request: Request) -> Response:
        body = await request.json()
        binding = body.get("binding")
        if binding is not None and binding not in BINDINGS:
            return JSONResponse({"error": f"unknown binding {binding!r}"}, status_code=400)
        named = set(BINDINGS if binding is None else (binding,))
        if body.get("gone", True):
            self.gone_bindings |= named
        else:
            self.gone_bindings -= named
        return JSONResponse(self.state())

    async def _set_push_dropped(self, request: Request) -> Response:
        self.push_sender.dropped = bool((await request.json()).get("dropped", True))
        return JSONResponse(self.state())

    async def _hold(self, request: Request) -> Response:
        self.holding.hold()
        return JSONResponse(self.state())

    async def _release(self, request: Request) -> Response:
        self.holding.release()
        return JSONResponse(self.state())

    async def _reset(self, request: Request) -> Response:
        self.card_fault = None
        self.gone_bindings.clear()
        self.push_sender.dropped = False
        self.push_sender.drops = 0
        self.holding.release()
        self.calls.clear()
        self.card_log.clear()
        self.executor.extensions.clear()
        return JSONResponse(self.state())


# -- the command line ---------------------------------------------------------------------------


def _write_ready(path: Path, urls: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"pid": os.getpid(), **urls}))
    partial.replace(path)


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    agent = Agent03(
        host=args.host,
        port=port,
        name=args.name,
        version=args.version,
        preferred=args.preferred_transport,
    )
    config = uvicorn.Config(
        agent.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                await serving
                raise SystemExit("agent03: the server stopped before it started")
            await asyncio.sleep(0.01)
        if args.ready_file:
            _write_ready(Path(args.ready_file), agent.urls)
        await serving
    finally:
        agent.holding.release()
        with contextlib.suppress(Exception):
            await agent.aclose()


async def _huge_card(card: dict[str, Any]) -> AsyncIterator[bytes]:
    """The card as JSON padded with spaces to ``HUGE_CARD_BYTES``, in paced chunks (a client
    that stops reading is noticed early)."""
    head = json.dumps(card).encode()[:-1] + b', "padding": "'
    tail = b'"}'
    remaining = max(0, HUGE_CARD_BYTES - len(head) - len(tail))
    yield head
    while remaining:
        size = min(HUGE_CHUNK_BYTES, remaining)
        remaining -= size
        yield b" " * size
        await asyncio.sleep(HUGE_CHUNK_PAUSE)
    yield tail


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--ready-file", help="where to write the bound URLs as JSON once serving")
    parser.add_argument("--name", default="cardfence-peer03")
    parser.add_argument("--version", default="1.0.0")
    parser.add_argument(
        "--preferred-transport",
        choices=BINDINGS,
        default="JSONRPC",
        help="the binding of the card's main url (the agent's preference)",
    )
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
