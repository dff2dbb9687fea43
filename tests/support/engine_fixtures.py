"""Helpers for the engine's integration tests (``test_rules.py``, ``test_cli_tasks.py``).

Plain functions and classes, no pytest fixtures: the test modules define their fixtures from these.

- :data:`FAST` — an :class:`EngineConfig` with small intervals, so a test takes well under a second
  of polling; :func:`audited_engine` opens an engine on a store and, when the block ends without an
  error, waits for its background re-checks and asserts the audit passes (R13).
- Reading what was recorded: :func:`events`, :func:`types`, :func:`transitions`, :func:`data_of`,
  :func:`agent_events` (``store_marks.write_marks`` proves a refusal wrote nothing).
- :func:`restored` — one agent shared by a module, back to normal service for every test.
- Card edits for ``mutate_card``: :func:`drop_skill`, :func:`withdraw_push`,
  :func:`rotate_security`, :func:`rotate_to_bearer`, :func:`retire_binding`,
  :func:`point_jsonrpc_at`; those rule tests run against both generations use edit a 1.0 card
  (`Peer`) and a 0.3 one (`Peer03`: ``url``, ``additionalInterfaces``) alike.
  :func:`wire_version` is the protocol version the engine records for an agent's endpoints;
  :func:`endpoint_in_use` the endpoint it talks to (the card's preference: JSON-RPC, or HTTP+JSON
  for a 0.3 agent started preferring it), :func:`other_endpoint` the agent's other one, and
  :func:`logged` how the agents' call logs name a binding; :func:`sends_status_timestamps`.
- :class:`PushReceiver` — a webhook on 127.0.0.1 that records what the agent POSTs and, once told
  to, hands each delivery to ``Engine.deliver`` on the test's event loop.
- :class:`MovableEndpoint` — a JSON-RPC endpoint of its own that relays to the agent's until it is
  retired (then a plain 404, incident 002): the old endpoint of an agent that moved.
- Crafted push bodies: :func:`status_update_body`, :data:`JSON`, :func:`push_headers`.
- :func:`database_bytes` — a store as it lies on disk (the SQLite files, a ``pg_dump`` of the
  PostgreSQL schema), to search for what must never be stored.
- :class:`LoopWatch` — functions patched to wait, at each call, for the event loop to run
  meanwhile: proof that work on a large input does not stall the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import glob
import json
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from cardfence.engine.client.audit import audit
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.creation import WebhookOutcome
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.demo.receiver import WebhookReceiver
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.serve.driver import Driver
from cardfence.store.database import normalise_url
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent
from support import Peer, Peer03, ServerThread

FAST = EngineConfig(
    max_poll_interval=0.2,
    first_poll_interval=0.02,
    max_card_age=0.3,
    card_limits=CardLimits(timeout=1.0, connect_timeout=0.5),
    request_timeout=5.0,
    # The rule tests watch polls and pushes; the stream tests turn streams on.
    follow_streams=False,
)

JSON = "application/json"

Agent = Peer | Peer03  # an agent of either generation


# -- engines and the audit ------------------------------------------------------------------------


def assert_audit_ok(store: EventStore) -> None:
    """R13: every chain intact, every projection equal to its replay, every snapshot present."""
    report = audit(store)
    assert report.ok, "audit found: " + "; ".join(
        f"{v.stream}@{v.position} {v.kind}: {v.detail}" for v in report.violations
    )
    assert report.events_checked > 0


@contextlib.asynccontextmanager
async def audited_engine(url: str, config: EngineConfig = FAST) -> AsyncIterator[Engine]:
    """An engine on the store at ``url``; audited once its background work has settled."""
    async with Engine.connect(url, config=config) as engine:
        yield engine
        await engine.settle()
        assert_audit_ok(engine.store)


@contextlib.asynccontextmanager
async def driving(
    url: str,
    config: EngineConfig = FAST,
    *,
    owner: str | None = None,
    lease_ttl: float = 15.0,
    scan_interval: float = 0.05,
) -> AsyncIterator[Driver]:
    """A driver on its own engine over the store at ``url`` (as `serve` runs one), stopped and
    audited at the end."""
    async with Engine.connect(url, config=config) as engine:
        driver = Driver(engine, owner=owner, lease_ttl=lease_ttl, scan_interval=scan_interval)
        job = asyncio.create_task(driver.run())
        await driver.ready()
        try:
            yield driver
        finally:
            driver.stop()
            await job
            await engine.settle()
            assert_audit_ok(engine.store)


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Yield to the loop until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def restored(peer: Agent) -> Iterator[Agent]:
    """A shared agent in normal service with zeroed counters, its card restored afterwards (one
    agent per module: starting one costs a quarter of a second)."""
    original = copy.deepcopy(peer.card)
    peer.reset()
    try:
        yield peer
    finally:
        peer.reset()
        peer.card = original


# -- what was recorded ----------------------------------------------------------------------------


def events(store: EventStore, key: str) -> list[RecordedEvent]:
    """The task's own stream, versions 1..n."""
    return store.read_stream(task_stream_id(key))


def types(store: EventStore, key: str) -> list[str]:
    return [e.type for e in events(store, key)]


def data_of(store: EventStore, key: str, type_: str) -> list[dict[str, Any]]:
    """The payloads of the task's events of one type, in order."""
    return [e.data for e in events(store, key) if e.type == type_]


def transitions(store: EventStore, key: str) -> list[tuple[str, str]]:
    """The task's ``StateChanged`` sequence as (from, to) pairs."""
    return [(d["from"], d["to"]) for d in data_of(store, key, ev.STATE_CHANGED)]


def agent_events(store: EventStore, peer: Agent) -> list[tuple[str, dict[str, Any]]]:
    stream = ev.agent_stream_id(card_urls(peer.base_url)[0])
    return [(e.type, e.data) for e in store.read_stream(stream)]


@contextlib.contextmanager
def events_refused(db_url: str) -> Iterator[None]:
    """The database itself refuses every new event (a trigger), mid-transaction: after the
    stream's head row was updated, so a partial write would show."""
    engine = sa.create_engine(normalise_url(db_url))
    sqlite = engine.dialect.name == "sqlite"
    try:
        with engine.begin() as conn:
            if sqlite:
                conn.exec_driver_sql(
                    "CREATE TRIGGER refuse_events BEFORE INSERT ON events "
                    "BEGIN SELECT RAISE(ABORT, 'the disk is on fire'); END"
                )
            else:
                conn.exec_driver_sql(
                    "CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'the disk is on fire'; END $$"
                )
                conn.exec_driver_sql(
                    "CREATE TRIGGER refuse_events BEFORE INSERT ON events "
                    "FOR EACH ROW EXECUTE FUNCTION refuse_events()"
                )
        yield
    finally:
        with engine.begin() as conn:
            if sqlite:
                conn.exec_driver_sql("DROP TRIGGER refuse_events")
            else:
                conn.exec_driver_sql("DROP TRIGGER refuse_events ON events")
                conn.exec_driver_sql("DROP FUNCTION refuse_events()")
        engine.dispose()


def calls(peer: Agent, method: str, binding: str | None = None) -> int:
    """How many ``method`` requests the agent received (on ``binding``, or either)."""
    return sum(1 for b, m in peer.calls if m == method and binding in (None, b))


# -- card edits (for Peer.mutate_card) ------------------------------------------------------------


def drop_skill(skill_id: str) -> Callable[[dict[str, Any]], None]:
    def edit(card: dict[str, Any]) -> None:
        card["skills"] = [s for s in card["skills"] if s["id"] != skill_id]
        card["version"] = "1.1.0"

    return edit


def wire_version(agent: Agent) -> str:
    """The protocol version recorded for the agent's endpoints: its card's."""
    return agent.protocol_version if isinstance(agent, Peer03) else "1.0"


def binding_in_use(agent: Agent) -> str:
    """The binding the engine talks to the agent over under FAST (no binding preferred): its
    card's first, JSON-RPC for the 1.3 agent, the 0.3 agent's ``preferred_transport``."""
    return agent.preferred_transport if isinstance(agent, Peer03) else "JSONRPC"


def _endpoint(agent: Agent, binding: str) -> dict[str, str]:
    url = agent.rest_url if binding == "HTTP+JSON" else agent.jsonrpc_url
    return {"url": url, "binding": binding, "protocol_version": wire_version(agent)}


def endpoint_in_use(agent: Agent) -> dict[str, str]:
    """The endpoint a task of the agent's card as served is sent to, as the task records it."""
    return _endpoint(agent, binding_in_use(agent))


def other_endpoint(agent: Agent) -> dict[str, str]:
    """The agent's endpoint of the other binding, as a task would record it."""
    other = "HTTP+JSON" if binding_in_use(agent) == "JSONRPC" else "JSONRPC"
    return _endpoint(agent, other)


def sends_status_timestamps(agent: Agent) -> bool:
    """Whether the agent's task answers carry ``status.timestamp``: a2a-sdk 0.3's HTTP+JSON
    binding leaves it out (its ``ToProto.task_status`` keeps the state and the message only);
    its JSON-RPC sends it, as a2a-sdk 1.3 does over both."""
    return not (isinstance(agent, Peer03) and binding_in_use(agent) == "HTTP+JSON")


def logged(binding: str) -> str:
    """How the agents' call logs name a binding: ``JSONRPC`` or ``REST``."""
    return "REST" if binding == "HTTP+JSON" else binding


def _is_03(card: dict[str, Any]) -> bool:
    """A 0.3 card names its main endpoint at the top (``url``); a 1.0 card lists them all."""
    return "supportedInterfaces" not in card


def withdraw_push(card: dict[str, Any]) -> None:
    card["capabilities"]["pushNotifications"] = False
    card["version"] = "1.1.0"


def rotate_security(card: dict[str, Any]) -> None:
    """Seed 004 #1: the agent moves to mTLS-only between two reads."""
    if _is_03(card):
        card["securitySchemes"] = {"mtls": {"type": "mutualTLS", "description": "mTLS only"}}
        card["security"] = [{"mtls": []}]
        card["version"] = "2.0.0"
        return
    card["securitySchemes"] = {"mtls": {"mtlsSecurityScheme": {"description": "mTLS only"}}}
    card["securityRequirements"] = [{"schemes": {"mtls": {"list": []}}}]
    card["version"] = "2.0.0"


def rotate_to_bearer(card: dict[str, Any]) -> None:
    """The agent starts requiring an HTTP bearer token (scheme ``bearer``)."""
    if _is_03(card):
        card["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        card["security"] = [{"bearer": []}]
        card["version"] = "2.0.0"
        return
    card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    card["version"] = "2.0.0"


def retire_binding(binding: str) -> Callable[[dict[str, Any]], None]:
    """A card edit: the endpoint of ``binding`` is retired, only the other one is left (same
    skills, same contract)."""

    def edit(card: dict[str, Any]) -> None:
        if _is_03(card):
            [kept] = [i for i in card["additionalInterfaces"] if i["transport"] != binding]
            card.update(
                url=kept["url"], preferredTransport=kept["transport"], additionalInterfaces=[kept]
            )
        else:
            card["supportedInterfaces"] = [
                i for i in card["supportedInterfaces"] if i["protocolBinding"] != binding
            ]
        card["version"] = "1.2.0"

    return edit


# -- push deliveries ------------------------------------------------------------------------------


def push_headers(
    token: str | None, content_type: str = JSON, authorization: str | None = None
) -> dict[str, str]:
    """Headers as a2a-sdk's push sender sends them."""
    headers = {"content-type": content_type}
    if token is not None:
        headers["x-a2a-notification-token"] = token
    if authorization is not None:
        headers["authorization"] = authorization
    return headers


def headers_for(outcome: WebhookOutcome, content_type: str = JSON) -> dict[str, str]:
    """The headers of a genuine delivery for the webhook ``outcome`` registered."""
    return push_headers(outcome.token, content_type, outcome.authorization)


def status_update_body(
    remote_task_id: str, context_id: str | None, state: str, timestamp: datetime
) -> bytes:
    """A 1.0 ``StreamResponse`` status update, as a2a-sdk's push sender posts it."""
    wire_state = "TASK_STATE_" + state.upper().replace("-", "_")
    update = {
        "taskId": remote_task_id,
        "contextId": context_id,
        "status": {"state": wire_state, "timestamp": timestamp.isoformat()},
    }
    return json.dumps({"statusUpdate": update}).encode()


class PushReceiver(WebhookReceiver):
    """The demo's webhook (``cardfence.engine.demo.receiver``): records what the agent POSTs and,
    after :meth:`forward_to`, hands each delivery to ``engine.deliver`` on the test's event loop.
    Use as ``with PushReceiver() as hook:``."""

    def states_delivered(self) -> list[str]:
        """The wire states of the status updates and tasks received, in order."""
        return [state for state in map(delivered_state, (b for b, _ in self.deliveries)) if state]


def delivered_state(body: bytes) -> str | None:
    """The state a push body reports, in 1.0 wire form: a 1.0 ``StreamResponse`` (status update
    or task), or a 0.3 push (the whole task, ``"completed"`` becomes ``TASK_STATE_COMPLETED``)."""
    doc = json.loads(body)
    task = doc.get("statusUpdate") or doc.get("task") or doc
    state = (task.get("status") or {}).get("state")
    if not isinstance(state, str):
        return None
    if state.startswith("TASK_STATE_"):
        return state
    return "TASK_STATE_" + state.upper().replace("-", "_")


def state_of(engine: Engine, key: str) -> Mapping[str, Any]:
    """The task's stored projection."""
    head = engine.store.stream(task_stream_id(key))
    assert head is not None
    return head.state


class MovableEndpoint:
    """A JSON-RPC endpoint on its own port (``url``) that relays every request to ``target`` (the
    agent's real one) until :attr:`gone` is set; from then on it answers a plain HTTP 404 with no
    A2A body, as a retired endpoint does. ``relayed`` lists the methods it passed on."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.gone = False
        self.relayed: list[str] = []
        self.refused: list[str] = []
        self._server = ServerThread(
            Starlette(routes=[Route("/rpc", self._relay, methods=["POST"])])
        )
        self.url = self._server.base_url + "/rpc"

    async def _relay(self, request: Request) -> Response:
        body = await request.body()
        method = str(json.loads(body).get("method"))
        if self.gone:
            self.refused.append(method)
            return PlainTextResponse("Not Found", status_code=404)
        self.relayed.append(method)
        keep = ("content-type", "a2a-version", "accept")
        headers = {k: v for k, v in request.headers.items() if k in keep}
        async with httpx.AsyncClient() as client:
            answer = await client.post(self.target, content=body, headers=headers, timeout=10)
        return Response(
            answer.content, answer.status_code, media_type=answer.headers["content-type"]
        )

    def __enter__(self) -> MovableEndpoint:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop()


class StreamCutter(MovableEndpoint):
    """A :class:`MovableEndpoint` that relays event streams (``SubscribeToTask``) up to their
    first event and then drops the connection mid-stream, as a proxy restart does; every other
    request is relayed whole. ``cuts`` counts the streams it dropped."""

    cuts = 0

    async def _relay(self, request: Request) -> Response:
        body = await request.body()
        if json.loads(body).get("method") != "SubscribeToTask":
            return await super()._relay(_replayed(request, body))
        self.relayed.append("SubscribeToTask")
        keep = ("content-type", "a2a-version", "accept")
        headers = {k: v for k, v in request.headers.items() if k in keep}
        first = b""
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", self.target, content=body, headers=headers, timeout=10) as up,
        ):
            async for chunk in up.aiter_raw():
                first += chunk
                if b"\n\n" in first.replace(b"\r\n", b"\n"):
                    break

        async def cut() -> AsyncIterator[bytes]:
            yield first
            self.cuts += 1
            raise ConnectionAbortedError("stream cut by the relay")  # uvicorn drops the socket

        return StreamingResponse(cut(), media_type="text/event-stream")


def _replayed(request: Request, body: bytes) -> Request:
    """``request`` with its body readable again."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


def point_jsonrpc_at(url: str) -> Callable[[dict[str, Any]], None]:
    """A card edit: the JSON-RPC interface now lives at ``url`` (same skills, same contract)."""

    def edit(card: dict[str, Any]) -> None:
        if _is_03(card):
            if card.get("preferredTransport", "JSONRPC") == "JSONRPC":
                card["url"] = url
            for interface in card.get("additionalInterfaces") or []:
                if interface["transport"] == "JSONRPC":
                    interface["url"] = url
            return
        for interface in card["supportedInterfaces"]:
            if interface["protocolBinding"] == "JSONRPC":
                interface["url"] = url

    return edit


@contextlib.asynccontextmanager
async def held_delivery(
    url: str, headers: dict[str, str], body: bytes, sent: int
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A POST whose head announces all of ``body`` and whose first ``sent`` bytes only are sent;
    the connection is closed on leaving (the rest never arrives)."""
    parsed = httpx.URL(url)
    reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
    lines = [f"POST {parsed.raw_path.decode()} HTTP/1.1", f"host: {parsed.netloc.decode()}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"content-length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body[:sent])
    await writer.drain()
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The status, headers and JSON body of the one answer on a raw connection."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    fields = {
        name.lower(): value
        for name, _, value in (
            line.partition(": ") for line in head.decode().split("\r\n")[1:] if ": " in line
        )
    }
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), 10)
    return int(head.split()[1]), fields, json.loads(body)


def webhook_url(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The webhook URL a `cardfence serve` subprocess announces on stderr once it listens."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        if "webhook at " in line:
            return line.rsplit("webhook at ", 1)[1].strip()
    process.kill()
    raise AssertionError(f"serve did not start: {process.communicate()}")


class LoopWatch:
    """Functions patched (:meth:`patch`) so that each call waits until the event loop has run
    something else meanwhile (:meth:`watching`, a task on the loop, says so). A call made on the
    loop's own thread waits in vain -- the loop cannot run while it waits -- and is recorded as
    such after ``patience`` seconds: :attr:`calls` holds ``(name, loop ran meanwhile)``."""

    def __init__(self, patience: float = 5.0) -> None:
        self.calls: list[tuple[str, bool]] = []
        self._patience = patience
        self._started = threading.Event()
        self._ran = threading.Event()

    def patch(self, monkeypatch: Any, module: Any, name: str) -> None:
        original = getattr(module, name)

        def waiting(*args: Any, **kwargs: Any) -> Any:
            self._ran.clear()
            self._started.set()
            self.calls.append((name, self._ran.wait(self._patience)))
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, waiting)

    async def watching(self) -> None:
        """Run until cancelled, saying that the loop ran whenever a patched call waits for it."""
        while True:
            if self._started.is_set():
                self._started.clear()
                self._ran.set()
            await asyncio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def watched(self) -> AsyncIterator[None]:
        watcher = asyncio.create_task(self.watching())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


# -- what a store holds, byte for byte ------------------------------------------------------------


def database_bytes(url: str, tmp_path: Path) -> bytes:
    """The database as stored: the SQLite file (and its journal) or a pg_dump of the schema."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = Path(str(parsed.database))
        files = [database, *(Path(p) for p in glob.glob(f"{database}-*"))]
        return b"".join(f.read_bytes() for f in files if f.exists())
    pg_dump = shutil.which("pg_dump") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump"), reverse=True)), None
    )
    if pg_dump is None:
        pytest.fail("pg_dump is not installed beside the PostgreSQL server")
    options = str(parsed.query.get("options", ""))
    schema = options.split("search_path=", 1)[1]
    out = tmp_path / "dump.sql"
    subprocess.run(
        [
            pg_dump,
            "--host", str(parsed.host), "--port", str(parsed.port or 5432),
            "--username", str(parsed.username), "--schema", schema,
            "--file", str(out), str(parsed.database),
        ],
        check=True,
        env={"PGPASSWORD": parsed.password or ""},
        timeout=60,
    )  # fmt: skip
    dumped = out.read_bytes()
    assert b"CardFetched" in dumped  # the dump holds the log: an empty one would prove nothing
    return dumped


def make_tasks(db: str, peer: Peer, *specs: tuple[str, str, str]) -> list[str]:
    """Create and drive tasks in-process: (skill, text, until) each; returns their keys."""

    async def main() -> list[str]:
        keys = []
        async with audited_engine(db) as engine:
            for skill, text, until in specs:
                view = await engine.start_task(peer.base_url, skill=skill, text=text)
                await engine.drive(view.task, until=until, timeout=10)
                keys.append(view.task)
        return keys

    return asyncio.run(main())
