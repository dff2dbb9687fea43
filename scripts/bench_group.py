"""The ``group`` benchmark section: group commit, observations applied by many writers at once.

Measured through the engine's observation path: ``Observing.apply`` (what a store worker thread runs
for every poll or push: head read, ``apply_observation`` with its guards, the fold, one event and
the new projection appended), on task streams that already exist, each observation recording one
event (the ``engine`` section's script: ``StateChanged`` and ``ObservationIgnored`` alternately).

For SQLite (a file in a temporary folder) and, when a server is given, PostgreSQL (a fresh
database, dropped afterwards), in one process, on one store opened with the default group commit:

1. **64 writers vs one**: observations applied per second by 64 threads at once, each applying
   its share round-robin over tasks of its own (so no two writers touch one stream), against one
   thread applying as many alone. Target on PostgreSQL >= 3x. The threads are started once, before
   the clock. Commits per append (``EventStore.stats``) during the 64-writer runs are printed as a
   note and as a figure (``value`` only).
2. **Group commit vs one transaction per append**: the same 64 writers on a second store, opened on
   the same database with ``group_commit=False``, against the first store's. No target.
3. **One writer, group commit vs one transaction per append**: a lone writer must not get slower.
   No target.
4. **A leader that waits for company**: the same writers on a third store, opened with
   ``GroupCommit(max_wait=WAIT)`` (a leader finding fewer than ``max_batch`` appends queued waits up
   to ``WAIT`` seconds for more), against the default (``max_wait=0``: take what queued while the
   previous batch committed), with 64 writers and with one (who waits the whole ``WAIT`` on every
   append, nobody else coming). Commits per append with the wait are printed as a note. No target:
   these say what the option buys and costs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from bench import BenchContext, Figure, Workload, median_rates, register
from bench_engine import ObservationPlan, planned_task
from bench_store import Database, durability, on_each_database

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core.observations import Observation
from cardfence.store.event_store import EventStore
from cardfence.store.groupcommit import GroupCommit

WRITERS = 64
TASKS_PER_WRITER = 2
MANY_TARGET_POSTGRES = 3.0
WAIT = 0.001  # GroupCommit.max_wait of the third store, seconds


@dataclass(frozen=True, slots=True)
class Sizes:
    observations: int  # per timed run, shared out among the writers

    @classmethod
    def for_context(cls, ctx: BenchContext) -> Sizes:
        return cls(observations=WRITERS * (4 if ctx.quick else 24))


Planned = list[list[tuple[str, Observation]]]  # one list of observations per writer


class Writers:
    """One engine on one store, its tasks shared out among ``WRITERS`` writers."""

    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, agent_url: str) -> None:
        self.engine = engine
        self.pool = pool
        moment = datetime(2025, 6, 1, 12, tzinfo=UTC)
        self.plans = []
        for _ in range(WRITERS):
            tasks = [planned_task("group", agent_url, moment) for _ in range(TASKS_PER_WRITER)]
            for task in tasks:
                engine.log.create(task.key, task.setup)
            self.plans.append(ObservationPlan(tasks))
        # A first round over every task: heads cached, as in a running engine's steady state.
        self.apply_alone([p.take(TASKS_PER_WRITER) for p in self.plans])

    def take(self, observations: int) -> Planned:
        share = observations // WRITERS
        return [plan.take(share) for plan in self.plans]

    def apply_alone(self, planned: Planned) -> int:
        count = 0
        for share in planned:
            for key, observation in share:
                self.engine.observing.apply(key, observation, None)
            count += len(share)
        return count

    def apply_at_once(self, planned: Planned) -> int:
        start = threading.Barrier(len(planned))

        def write(share: list[tuple[str, Observation]]) -> int:
            start.wait()
            for key, observation in share:
                self.engine.observing.apply(key, observation, None)
            return len(share)

        return sum(f.result() for f in [self.pool.submit(write, share) for share in planned])


def runs_of(prepared: list[Planned], work: Callable[[Planned], int]) -> Workload:
    items = iter(prepared)
    return lambda: work(next(items))


@contextmanager
def engine_on(store: EventStore) -> Iterator[Engine]:
    client = httpx.AsyncClient()  # never used for a request: apply does no I/O but the store's
    engine = Engine(store, client)
    try:
        yield engine
    finally:
        engine.records.calls.close()
        asyncio.run(client.aclose())


def bench_database(ctx: BenchContext, db: Database, sizes: Sizes) -> list[Figure]:
    label, runs, count = db.label, ctx.runs, sizes.observations
    with ExitStack() as stack:
        grouped = stack.enter_context(EventStore.open(db.url))
        single = stack.enter_context(EventStore.open(db.url, migrate=False, group_commit=False))
        patient = stack.enter_context(
            EventStore.open(db.url, migrate=False, group_commit=GroupCommit(max_wait=WAIT))
        )
        pool = stack.enter_context(ThreadPoolExecutor(WRITERS, thread_name_prefix="bench-writer"))
        ctx.note(f"{label}: {durability(grouped.engine)}; {grouped.group_commit}")
        ctx.progress(f"{label}: creating {WRITERS * TASKS_PER_WRITER} tasks per store")
        ours = Writers(stack.enter_context(engine_on(grouped)), pool, "http://127.0.0.1:9999")
        off = Writers(stack.enter_context(engine_on(single)), pool, "http://127.0.0.1:9998")
        wait = Writers(stack.enter_context(engine_on(patient)), pool, "http://127.0.0.1:9997")
        before = grouped.stats
        many_stats: list[tuple[int, int]] = []
        wait_stats: list[tuple[int, int]] = []

        def counted(
            work: Callable[[Planned], int], store: EventStore, stats: list[tuple[int, int]]
        ) -> Callable[[Planned], int]:
            def run(planned: Planned) -> int:
                start = store.stats
                done = work(planned)
                end = store.stats
                stats.append((end.appends - start.appends, end.commits - start.commits))
                return done

            return run

        ctx.progress(f"{label}: {count} observations a run, {WRITERS} writers and one")
        rates = median_rates(
            {
                "one": runs_of([ours.take(count) for _ in range(runs)], ours.apply_alone),
                "many": runs_of(
                    [ours.take(count) for _ in range(runs)],
                    counted(ours.apply_at_once, grouped, many_stats),
                ),
                "one-off": runs_of([off.take(count) for _ in range(runs)], off.apply_alone),
                "many-off": runs_of([off.take(count) for _ in range(runs)], off.apply_at_once),
                "one-wait": runs_of([wait.take(count) for _ in range(runs)], wait.apply_alone),
                "many-wait": runs_of(
                    [wait.take(count) for _ in range(runs)],
                    counted(wait.apply_at_once, patient, wait_stats),
                ),
            },
            runs,
        )
        after = grouped.stats
        for writers in (ours, off, wait):
            for plan in writers.plans:
                for task in plan.tasks:
                    broken = writers.engine.store.verify_stream(task_stream_id(task.key))
                    if broken is not None:
                        raise AssertionError(f"{label}: {broken}")
    appends, commits, per = _per_append(many_stats)
    _, _, per_wait = _per_append(wait_stats)
    ctx.note(
        f"{label}: {WRITERS} writers x {TASKS_PER_WRITER} tasks each; with group commit "
        f"{appends} appends in {commits} commits while 64 wrote ({per:.3f} commits per append, "
        f"{appends / commits if commits else 0:.1f} appends per commit); over the whole run "
        f"{after.appends - before.appends} appends, {after.commits - before.commits} commits, "
        f"{after.splits - before.splits} batches split"
    )
    ctx.note(
        f"{label}: one writer {1e3 / rates['one']:.2f} ms per observation with group commit, "
        f"{1e3 / rates['one-off']:.2f} ms without; 64 writers {rates['many']:,.0f}/s with, "
        f"{rates['many-off']:,.0f}/s without"
    )
    ctx.note(
        f"{label}: with max_wait {WAIT * 1e3:g} ms, 64 writers {rates['many-wait']:,.0f}/s at "
        f"{per_wait:.3f} commits per append (the default: {per:.3f}); one writer "
        f"{1e3 / rates['one-wait']:.2f} ms per observation"
    )
    target = MANY_TARGET_POSTGRES if label == "postgresql" else None
    unit = "observations/s"
    return [
        Figure.compared(
            f"{label} observations applied, {WRITERS} writers at once (vs one writer)",
            rates["many"],
            rates["one"],
            unit,
            target,
        ),
        Figure(f"{label} commits per append, {WRITERS} writers, group commit", per, "commits"),
        Figure.compared(
            f"{label} {WRITERS} writers, group commit (vs one transaction per append)",
            rates["many"],
            rates["many-off"],
            unit,
            None,
        ),
        Figure.compared(
            f"{label} one writer, group commit (vs one transaction per append)",
            rates["one"],
            rates["one-off"],
            unit,
            None,
        ),
        Figure.compared(
            f"{label} {WRITERS} writers, max_wait {WAIT * 1e3:g} ms (vs max_wait 0)",
            rates["many-wait"],
            rates["many"],
            unit,
            None,
        ),
        Figure.compared(
            f"{label} one writer, max_wait {WAIT * 1e3:g} ms (vs max_wait 0)",
            rates["one-wait"],
            rates["one"],
            unit,
            None,
        ),
    ]


def _per_append(stats: list[tuple[int, int]]) -> tuple[int, int, float]:
    """Appends, commits, and commits per append over the runs counted in ``stats``."""
    appends = sum(a for a, _ in stats)
    commits = sum(c for _, c in stats)
    return appends, commits, commits / appends if appends else float("nan")


@register("group")
def group_section(ctx: BenchContext) -> list[Figure]:
    """Group commit: 64 writers vs one, through the engine's observation path, per database."""
    sizes = Sizes.for_context(ctx)
    return on_each_database(ctx, lambda db: bench_database(ctx, db, sizes))


__all__: Sequence[str] = ()
