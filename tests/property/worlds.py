"""In-memory worlds for the differential property (P1): one remote agent, several engines.

The remote's truth (each task's history of states) is shared by every world; each world is an
engine with its own store (SQLite in memory) and its own ``httpx.MockTransport`` that answers A2A
from that truth exactly as docs/wire.md shows, and answers card requests with whatever discovery
outcome the test gives that world: the same card, a changed card, or a failure.

The agent speaks one of :data:`PROTOCOLS`, its card saying so: A2A 1.0 over JSON-RPC, or A2A 0.3
over JSON-RPC (``message/send`` & co., ``kind``-tagged objects, lower-case states) or over
HTTP+JSON (``/v1/message:send`` & co., protobuf JSON, no status timestamps, errors as an HTTP
status with ``{"message"}``), as a2a-sdk 0.3.26 answers (docs/wire.md, "A2A 0.3 on the wire").
The 0.3 answers are written here from those captures, not with the engine's own translation
(``engine/wire03.py``), so that translation is what the worlds put to the test. A 0.3 agent
pushes the whole task (:func:`push_body`), with the notification token only.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

AGENT = "https://agent.test"
CARD_URL = f"{AGENT}/.well-known/agent-card.json"
RPC = f"{AGENT}/rpc"
RPC_MOVED = f"{AGENT}/rpc2"
REST = f"{AGENT}/rest"  # the HTTP+JSON interface: its paths are REST + "/v1/..."
REST_MOVED = f"{AGENT}/rest2"
PROTOCOLS = ("1.0", "0.3-jsonrpc", "0.3-http+json")
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MAX_CARD_BYTES = 8192

WIRE_STATE = {
    "submitted": "TASK_STATE_SUBMITTED",
    "working": "TASK_STATE_WORKING",
    "input-required": "TASK_STATE_INPUT_REQUIRED",
    "auth-required": "TASK_STATE_AUTH_REQUIRED",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "canceled": "TASK_STATE_CANCELED",
    "rejected": "TASK_STATE_REJECTED",
    "unknown": "TASK_STATE_UNSPECIFIED",
}
TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})

BASE_CARD: dict[str, Any] = {
    "name": "fake",
    "version": "1.0.0",
    "supportedInterfaces": [{"url": RPC, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
    "capabilities": {"pushNotifications": True, "streaming": False},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "work", "name": "Work", "description": "does work"}],
}

# Discovery outcomes. Variants are cards; failures are what the card endpoint does instead.
CARD_VARIANTS = (
    "same",
    "push_withdrawn",
    "skill_dropped",
    "skill_changed",
    "contract_rotated",
    "endpoint_moved",
    "version_bumped",
)
CARD_FAILURES = ("network", "timeout", "503", "invalid_json", "too_large")


def card_variant(name: str, protocol: str = "1.0") -> dict[str, Any]:
    """The card of a variant, as an agent of ``protocol`` serves it."""
    card = _variant(name)
    return card if protocol == "1.0" else _as_03(card, protocol == "0.3-http+json")


def _as_03(card: dict[str, Any], rest: bool) -> dict[str, Any]:
    """The same card as a 0.3 agent serves it: one main ``url`` and its ``preferredTransport``,
    ``protocolVersion``, and a 0.3 security contract (``security``, typed schemes)."""
    moved = card["supportedInterfaces"][0]["url"] == RPC_MOVED
    url = (REST_MOVED if moved else REST) if rest else (RPC_MOVED if moved else RPC)
    transport = "HTTP+JSON" if rest else "JSONRPC"
    document: dict[str, Any] = {
        "name": card["name"],
        "description": "fake 0.3 agent",
        "version": card["version"],
        "protocolVersion": "0.3.0",
        "url": url,
        "preferredTransport": transport,
        "additionalInterfaces": [{"url": url, "transport": transport}],
        "capabilities": card["capabilities"],
        "defaultInputModes": card["defaultInputModes"],
        "defaultOutputModes": card["defaultOutputModes"],
        "skills": [{**skill, "tags": []} for skill in card["skills"]],
    }
    if "securitySchemes" in card:  # contract_rotated: mTLS only
        document["securitySchemes"] = {"mtls": {"type": "mutualTLS"}}
        document["security"] = [{"mtls": []}]
    return document


def _variant(name: str) -> dict[str, Any]:
    card = copy.deepcopy(BASE_CARD)
    if name == "push_withdrawn":
        card["capabilities"]["pushNotifications"] = False
    elif name == "skill_dropped":
        card["skills"] = [{"id": "other", "name": "Other", "description": "moved elsewhere"}]
    elif name == "skill_changed":
        card["skills"][0]["inputModes"] = ["application/json"]
    elif name == "contract_rotated":
        card["securitySchemes"] = {"mtls": {"mtlsSecurityScheme": {}}}
        card["securityRequirements"] = [{"schemes": {"mtls": {}}}]
    elif name == "endpoint_moved":
        card["supportedInterfaces"][0]["url"] = RPC_MOVED
    elif name == "version_bumped":
        card["version"] = "1.0.1"
        card["skills"][0]["description"] = "does work, now described better"
    return card


@dataclass
class RemoteTask:
    """One task's history as the remote lived it: (state, timestamp, message)."""

    remote_id: str
    history: list[tuple[str, datetime, str | None]] = field(default_factory=list)

    @property
    def current(self) -> tuple[str, datetime, str | None]:
        return self.history[-1]


class Remote:
    """The agent's truth, shared by every world."""

    def __init__(self) -> None:
        self.tasks: dict[str, RemoteTask] = {}
        self.clock = T0

    def tick(self, seconds: float) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def create(self, label: str) -> RemoteTask:
        task = RemoteTask(f"r-{label}", [("submitted", self.tick(0.001), None)])
        self.tasks[task.remote_id] = task
        return task

    def step(self, remote_id: str, state: str, seconds: float, message: str | None) -> None:
        self.tasks[remote_id].history.append((state, self.tick(seconds), message))


def task_json(remote: RemoteTask, context_id: str | None, index: int = -1) -> dict[str, Any]:
    state, moment, message = remote.history[index]
    status: dict[str, Any] = {
        "state": WIRE_STATE[state],
        "timestamp": moment.isoformat().replace("+00:00", "Z"),
    }
    if message is not None:
        status["message"] = {
            "messageId": f"m-{remote.remote_id}-{len(remote.history)}",
            "role": "ROLE_AGENT",
            "parts": [{"text": message}],
        }
    body: dict[str, Any] = {"id": remote.remote_id, "status": status}
    if context_id:
        body["contextId"] = context_id
    return body


def status_update_body(remote: RemoteTask, context_id: str | None, index: int) -> bytes:
    task = task_json(remote, context_id, index)
    update = {"taskId": task["id"], "status": task["status"]}
    if context_id:
        update["contextId"] = context_id
    return json.dumps({"statusUpdate": update}).encode()


# -- A2A 0.3 ------------------------------------------------------------------------------------

# The 0.3 JSON-RPC method of each 1.0 operation the worlds use (docs/wire.md, "Methods and paths").
METHODS_03 = {
    "message/send": "SendMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
}
# HTTP+JSON 0.3 (protobuf) state names: one of them differs from 1.0's.
PROTO_STATE_03 = {**WIRE_STATE, "canceled": "TASK_STATE_CANCELLED"}


def task_json03(remote: RemoteTask, context_id: str | None, index: int = -1) -> dict[str, Any]:
    """A task as a2a-sdk 0.3 writes it in JSON-RPC answers and pushes: ``kind``-tagged,
    lower-case state, the timestamp as Python writes it (``+00:00``)."""
    state, moment, message = remote.history[index]
    status: dict[str, Any] = {"state": state, "timestamp": moment.isoformat()}
    if message is not None:
        status["message"] = {
            "kind": "message",
            "messageId": f"m-{remote.remote_id}-{len(remote.history)}",
            "role": "agent",
            "parts": [{"kind": "text", "text": message}],
        }
    body: dict[str, Any] = {"kind": "task", "id": remote.remote_id, "status": status}
    if context_id:
        body["contextId"] = context_id
    return body


def task_proto03(remote: RemoteTask, context_id: str | None, index: int = -1) -> dict[str, Any]:
    """A task as a2a-sdk 0.3 writes it over HTTP+JSON: protobuf JSON, ``TASK_STATE_*``, the
    message's parts in ``content``, and no status timestamp (a2a-sdk 0.3 drops it)."""
    state, _, message = remote.history[index]
    status: dict[str, Any] = {"state": PROTO_STATE_03[state]}
    if message is not None:
        status["message"] = {
            "messageId": f"m-{remote.remote_id}-{len(remote.history)}",
            "role": "ROLE_AGENT",
            "content": [{"text": message}],
        }
    body: dict[str, Any] = {"id": remote.remote_id, "status": status}
    if context_id:
        body["contextId"] = context_id
    return body


def push_body(protocol: str, remote: RemoteTask, context_id: str | None, index: int) -> bytes:
    """A push delivery of the report at ``index``: a 1.0 status update, or the whole task as a
    0.3 agent POSTs it (over either binding: the push is the task's JSON model)."""
    if protocol == "1.0":
        return status_update_body(remote, context_id, index)
    return json.dumps(task_json03(remote, context_id, index)).encode()


def _error(request_id: object, code: int, reason: str, message: str) -> httpx.Response:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": "a2a-protocol.org", "metadata": {}}  # fmt: skip
    return httpx.Response(
        200,
        json={"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message,
                                                            "data": [info]}},
    )  # fmt: skip


class FakeAgent:
    """One world's view of the remote over HTTP: A2A of ``protocol`` plus a card endpoint whose
    behaviour the test sets (``card``: a variant name or a failure name). ``calls`` names each
    A2A request by its 1.0 operation, whatever the protocol."""

    def __init__(self, remote: Remote, protocol: str = "1.0") -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
        self.remote = remote
        self.protocol = protocol
        self.card = "same"
        self.contexts: dict[str, str] = {}
        self.calls: list[str] = []
        self.card_served: list[tuple[str, bool | None]] = []  # (outcome, push advertised)
        self.cancel_answers: dict[str, int] = {}  # remote id -> history index answered

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/.well-known/"):
            return self._card(request)
        if self.protocol == "0.3-http+json":
            return self._rest03(request)
        if str(request.url) not in (RPC, RPC_MOVED) or request.method != "POST":
            return httpx.Response(404, text="Not Found")
        envelope = json.loads(request.content)
        method, params, request_id = envelope["method"], envelope["params"], envelope["id"]
        if self.protocol == "0.3-jsonrpc":
            return self._rpc03(method, params, request_id)
        self.calls.append(method)
        return self._rpc(method, params, request_id)

    def _card(self, request: httpx.Request) -> httpx.Response:
        outcome = self.card
        if outcome == "network":
            self.card_served.append((outcome, None))
            raise httpx.ConnectError("connection refused", request=request)
        if outcome == "timeout":
            self.card_served.append((outcome, None))
            raise httpx.ReadTimeout("timed out", request=request)
        if outcome in CARD_FAILURES:
            self.card_served.append((outcome, None))
            body = {"503": b"Service Unavailable", "invalid_json": b"{not json",
                    "too_large": b" " * (MAX_CARD_BYTES + 10)}[outcome]  # fmt: skip
            status = 503 if outcome == "503" else 200
            return httpx.Response(
                status, content=body, headers={"content-type": "application/json"}
            )
        card = card_variant(outcome, self.protocol)
        self.card_served.append((outcome, bool(card["capabilities"]["pushNotifications"])))
        return httpx.Response(200, json=card)

    def _rpc(self, method: str, params: dict[str, Any], request_id: object) -> httpx.Response:
        def ok(result: object) -> httpx.Response:
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": request_id, "result": result})

        if method == "SendMessage":
            message = params["message"]
            remote_id = message.get("taskId")
            if remote_id is None:  # creation: the label is the text
                remote_id = f"r-{message['parts'][0]['text']}"
                self.contexts[remote_id] = message.get("contextId") or f"ctx-{remote_id}"
            remote = self.remote.tasks[remote_id]
            return ok({"task": task_json(remote, self.contexts.get(remote_id))})
        if method == "GetTask":
            remote = self.remote.tasks[params["id"]]
            return ok(task_json(remote, self.contexts.get(params["id"])))
        if method == "CancelTask":
            remote_id = params["id"]
            index = self.cancel_answers.get(remote_id)
            if index is None:
                return _error(request_id, -32002, "TASK_NOT_CANCELABLE", "Task cannot be canceled")
            remote = self.remote.tasks[remote_id]
            return ok(task_json(remote, self.contexts.get(remote_id), index))
        if method == "CreateTaskPushNotificationConfig":
            return ok(params)
        if method == "ListTasks":
            return ok({"tasks": []})
        return _error(request_id, -32601, "METHOD_NOT_FOUND", "Method not found")

    # -- A2A 0.3 ----------------------------------------------------------------------------------

    def _created(self, message: dict[str, Any], text: str) -> str:
        """The remote id a send names: its task, or (a creation) the task its text labels."""
        remote_id = message.get("taskId")
        if remote_id is None:
            remote_id = f"r-{text}"
            self.contexts[remote_id] = message.get("contextId") or f"ctx-{remote_id}"
        return str(remote_id)

    def _rpc03(self, method: str, params: dict[str, Any], request_id: object) -> httpx.Response:
        def ok(result: object) -> httpx.Response:
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": request_id, "result": result})

        def error(code: int, message: str) -> httpx.Response:  # 0.3 errors carry no data
            body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
            return httpx.Response(200, json=body)

        operation = METHODS_03.get(method)
        self.calls.append(operation or f"unknown:{method}")
        if operation == "SendMessage":
            message = params["message"]
            remote_id = self._created(message, message["parts"][0]["text"])
            return ok(task_json03(self.remote.tasks[remote_id], self.contexts.get(remote_id)))
        if operation == "GetTask":
            remote_id = params["id"]
            return ok(task_json03(self.remote.tasks[remote_id], self.contexts.get(remote_id)))
        if operation == "CancelTask":
            remote_id = params["id"]
            index = self.cancel_answers.get(remote_id)
            if index is None:
                return error(-32002, "Task cannot be canceled")
            task = self.remote.tasks[remote_id]
            return ok(task_json03(task, self.contexts.get(remote_id), index))
        if operation == "CreateTaskPushNotificationConfig":
            return ok(params)
        return error(-32601, "Method not found")

    def _rest03(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url.copy_with(query=None))
        base = next((b for b in (REST, REST_MOVED) if url.startswith(b + "/v1/")), None)
        if base is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        path, method = url[len(base) :], request.method
        if method == "POST" and path == "/v1/message:send":
            self.calls.append("SendMessage")
            message = json.loads(request.content)["message"]
            remote_id = self._created(message, message["content"][0]["text"])
            task = task_proto03(self.remote.tasks[remote_id], self.contexts.get(remote_id))
            return httpx.Response(200, json={"task": task})
        remote_id, _, action = path.removeprefix("/v1/tasks/").partition(":")
        if method == "GET" and path.startswith("/v1/tasks/") and not action:
            self.calls.append("GetTask")
            task = task_proto03(self.remote.tasks[remote_id], self.contexts.get(remote_id))
            return httpx.Response(200, json=task)
        if method == "POST" and path.startswith("/v1/tasks/") and action == "cancel":
            self.calls.append("CancelTask")
            index = self.cancel_answers.get(remote_id)
            if index is None:
                return httpx.Response(409, json={"message": "Task cannot be canceled"})
            task = self.remote.tasks[remote_id]
            return httpx.Response(200, json=task_proto03(task, self.contexts.get(remote_id), index))
        if method == "POST" and path.endswith("/pushNotificationConfigs"):
            self.calls.append("CreateTaskPushNotificationConfig")
            return httpx.Response(200, json=json.loads(request.content)["config"])
        self.calls.append(f"{method} {path}")
        return httpx.Response(404, json={"detail": "Not Found"})
