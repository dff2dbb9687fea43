"""Crash consistency (R9, R10, R13; docs/cli.md `run`, "Crash safety"), on SQLite and PostgreSQL.

The engine runs in a child process (``tests/support/crash_driver.py``) that starts and drives
tasks against a real a2a-sdk agent (:class:`support.Peer`, in this process, so it outlives the
child), and is killed with SIGKILL. Then, here, the store is reopened and:

- the log is sound: the audit is clean (chains verify, replay equals projection, snapshots
  present) and, checked directly, no event is half-written or duplicated — every stream's versions
  are 1..n in position order, positions and hashes are unique, every head row has its events and
  its version, every task stream starts with one ``TaskSubmitted``, its ``StateChanged`` events
  form one unbroken path and it is bound to at most one remote task;
- ``resume`` then drives every task to the state the REMOTE reports (GetTask on the agent): tasks
  recorded but never sent are sent by resume, tasks sent but not recorded are found through
  ``ListTasks`` on their context — never sent twice: every context holds exactly one remote task,
  and every remote task the child created belongs to a recorded task;
- the audit is clean again afterwards.

Three kinds of test:

- seeded random kills (:func:`test_sigkill_at_random_points_then_resume_reaches_the_remote_end`):
  run i aims at the kind of point ``KILL_POINTS[i]`` (anywhere in the first second after start-up
  — migration included —, between ``TaskSubmitted`` and the send, between the answer and its
  record, inside an append's open transaction, mid-drive, around a reply, inside discovery, with
  the send in flight) at a seeded occurrence, then waits a seeded delay: under 3 ms (the child
  stands still after each probe line, so the kill lands right there) or up to 50 ms (anywhere
  after it);
- deterministic SIGKILLs (:func:`test_sigkill_held_at_one_point`): the child stands still for
  good at one named point and is killed there;
- in-process crashes where that is cleaner: the transport is patched to "die" (a
  ``BaseException`` nothing catches) just before or just after the agent received a message.
  Two of them pin bugs this file found (fixed): a resume that trusted a stale input-required,
  and a task rebound through ListTasks without its artifacts.

``CI=true`` or ``CARDFENCE_HYPOTHESIS=ci`` runs 10 random kills per database instead of 6;
``CARDFENCE_CRASH_RUNS=N`` runs N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.crash_driver import PAUSE  # how long the child stands still after each probe line
from support.engine_fixtures import FAST, calls, data_of, types

import cardfence.migrations as migrations
from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.client.audit import AuditReport, audit
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import RemoteTask
from cardfence.engine.core.lifecycle import TERMINAL
from cardfence.engine.core.views import TaskView
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.event_store import EventStore, iter_all
from cardfence.store.records import RecordedEvent

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "support" / "crash_driver.py"

THOROUGH = os.environ.get("CI") == "true" or os.environ.get("CARDFENCE_HYPOTHESIS") == "ci"

# Where a random run aims its kill: (probe, highest occurrence to aim at), in the order the runs
# take them (run i aims at KILL_POINTS[i % len]); the first six are the default runs.
KILL_POINTS: tuple[tuple[str, int], ...] = (
    ("boot", 1),  # 0-1.2 s after start-up: migration, discovery, the first tasks, anywhere
    ("submitted", 5),  # TaskSubmitted committed, SendMessage not yet sent
    ("answered", 5),  # the agent answered, the answer is not recorded
    ("in-append", 40),  # inside an append's transaction, events inserted, not committed
    ("polled", 20),  # mid-drive: GetTask answered, not recorded
    ("reply-answered", 1),  # the reply reached the agent, its answer is not recorded
    ("card-fetched", 5),  # inside discovery: the card is read, not yet recorded
    ("send", 5),  # SendMessage about to leave / in flight
    ("poll", 20),  # mid-drive: GetTask in flight
    ("reply-send", 1),  # ReplySent committed, the reply about to leave
)
# Random runs per database; CARDFENCE_CRASH_RUNS=N for a long hunt.
RUNS = int(os.environ.get("CARDFENCE_CRASH_RUNS", "10" if THOROUGH else "6"))
TASKS_PER_CHILD = 40  # more than a child gets through before its kill
AIM_TIMEOUT = 6.0  # a random kill aimed at a point not reached by then lands wherever it is
HOLD_TIMEOUT = 30.0  # a child holding at a point never gets past it: wait for it that long
CONCLUDE = 15.0  # seconds for resume to take one task to its end


# -- fixtures -------------------------------------------------------------------------------------


# -- the child and its kill ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KillPlan:
    """Kill the child ``delay`` seconds after its ``at``-th ``probe`` line."""

    seed: int
    probe: str
    at: int
    delay: float
    prefix: str = ""  # the line's second word must start with it (e.g. "task:" for in-append)

    def aims_at(self, line: str) -> bool:
        words = line.split()
        if not words or words[0] != self.probe:
            return False
        return not self.prefix or (len(words) > 1 and words[1].startswith(self.prefix))

    @classmethod
    def random(cls, run: int) -> KillPlan:
        rng = random.Random(f"cardfence-crash-{run}")
        probe, most = KILL_POINTS[run % len(KILL_POINTS)]
        if probe == "boot":
            return cls(run, probe, 1, rng.uniform(0, 1.2))
        at = rng.randint(1, most)
        # Mostly right at the point (the child stands still PAUSE seconds), else anywhere after.
        delay = rng.uniform(0, PAUSE * 0.7) if rng.random() < 0.6 else rng.uniform(0, 0.05)
        return cls(run, probe, at, delay)

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.delay * 1000:.1f} ms after {self.probe} #{self.at}"


@dataclass(slots=True)
class Crash:
    """What the child printed before it died, and how it ended."""

    plan: KillPlan
    lines: list[str]
    returncode: int
    stderr: str
    aimed: bool  # the kill followed the line it aimed at (not the timeout)

    @property
    def last(self) -> str:
        return self.lines[-1] if self.lines else "<nothing printed>"

    def describe(self) -> str:
        tail = "\n    ".join(self.lines[-6:])
        return (
            f"{self.plan}; exit {self.returncode}; last lines:\n    {tail}\n{self.stderr[-2000:]}"
        )


def run_and_kill(
    store_url: str,
    agent_url: str,
    plan: KillPlan,
    *,
    tasks: int = TASKS_PER_CHILD,
    options: tuple[str, ...] = (),
    aim_timeout: float = AIM_TIMEOUT,
) -> Crash:
    """Start the driver, SIGKILL it as ``plan`` says, wait for it to end."""
    command = [sys.executable, str(DRIVER), store_url, agent_url, str(tasks), str(plan.seed)]
    lines: list[str] = []
    aimed_line, ended = threading.Event(), threading.Event()
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(
            [*command, *options], cwd=ROOT, stdout=subprocess.PIPE, stderr=errors, text=True
        )
        assert child.stdout is not None
        stdout = child.stdout

        def follow() -> None:
            seen = 0
            for line in stdout:
                lines.append(line.rstrip("\n"))
                if plan.aims_at(line):
                    seen += 1
                    if seen == plan.at:
                        aimed_line.set()
            ended.set()

        reader = threading.Thread(target=follow, name="crash-child-stdout", daemon=True)
        reader.start()
        try:
            aimed = aimed_line.wait(aim_timeout)
            if aimed:
                ended.wait(plan.delay)  # a child that ends meanwhile is not waited for
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            returncode = child.wait(10)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(10)
            reader.join(10)
            stdout.close()
        errors.seek(0)
        stderr = errors.read()
    return Crash(plan, lines, returncode, stderr, aimed)


def assert_killed(crash: Crash) -> None:
    assert crash.returncode == -signal.SIGKILL, "the child did not die of SIGKILL: " + (
        crash.describe()
    )


# -- the log, read directly -----------------------------------------------------------------------


def audit_failures(report: AuditReport) -> str:
    return "; ".join(f"{v.stream}@{v.position} {v.kind}: {v.detail}" for v in report.violations)


def assert_log_sound(store: EventStore) -> AuditReport:
    """The audit is clean, and nothing is half-written or duplicated (checked directly)."""
    report = audit(store)
    assert report.ok, "audit found: " + audit_failures(report)
    logged = list(iter_all(store))
    positions = [e.position for e in logged]
    assert positions == sorted(set(positions)), "global positions repeat or go backwards"
    assert len({e.hash for e in logged}) == len(logged), "two events share a hash"
    assert len({(e.stream_id, e.version) for e in logged}) == len(logged), "a version repeats"
    by_stream: dict[str, list[RecordedEvent]] = defaultdict(list)
    for event in logged:  # in position order
        by_stream[event.stream_id].append(event)
    assert set(by_stream) == set(store.stream_ids()), "a head row without events, or the reverse"
    for stream_id, stream in by_stream.items():
        versions = [e.version for e in stream]
        assert versions == list(range(1, len(stream) + 1)), (
            f"{stream_id}: versions in position order are {versions}, not 1..{len(stream)}"
        )
        head = store.stream(stream_id)
        assert head is not None
        assert head.version == len(stream), f"{stream_id}: head at {head.version}/{len(stream)}"
        assert [e.position for e in store.read_stream(stream_id)] == [e.position for e in stream]
        for event in stream:
            assert isinstance(event.data, dict)  # the payload is whole JSON
        if stream_id.startswith(ev.TASK_STREAM_PREFIX):
            assert_task_history(stream_id, stream)
    return report


def assert_task_history(stream_id: str, stream: list[RecordedEvent]) -> None:
    """One ``TaskSubmitted`` first; the ``StateChanged`` events one unbroken path; one binding."""
    kinds = [e.type for e in stream]
    assert kinds[0] == ev.TASK_SUBMITTED, f"{stream_id} starts with {kinds[0]}"
    assert kinds.count(ev.TASK_SUBMITTED) == 1, f"{stream_id}: TaskSubmitted repeated"
    state = "submitted"
    for event in stream:
        if event.type != ev.STATE_CHANGED:
            continue
        data = event.data
        assert data["from"] == state, f"{stream_id}@{event.version}: {data} follows {state}"
        assert data["to"] != state, f"{stream_id}@{event.version}: same-state {data}"
        assert state not in TERMINAL, f"{stream_id}@{event.version}: out of terminal {state}"
        state = data["to"]
    bindings = [e.data["remote_task_id"] for e in stream if e.data.get("remote_task_id")]
    assert len(bindings) <= 1, f"{stream_id} bound to remote tasks {bindings}"
    artifacts = [e.data["artifact_id"] for e in stream if e.type == ev.ARTIFACT_RECEIVED]
    assert len(artifacts) == len(set(artifacts)), f"{stream_id}: artifact recorded twice"


# -- the remote, read directly --------------------------------------------------------------------


def remote_contexts(peer: Peer) -> dict[str, str]:
    """Every task the agent holds: remote task id -> context id (its in-memory task store)."""
    store: Any = peer.handler.task_store  # an InMemoryTaskStore
    impl = store._impl
    with impl.lock:
        return {t.id: t.context_id for owned in impl.tasks.values() for t in owned.values()}


def agent_transport(engine: Engine, peer: Peer) -> A2ATransport:
    return A2ATransport(engine.client, Interface(peer.jsonrpc_url, JSONRPC, "1.0"))


async def remote_reaches(agent: A2ATransport, task_id: str, state: str) -> RemoteTask:
    """GetTask on the agent until the task is in ``state``."""
    deadline = time.monotonic() + CONCLUDE
    while (task := await agent.get_task(task_id)).state != state:
        assert time.monotonic() < deadline, f"remote task {task_id} still {task.state}"
        await asyncio.sleep(0.01)
    return task


# -- recovery -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Recovery:
    tasks: int = 0
    unbound: int = 0  # no remote id recorded at the crash
    never_sent: int = 0  # ... and the agent had no task in the context: resume had to send it
    replied: int = 0  # replies sent here, after the restart
    rebound_ended: int = 0  # found through ListTasks already ended (artifacts fetched)
    final: Counter[str] = field(default_factory=Counter)


async def conclude(engine: Engine, key: str) -> TaskView:
    """What `cardfence resume` and an orchestrator do: reconcile, observe, answer, drive."""
    view = await engine.resume(key)
    if view.state in TERMINAL:
        return view
    view = await engine.poll(key)  # the record may be stale: ask the agent where it is
    for _ in range(3):
        view = await engine.drive(key, until="interrupted", timeout=CONCLUDE)
        if view.state in TERMINAL:
            return view
        view = await engine.reply(key, "42")
    raise AssertionError(f"task {key} still {view.state} after three replies")


async def recover(db_url: str, peer: Peer, known_before: set[str]) -> Recovery:
    """Reopen the store, check it, resume every task to the remote's end, check again."""
    outcome = Recovery()
    async with Engine.connect(db_url, config=FAST) as engine:
        assert_log_sound(engine.store)
        agent = agent_transport(engine, peer)
        views = await engine.tasks()
        outcome.tasks = len(views)
        bound_at_crash = {v.task for v in views if v.remote_task_id}
        contexts = {}
        for view in views:
            context = engine.log.head(view.task).state["context_id"]
            contexts[view.task] = context
            if view.remote_task_id is None:
                outcome.unbound += 1
                found = await agent.list_tasks(context_id=context)
                assert len(found) <= 1, f"{len(found)} remote tasks in one context"
                outcome.never_sent += not found

        for view in views:
            replies = len(data_of(engine.store, view.task, ev.REPLY_SENT))
            done = await conclude(engine, view.task)
            outcome.replied += len(data_of(engine.store, view.task, ev.REPLY_SENT)) - replies
            assert done.remote_task_id is not None
            listed = await agent.list_tasks(context_id=contexts[view.task])
            assert [t.id for t in listed] == [done.remote_task_id], (
                f"task {view.task}: the agent holds {[t.id for t in listed]} in its context"
            )
            remote = await agent.get_task(done.remote_task_id)
            assert done.state == remote.state, f"{view.task}: {done.state}, remote {remote.state}"
            assert remote.state == "completed"  # every script of the mix completes
            if view.task not in bound_at_crash and bound_already_ended(engine.store, view.task):
                outcome.rebound_ended += 1
            assert_same_artifacts(done, remote)
            outcome.final[done.state] += 1

        created = {
            task_id: context
            for task_id, context in remote_contexts(peer).items()
            if task_id not in known_before
        }
        per_context = Counter(created.values())
        assert set(per_context) <= set(contexts.values()), "a remote task no recorded task owns"
        assert all(n == 1 for n in per_context.values()), f"duplicated: {per_context}"
        assert set(per_context) == set(contexts.values()), "a recorded task the agent never got"
        await engine.settle()
        assert_log_sound(engine.store)
    return outcome


def bound_already_ended(store: EventStore, key: str) -> bool:
    """Whether the event that bound the task's remote id took it to a terminal state."""
    for event in store.read_stream(task_stream_id(key)):
        data = event.data
        if data.get("remote_task_id"):
            return event.type == ev.STATE_CHANGED and data["to"] in TERMINAL
    return False


def assert_same_artifacts(done: TaskView, remote: RemoteTask) -> None:
    local = sorted((a["artifact_id"], a["name"]) for a in done.artifacts)
    assert local == sorted((a.artifact_id, a.name) for a in remote.artifacts)


# -- random kills ---------------------------------------------------------------------------------


@pytest.mark.parametrize("run", range(RUNS))
async def test_sigkill_at_random_points_then_resume_reaches_the_remote_end(
    peer: Peer, db_url: str, run: int
) -> None:
    plan = KillPlan.random(run)
    known = set(remote_contexts(peer))

    crash = run_and_kill(db_url, peer.base_url, plan)
    print(f"[{plan}] killed after {crash.last!r} (aimed: {crash.aimed})")
    assert_killed(crash)

    outcome = await recover(db_url, peer, known)
    print(f"[{plan}] recovered: {outcome}")
    # Every task the child said it recorded is there; one more if the kill fell between the
    # commit of its TaskSubmitted and the line saying so.
    said = sum(1 for line in crash.lines if line.startswith("submitted "))
    assert said <= outcome.tasks <= said + 1


# -- deterministic kills: the child stands still at one point -------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """A point the child stands still at for good, and what the store must show after the kill."""

    probe: str
    prefix: str = ""
    at: int = 1
    scripts: str = "slow"
    tasks: int = 1
    recorded: int = 1  # tasks in the store after the kill
    bound: int = 0  # ... with a remote id recorded
    sent: int = 1  # SendMessage requests that reached the agent before the kill
    migrated: bool = True  # the schema committed before the kill

    @property
    def options(self) -> tuple[str, ...]:
        held = ("--hold", self.probe, "--hold-prefix", self.prefix, "--hold-at", str(self.at))
        return (*held, "--scripts", self.scripts)


HOLDS = {
    # the schema made inside the migration's transaction, not committed: the reopen migrates
    "in-migration": Hold("in-migration", recorded=0, sent=0, migrated=False),
    # inside discovery: the card is read, nothing recorded for the agent yet
    "in-discovery": Hold("card-fetched", recorded=0, sent=0),
    # the contract is being pinned (the agent stream's second append): open transaction
    "mid-append-pin": Hold("in-append", prefix="agent:", at=2, recorded=0, sent=0),
    # TaskSubmitted inserted, not committed: no task, and nothing may have been sent
    "mid-append-submitted": Hold("in-append", prefix="task:", recorded=0, sent=0),
    # TaskSubmitted committed, SendMessage not sent: resume must send it
    "after-submitted": Hold("submitted", sent=0),
    # the agent answered SendMessage, the answer not recorded: resume finds it by ListTasks
    "after-answer": Hold("answered"),
    # the answer's events inserted, not committed: as if never recorded
    "mid-append-answer": Hold("in-append", prefix="task:", at=2),
    # mid-drive: a poll answered, not recorded
    "mid-drive": Hold("polled", at=2, bound=1),
    # the reply reached the agent, its answer not recorded: the agent has moved on
    "after-reply": Hold("reply-answered", scripts="ask", bound=1, sent=2),
    # ReplySent committed, the reply never left: the agent still waits for it
    "before-reply": Hold("reply-send", scripts="ask", bound=1),
}


@pytest.mark.parametrize("point", list(HOLDS))
async def test_sigkill_held_at_one_point(peer: Peer, db_url: str, point: str) -> None:
    hold = HOLDS[point]
    known = set(remote_contexts(peer))

    plan = KillPlan(7, hold.probe, hold.at, 0.05, hold.prefix)  # well inside the hold
    crash = run_and_kill(
        db_url,
        peer.base_url,
        plan,
        tasks=hold.tasks,
        options=hold.options,
        aim_timeout=HOLD_TIMEOUT,
    )
    print(f"[{point}] killed after {crash.last!r}")
    assert_killed(crash)
    assert crash.aimed, crash.describe()
    assert crash.last.split(" ", 1)[0] == hold.probe, crash.describe()
    assert calls(peer, "SendMessage") == hold.sent

    with EventStore.open(db_url, migrate=False) as unopened:
        revision = unopened.schema_revision()
    assert revision == (migrations.head_revision() if hold.migrated else None)
    with EventStore.open(db_url) as store:
        assert_log_sound(store)
        heads = [store.stream(s) for s in store.stream_ids() if s.startswith("task:")]
        assert len(heads) == hold.recorded
        assert sum(1 for h in heads if h and h.state.get("remote_task_id")) == hold.bound

    outcome = await recover(db_url, peer, known)
    print(f"[{point}] recovered: {outcome}")
    assert outcome.tasks == hold.recorded
    # Nothing is sent twice: one SendMessage per task, one per reply, whatever the crash point.
    expected = hold.recorded * (2 if hold.scripts == "ask" else 1)
    assert calls(peer, "SendMessage") == expected


# -- in-process crashes at the send ---------------------------------------------------------------


class ProcessKilled(BaseException):
    """Stands for SIGKILL in process: nothing in the engine catches it, nothing after it runs."""


def die_at_send(monkeypatch: pytest.MonkeyPatch, *, after_delivery: bool, reply: bool) -> None:
    """Make a task's first SendMessage (or, with ``reply``, a reply's) "kill the process" just
    before it leaves, or just after the agent answered, before the engine records the answer."""
    real = A2ATransport.send_message

    async def send(self: A2ATransport, **kwargs: Any) -> Any:
        if (kwargs.get("task_id") is not None) != reply:
            return await real(self, **kwargs)
        if after_delivery:
            await real(self, **kwargs)
            raise ProcessKilled("killed after the agent answered, before the answer was recorded")
        raise ProcessKilled("killed after TaskSubmitted, before SendMessage left")

    monkeypatch.setattr(A2ATransport, "send_message", send)


@contextlib.asynccontextmanager
async def restart(db_url: str) -> AsyncIterator[Engine]:
    """A new engine on the store a dead one left (its log checked before anything else)."""
    async with Engine.connect(db_url, config=FAST) as engine:
        assert_log_sound(engine.store)
        yield engine
        await engine.settle()
        assert_log_sound(engine.store)


async def test_killed_after_the_agent_received_send_resume_binds_the_task_it_finds(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_at_send(monkeypatch, after_delivery=True, reply=False)
    async with Engine.connect(db_url, config=FAST) as engine:
        with pytest.raises(ProcessKilled):
            await engine.start_task(peer.base_url, skill="slow", text="slow 0.2")
        [pending] = await engine.tasks()
        context = engine.log.head(pending.task).state["context_id"]
    monkeypatch.undo()

    async with restart(db_url) as engine:
        assert types(engine.store, pending.task) == [ev.TASK_SUBMITTED]
        assert (await engine.task(pending.task)).remote_task_id is None
        [remote] = await agent_transport(engine, peer).list_tasks(context_id=context)

        resumed = await engine.resume(pending.task)
        done = await engine.drive(resumed.task, until="terminal", timeout=CONCLUDE)

        assert resumed.remote_task_id == done.remote_task_id == remote.id
        assert done.state == "completed"
        assert calls(peer, "ListTasks") == 2  # ours, then resume's
        assert calls(peer, "SendMessage") == 1  # found, not sent again
        listed = await agent_transport(engine, peer).list_tasks(context_id=context)
        assert [t.id for t in listed] == [remote.id]
        assert (await engine.task(remote.id)).task == pending.task


async def test_killed_between_task_submitted_and_the_send_resume_sends_it_once(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_at_send(monkeypatch, after_delivery=False, reply=False)
    async with Engine.connect(db_url, config=FAST) as engine:
        with pytest.raises(ProcessKilled):
            await engine.start_task(peer.base_url, skill="echo", text="echo kept")
        [pending] = await engine.tasks()
    monkeypatch.undo()
    assert calls(peer, "SendMessage") == 0

    async with restart(db_url) as engine:
        [submitted] = data_of(engine.store, pending.task, ev.TASK_SUBMITTED)
        resumed = await engine.resume(pending.task)
        done = await engine.drive(resumed.task, until="terminal", timeout=CONCLUDE)

        assert done.state == "completed"
        assert [a["parts"][0]["text"] for a in done.artifacts] == ["kept"]
        assert calls(peer, "SendMessage") == 1
        [remote] = await agent_transport(engine, peer).list_tasks(
            context_id=submitted["context_id"]
        )
        assert remote.id == done.remote_task_id
        assert remote.context_id == submitted["context_id"]


async def test_killed_after_the_reply_reached_the_agent_the_task_still_completes(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.connect(db_url, config=FAST) as engine:
        view = await engine.start_task(peer.base_url, skill="ask", text="ask")
        asked = await engine.drive(view.task, timeout=CONCLUDE)
        assert asked.state == "input-required"
        die_at_send(monkeypatch, after_delivery=True, reply=True)
        with pytest.raises(ProcessKilled):
            await engine.reply(view.task, "42")
    monkeypatch.undo()

    async with restart(db_url) as engine:
        recorded = await engine.task(view.task)
        assert recorded.state == "input-required"  # what the log last knew
        await remote_reaches(
            agent_transport(engine, peer), str(recorded.remote_task_id), "completed"
        )
        done = await conclude(engine, view.task)

        assert done.state == "completed"
        assert calls(peer, "SendMessage") == 2  # the task, the one reply: never answered twice
        assert len(data_of(engine.store, view.task, ev.REPLY_SENT)) == 1


async def test_resume_after_a_lost_reply_answer_reports_the_remote_state(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.connect(db_url, config=FAST) as engine:
        view = await engine.start_task(peer.base_url, skill="ask", text="ask")
        await engine.drive(view.task, timeout=CONCLUDE)
        die_at_send(monkeypatch, after_delivery=True, reply=True)
        with pytest.raises(ProcessKilled):
            await engine.reply(view.task, "42")
    monkeypatch.undo()

    async with restart(db_url) as engine:
        agent = agent_transport(engine, peer)
        remote = await remote_reaches(agent, str(view.remote_task_id), "completed")

        resumed = await engine.resume(view.task)
        driven = await engine.drive(resumed.task, until="interrupted", timeout=CONCLUDE)

        assert driven.state == remote.state == "completed"


async def test_rebinding_a_task_that_already_ended_records_its_artifacts(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    die_at_send(monkeypatch, after_delivery=True, reply=False)
    async with Engine.connect(db_url, config=FAST) as engine:
        with pytest.raises(ProcessKilled):
            await engine.start_task(peer.base_url, skill="echo", text="echo result")
        [pending] = await engine.tasks()
        context = engine.log.head(pending.task).state["context_id"]
    monkeypatch.undo()

    async with restart(db_url) as engine:
        agent = agent_transport(engine, peer)
        [listed] = await agent.list_tasks(context_id=context)
        remote = await remote_reaches(agent, listed.id, "completed")
        assert [p.text for a in remote.artifacts for p in a.parts] == ["result"]

        resumed = await engine.resume(pending.task)
        done = await engine.drive(resumed.task, until="terminal", timeout=CONCLUDE)

        assert done.state == "completed"
        assert [a["parts"][0]["text"] for a in done.artifacts] == ["result"]
