"""The ``engine`` benchmark section: the engine's own costs, each beside a bare baseline.

All on SQLite (a file in a temporary folder, WAL, ``synchronous=NORMAL``); ``--pg-url`` is not used
by this section. In one process (and, for part 6, a helper process of its own):

1. **Observation application** (``Observing.apply``: head read, ``apply_observation`` with its
   guards, the fold, one event and the new projection appended in one transaction), round-robin
   over 200 tasks that already exist, alternating per task between a poll that sees a new
   state (``working`` <-> ``input-required``, so ``StateChanged``) and one that sees the same state
   with a newer status timestamp and a new progress message (``ObservationIgnored``, reason
   ``same_state``): one event each,
   like the baseline's one row. (A snapshot read back unchanged, ``duplicate``, records nothing;
   its cost — a head read and the decision — is printed as a note.) Beside it, a raw
   SQLAlchemy Core insert + commit of one row per transaction carrying exactly the payloads those
   observations produce (computed before the clock starts) into ``bench_store``'s ``raw_events``
   table (same columns and index as ours), one ``engine.begin()`` per row. Target >= 0.5 x raw.

   Also printed, with no target: the python-statemachine ``send`` on a live
   ``engine.core.lifecycle.TaskLifecycle`` machine, and ``machine_at`` (restoring a machine from a
   persisted state, as a stored task would need) + ``send``, each beside the ``is_legal`` lookup
   the hot path really uses (a frozenset membership test compiled from the declaration at import).

2. **End to end**: 40 tasks a run, one after another, driven ask -> reply -> completed against a
   real a2a-sdk agent on 127.0.0.1 (``tests/support``) by an :class:`~engine.client.engine.Engine`
   that
   persists everything (``start_task`` -> ``drive`` -> ``reply`` -> ``drive(until="terminal")``,
   ``EngineConfig(first_poll_interval=0.005, max_poll_interval=0.05)``), beside the a2a-sdk 1.3
   client (``ClientFactory(...).create(card)``, JSON-RPC, no streaming, nothing persisted) making
   the same calls: SendMessage(``ask``, returnImmediately) -> GetTask until input-required ->
   SendMessage(reply, returnImmediately) -> GetTask until completed, polling with the same backoff
   as ``Engine.drive`` (poll at once, then 5, 10, 20, 40, 50, 50 ... ms). The baseline client is
   built once from the agent's card; the engine reads the card afresh for every task (R2), as it
   must. Target >= 0.85 x the bare client's tasks/s.

3. **Card requests per task**, counted at the agent (``Peer.card_requests``): while creating 20
   tasks (``start_task``, target <= 1), while registering a webhook on each (``register_webhook``
   to a dummy loopback URL, target <= 1), and while polling each of them 10 times
   (``Engine.poll``, target 0: the continuation path never reads the card; measured before the
   webhooks are registered, so no push-mode boundary re-check can run). These figures are
   counts, not rates: ``value`` is requests per task and ``target`` the budget (1, 1, 0); there is
   no baseline and ``ratio`` is ``null``, because the table's verdict (ratio >= target) reads the
   wrong way for a budget. The verdicts are printed as notes instead. A further note drives one
   ``slow`` task under a short ``max_card_age`` to show R7's off-path re-validation staying within
   one card read per ``max_card_age``.

4. **Replay** (what ``engine.client.audit`` does per stream: ``EventStore.read_stream`` then
   ``engine.client.audit.replay``, the fold into the projection) over 100 task streams of 40
   realistic events (TaskSubmitted, then what polls, replies and artifacts record), beside the
   eventsourcing library rebuilding as many aggregates of as many events each with
   ``app.repository.get`` (its SQLite module, in the same database file, switched to
   ``synchronous=NORMAL`` like ours). Target >= 1.5 x.

5. **A file part**: ``file_tasks`` tasks a run, one after another, each created with a text and a
   1 MiB file part (``File(data=..., filename="report.pdf", media_type="application/pdf")``, random
   bytes, the same each time) and followed until completed, against the same agent's ``echo`` (its
   card's input modes widened to take ``application/pdf``, so R2 lets the file through; it
   answers with one small text artifact): ``start_task(..., parts=[...])`` ->
   ``drive(until="terminal")``, the engine checking every part against the skill, recording the
   message (its file stored out of line, a content record of its own) and sending it, beside the
   bare a2a-sdk client sending the same two parts (``Part(raw=...)``, the same filename and media
   type; JSON-RPC, returnImmediately) and polling as in part 2. Target >= 0.8 x the bare client's
   tasks/s. ``--quick`` sends a 256 KiB file.

6. **Updates across processes**: one process appends, another awaits. A helper process
   (``python scripts/bench_engine.py appender DB_URL COUNT``: the same agent in a thread of its own
   and an engine on a SQLite file) drives ``update_tasks`` ``echo`` tasks one after another,
   start to completion, recording every transition; this process reads them with
   ``engine.updates(after=...)`` on an engine of its own over the same file, from the position the
   helper reached once warmed up, and notes for each update when it was delivered. The figures
   are the p50 and p99 of (delivered - recorded) in milliseconds, ``recorded`` being the event's
   ``recorded_at`` (the time of the appending transaction) and both read from the one clock of
   the machine. No baseline and no target: ``baseline``, ``ratio`` and ``target`` are ``null``.

The agent runs in a thread of this process and shares the GIL with the client, so part 2's rates
are whole round trips on one machine. Its sockets are bound with ``TCP_NODELAY`` on every
connection (``engine.demo.server.bind``): otherwise each response with a body would wait ~40 ms
for a delayed ACK, and both sides would mostly measure that stall. With this agent the scripted
task is usually done by the first poll, so part 2 measures the client's own cost per task (about
10 ms of round trips for the bare client) rather than backoff sleeps. ``--quick`` runs every part
at smoke-test sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import sqlalchemy as sa
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from a2a.types import Task as A2ATask
from bench import BenchContext, Figure, Workload, median_rates, register
from bench_store import (
    BenchApp,
    BenchTask,
    Database,
    durability,
    es_command_args,
    eventsourcing_sqlite_pragmas,
    eventsourcing_sqlite_synchronous_normal,
    raw_engine,
    raw_events,
    raw_metadata,
    runs_of,
    sqlite_database,
)
from eventsourcing.application import Application
from support import Peer

from cardfence.engine.client.audit import replay
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import reached
from cardfence.engine.client.tasklog import TaskLog, projection_of, task_stream_id
from cardfence.engine.client.updates import POLL_INTERVAL as UPDATES_POLL
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import TaskEvent as Event
from cardfence.engine.core.lifecycle import TERMINAL, TaskLifecycle, is_legal, machine_at
from cardfence.engine.core.observations import ArtifactRecord, Observation, apply_observation
from cardfence.engine.core.parts import File
from cardfence.engine.core.replay import apply_task_event, fold_task
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, RecordedEvent

OBSERVE_TARGET = 0.5
E2E_TARGET = 0.85
FILE_TARGET = 0.8
REPLAY_TARGET = 1.5
CREATION_BUDGET = 1.0
WEBHOOK_BUDGET = 1.0
POLL_BUDGET = 0.0
FIRST_POLL = 0.005
MAX_POLL = 0.05
DUMMY_HOOK = "http://127.0.0.1:9/cardfence-bench-hook"  # discard port: never delivered to
QUESTION = "What is your answer?"
FILE_NAME = "report.pdf"
FILE_TYPE = "application/pdf"
FILE_TEXT = "summarise this"
HERE = Path(__file__).resolve()


@dataclass(frozen=True, slots=True)
class Sizes:
    """Work per timed run (each rate is the median of ``ctx.runs`` such runs)."""

    tasks: int  # tasks the observations go round
    observations: int  # Observing.apply calls
    machine_sends: int  # python-statemachine sends (~75 us each)
    lookups: int  # is_legal calls (~0.1 us each)
    e2e_tasks: int  # tasks driven ask -> reply -> completed, one after another
    card_tasks: int  # tasks created, polled and registered for part 3
    polls: int  # Engine.poll calls per task in part 3
    replay_streams: int  # task streams replayed (and as many aggregates rebuilt)
    stream_length: int  # events per stream / aggregate
    file_tasks: int  # tasks sent with a file part, one after another
    file_bytes: int  # the size of that file
    update_tasks: int  # tasks the helper process drives while this one awaits their updates

    @classmethod
    def for_context(cls, ctx: BenchContext) -> Sizes:
        if ctx.quick:
            return cls(
                tasks=20,
                observations=60,
                machine_sends=100,
                lookups=10_000,
                e2e_tasks=2,
                card_tasks=3,
                polls=3,
                replay_streams=5,
                stream_length=40,
                file_tasks=2,
                file_bytes=256 << 10,
                update_tasks=3,
            )
        return cls(
            tasks=200,
            observations=1000,
            machine_sends=2000,
            lookups=500_000,
            e2e_tasks=40,
            card_tasks=20,
            polls=10,
            replay_streams=100,
            stream_length=40,
            file_tasks=10,
            file_bytes=1 << 20,
            update_tasks=200,
        )


# -- realistic task streams ------------------------------------------------------------------------


def submitted_event(key: str, agent_url: str) -> Event:
    """A ``TaskSubmitted`` as ``Engine.start_task`` records it (about 730 bytes of JSON)."""
    revision, contract, skill_hash = (uuid.uuid4().hex * 2 for _ in range(3))
    return ev.TaskSubmitted.from_payload(
        {
            "task": key,
            "agent": agent_url,
            "agent_url": agent_url,
            "card_url": f"{agent_url}/.well-known/agent-card.json",
            "skill": "ask",
            "message_id": f"m-{uuid.uuid4().hex}",
            "context_id": f"c-{uuid.uuid4().hex}",
            "text": "ask what is the answer?",
            "media_type": "text/plain",
            "card_revision": revision,
            "card_version": "1.0.0",
            "contract_hash": contract,
            "skill_hash": skill_hash,
            "endpoint": {"url": f"{agent_url}/a2a/jsonrpc", "binding": "JSONRPC"},
            "submitted_at": datetime.now(UTC).isoformat(),
        }
    )


class RemoteTaskScript:
    """One remote task as successive polls see it: alternately a new state, and the same state
    again with a newer status timestamp and a new progress message.

    ``next()`` alternates between a snapshot in the other one of ``working`` / ``input-required``
    (``StateChanged``) and :meth:`again` (``ObservationIgnored``, reason ``same_state``). Both
    record one event. (A snapshot read back unchanged, reason ``duplicate``, records nothing.)
    """

    def __init__(self, moment: datetime) -> None:
        self.remote_task_id = str(uuid.uuid4())
        self.remote_context_id = f"c-{uuid.uuid4().hex}"
        self.moment = moment
        self.state = "working"
        self.last: Observation | None = None
        self.polls = 0
        self.touched = 0

    def snapshot(
        self,
        state: str,
        *,
        artifacts: tuple[ArtifactRecord, ...] = (),
        message: str | None = None,
    ) -> Observation:
        self.moment += timedelta(milliseconds=7)
        self.state = state
        self.last = Observation(
            source="poll",
            state=state,
            remote_timestamp=self.moment,
            message=message or (QUESTION if state == "input-required" else None),
            artifacts=artifacts,
            remote_task_id=self.remote_task_id,
            remote_context_id=self.remote_context_id,
        )
        return self.last

    def again(self) -> Observation:
        # A new progress message: the same status restamped with nothing new is a repeat (R12),
        # counted and not recorded.
        self.touched += 1
        return self.snapshot(self.state, message=f"progress {self.touched}")

    def next(self) -> Observation:
        self.polls += 1
        if self.polls % 2 == 0:
            return self.again()
        return self.snapshot("input-required" if self.state == "working" else "working")


@dataclass(slots=True)
class PlannedTask:
    key: str
    remote: RemoteTaskScript
    setup: list[Event]


def planned_task(prefix: str, agent_url: str, moment: datetime) -> PlannedTask:
    """A task already submitted and bound to its remote task (its first poll saw ``working``)."""
    key = f"{prefix}-{uuid.uuid4().hex}"
    remote = RemoteTaskScript(moment)
    setup = [submitted_event(key, agent_url)]
    state = fold_task(key, setup)
    binding = apply_observation(state, remote.snapshot("working"))
    return PlannedTask(key, remote, setup + binding)


class ObservationPlan:
    """Observations round-robin over tasks, built ahead of the clock."""

    def __init__(self, tasks: Sequence[PlannedTask]) -> None:
        self.tasks = list(tasks)
        self._next = 0

    def take(self, count: int) -> list[tuple[str, Observation]]:
        out: list[tuple[str, Observation]] = []
        for _ in range(count):
            task = self.tasks[self._next % len(self.tasks)]
            self._next += 1
            out.append((task.key, task.remote.next()))
        return out


class RawPlan:
    """Raw rows carrying the payloads our observations record, one per transaction.

    Its tasks get the same scripts as ours; their events are worked out here, before the clock,
    with the same pure functions, so each row's payload is byte for byte what we would append.
    """

    def __init__(self, tasks: Sequence[PlannedTask]) -> None:
        self.plan = ObservationPlan(tasks)
        self.states = {t.key: fold_task(t.key, t.setup) for t in tasks}
        self.versions = {t.key: len(t.setup) for t in tasks}
        self.types: dict[str, int] = {}
        self.rows = 0

    def take(self, count: int) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        rows: list[dict[str, Any]] = []
        for key, observation in self.plan.take(count):
            events = apply_observation(self.states[key], observation)
            for event in events:
                type_, data = event.TYPE, event.payload()
                self.states[key] = apply_task_event(self.states[key], type_, data)
                self.versions[key] += 1
                self.types[type_] = self.types.get(type_, 0) + 1
                self.rows += 1
                rows.append(
                    {
                        "stream_id": f"raw-{task_stream_id(key)}",
                        "version": self.versions[key],
                        "type": type_,
                        "schema_version": 1,
                        "payload": json.dumps(data, separators=(",", ":"), sort_keys=True),
                        "recorded_at": now,
                        "prev_hash": uuid.uuid4().hex * 2,
                        "hash": uuid.uuid4().hex * 2,
                    }
                )
        return rows


# -- part 1: observation application ---------------------------------------------------------------


def observe_each(engine: Engine) -> Callable[[list[tuple[str, Observation]]], int]:
    def work(observations: list[tuple[str, Observation]]) -> int:
        for key, observation in observations:
            engine.observing.apply(key, observation, None)
        return len(observations)

    return work


def raw_insert_each(engine: sa.Engine) -> Callable[[list[dict[str, Any]]], int]:
    insert = raw_events.insert()

    def work(rows: list[dict[str, Any]]) -> int:
        for row in rows:
            with engine.begin() as conn:
                conn.execute(insert, row)
        return len(rows)

    return work


def bench_observations(
    ctx: BenchContext, db: Database, store: EventStore, sizes: Sizes
) -> list[Figure]:
    runs = ctx.runs
    agent_url = "http://127.0.0.1:9999"
    moment = datetime(2025, 6, 1, 12, tzinfo=UTC)
    ours_tasks = [planned_task("observe", agent_url, moment) for _ in range(sizes.tasks)]
    raw_tasks = [planned_task("raw", agent_url, moment) for _ in range(sizes.tasks)]
    # Tasks that only ever see their last snapshot again: duplicates, which record nothing.
    still_tasks = [planned_task("still", agent_url, moment) for _ in range(sizes.tasks)]
    log = TaskLog(store)
    for task in ours_tasks + still_tasks:
        log.create(task.key, task.setup)
    duplicates = [
        (task.key, task.remote.last)
        for task in still_tasks * (sizes.observations // sizes.tasks + 1)
        if task.remote.last is not None
    ][: sizes.observations]

    with ExitStack() as stack:
        raw = raw_engine(db)
        stack.callback(raw.dispose)
        raw_metadata.create_all(raw)
        client = httpx.AsyncClient()
        # Never used for a request: _observe does no I/O beyond the store.
        stack.callback(lambda: asyncio.run(client.aclose()))
        engine = Engine(store, client)
        ctx.note(f"observe: our store {durability(store.engine)}; raw {durability(raw)}")

        ours_plan, raw_plan = ObservationPlan(ours_tasks), RawPlan(raw_tasks)
        # One round over every task first: each stream's head is then in the store's cache and
        # every raw stream key has rows, as in the steady state of a running engine.
        observe_each(engine)(ours_plan.take(sizes.tasks))
        raw_insert_each(raw)(raw_plan.take(sizes.tasks))
        raw_plan.types.clear()
        raw_plan.rows = 0
        before = store.last_position()

        ctx.progress("applying observations")
        rates = median_rates(
            {
                "raw": runs_of(
                    [raw_plan.take(sizes.observations) for _ in range(runs)], raw_insert_each(raw)
                ),
                "ours": runs_of(
                    [ours_plan.take(sizes.observations) for _ in range(runs)],
                    observe_each(engine),
                ),
                "duplicate": lambda: observe_each(engine)(duplicates),
            },
            runs,
        )
        # Same scripts, same pure functions: we appended exactly the rows the raw side inserted.
        appended = store.last_position() - before
        if appended != raw_plan.rows:
            raise AssertionError(f"we appended {appended} events, the raw side {raw_plan.rows}")
        mix = ", ".join(f"{n} {t}" for t, n in sorted(raw_plan.types.items()))
        ctx.note(f"observe: {sizes.tasks} tasks round-robin; events over the timed runs: {mix}")
        ctx.note(
            f"observe: {1e6 / rates['ours']:.0f} us per observation, raw insert+commit "
            f"{1e6 / rates['raw']:.0f} us per row; a poll reading back the applied snapshot "
            f"(duplicate: head read + decide, nothing written) {1e6 / rates['duplicate']:.0f} us"
        )

    figures = [
        Figure.compared(
            "Observing.apply: transition+guards+event+projection, 1 event/txn (vs raw insert)",
            rates["ours"],
            rates["raw"],
            "observations/s",
            OBSERVE_TARGET,
        )
    ]
    return figures + bench_machine(ctx, sizes)


def machine_sends(count: int) -> Workload:
    machine = machine_at("working")
    pairs = count // 2

    def work() -> int:
        send = machine.send
        for _ in range(pairs):
            send("to_input_required")
            send("to_working")
        return pairs * 2

    return work


def machine_restores(count: int) -> Workload:
    def work() -> int:
        for i in range(count):
            machine_at("working" if i % 2 else "input-required").send(
                "to_input_required" if i % 2 else "to_working"
            )
        return count

    return work


def legal_lookups(count: int) -> Workload:
    pairs = count // 2

    def work() -> int:
        legal = is_legal
        for _ in range(pairs):
            legal("working", "input-required")
            legal("input-required", "working")
        return pairs * 2

    return work


def bench_machine(ctx: BenchContext, sizes: Sizes) -> list[Figure]:
    ctx.progress("python-statemachine send vs is_legal")
    if not isinstance(machine_at("working"), TaskLifecycle):  # the declared machine, nothing else
        raise AssertionError("machine_at does not give a TaskLifecycle")
    rates = median_rates(
        {
            "is_legal": legal_lookups(sizes.lookups),
            "send": machine_sends(sizes.machine_sends),
            "restore": machine_restores(sizes.machine_sends // 2),
        },
        ctx.runs,
    )
    per_call = {name: 1e6 / rate for name, rate in rates.items()}
    ctx.note(
        "lifecycle: TaskLifecycle.send {send:.1f} us/call, machine_at+send {restore:.1f} us/call, "
        "is_legal {is_legal:.3f} us/call (the hot path uses is_legal only)".format(**per_call)
    )
    return [
        Figure.compared(
            "TaskLifecycle.send on a live machine (vs is_legal)",
            rates["send"],
            rates["is_legal"],
            "calls/s",
            None,
        ),
        Figure.compared(
            "machine_at(state) + send, per observation (vs is_legal)",
            rates["restore"],
            rates["is_legal"],
            "calls/s",
            None,
        ),
    ]


# -- parts 2 and 3: against a live agent -----------------------------------------------------------


@contextmanager
def sqlite_store(folder: Path, name: str) -> Iterator[EventStore]:
    store = EventStore.open(f"sqlite:///{folder / name}")
    try:
        yield store
    finally:
        store.close()


def engine_config(**overrides: Any) -> EngineConfig:
    return replace(
        EngineConfig(first_poll_interval=FIRST_POLL, max_poll_interval=MAX_POLL), **overrides
    )


class EngineDriver:
    """Tasks driven through ``ask`` by the engine, start to finish, one after another."""

    def __init__(self, engine: Engine, agent_url: str) -> None:
        self.engine = engine
        self.agent_url = agent_url

    async def start(self) -> str:
        view = await self.engine.start_task(self.agent_url, skill="ask", text="ask the answer?")
        return view.task

    async def one(self) -> None:
        key = await self.start()
        waiting = await self.engine.drive(key)
        if waiting.state != "input-required":
            raise AssertionError(f"engine: task {key} is {waiting.state}, not input-required")
        await self.engine.reply(key, "42")
        done = await self.engine.drive(key, until="terminal")
        if done.state != "completed" or not done.artifacts:
            raise AssertionError(f"engine: task {key} ended {done.state}, {done.artifacts}")

    async def run(self, count: int) -> int:
        for _ in range(count):
            await self.one()
        return count

    async def one_file(self, document: File) -> None:
        view = await self.engine.start_task(
            self.agent_url, skill="echo", text=FILE_TEXT, parts=[document]
        )
        done = await self.engine.drive(view.task, until="terminal")
        if done.state != "completed" or not done.artifacts:
            raise AssertionError(f"engine: task {view.task} ended {done.state}, {done.artifacts}")

    async def run_files(self, count: int, document: File) -> int:
        for _ in range(count):
            await self.one_file(document)
        return count


_INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED
_COMPLETED = TaskState.TASK_STATE_COMPLETED
_STATE_NAMES = {
    TaskState.TASK_STATE_SUBMITTED: "submitted",
    TaskState.TASK_STATE_WORKING: "working",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input-required",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth-required",
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_REJECTED: "rejected",
}


def _state(task: A2ATask) -> str:
    return _STATE_NAMES.get(task.status.state, "unknown")


class BareDriver:
    """The same calls with the a2a-sdk 1.3 client: no card read per task, nothing persisted.

    Polls like ``Engine.drive``: at once, then after ``FIRST_POLL`` doubling up to ``MAX_POLL``.
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    async def send(
        self,
        text: str,
        context_id: str,
        task_id: str | None = None,
        *,
        skill: str = "ask",
        more: Sequence[Part] = (),
    ) -> A2ATask:
        message = Message(
            message_id=f"m-{uuid.uuid4().hex}",
            role=Role.ROLE_USER,
            parts=[Part(text=text, media_type="text/plain"), *more],
            context_id=context_id,
            task_id=task_id or "",
        )
        message.metadata.update({"skillId": skill})
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        answer: A2ATask | None = None
        async for response in self.client.send_message(request):
            if response.HasField("task"):
                answer = response.task
        if answer is None:
            raise AssertionError("bare: SendMessage answered without a task")
        return answer

    async def follow(self, task: A2ATask, until: str) -> A2ATask:
        delay = FIRST_POLL
        while not reached(_state(task), until):
            task = await self.client.get_task(GetTaskRequest(id=task.id, history_length=0))
            if reached(_state(task), until):
                break
            await asyncio.sleep(min(delay, MAX_POLL))
            delay = min(delay * 2, MAX_POLL)
        return task

    async def one(self) -> None:
        task = await self.send("ask the answer?", f"c-{uuid.uuid4().hex}")
        task = await self.follow(task, "interrupted")
        if task.status.state != _INPUT_REQUIRED:
            raise AssertionError(f"bare: task {task.id} is {_state(task)}, not input-required")
        await self.send("42", task.context_id, task.id)
        task = await self.follow(task, "terminal")
        if task.status.state != _COMPLETED or not task.artifacts:
            raise AssertionError(f"bare: task {task.id} ended {_state(task)}")

    async def run(self, count: int) -> int:
        for _ in range(count):
            await self.one()
        return count

    async def one_file(self, document: Part) -> None:
        task = await self.send(FILE_TEXT, f"c-{uuid.uuid4().hex}", skill="echo", more=[document])
        task = await self.follow(task, "terminal")
        if task.status.state != _COMPLETED or not task.artifacts:
            raise AssertionError(f"bare: task {task.id} ended {_state(task)}")

    async def run_files(self, count: int, document: Part) -> int:
        for _ in range(count):
            await self.one_file(document)
        return count


def _per_task(calls: Sequence[tuple[str, str]], tasks: int) -> str:
    methods = sorted({method for _, method in calls})
    return ", ".join(
        f"{sum(1 for _, m in calls if m == method) / tasks:.2f} {method}" for method in methods
    )


def bench_end_to_end(
    ctx: BenchContext, peer: Peer, folder: Path, runner: asyncio.Runner, sizes: Sizes
) -> Figure:
    count = sizes.e2e_tasks
    with ExitStack() as stack:
        store = stack.enter_context(sqlite_store(folder, "e2e.db"))
        engine_http = httpx.AsyncClient()
        stack.callback(lambda: runner.run(engine_http.aclose()))
        engine = Engine(store, engine_http, engine_config())
        stack.callback(lambda: runner.run(engine.settle()))
        bare_http = httpx.AsyncClient(headers={"A2A-Version": "1.0"})
        stack.callback(lambda: runner.run(bare_http.aclose()))
        config = ClientConfig(streaming=False, polling=True, httpx_client=bare_http)
        bare_client = ClientFactory(config).create(peer.agent_card)
        ours, bare = EngineDriver(engine, peer.base_url), BareDriver(bare_client)

        # Warm up both: connections, the agent's stream and contract pin, imports, caches.
        runner.run(ours.run(min(count, 5)))
        runner.run(bare.run(min(count, 5)))

        calls: dict[str, list[tuple[str, str]]] = {"ours": [], "bare": []}

        def counted(name: str, driver: EngineDriver | BareDriver) -> Workload:
            def work() -> int:
                mark = len(peer.calls)
                done = runner.run(driver.run(count))
                calls[name] += peer.calls[mark:]
                return done

            return work

        ctx.progress(f"driving {count} tasks end to end, engine and bare client")
        workloads = {"bare": counted("bare", bare), "ours": counted("ours", ours)}
        rates = median_rates(workloads, ctx.runs)
        tasks = count * ctx.runs
        ctx.note(
            f"end to end, A2A calls per task: engine {_per_task(calls['ours'], tasks)}; "
            f"bare client {_per_task(calls['bare'], tasks)} (GetTask counts differ with timing: "
            "each extra poll is one more backoff sleep)"
        )
    return Figure.compared(
        f"end to end ask->reply->completed, {count} tasks in sequence (vs a2a-sdk client)",
        rates["ours"],
        rates["bare"],
        "tasks/s",
        E2E_TARGET,
    )


def _echo_takes_files(card: dict[str, Any]) -> None:
    """The card with ``echo`` taking a PDF beside its text (R2 checks every part)."""
    for skill in card["skills"]:
        if skill["id"] == "echo":
            skill["inputModes"] = [*skill.get("inputModes", []), FILE_TYPE]


def bench_file_part(
    ctx: BenchContext, peer: Peer, folder: Path, runner: asyncio.Runner, sizes: Sizes
) -> Figure:
    count = sizes.file_tasks
    content = os.urandom(sizes.file_bytes)  # as incompressible as a PDF's streams
    size = _binary_size(sizes.file_bytes)
    peer.mutate_card(_echo_takes_files)
    document = File(data=content, filename=FILE_NAME, media_type=FILE_TYPE)
    bare_document = Part(raw=content, filename=FILE_NAME, media_type=FILE_TYPE)
    with ExitStack() as stack:
        store = stack.enter_context(sqlite_store(folder, "file.db"))
        engine_http = httpx.AsyncClient()
        stack.callback(lambda: runner.run(engine_http.aclose()))
        engine = Engine(store, engine_http, engine_config())
        stack.callback(lambda: runner.run(engine.settle()))
        bare_http = httpx.AsyncClient(headers={"A2A-Version": "1.0"})
        stack.callback(lambda: runner.run(bare_http.aclose()))
        config = ClientConfig(streaming=False, polling=True, httpx_client=bare_http)
        ours = EngineDriver(engine, peer.base_url)
        bare = BareDriver(ClientFactory(config).create(peer.agent_card))

        runner.run(ours.run_files(min(count, 3), document))  # warm up both
        runner.run(bare.run_files(min(count, 3), bare_document))
        ctx.progress(f"sending {count} tasks with a {size} file part, engine and bare client")
        rates = median_rates(
            {
                "bare": lambda: runner.run(bare.run_files(count, bare_document)),
                "ours": lambda: runner.run(ours.run_files(count, document)),
            },
            ctx.runs,
        )
    per_task = {name: 1e3 / rate for name, rate in rates.items()}
    ctx.note(
        f"file part: {count} tasks a run, each a text and a {size} {FILE_TYPE} file to echo; "
        f"engine {per_task['ours']:.1f} ms a task, bare client {per_task['bare']:.1f} ms"
    )
    return Figure.compared(
        f"task with a {size} file part, {count} tasks in sequence (vs a2a-sdk client)",
        rates["ours"],
        rates["bare"],
        "tasks/s",
        FILE_TARGET,
    )


def _binary_size(count: int) -> str:
    return f"{count >> 20} MiB" if count % (1 << 20) == 0 else f"{count >> 10} KiB"


def _budget(name: str, value: float, budget: float) -> Figure:
    return Figure(name, value, "requests/task", None, None, budget)


def bench_card_requests(
    ctx: BenchContext, peer: Peer, folder: Path, runner: asyncio.Runner, sizes: Sizes
) -> list[Figure]:
    count = sizes.card_tasks
    with ExitStack() as stack:
        store = stack.enter_context(sqlite_store(folder, "cards.db"))
        http = httpx.AsyncClient()
        stack.callback(lambda: runner.run(http.aclose()))
        engine = Engine(store, http, engine_config())
        stack.callback(lambda: runner.run(engine.settle()))
        driver = EngineDriver(engine, peer.base_url)
        ctx.progress("counting card requests")

        mark = peer.card_requests
        keys = [runner.run(driver.start()) for _ in range(count)]
        at_creation = peer.card_requests - mark

        for key in keys:  # to input-required, the state webhooks get registered in
            runner.run(engine.drive(key))
        mark = peer.card_requests
        for key in keys:
            for _ in range(sizes.polls):
                runner.run(engine.poll(key))
        runner.run(engine.settle())
        on_polls = peer.card_requests - mark

        mark = peer.card_requests
        outcomes = [runner.run(engine.register_webhook(key, DUMMY_HOOK)) for key in keys]
        runner.run(engine.settle())
        at_registration = peer.card_requests - mark
        if not all(outcome.registered for outcome in outcomes):
            reasons = {outcome.reason for outcome in outcomes}
            raise AssertionError(f"webhook registration refused: {reasons}")
        revalidation = r7_revalidation(peer, folder, runner)

    figures = [
        _budget("card GETs at creation (start_task)", at_creation / count, CREATION_BUDGET),
        _budget("card GETs per webhook registration", at_registration / count, WEBHOOK_BUDGET),
        _budget(
            f"card GETs on the poll path (Engine.poll x{sizes.polls}/task)",
            on_polls / count,
            POLL_BUDGET,
        ),
    ]
    verdicts = [f"{f.name}: {f.value:g} (budget {f.target:g}) {_within(f)}" for f in figures]
    ctx.note("card requests: " + "; ".join(verdicts) + f". {revalidation}")
    return figures


def _within(figure: Figure) -> str:
    return "ok" if figure.target is not None and figure.value <= figure.target else "OVER"


def r7_revalidation(peer: Peer, folder: Path, runner: asyncio.Runner) -> str:
    """Drive one ``slow`` task under a short ``max_card_age``: card reads stay off the poll path,
    at most one per ``max_card_age`` of driving (R7). Returns a sentence for the notes."""
    max_card_age, seconds = 0.1, 0.5
    with sqlite_store(folder, "r7.db") as store:
        http = httpx.AsyncClient()
        engine = Engine(store, http, engine_config(max_card_age=max_card_age))
        try:
            view = runner.run(engine.start_task(peer.base_url, skill="slow", text=f"{seconds}"))
            mark, polls = peer.card_requests, len(peer.calls)
            started = time.perf_counter()
            done = runner.run(engine.drive(view.task, until="terminal"))
            elapsed = time.perf_counter() - started
            runner.run(engine.settle())  # a re-validation spawned last may still be on the wire
            reads = peer.card_requests - mark
            gets = sum(1 for _, m in peer.calls[polls:] if m == "GetTask")
        finally:
            runner.run(http.aclose())
    bound = int(elapsed / max_card_age)  # drive spawns one each time max_card_age has passed
    verdict = "ok" if reads <= bound and done.state == "completed" else "OVER"
    return (
        f"R7: one {seconds:g} s task driven with max_card_age={max_card_age:g} s: {reads} card "
        f"GETs over {gets} GetTask polls in {elapsed:.2f} s (bound {bound}) {verdict}"
    )


# -- part 4: replay --------------------------------------------------------------------------------


def realistic_stream(key: str, agent_url: str, length: int) -> list[Event]:
    """``length`` events as a task followed by polling records them: submitted, bound, then
    rounds of question (StateChanged), a status touched in the same state (ObservationIgnored),
    ReplySent, back to work with an artifact, touched again, and completed at the end."""
    remote = RemoteTaskScript(datetime(2025, 6, 1, 12, tzinfo=UTC))
    events = [submitted_event(key, agent_url)]
    state = fold_task(key, events)

    def add(new: list[Event]) -> None:
        nonlocal state
        for event in new:
            if len(events) < length - 1:
                events.append(event)
                state = apply_task_event(state, event.TYPE, event.payload())

    add(apply_observation(state, remote.snapshot("working")))
    round_ = 0
    while len(events) < length - 1:
        round_ += 1
        add(apply_observation(state, remote.snapshot("input-required")))
        add(apply_observation(state, remote.again()))
        add([ev.ReplySent(message_id=f"m-{uuid.uuid4().hex}", chars=2)])
        artifact = ArtifactRecord(
            str(uuid.uuid4()), "answer", ({"kind": "text", "text": f"answer: {round_}"},)
        )
        add(apply_observation(state, remote.snapshot("working", artifacts=(artifact,))))
        add(apply_observation(state, remote.again()))
    events.extend(apply_observation(state, remote.snapshot("completed"))[:1])
    return events


def replay_streams(store: EventStore, stream_ids: list[str]) -> Workload:
    def work() -> int:
        count = 0
        for stream_id in stream_ids:
            logged: list[RecordedEvent] = store.read_stream(stream_id)
            replay(stream_id, logged)
            count += len(logged)
        return count

    return work


def es_reconstruct(app: Application[UUID], ids: list[UUID]) -> Workload:
    def work() -> int:
        count = 0
        for aggregate_id in ids:
            count += app.repository.get(aggregate_id).version
        return count

    return work


def es_aggregates(app: Application[UUID], count: int, length: int) -> list[UUID]:
    ids: list[UUID] = []
    for _ in range(count):
        aggregate = BenchTask()  # its Created event is the first of ``length``
        for version in range(2, length + 1):
            aggregate.change_state(**es_command_args(version))
        app.save(aggregate)
        ids.append(aggregate.id)
    return ids


def bench_replay(ctx: BenchContext, db: Database, store: EventStore, sizes: Sizes) -> Figure:
    length = sizes.stream_length
    stream_ids: list[str] = []
    types: dict[str, int] = {}
    sizes_seen: list[int] = []
    for _ in range(sizes.replay_streams):
        key = f"replay-{uuid.uuid4().hex}"
        events = realistic_stream(key, "http://127.0.0.1:9999", length)
        if len(events) != length:
            raise AssertionError(f"built a stream of {len(events)} events, not {length}")
        state = fold_task(key, events)
        stream_id = task_stream_id(key)
        store.append(
            stream_id,
            0,
            [NewEvent(event.TYPE, event.payload()) for event in events],
            projection=projection_of(state),
        )
        stream_ids.append(stream_id)
        for event in events:
            types[event.TYPE] = types.get(event.TYPE, 0) + 1
            sizes_seen.append(len(json.dumps(event.payload(), separators=(",", ":"))))
    # The replay must reproduce what was stored, or it is not the audit's replay.
    head = store.stream(stream_ids[0])
    if head is None or replay(stream_ids[0], store.read_stream(stream_ids[0])) != head.state:
        raise AssertionError("replay does not reproduce the stored projection")
    if head.state["state"] not in TERMINAL:
        raise AssertionError(f"replayed stream ends {head.state['state']}, not terminal")

    with ExitStack() as stack:
        stack.enter_context(eventsourcing_sqlite_synchronous_normal())
        app: Application[UUID] = BenchApp(env=db.eventsourcing_env)
        stack.callback(app.close)
        ctx.note(f"replay: eventsourcing {eventsourcing_sqlite_pragmas(app)}")
        ids = es_aggregates(app, sizes.replay_streams, length)
        ctx.progress("replaying streams")
        rates = median_rates(
            {
                "eventsourcing": es_reconstruct(app, ids),
                "ours": replay_streams(store, stream_ids),
            },
            ctx.runs,
        )
    mix = ", ".join(f"{n} {t}" for t, n in sorted(types.items()))
    mean = sum(sizes_seen) / len(sizes_seen)
    ctx.note(
        f"replay: {sizes.replay_streams} streams x {length} events ({mix}; mean payload "
        f"{mean:.0f} bytes) vs as many eventsourcing aggregates of {length} events"
    )
    return Figure.compared(
        f"replay: read_stream + audit.replay, {length}-event task streams (vs eventsourcing get)",
        rates["ours"],
        rates["eventsourcing"],
        "events/s",
        REPLAY_TARGET,
    )


# -- part 6: updates across processes -------------------------------------------------------------


@contextmanager
def appender(url: str, count: int, log: Path) -> Iterator[subprocess.Popen[str]]:
    """Part 6's helper process (stderr to ``log``), stopped by its pid if still running."""
    root = str(HERE.parents[1])  # the child imports the cardfence this process does
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    args = [sys.executable, str(HERE), "appender", url, str(count)]
    with log.open("w") as err:
        child = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        try:
            yield child
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


def _said(child: subprocess.Popen[str], log: Path) -> dict[str, int]:
    """The helper's next line on stdout (blocking; call it off the event loop)."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the appender ended early (exit {child.wait()}): see {log}")
    said: dict[str, int] = json.loads(line)
    return said


async def update_delays(url: str, count: int, log: Path) -> list[float]:
    """Seconds from each update's ``recorded_at`` (in the helper) to its delivery here."""
    # This engine opens (and migrates) the file before the helper does.
    async with Engine.connect(url) as engine, contextlib.AsyncExitStack() as stack:
        child = stack.enter_context(appender(url, count, log))
        assert child.stdin is not None
        after = (await asyncio.to_thread(_said, child, log))["ready"]
        delays: list[float] = []
        positions: list[int] = []

        async def consume() -> None:
            async with contextlib.aclosing(engine.updates(after=after)) as updates:
                async for update in updates:
                    delivered = datetime.now(UTC)
                    recorded = update.task.updated_at
                    if recorded is None:
                        raise AssertionError(f"update {update.position} has no recorded_at")
                    delays.append((delivered - recorded).total_seconds())
                    positions.append(update.position)

        consumer = asyncio.create_task(consume())
        stack.push_async_callback(_cancelled, consumer)
        await asyncio.sleep(0.3)  # the iterator is tailing the log before the first append
        child.stdin.write("go\n")
        child.stdin.flush()
        done = await asyncio.to_thread(_said, child, log)
        # Every append is made by now: waking up to look costs the measured updates nothing.
        async with asyncio.timeout(60):
            while not positions or positions[-1] < done["last"]:
                if consumer.done():
                    consumer.result()  # its error, if it failed
                    raise AssertionError("the updates ended")
                await asyncio.sleep(0.01)
        if len(delays) != done["events"]:
            raise AssertionError(f"{len(delays)} updates delivered, {done['events']} recorded")
    return delays


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _percentile(values: Sequence[float], percent: int) -> float:
    if len(values) < 2:
        raise AssertionError(f"{len(values)} delays: too few for percentiles")
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def bench_updates(
    ctx: BenchContext, folder: Path, runner: asyncio.Runner, sizes: Sizes
) -> list[Figure]:
    count = sizes.update_tasks
    ctx.progress(f"awaiting the updates of {count} tasks driven by another process")
    url = f"sqlite:///{folder / 'updates.db'}"
    delays = runner.run(update_delays(url, count, folder / "appender.log"))
    ms = sorted(delay * 1e3 for delay in delays)
    p50, p99 = _percentile(ms, 50), _percentile(ms, 99)
    ctx.note(
        f"updates: {len(ms)} updates of {count} echo tasks appended by another process; "
        f"delivered {ms[0]:.1f} / {p50:.1f} / {p99:.1f} / {ms[-1]:.1f} ms after they were "
        f"recorded (min / p50 / p99 / max); the iterator reads again {UPDATES_POLL * 1e3:.0f} "
        "ms after it has read all there is"
    )
    name = "engine.updates: recorded by another process -> delivered"
    return [Figure(f"{name}, p50", p50, "ms"), Figure(f"{name}, p99", p99, "ms")]


async def _append(url: str, count: int) -> None:
    """Part 6's helper: drives ``count`` echo tasks once this process's stdin says go."""
    peer = Peer()
    peer.start()
    try:
        async with Engine.connect(url, config=engine_config()) as engine:

            async def one() -> None:
                view = await engine.start_task(peer.base_url, skill="echo", text="echo the answer")
                done = await engine.drive(view.task, until="terminal")
                if done.state != "completed":
                    raise AssertionError(f"appender: task {view.task} ended {done.state}")

            for _ in range(3):  # warm up: connections, the agent's stream, caches
                await one()
            await engine.settle()
            ready = await asyncio.to_thread(engine.store.last_position)
            _say(ready=ready)
            await asyncio.to_thread(sys.stdin.readline)
            for _ in range(count):
                await one()
            await engine.settle()
            recorded = await asyncio.to_thread(engine.store.read_all, ready, 1_000_000)
            tasks = [e.position for e in recorded if e.stream_id.startswith(ev.TASK_STREAM_PREFIX)]
            _say(last=max(tasks), events=len(tasks))
    finally:
        peer.stop()


def _say(**said: int) -> None:
    print(json.dumps(said), flush=True)


# -- the section -----------------------------------------------------------------------------------


@register("engine")
def engine_section(ctx: BenchContext) -> list[Figure]:
    """Observations, end to end, a file part, card requests and replay, each beside its
    baseline; the updates' delay across processes."""
    sizes = Sizes.for_context(ctx)
    if ctx.pg_url:
        ctx.note("the engine section runs on SQLite only: --pg-url is not used")
    figures: list[Figure] = []
    with sqlite_database() as db, ExitStack() as stack:
        ctx.progress("setting up")
        store = EventStore.open(db.url)
        stack.callback(store.close)
        figures += bench_observations(ctx, db, store, sizes)

        peer = Peer()
        peer.start()
        stack.callback(peer.stop)
        runner = stack.enter_context(asyncio.Runner())
        folder = Path(str(db.url.database)).parent
        figures.append(bench_end_to_end(ctx, peer, folder, runner, sizes))
        figures.append(bench_file_part(ctx, peer, folder, runner, sizes))
        figures += bench_card_requests(ctx, peer, folder, runner, sizes)
        figures.append(bench_replay(ctx, db, store, sizes))
        figures += bench_updates(ctx, folder, runner, sizes)
    return figures


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "appender":
    asyncio.run(_append(sys.argv[2], int(sys.argv[3])))
    sys.exit(0)
