"""The fake A2A agent of the property tests: in memory, one ``httpx.MockTransport``, no sockets.

- :class:`Remote` — the agent's truth: each task's reports in order (state, timestamp, status
  message: text, or parts of any kind, ``cardfence`` :class:`Text`, :class:`File`, :class:`Data`),
  and the artifacts each report made (:class:`RemoteArtifact`, of any parts; one of an id made
  later replaces it), on a clock that moves only when a report is made. The test moves it
  (:meth:`Remote.step`). One
  remote may be shared by several agents, each the view of one engine (P1's worlds): they then
  answer alike, and the test decides for all of them whether a cancel is accepted
  (:meth:`Remote.accept_cancel`).
- :class:`FakeAgent` — that truth over HTTP, in one of :data:`PROTOCOLS`: A2A 1.0 over JSON-RPC as
  docs/wire.md shows (``A2A-Version: 1.0`` required, errors carrying a google.rpc ``ErrorInfo``),
  or A2A 0.3 over JSON-RPC (``message/send`` & co., ``kind``-tagged objects, lower-case states,
  errors without data) or over HTTP+JSON (``/v1/message:send`` & co., protobuf JSON, no status
  timestamps, errors as an HTTP status with ``{"message"}``), as a2a-sdk 0.3.26 answers
  (docs/wire.md, "A2A 0.3 on the wire"). The 0.3 answers are written here from those captures,
  not with the engine's own translation (``engine/wire/_v03.py``), so that translation is what the
  tests put to the test. Each operation has one answer, written in the protocol's shapes:
  ``SendMessage`` answers the task it names or, creating, the task the test made under the
  message's text (:meth:`Remote.create`), or the one the test awaits whatever the message's
  parts (:meth:`Remote.await_creation`), else a new one (``t-1``, ``t-2`` …, submitted);
  ``GetTask`` the task's latest report; ``CancelTask`` the report the remote accepted the cancel
  with, or ``TASK_NOT_CANCELABLE``; ``CreateTaskPushNotificationConfig`` echoes the config;
  ``ListTasks`` (1.0 only) the tasks of a context, each with the messageIds of the creations
  sent to it as its history; a task it does not have is
  ``TASK_NOT_FOUND``. The test may make it serve A2A at one URL only (``only_at``: a bare 404
  elsewhere) and refuse every A2A request with a bare 401 or 403 (``refuse``), as a gateway
  refusing the credentials would. Every body streams in, as from a socket.
- Its card endpoint (both well-known paths), whose answer to each card request the test scripts
  (:meth:`FakeAgent.serve`, then ``default``): a card :class:`Variant` (push on or off; the skill
  present, absent or taking another media type; a security contract of :data:`AUTH_CONTRACTS`;
  the endpoint moved, within the origin or to another; a new version), written in the agent's
  protocol, with an ``ETag`` and a ``304`` on a matching ``If-None-Match``; or a failure
  (:data:`FAILURES`: network error, timeout, 503, invalid JSON, a card over
  :data:`MAX_CARD_BYTES`). :data:`CARD_CHANGES` names the ways P1 changes a card.
- Every request is recorded as a :class:`Seen`: its URL, headers and body (what credentials it
  carried, R15), the operation it asked by its 1.0 name whatever the protocol, the HTTP status it
  was answered with, and, for a card request, the card or failure it was served.
- :func:`push_body` — a push delivery of a report: a 1.0 status update, or the whole task as a
  0.3 agent POSTs it, with the notification token only; or one of its artifacts alone, as an
  artifact update. :func:`part_body` writes a part in each protocol, :func:`carried` says what
  of it travels (0.3 text and data parts carry no media type).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.core.parts import Data, File, Part, Text
from cardfence.engine.discovery.fetch import card_urls

AGENT_URL = "http://agent.test"
ORIGIN = card_urls(AGENT_URL)[0]
CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
RPC_PATH = "/a2a/jsonrpc"
MOVED_RPC_PATH = "/v2/a2a/jsonrpc"
REST_PATH = "/a2a/rest"  # the HTTP+JSON interface: its paths are REST_PATH + "/v1/..."
MOVED_REST_PATH = "/v2/a2a/rest"
SKILL = "echo"
MAX_CARD_BYTES = 4096

V10, V03_JSONRPC, V03_REST = PROTOCOLS = ("1.0", "0.3-jsonrpc", "0.3-http+json")
# The operations the agent answers, by their 1.0 names; 0.3 has no ListTasks.
OPERATIONS = ("SendMessage", "GetTask", "CancelTask", "CreateTaskPushNotificationConfig",
              "ListTasks")  # fmt: skip
# The 0.3 JSON-RPC method of each (docs/wire.md, "Methods and paths").
METHODS_03 = {
    "message/send": "SendMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
}

# -- the remote's truth ---------------------------------------------------------------------------

T0 = datetime(2026, 11, 29, 15, 26, 20, tzinfo=UTC)
TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})
# (state, timestamp, message): the message as text alone, or as its parts
Report = tuple[str, datetime, str | tuple[Part, ...] | None]


@dataclass(frozen=True, slots=True)
class RemoteArtifact:
    """An artifact as the remote made it: a report's artifact of an id replaces the one before."""

    artifact_id: str
    name: str | None
    parts: tuple[Part, ...]


@dataclass
class RemoteTask:
    """One task as the remote lived it: its reports, in order."""

    remote_id: str
    context_id: str
    history: list[Report] = field(default_factory=list)
    cancel_answer: int | None = None  # the report a CancelTask is answered with (None: refused)
    said: list[str] = field(default_factory=list)  # the creations' messageIds: its history
    made: dict[int, tuple[RemoteArtifact, ...]] = field(default_factory=dict)  # by report

    @property
    def current(self) -> Report:
        return self.history[-1]

    def artifacts(self, index: int = -1) -> list[RemoteArtifact]:
        """The task's artifacts as the report at ``index`` holds them: each id's latest by then,
        in the order the ids were first made."""
        upto = index % len(self.history)
        held: dict[str, RemoteArtifact] = {}
        for at in sorted(self.made):
            if at <= upto:
                held.update((a.artifact_id, a) for a in self.made[at])
        return list(held.values())


class Remote:
    """The agent's truth; see the module docstring."""

    def __init__(self) -> None:
        self.tasks: dict[str, RemoteTask] = {}
        self.clock = T0
        self._numbers = itertools.count(1)
        # The task the next creation is answered with whatever its parts (None: by its text).
        self.awaited: RemoteTask | None = None

    def tick(self, seconds: float) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def create(self, label: str | None = None) -> RemoteTask:
        """A task submitted now: ``r-<label>``, the one a creation whose text is ``label`` answers,
        or (no label) the next of ``t-1``, ``t-2`` …"""
        remote_id = f"t-{next(self._numbers)}" if label is None else f"r-{label}"
        task = RemoteTask(remote_id, f"ctx-{remote_id}", [("submitted", self.tick(0.001), None)])
        self.tasks[remote_id] = task
        return task

    def await_creation(self, label: str) -> RemoteTask:
        """:meth:`create`, the task then answering every creation, whatever its parts, until
        the next call (a message of any parts need not carry its label as text)."""
        self.awaited = self.create(label)
        return self.awaited

    def step(
        self,
        remote_id: str,
        state: str,
        seconds: float = 0.001,
        message: str | tuple[Part, ...] | None = None,
        artifacts: Iterable[RemoteArtifact] = (),
    ) -> None:
        """The task reports ``state`` (a lifecycle state, e.g. ``input-required``), ``seconds``
        after the last report of any task, with a status message of text or of any parts, and
        ``artifacts`` made (each replacing the one of its id made before)."""
        task = self.tasks[remote_id]
        task.history.append((state, self.tick(seconds), message))
        if made := tuple(artifacts):
            task.made[len(task.history) - 1] = made

    def accept_cancel(self, remote_id: str) -> bool:
        """Decide the task's cancels: unless it has ended it is canceled now, which report its
        cancels are answered with; else they are refused (``TASK_NOT_CANCELABLE``)."""
        task = self.tasks[remote_id]
        if task.current[0] in TERMINAL:
            task.cancel_answer = None
            return False
        self.step(remote_id, "canceled")
        task.cancel_answer = len(task.history) - 1
        return True


# -- a task on the wire ---------------------------------------------------------------------------

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
# HTTP+JSON 0.3 (protobuf) state names: one of them differs from 1.0's.
PROTO_STATE_03 = {**WIRE_STATE, "canceled": "TASK_STATE_CANCELLED"}


def task_body(protocol: str, task: RemoteTask, index: int = -1) -> dict[str, Any]:
    """The report at ``index`` as a task of ``protocol`` (docs/wire.md): 1.0 with ``TASK_STATE_*``
    and the timestamp in UTC (``Z``); 0.3 over JSON-RPC (and in any 0.3 push) ``kind``-tagged,
    with lower-case states and the timestamp as Python writes it (``+00:00``); 0.3 over HTTP+JSON
    in protobuf JSON, ``TASK_STATE_*`` (``CANCELLED``), the message's parts in ``content`` and no
    status timestamp (a2a-sdk 0.3 drops it)."""
    state, moment, message = task.history[index]
    status: dict[str, Any]
    said: dict[str, Any] = {"messageId": f"m-{task.remote_id}-{len(task.history)}"}
    parts = [part_body(protocol, p) for p in _said_parts(message)]
    if protocol == V10:
        stamp = moment.isoformat().replace("+00:00", "Z")
        status = {"state": WIRE_STATE[state], "timestamp": stamp}
        said |= {"role": "ROLE_AGENT", "parts": parts}
    elif protocol == V03_JSONRPC:
        status = {"state": state, "timestamp": moment.isoformat()}
        said |= {"kind": "message", "role": "agent", "parts": parts}
    else:
        status = {"state": PROTO_STATE_03[state]}
        said |= {"role": "ROLE_AGENT", "content": parts}
    if message is not None:
        status["message"] = said
    body: dict[str, Any] = {"id": task.remote_id, "contextId": task.context_id, "status": status}
    if artifacts := task.artifacts(index):
        body["artifacts"] = [artifact_body(protocol, a) for a in artifacts]
    return {"kind": "task", **body} if protocol == V03_JSONRPC else body


def _said_parts(message: str | tuple[Part, ...] | None) -> tuple[Part, ...]:
    if message is None:
        return ()
    return (Text(message),) if isinstance(message, str) else message


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def part_body(protocol: str, part: Part) -> dict[str, Any]:
    """A part as an agent of ``protocol`` writes it (docs/wire.md): 1.0 ``text`` | ``raw``
    (base64) | ``url`` | ``data`` with ``mediaType`` and a file's ``filename``; 0.3 over
    JSON-RPC ``kind``-tagged, a file's content in ``file`` (``bytes`` or ``uri``, ``mimeType``,
    ``name``), text and data without a media type; 0.3 over HTTP+JSON in protobuf JSON
    (``fileWithBytes``: the base64 text a2a-sdk 0.3 keeps, in base64 once more;
    ``fileWithUri``; a data part's object in ``data.data``)."""
    rest = protocol == V03_REST
    if isinstance(part, Text):
        if protocol == V10:
            return {"text": part.text, "mediaType": part.media_type}
        return {"text": part.text} if rest else {"kind": "text", "text": part.text}
    if isinstance(part, Data):
        if protocol == V10:
            return {"data": part.data, "mediaType": part.media_type}
        return {"data": {"data": part.data}} if rest else {"kind": "data", "data": part.data}
    named = {} if part.filename is None else {"filename": part.filename}
    if protocol == V10:
        typed = {} if part.media_type is None else {"mediaType": part.media_type}
        content = {"raw": _base64(part.data)} if part.data is not None else {"url": part.url}
        return {**content, **named, **typed}
    file: dict[str, Any] = {}
    if part.data is not None:
        encoded = _base64(part.data)
        file["fileWithBytes" if rest else "bytes"] = _base64(encoded.encode()) if rest else encoded
    else:
        file["fileWithUri" if rest else "uri"] = part.url
    if part.media_type is not None:
        file["mimeType"] = part.media_type
    if part.filename is not None:
        file["name"] = part.filename
    return {"file": file} if rest else {"kind": "file", "file": file}


def artifact_body(protocol: str, artifact: RemoteArtifact) -> dict[str, Any]:
    """An artifact as an agent of ``protocol`` writes it."""
    body: dict[str, Any] = {"artifactId": artifact.artifact_id}
    if artifact.name is not None:
        body["name"] = artifact.name
    parts = [part_body(protocol, p) for p in artifact.parts]
    body["parts"] = parts
    return body


def carried(protocol: str, part: Part) -> dict[str, Any]:
    """What of a part the agent sent travels in ``protocol``, as cardfence records a part
    whole: its kind (a file by bytes ``file``, by URL ``url``), its media type when the protocol
    carries one (0.3's text and data parts have none), its content (``text``, ``bytes`` in
    base64, ``url``, ``data``) and a file's ``filename``."""
    out: dict[str, Any]
    if isinstance(part, Text):
        out = {"kind": "text", "text": part.text}
    elif isinstance(part, Data):
        out = {"kind": "data", "data": part.data}
    elif part.data is not None:
        out = {"kind": "file", "bytes": _base64(part.data)}
    else:
        out = {"kind": "url", "url": part.url}
    media_type = part.media_type if isinstance(part, File) or protocol == V10 else None
    if media_type is not None:
        out["media_type"] = media_type
    if isinstance(part, File) and part.filename is not None:
        out["filename"] = part.filename
    return out


def push_body(
    protocol: str, task: RemoteTask, index: int = -1, *, artifact: RemoteArtifact | None = None
) -> bytes:
    """A push delivery of the report at ``index``: a 1.0 status update, or the whole task as a
    0.3 agent POSTs it (over either binding: the push is the task's JSON model); with
    ``artifact``, an artifact update carrying it whole instead."""
    if artifact is not None:
        ids = {"taskId": task.remote_id, "contextId": task.context_id}
        if protocol == V10:
            return json.dumps(
                {"artifactUpdate": {**ids, "artifact": artifact_body(V10, artifact)}}
            ).encode()
        written = artifact_body(V03_JSONRPC, artifact)
        return json.dumps({"kind": "artifact-update", **ids, "artifact": written}).encode()
    if protocol != V10:
        return json.dumps(task_body(V03_JSONRPC, task, index)).encode()
    status = task_body(V10, task, index)["status"]
    update = {"taskId": task.remote_id, "contextId": task.context_id, "status": status}
    return json.dumps({"statusUpdate": update}).encode()


# -- cards ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthContract:
    """A card's R15 contract: its ``securitySchemes``, its card-level ``securityRequirements``
    and, when not None, the ones of skill :data:`SKILL` (which replace the card's)."""

    schemes: dict[str, dict[str, Any]]
    requirements: list[dict[str, Any]]
    skill_requirements: list[dict[str, Any]] | None = None


def _alternatives(*alternatives: tuple[str, ...]) -> list[dict[str, Any]]:
    """1.0 ``securityRequirements``: each alternative's schemes, without scopes."""
    return [{"schemes": {name: {"list": []} for name in names}} for names in alternatives]


_BEARER = {"httpAuthSecurityScheme": {"scheme": "bearer"}}
_BASIC = {"httpAuthSecurityScheme": {"scheme": "basic"}}


def _api_key(location: str, name: str) -> dict[str, Any]:
    return {"apiKeySecurityScheme": {"location": location, "name": name}}


# Security contracts a card may carry (``Variant.auth``), by name. The scheme names ``bearer``,
# ``key`` and ``basic`` are the ones a test would configure credentials for; ``acme`` (first in
# canonical order: the alternatives naming it come first) is meant to be left unconfigured.
AUTH_CONTRACTS: dict[str, AuthContract] = {
    "none": AuthContract({}, []),
    "optional": AuthContract({"bearer": _BEARER}, _alternatives((), ("bearer",))),
    "bearer": AuthContract({"bearer": _BEARER}, _alternatives(("bearer",))),
    "basic": AuthContract({"basic": _BASIC}, _alternatives(("basic",))),
    "key-header": AuthContract({"key": _api_key("header", "X-Key")}, _alternatives(("key",))),
    "key-renamed": AuthContract({"key": _api_key("header", "X-Api-Key")}, _alternatives(("key",))),
    "key-query": AuthContract({"key": _api_key("query", "api_key")}, _alternatives(("key",))),
    "key-cookie": AuthContract({"key": _api_key("cookie", "sid")}, _alternatives(("key",))),
    "bearer+key": AuthContract(
        {"bearer": _BEARER, "key": _api_key("header", "X-Key")}, _alternatives(("bearer", "key"))
    ),
    "key|bearer": AuthContract(
        {"bearer": _BEARER, "key": _api_key("query", "api_key")},
        _alternatives(("key",), ("bearer",)),
    ),
    "acme|key": AuthContract(
        {"acme": _api_key("header", "X-Acme"), "key": _api_key("header", "X-Key")},
        _alternatives(("acme",), ("key",)),
    ),
    "skill-key": AuthContract(  # the skill's requirements replace the card's
        {"bearer": _BEARER, "key": _api_key("query", "api_key")},
        _alternatives(("bearer",)),
        _alternatives(("key",)),
    ),
    "acme": AuthContract({"acme": _api_key("header", "X-Acme")}, _alternatives(("acme",))),
}
# A rotated contract: the card, which said nothing of security, now requires a bearer token.
ROTATED = "bearer"


@dataclass(frozen=True, slots=True)
class Variant:
    """One card the endpoint may serve; ``Variant()`` is the agent's card as it starts."""

    push: bool = True
    skill: bool = True  # the card has SKILL (beside a skill "other")
    auth: str = ""  # a name in AUTH_CONTRACTS ("": the card says nothing of security)
    moved: bool = False  # the interface is at MOVED_RPC_PATH (MOVED_REST_PATH)
    origin: str = AGENT_URL  # where the interface is (another origin than the card's)
    media: str = "text/plain"  # what SKILL takes
    revised: bool = False  # version 1.0.1, SKILL described anew: nothing the engine checks

    def endpoint(self, protocol: str = V10) -> str:
        """The URL of the interface the card declares: the JSON-RPC endpoint, or the prefix of
        the HTTP+JSON paths."""
        if protocol == V03_REST:
            return self.origin + (MOVED_REST_PATH if self.moved else REST_PATH)
        return self.origin + (MOVED_RPC_PATH if self.moved else RPC_PATH)

    def document(self, protocol: str = V10) -> dict[str, Any]:
        """The card as an agent speaking ``protocol`` serves it."""
        description = "echoes its input" + (", now described better" if self.revised else "")
        skills: list[dict[str, Any]] = [
            {"id": "other", "name": "Other", "description": "does other work",
             "inputModes": ["text/plain"]},
        ]  # fmt: skip
        if self.skill:
            echo = {"id": SKILL, "name": "Echo", "description": description,
                    "inputModes": [self.media]}  # fmt: skip
            skills.insert(0, echo)
        contract = AUTH_CONTRACTS.get(self.auth)
        if contract is not None and contract.skill_requirements is not None and self.skill:
            skills[0]["securityRequirements"] = contract.skill_requirements
        card: dict[str, Any] = {
            "name": "fake-agent",
            "description": "in-memory A2A agent for property tests",
            "version": "1.0.1" if self.revised else "1.0.0",
            "supportedInterfaces": [
                {"url": self.endpoint(), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": False, "pushNotifications": self.push},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": skills,
        }
        if contract is not None:
            card["securitySchemes"] = contract.schemes
            card["securityRequirements"] = contract.requirements
        return card if protocol == V10 else _as_03(card, self.endpoint(protocol), protocol)

    @property
    def card(self) -> AgentCard:
        """The card as the engine reads it (served by a 1.0 agent)."""
        return _parsed(self)


def _as_03(card: dict[str, Any], url: str, protocol: str) -> dict[str, Any]:
    """A 1.0 card as a 0.3 agent serves it: one main ``url`` and its ``preferredTransport``,
    ``protocolVersion``, skills with ``tags``, and the 0.3 security contract (``security``,
    schemes typed by ``type``, an API key's place in ``in``)."""
    transport = "HTTP+JSON" if protocol == V03_REST else "JSONRPC"
    skills = []
    for skill in card["skills"]:
        written = {k: v for k, v in skill.items() if k != "securityRequirements"}
        if "securityRequirements" in skill:
            written["security"] = _security03(skill["securityRequirements"])
        skills.append({**written, "tags": []})
    document: dict[str, Any] = {
        "name": card["name"],
        "description": card["description"],
        "version": card["version"],
        "protocolVersion": "0.3.0",
        "url": url,
        "preferredTransport": transport,
        "additionalInterfaces": [{"url": url, "transport": transport}],
        "capabilities": card["capabilities"],
        "defaultInputModes": card["defaultInputModes"],
        "defaultOutputModes": card["defaultOutputModes"],
        "skills": skills,
    }
    if "securitySchemes" in card:
        document["securitySchemes"] = {
            name: _scheme03(scheme) for name, scheme in card["securitySchemes"].items()
        }
        document["security"] = _security03(card["securityRequirements"])
    return document


_TYPES_03 = {"httpAuthSecurityScheme": "http", "apiKeySecurityScheme": "apiKey"}


def _scheme03(scheme: dict[str, Any]) -> dict[str, Any]:
    ((key, body),) = scheme.items()
    written = {"in" if k == "location" else k: v for k, v in body.items()}
    return {"type": _TYPES_03[key], **written}


def _security03(requirements: list[dict[str, Any]]) -> list[dict[str, list[str]]]:
    return [
        {name: scopes["list"] for name, scopes in alternative["schemes"].items()}
        for alternative in requirements
    ]


@functools.cache
def card_body(variant: Variant, protocol: str = V10) -> bytes:
    return json.dumps(variant.document(protocol)).encode()


@functools.cache
def _parsed(variant: Variant) -> AgentCard:
    return parse_card(card_body(variant), url=AGENT_URL + CARD_PATHS[0])


def _etag(body: bytes) -> str:
    return f'W/"{hashlib.sha256(body).hexdigest()[:24]}"'


# What a card request may be answered with, besides a card.
NETWORK, TIMEOUT, UNAVAILABLE, INVALID_JSON, TOO_LARGE = FAILURES = (
    "network",
    "timeout",
    "503",
    "invalid_json",
    "too_large",
)
# The failures the engine reports as CardInvalidError (a body it could not accept).
INVALID_BODIES = (INVALID_JSON, TOO_LARGE)
Behaviour = Variant | str  # a card, or one of FAILURES

VARIANTS = tuple(
    Variant(push=push, skill=skill, auth=auth, moved=moved)
    for push in (True, False)
    for skill in (True, False)
    for auth in ("", ROTATED)
    for moved in (False, True)
)
# The ways P1 changes a card, by name ("same": it does not).
CARD_CHANGES: dict[str, Variant] = {
    "same": Variant(),
    "push_withdrawn": Variant(push=False),
    "skill_dropped": Variant(skill=False),
    "skill_changed": Variant(media="application/json"),
    "contract_rotated": Variant(auth=ROTATED),
    "endpoint_moved": Variant(moved=True),
    "version_bumped": Variant(revised=True),
}

# -- what the agent saw ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)  # each request is itself: ``seen.index`` finds it
class Seen:
    """One request the fake received; for card requests, what it was answered with."""

    method: str
    path: str
    rpc: str | None = None  # the A2A operation asked, by its 1.0 name (None: none it answers)
    served: Behaviour | None = None  # card requests: the card variant or the failure
    status: int | None = None  # card requests: the HTTP status (None: raised)
    params: dict[str, Any] = field(default_factory=dict)  # JSON-RPC params; HTTP+JSON: the body
    url: str = ""  # the whole URL asked, query included
    headers: tuple[tuple[str, str], ...] = ()  # every header sent (names lower-case), in order
    body: bytes = b""
    answered: int | None = None  # A2A requests: the HTTP status they were answered with

    @property
    def origin(self) -> str:
        """``scheme://host[:port]`` of the request, default port left out."""
        return card_urls(self.url)[0] if self.url else ""

    @property
    def endpoint(self) -> str:
        """The URL asked, without its query."""
        return str(httpx.URL(self.url).copy_with(query=None)) if self.url else ""

    @property
    def query(self) -> list[tuple[str, str]]:
        return list(httpx.URL(self.url).params.multi_items()) if self.url else []

    def header_values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name.lower()]

    @property
    def cookies(self) -> list[tuple[str, str]]:
        """The ``Cookie`` header's pairs."""
        pairs = []
        for header in self.header_values("cookie"):
            for item in header.split(";"):
                name, _, value = item.strip().partition("=")
                if name:
                    pairs.append((name, value))
        return pairs

    @property
    def is_card(self) -> bool:
        return self.path in CARD_PATHS

    @property
    def healthy(self) -> bool:
        """A card request answered with a card (200, or 304 confirming it)."""
        return isinstance(self.served, Variant) and self.status in (200, 304)

    @property
    def said_push(self) -> bool:
        return self.healthy and isinstance(self.served, Variant) and self.served.push


def _sent(request: httpx.Request) -> dict[str, Any]:
    """What a :class:`Seen` keeps of what the request carried."""
    headers = tuple((k.decode().lower(), v.decode()) for k, v in request.headers.raw)
    return {"url": str(request.url), "headers": headers, "body": request.content}


# -- the agent ------------------------------------------------------------------------------------

# Each error: its JSON-RPC code and message, and the HTTP status HTTP+JSON 0.3 answers it with.
ERRORS = {
    "TASK_NOT_FOUND": (-32001, "Task not found", 404),
    "TASK_NOT_CANCELABLE": (-32002, "Task cannot be canceled", 409),
    "METHOD_NOT_FOUND": (-32601, "Method not found", 404),
    "VERSION_NOT_SUPPORTED": (-32009, "A2A version is not supported", 400),
}


class FakeAgent:
    """The remote agent and its card endpoint; see the module docstring. Its truth is ``remote``
    (a :class:`Remote` of its own unless given, to share one)."""

    def __init__(
        self,
        script: Iterable[Behaviour] = (),
        default: Behaviour = Variant(),
        *,
        remote: Remote | None = None,
        protocol: str = V10,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
        self.protocol = protocol
        self.remote = remote if remote is not None else Remote()
        self.script: deque[Behaviour] = deque(script)
        self.default = default
        self.seen: list[Seen] = []
        # A2A only at this URL (the JSON-RPC endpoint, or the HTTP+JSON prefix; None: at either
        # path of the protocol on any host); elsewhere a bare 404, as from a server that has no
        # such route.
        self.only_at: str | None = None
        # When set (401 or 403), every A2A request is answered with that status and a body that
        # is no A2A error, as a gateway refusing the credentials would.
        self.refuse: int | None = None
        self.transport = httpx.MockTransport(self.handle)

    # -- what the test controls ----------------------------------------------------------------

    def serve(self, *behaviours: Behaviour) -> None:
        """Answer the next card requests with these, in order (then with ``default``)."""
        self.script.extend(behaviours)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport)

    # -- what the test reads ------------------------------------------------------------------

    def mark(self) -> int:
        return len(self.seen)

    def card_requests(self, since: int = 0) -> list[Seen]:
        return [s for s in self.seen[since:] if s.is_card]

    def rpc_requests(self, operation: str, since: int = 0) -> list[Seen]:
        return [s for s in self.seen[since:] if s.rpc == operation]

    # -- the wire ------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path in CARD_PATHS:
            return self._card(request)
        asked = self._asked(request)
        if asked is None:
            self.seen.append(Seen(request.method, path, **_sent(request), answered=404))
            return wire(404, b"Not Found", {"Content-Type": "text/plain; charset=utf-8"})
        operation, params, rid = asked
        if self.refuse is not None:
            refusal = json.dumps({"detail": "invalid or missing credentials"}).encode()
            headers = {**_JSON, "WWW-Authenticate": 'Bearer realm="a2a"'}
            response = wire(self.refuse, refusal, headers)
        elif self.protocol == V10 and request.headers.get("a2a-version") != "1.0":
            response = self._error(rid, "VERSION_NOT_SUPPORTED")
        else:
            response = self._answer(operation, params, rid)
        seen = Seen(request.method, path, operation, params=params, **_sent(request),
                    answered=response.status_code)  # fmt: skip
        self.seen.append(seen)
        return response

    def _card(self, request: httpx.Request) -> httpx.Response:
        behaviour = self.script.popleft() if self.script else self.default
        path = request.url.path

        def answered(status: int | None) -> None:
            seen = Seen("GET", path, served=behaviour, status=status, **_sent(request))
            self.seen.append(seen)

        if behaviour == NETWORK:
            answered(None)
            raise httpx.ConnectError("connection refused", request=request)
        if behaviour == TIMEOUT:
            answered(None)
            raise httpx.ReadTimeout("timed out", request=request)
        if behaviour == UNAVAILABLE:
            answered(503)
            return wire(503, b"Service Unavailable", {"Content-Type": "text/plain"})
        if behaviour == INVALID_JSON:
            answered(200)
            return wire(200, b'{"name": "fake-agent", "skills": [', _JSON)
        if behaviour == TOO_LARGE:
            answered(200)
            padded = {**Variant().document(self.protocol), "padding": "x" * MAX_CARD_BYTES}
            return wire(200, json.dumps(padded).encode(), _JSON)
        assert isinstance(behaviour, Variant), behaviour
        body = card_body(behaviour, self.protocol)
        headers = {**_JSON, "ETag": _etag(body), "Cache-Control": "max-age=60"}
        if request.headers.get("if-none-match") == headers["ETag"]:
            answered(304)
            return wire(304, b"", headers)
        answered(200)
        return wire(200, body, headers)

    def _asked(self, request: httpx.Request) -> tuple[str | None, dict[str, Any], object] | None:
        """What an A2A request asks, in the agent's protocol: the operation by its 1.0 name
        (None: one the protocol has not), its parameters and its JSON-RPC id; None when the
        request is for no endpoint of the agent."""
        endpoints: tuple[str, ...]
        if self.only_at is not None:
            at, endpoints = str(request.url.copy_with(query=None)), (self.only_at,)
        else:
            at = request.url.path
            rest = self.protocol == V03_REST
            endpoints = (REST_PATH, MOVED_REST_PATH) if rest else (RPC_PATH, MOVED_RPC_PATH)
        if self.protocol == V03_REST:
            prefix = next((e for e in endpoints if at.startswith(e + "/v1/")), None)
            return None if prefix is None else (*_rest_call(request, at[len(prefix) :]), None)
        if request.method != "POST" or at not in endpoints:
            return None
        envelope = json.loads(request.content)
        method, params = envelope.get("method"), envelope.get("params") or {}
        operation = method if self.protocol == V10 else METHODS_03.get(method)
        return (operation if operation in OPERATIONS else None), params, envelope.get("id")

    def _answer(self, operation: str | None, params: dict[str, Any], rid: object) -> httpx.Response:
        """Each operation's one answer; :meth:`_result` and :meth:`_error` write it in the
        agent's protocol."""
        if operation is None:
            return self._error(rid, "METHOD_NOT_FOUND")
        if operation == "SendMessage":
            task = self._addressed(params["message"])
            if task is None:
                return self._error(rid, "TASK_NOT_FOUND")
            return self._result(rid, self._task(task, -1, sent=True))
        if operation == "ListTasks":
            tasks = [{**task_body(V10, t), "history": [{"messageId": m} for m in t.said]}
                     for t in self.remote.tasks.values()
                     if t.context_id == params.get("contextId")]  # fmt: skip
            page = {"tasks": tasks, "nextPageToken": "", "pageSize": len(tasks),
                    "totalSize": len(tasks)}  # fmt: skip
            return self._result(rid, page)
        key = "taskId" if operation == "CreateTaskPushNotificationConfig" else "id"
        task = self.remote.tasks.get(str(params.get(key)))
        if task is None:
            return self._error(rid, "TASK_NOT_FOUND")
        if operation == "GetTask":
            return self._result(rid, self._task(task, -1))
        if operation == "CancelTask":
            if task.cancel_answer is None:
                return self._error(rid, "TASK_NOT_CANCELABLE")
            return self._result(rid, self._task(task, task.cancel_answer))
        # CreateTaskPushNotificationConfig: the config as sent, echoed (1.0: its id defaulted to
        # the task's, as a2a-sdk does).
        if self.protocol == V10:
            config = {**params, "id": params.get("id") or task.remote_id}
        else:
            config = params["config"] if self.protocol == V03_REST else params
        return self._result(rid, config)

    def _addressed(self, message: dict[str, Any]) -> RemoteTask | None:
        """The task a ``SendMessage`` is about: the one it names, or (a creation) the one the
        test made under its text, else a new one."""
        if message.get("taskId") is not None:
            return self.remote.tasks.get(str(message["taskId"]))
        parts = message.get("parts") or message.get("content") or [{}]
        task = (
            self.remote.awaited
            or self.remote.tasks.get(f"r-{parts[0].get('text')}")
            or self.remote.create()
        )
        if message.get("contextId"):
            task.context_id = message["contextId"]
        task.said.append(str(message.get("messageId")))
        return task

    def _task(self, task: RemoteTask, index: int, *, sent: bool = False) -> dict[str, Any]:
        """The report at ``index`` as the agent's protocol writes a task (``sent``: the answer to
        a ``SendMessage``, which 1.0 and HTTP+JSON wrap as ``{"task"}``)."""
        body = task_body(self.protocol, task, index)
        return {"task": body} if sent and self.protocol != V03_JSONRPC else body

    def _result(self, rid: object, result: object) -> httpx.Response:
        if self.protocol == V03_REST:
            return _json(200, result)
        return _json(200, {"result": result, "id": rid, "jsonrpc": "2.0"})

    def _error(self, rid: object, reason: str) -> httpx.Response:
        code, message, status = ERRORS[reason]
        if self.protocol == V03_REST:  # no code; a path a2a-sdk 0.3 has not: FastAPI's 404
            body = {"detail": "Not Found"} if reason == "METHOD_NOT_FOUND" else {"message": message}
            return _json(status, body)
        error: dict[str, Any] = {"code": code, "message": message}
        if self.protocol == V10:  # 0.3 errors carry no data
            info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                    "domain": "a2a-protocol.org", "metadata": {}}  # fmt: skip
            error["data"] = [info]
        return _json(200, {"error": error, "id": rid, "jsonrpc": "2.0"})


def _rest_call(request: httpx.Request, path: str) -> tuple[str | None, dict[str, Any]]:
    """The operation an HTTP+JSON 0.3 request asks (``path``: after the interface's prefix) and
    its parameters: the task its path names, and its body."""
    body = json.loads(request.content) if request.content else {}
    if request.method == "POST" and path == "/v1/message:send":
        return "SendMessage", body
    if not path.startswith("/v1/tasks/"):
        return None, body
    task_id, _, action = path.removeprefix("/v1/tasks/").partition(":")
    if request.method == "GET" and not action and "/" not in task_id:
        return "GetTask", {"id": task_id}
    if request.method == "POST" and action == "cancel" and "/" not in task_id:
        return "CancelTask", {"id": task_id}
    task_id, _, collection = path.removeprefix("/v1/tasks/").partition("/")
    if request.method == "POST" and collection == "pushNotificationConfigs":
        return "CreateTaskPushNotificationConfig", {"taskId": task_id, **body}
    return None, body


_JSON = {"Content-Type": "application/json"}


class _Streamed(httpx.AsyncByteStream):
    """A body read as it streams in, as from a socket (``Response(content=…)`` would be read
    already, and the engine's drain of an unwanted body would find it consumed)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self._body), 1024):
            yield self._body[start : start + 1024]


def wire(status: int, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """A response as a transport hands it over: streamed, with its Content-Length."""
    sized = {**headers, "Content-Length": str(len(body))}
    return httpx.Response(status, headers=sized, stream=_Streamed(body))


def _json(status: int, document: object) -> httpx.Response:
    return wire(status, json.dumps(document).encode(), _JSON)
