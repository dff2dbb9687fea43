"""In-memory worlds for the differential property (P1): one remote agent, several engines.

The remote's truth (each task's history of states) is shared by every world; each world is an
engine with its own store (SQLite in memory) and its own ``httpx.MockTransport`` that answers A2A
JSON-RPC from that truth exactly as docs/wire.md shows, and answers card requests with whatever
discovery outcome the test gives that world: the same card, a changed card, or a failure.
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


def card_variant(name: str) -> dict[str, Any]:
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


def _error(request_id: object, code: int, reason: str, message: str) -> httpx.Response:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": "a2a-protocol.org", "metadata": {}}  # fmt: skip
    return httpx.Response(
        200,
        json={"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message,
                                                            "data": [info]}},
    )  # fmt: skip


class FakeAgent:
    """One world's view of the remote over HTTP: A2A JSON-RPC plus a card endpoint whose
    behaviour the test sets (``card``: a variant name or a failure name)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
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
        if str(request.url) not in (RPC, RPC_MOVED) or request.method != "POST":
            return httpx.Response(404, text="Not Found")
        envelope = json.loads(request.content)
        method, params, request_id = envelope["method"], envelope["params"], envelope["id"]
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
        card = card_variant(outcome)
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
