"""In-memory fakes for the engine's property tests (P4-P7): no sockets, a real store.

- :class:`FakeAgent` — one ``httpx.MockTransport`` that is two things. A remote A2A agent
  speaking JSON-RPC as docs/wire.md shows: ``SendMessage`` answers a ``TASK_STATE_SUBMITTED``
  snapshot, ``GetTask``, ``CancelTask``, ``CreateTaskPushNotificationConfig`` echoes the config,
  ``ListTasks``. And its card endpoint, whose answer to each card request the test scripts: a
  card :class:`Variant` (push on/off, skill present/absent, contract rotated, endpoint moved;
  with an ``ETag``, and a ``304`` on a matching ``If-None-Match``) or a failure
  (:data:`FAILURES`: network error, timeout, 503, invalid JSON, a body over the engine's card
  size limit). Every request is recorded as a :class:`Seen`, card requests with their answer,
  each with its URL, headers and body (what credentials it carried, R15). For R15 a variant may
  carry a security contract of :data:`AUTH_CONTRACTS` and put its JSON-RPC endpoint at another
  origin (``Variant.origin``); the agent may serve JSON-RPC at one URL only (``rpc_at``: a bare
  404 elsewhere) and refuse every JSON-RPC request with a bare 401 or 403 (``refuse``).
- :func:`open_engine` — an :class:`Engine` on a real store (unless given, a fresh in-memory
  SQLite one, copied from a migrated template by :func:`fresh_store`; unless given,
  :data:`CONFIG`) whose client is the fake's, with a clock that jumps ``max_card_age`` at every
  reading (so the engine's memoised reads always go to the wire, unless a planted bug trusts
  the memo).
- :func:`hunt` — the settings of a ``find()`` hunt for a planted bug.
- Reading what was recorded: :func:`agent_events`, :func:`task_events`, :func:`write_marks`,
  :func:`audit_problems`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from hypothesis import Phase, settings

from cardfence.engine import events as ev
from cardfence.engine.audit import audit
from cardfence.engine.cards.fetch import CardLimits, card_urls
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.credentials import Bearer, CredentialsConfig
from cardfence.engine.engine import Engine, EngineConfig
from cardfence.engine.tasklog import task_stream_id
from cardfence.store import EventStore, RecordedEvent

AGENT_URL = "http://agent.test"
ORIGIN = card_urls(AGENT_URL)[0]
CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
RPC_PATH = "/a2a/jsonrpc"
MOVED_RPC_PATH = "/v2/a2a/jsonrpc"
SKILL = "echo"
MAX_CARD_BYTES = 4096

CONFIG = EngineConfig(
    max_poll_interval=0.05,
    first_poll_interval=0.01,
    max_card_age=60.0,
    # Plain http to agent.test: nothing leaves the process (MockTransport), so allow it.
    card_limits=CardLimits(
        timeout=5.0, connect_timeout=1.0, max_bytes=MAX_CARD_BYTES, allow_insecure=True
    ),
    request_timeout=5.0,
    # R15: the rotated contract (_CONTRACTS[1]) requires a bearer token; without one configured
    # a creation on it would be refused before sending (CredentialsMissing).
    credentials=CredentialsConfig.of({AGENT_URL: {"bearer": Bearer("fake-agent-token")}}),
)

# What a card request may be answered with, besides a card.
NETWORK, TIMEOUT, UNAVAILABLE, INVALID_JSON, TOO_LARGE = (
    "network",
    "timeout",
    "503",
    "invalid_json",
    "too_large",
)
FAILURES = (NETWORK, TIMEOUT, UNAVAILABLE, INVALID_JSON, TOO_LARGE)
# The failures the engine reports as CardInvalidError (a body it could not accept).
INVALID_BODIES = (INVALID_JSON, TOO_LARGE)

_CONTRACTS: tuple[dict[str, Any], ...] = (
    {},
    {  # rotated: a bearer scheme now required (R3 contract fields)
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
        "securityRequirements": [{"schemes": {"bearer": {}}}],
    },
)


def _alternatives(*alternatives: tuple[str, ...]) -> list[dict[str, Any]]:
    """1.0 ``securityRequirements``: each alternative's schemes, without scopes."""
    return [{"schemes": {name: {"list": []} for name in names}} for names in alternatives]


_BEARER = {"httpAuthSecurityScheme": {"scheme": "bearer"}}
_BASIC = {"httpAuthSecurityScheme": {"scheme": "basic"}}


def _api_key(location: str, name: str) -> dict[str, Any]:
    return {"apiKeySecurityScheme": {"location": location, "name": name}}


@dataclass(frozen=True, slots=True)
class AuthContract:
    """A card's R15 contract: its ``securitySchemes``, its card-level ``securityRequirements``
    and, when not None, the ones of skill :data:`SKILL` (which replace the card's)."""

    schemes: dict[str, dict[str, Any]]
    requirements: list[dict[str, Any]]
    skill_requirements: list[dict[str, Any]] | None = None


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


@dataclass(frozen=True, slots=True)
class Variant:
    """One card the endpoint may serve."""

    push: bool = True
    skill: bool = True
    contract: int = 0  # index into _CONTRACTS
    moved: bool = False  # the JSON-RPC endpoint is at MOVED_RPC_PATH
    auth: str = ""  # a name in AUTH_CONTRACTS: that contract instead of _CONTRACTS[contract]
    origin: str = AGENT_URL  # where the JSON-RPC endpoint is (another origin than the card's)

    @property
    def rpc_path(self) -> str:
        return MOVED_RPC_PATH if self.moved else RPC_PATH

    @property
    def rpc_url(self) -> str:
        return self.origin + self.rpc_path

    def document(self) -> dict[str, Any]:
        skills: list[dict[str, Any]] = [
            {"id": "other", "name": "Other", "inputModes": ["text/plain"]}
        ]
        if self.skill:
            skills.insert(0, {"id": SKILL, "name": "Echo", "inputModes": ["text/plain"]})
        contract: dict[str, Any] = _CONTRACTS[self.contract]
        if self.auth:
            auth = AUTH_CONTRACTS[self.auth]
            contract = {"securitySchemes": auth.schemes, "securityRequirements": auth.requirements}
            if auth.skill_requirements is not None and self.skill:
                skills[0]["securityRequirements"] = auth.skill_requirements
        return {
            "name": "fake-agent",
            "description": "in-memory A2A agent for property tests",
            "version": "1.0.0",
            "supportedInterfaces": [
                {
                    "url": self.rpc_url,
                    "protocolBinding": "JSONRPC",
                    "protocolVersion": "1.0",
                }
            ],
            "capabilities": {"streaming": False, "pushNotifications": self.push},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": skills,
            **contract,
        }

    @property
    def body(self) -> bytes:
        return _body(self)

    @property
    def etag(self) -> str:
        return f'W/"{hashlib.sha256(self.body).hexdigest()[:24]}"'

    @property
    def card(self) -> AgentCard:
        return _card(self)


@functools.cache
def _body(variant: Variant) -> bytes:
    return json.dumps(variant.document()).encode()


@functools.cache
def _card(variant: Variant) -> AgentCard:
    return parse_card(variant.body, url=AGENT_URL + CARD_PATHS[0])


VARIANTS = tuple(
    Variant(push, skill, contract, moved)
    for push in (True, False)
    for skill in (True, False)
    for contract in range(len(_CONTRACTS))
    for moved in (False, True)
)

Behaviour = Variant | str  # a card, or one of FAILURES


@dataclass(frozen=True, slots=True, eq=False)  # each request is itself: ``seen.index`` finds it
class Seen:
    """One request the fake received; for card requests, what it was answered with."""

    method: str
    path: str
    rpc: str | None = None  # the JSON-RPC method
    served: Behaviour | None = None  # card requests: the card variant or the failure
    status: int | None = None  # card requests: the HTTP status (None: raised)
    params: dict[str, Any] = field(default_factory=dict)
    url: str = ""  # the whole URL asked, query included
    headers: tuple[tuple[str, str], ...] = ()  # every header sent (names lower-case), in order
    body: bytes = b""
    answered: int | None = None  # JSON-RPC requests: the HTTP status they were answered with

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


class FakeAgent:
    """The remote agent and its card endpoint; see the module docstring."""

    def __init__(self, script: Iterable[Behaviour] = (), default: Behaviour = Variant()) -> None:
        self.script: deque[Behaviour] = deque(script)
        self.default = default
        self.seen: list[Seen] = []
        # JSON-RPC only at this URL (None: at RPC_PATH and MOVED_RPC_PATH on any host);
        # elsewhere a bare 404, as from a server that has no such route.
        self.rpc_at: str | None = None
        # When set (401 or 403), every JSON-RPC request is answered with that status and a body
        # that is no A2A error, as a gateway refusing the credentials would.
        self.refuse: int | None = None
        self.tasks: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, list[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)
        self._epoch = datetime(2026, 11, 29, 15, 26, 20, tzinfo=UTC)
        self.transport = httpx.MockTransport(self.handle)

    # -- what the test controls ----------------------------------------------------------------

    def serve(self, *behaviours: Behaviour) -> None:
        """Answer the next card requests with these, in order (then with ``default``)."""
        self.script.extend(behaviours)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport)

    def advance(self, task_id: str, state: str) -> None:
        """The remote moves its task to ``state`` (e.g. ``TASK_STATE_WORKING``), newly stamped."""
        self.tasks[task_id]["status"] = {"state": state, "timestamp": self._stamp()}

    # -- what the test reads ------------------------------------------------------------------

    def mark(self) -> int:
        return len(self.seen)

    def card_requests(self, since: int = 0) -> list[Seen]:
        return [s for s in self.seen[since:] if s.is_card]

    def rpc_requests(self, method: str, since: int = 0) -> list[Seen]:
        return [s for s in self.seen[since:] if s.rpc == method]

    # -- the wire ------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path in CARD_PATHS:
            return self._card(request)
        if self.rpc_at is None:
            served = path in (RPC_PATH, MOVED_RPC_PATH)
        else:
            served = str(request.url.copy_with(query=None)) == self.rpc_at
        if request.method == "POST" and served:
            return self._rpc(request)
        self.seen.append(Seen(request.method, path, **_sent(request), answered=404))
        return wire(404, b"Not Found", {"Content-Type": "text/plain; charset=utf-8"})

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
            padded = {**Variant().document(), "padding": "x" * MAX_CARD_BYTES}
            return wire(200, json.dumps(padded).encode(), _JSON)
        assert isinstance(behaviour, Variant), behaviour
        headers = {**_JSON, "ETag": behaviour.etag, "Cache-Control": "max-age=60"}
        if request.headers.get("if-none-match") == behaviour.etag:
            answered(304)
            return wire(304, b"", headers)
        answered(200)
        return wire(200, behaviour.body, headers)

    def _rpc(self, request: httpx.Request) -> httpx.Response:
        envelope = json.loads(request.content)
        method, params, rid = envelope["method"], envelope.get("params") or {}, envelope.get("id")
        status = self.refuse or 200
        sent = _sent(request)
        seen = Seen("POST", request.url.path, rpc=method, params=params, answered=status, **sent)
        self.seen.append(seen)
        if self.refuse is not None:
            refusal = json.dumps({"detail": "invalid or missing credentials"}).encode()
            return wire(self.refuse, refusal, {**_JSON, "WWW-Authenticate": 'Bearer realm="a2a"'})
        if request.headers.get("a2a-version") != "1.0":
            return _error(rid, -32009, "VERSION_NOT_SUPPORTED", "A2A version is not supported")
        handler = {
            "SendMessage": self._send_message,
            "GetTask": self._get_task,
            "CancelTask": self._cancel_task,
            "CreateTaskPushNotificationConfig": self._create_push_config,
            "ListTasks": self._list_tasks,
        }.get(method)
        if handler is None:
            error = {"code": -32601, "message": "Method not found"}
            return _json(200, {"error": error, "id": rid, "jsonrpc": "2.0"})
        return handler(rid, params)

    def _send_message(self, rid: object, params: dict[str, Any]) -> httpx.Response:
        message = params["message"]
        number = next(self._ids)
        task = {
            "id": f"t-{number}",
            "contextId": message.get("contextId") or f"ctx-{number}",
            "status": {"state": "TASK_STATE_SUBMITTED", "timestamp": self._stamp()},
        }
        self.tasks[task["id"]] = task
        return _result(rid, {"task": task})

    def _get_task(self, rid: object, params: dict[str, Any]) -> httpx.Response:
        task = self.tasks.get(str(params.get("id")))
        if task is None:
            return _error(rid, -32001, "TASK_NOT_FOUND", "Task not found")
        return _result(rid, task)

    def _cancel_task(self, rid: object, params: dict[str, Any]) -> httpx.Response:
        task = self.tasks.get(str(params.get("id")))
        if task is None:
            return _error(rid, -32001, "TASK_NOT_FOUND", "Task not found")
        if task["status"]["state"] in _TERMINAL:
            return _error(rid, -32002, "TASK_NOT_CANCELABLE", "Task cannot be canceled")
        self.advance(task["id"], "TASK_STATE_CANCELED")
        return _result(rid, task)

    def _create_push_config(self, rid: object, params: dict[str, Any]) -> httpx.Response:
        task_id = str(params.get("taskId"))
        if task_id not in self.tasks:
            return _error(rid, -32001, "TASK_NOT_FOUND", "Task not found")
        config = {k: params[k] for k in ("id", "url", "token", "authentication") if k in params}
        config = {"id": config.get("id") or task_id, "taskId": task_id, **config}
        self.configs.setdefault(task_id, []).append(config)
        return _result(rid, config)

    def _list_tasks(self, rid: object, params: dict[str, Any]) -> httpx.Response:
        tasks = [t for t in self.tasks.values() if t["contextId"] == params.get("contextId")]
        page = {"tasks": tasks, "nextPageToken": "", "pageSize": len(tasks),
                "totalSize": len(tasks)}  # fmt: skip
        return _result(rid, page)

    def _stamp(self) -> str:
        moment = self._epoch + timedelta(milliseconds=next(self._ticks))
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_JSON = {"Content-Type": "application/json"}


def _sent(request: httpx.Request) -> dict[str, Any]:
    """What a :class:`Seen` keeps of what the request carried."""
    headers = tuple((k.decode().lower(), v.decode()) for k, v in request.headers.raw)
    return {"url": str(request.url), "headers": headers, "body": request.content}


_TERMINAL = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
)


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


def _result(rid: object, result: object) -> httpx.Response:
    return _json(200, {"result": result, "id": rid, "jsonrpc": "2.0"})


def _error(rid: object, code: int, reason: str, message: str) -> httpx.Response:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": "a2a-protocol.org", "metadata": {}}  # fmt: skip
    error = {"code": code, "message": message, "data": [info]}
    return _json(200, {"error": error, "id": rid, "jsonrpc": "2.0"})


def hunt(max_examples: int) -> settings:
    """Settings for a ``find()`` hunt for a planted bug: a budget of its own (the profile's, small
    under ``dev``, is for the property), and no shrinking — the hunt only has to show one failing
    example, and shrinking would replay whole engine runs by the hundred. Derandomised: the
    same hunt on every run, so a planted bug caught once is caught always."""
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
    )


# -- engines --------------------------------------------------------------------------------------


def jumping_clock(step: float = CONFIG.max_card_age) -> Any:
    """A clock that moves ``step`` seconds at every reading: no memo is ever young enough."""
    ticks = itertools.count()
    return lambda: next(ticks) * step


@functools.cache
def _migrated() -> EventStore:
    return EventStore.open("sqlite://")


def clone(source: EventStore) -> EventStore:
    """A new in-memory SQLite store holding a copy of ``source`` (an in-memory SQLite store).

    A copy of a migrated database costs a tenth of a migration: examples start from a fresh
    store without paying for alembic every time.
    """
    target = EventStore.open("sqlite://", migrate=False)
    with _driver(source) as origin, _driver(target) as copy:
        origin.backup(copy)
    return target


def fresh_store() -> EventStore:
    """An empty, migrated in-memory SQLite store of its own."""
    return clone(_migrated())


@contextlib.contextmanager
def _driver(store: EventStore) -> Iterator[Any]:
    proxy = store.engine.raw_connection()  # in memory: the one connection (StaticPool)
    try:
        yield proxy.driver_connection
    finally:
        proxy.close()


@contextlib.asynccontextmanager
async def open_engine(
    agent: FakeAgent, store: EventStore | None = None, config: EngineConfig = CONFIG
) -> AsyncIterator[Engine]:
    """An engine on a real store (a fresh in-memory one unless given), talking to ``agent``;
    closing it closes the store."""
    opened = store if store is not None else fresh_store()
    engine = Engine(opened, agent.client(), config, owns_client=True, clock=jumping_clock())
    async with engine:
        yield engine


# -- what was recorded ----------------------------------------------------------------------------


def agent_events(store: EventStore, since: int = 0) -> list[RecordedEvent]:
    """The fake agent's stream, from version ``since + 1``."""
    return store.read_stream(ev.agent_stream_id(ORIGIN), from_version=since + 1)


def agent_version(store: EventStore) -> int:
    head = store.stream(ev.agent_stream_id(ORIGIN))
    return 0 if head is None else head.version


def task_events(store: EventStore, key: str, since: int = 0) -> list[RecordedEvent]:
    return store.read_stream(task_stream_id(key), from_version=since + 1)


def task_version(store: EventStore, key: str) -> int:
    head = store.stream(task_stream_id(key))
    return 0 if head is None else head.version


def task_streams(store: EventStore) -> list[str]:
    return [s.stream_id for s in store.streams(category=ev.TASK_CATEGORY)]


def write_marks(store: EventStore) -> tuple[int, dict[str, int]]:
    """The global position and every stream's version: unchanged means nothing was written."""
    versions = {}
    for stream_id in store.stream_ids():
        head = store.stream(stream_id)
        versions[stream_id] = head.version if head else 0
    return store.last_position(), versions


def audit_problems(store: EventStore) -> str | None:
    """What the audit (R13, R14) found, or None."""
    report = audit(store)
    if report.ok:
        return None
    return "; ".join(f"{v.stream}@{v.position} {v.kind}: {v.detail}" for v in report.violations)
