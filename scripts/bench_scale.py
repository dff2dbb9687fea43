"""``scale``: tasks driven to completion per second by 1, 2 and 4 ``cardfence serve`` processes over
one PostgreSQL store, beside the agent alone as the ceiling, in the same run.

- The agent: ``cardfence demo --agent-only`` in its own process (a2a-sdk 1.3), skill ``slow`` with
  ``SLOW_SECONDS``.
- ``N serve``: N ``cardfence serve`` processes share the store (``--max-poll-interval`` =
  ``MAX_POLL``). The bench process creates ``count`` tasks (``Engine.start_task``: card, send,
  ``TaskSubmitted``; 32 at once) and never polls them: the serves claim them (leases) and poll them
  to completion. A run ends when every task's stream says ``completed``.
- ``ceiling``: the agent alone, with no client-side persistence: the a2a-sdk client sends the same
  tasks (32 at once) and polls each with the serves' backoff (``first_poll_interval`` doubling to
  ``MAX_POLL``) until it completes.
- ``driven``: driving alone, the serves' share of the work. The serves are stopped (SIGSTOP)
  while the bench creates the tasks and the agent finishes them, then resumed: the clock runs
  from the resume until every task is recorded completed (a claim round, at most 0.5 s, included:
  the serves see no new event to claim sooner). Its ceiling is the agent alone answering one
  GetTask for each of the same (completed) tasks, 32 at once.

Each figure is a ratio to the ceiling. The database work per task is read from PostgreSQL's own
counters over the timed runs, for the whole database (the creating engine's work included):
statements run (``pg_stat_statements``, when the server preloads it: each one a round trip,
BEGIN and COMMIT included) and transactions committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import GetTaskRequest, TaskState
from bench import BenchContext, Figure, register
from bench_serve import BareAtOnce, _process, _wait_for
from bench_store import postgres_database
from support.agent_process import demo_agent_process

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.store.event_store import EventStore

SLOW_SECONDS = "0.2"
FIRST_POLL = EngineConfig().first_poll_interval  # serve's driver starts here
MAX_POLL = 0.5  # serve --max-poll-interval, and the bare client's backoff cap
AT_ONCE = 32
SERVE_COUNTS = (1, 2, 4)


def _serve_args(db_url: str) -> list[str]:
    return [
        sys.executable, "-m", "cardfence", "serve", "--db", db_url, "--port", "0",
        "--max-poll-interval", str(MAX_POLL), "--lease-ttl", "10",
    ]  # fmt: skip


@contextlib.contextmanager
def serves(count: int, db_url: str, folder: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` serve processes on the store, each listening before this yields them."""
    with contextlib.ExitStack() as stack:
        processes = []
        for n in range(count):
            log = folder / f"serve-{count}-{n}.log"
            args = _serve_args(db_url)
            processes.append(stack.enter_context(_process(args, log, stdout=subprocess.DEVNULL)))
            _wait_for(lambda log=log: "webhook at" in log.read_text(), f"serve {n + 1}/{count}")
        yield processes


def _pg_counters(url: str) -> tuple[float, float]:
    """(statements run, transactions committed) in this database so far. Statements come from
    ``pg_stat_statements`` (every one a round trip; BEGIN and COMMIT included) when the server
    preloads it, else NaN."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            commits = conn.execute(
                sa.text(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                )
            ).scalar_one()
            try:
                with conn.begin_nested():
                    statements = conn.execute(
                        sa.text(
                            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
                            "JOIN pg_database d ON d.oid = s.dbid "
                            "WHERE d.datname = current_database()"
                        )
                    ).scalar_one()
            except sa.exc.DBAPIError:  # not preloaded on this server
                statements = math.nan
            conn.commit()
    finally:
        engine.dispose()
    return float(statements), float(commits)


def _track_statements(url: str) -> bool:
    """Make ``pg_stat_statements`` readable in this database, if the server preloads it."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            conn.execute(sa.text("SELECT count(*) FROM pg_stat_statements"))
        return True
    except sa.exc.DBAPIError:
        return False
    finally:
        engine.dispose()


class Created:
    """``count`` tasks created by an engine that never polls them; done when all completed."""

    def __init__(self, engine: Engine, agent_url: str) -> None:
        self.engine = engine
        self.agent_url = agent_url
        self.creating_share: list[float] = []  # of each run's time, the part spent creating
        self.last_keys: list[str] = []

    async def run(self, count: int) -> float:
        gate = asyncio.Semaphore(AT_ONCE)
        start = time.perf_counter()

        async def one() -> str:
            async with gate:
                view = await self.engine.start_task(self.agent_url, skill="slow", text=SLOW_SECONDS)
                return view.task

        keys = await asyncio.gather(*(one() for _ in range(count)))
        creating = time.perf_counter() - start
        # Done when no task has due work left (one query a look, not one per task)...
        deadline = time.monotonic() + 300
        while await asyncio.to_thread(self.engine.store.due.rows):
            if time.monotonic() > deadline:
                raise RuntimeError("scale: tasks still live after 300 s")
            await asyncio.sleep(0.05)
        rate = count / (time.perf_counter() - start)
        self.creating_share.append(creating * rate / count)
        # ...and each ended completed.
        states = [(await self.engine.task(k)).state for k in keys]
        ended = [s for s in states if s != "completed"]
        if ended:
            raise RuntimeError(f"scale: {len(ended)} tasks ended otherwise: {ended[:3]}")
        return rate

    async def drive_only(self, count: int, processes: list[subprocess.Popen[str]]) -> float:
        """Driving alone: ``count`` tasks created (and finished by the agent) while the serves
        are stopped (SIGSTOP), then the rate at which the resumed serves claim, poll and record
        them completed."""
        for process in processes:
            process.send_signal(signal.SIGSTOP)
        try:
            gate = asyncio.Semaphore(AT_ONCE)

            async def one() -> str:
                async with gate:
                    view = await self.engine.start_task(
                        self.agent_url, skill="slow", text=SLOW_SECONDS
                    )
                    return view.task

            keys = await asyncio.gather(*(one() for _ in range(count)))
            await asyncio.sleep(float(SLOW_SECONDS) + 0.3)  # the agent completes them
        finally:
            start = time.perf_counter()
            for process in processes:
                process.send_signal(signal.SIGCONT)
        await self._until_driven(keys)
        return count / (time.perf_counter() - start)

    async def _until_driven(self, keys: list[str]) -> None:
        deadline = time.monotonic() + 300
        while await asyncio.to_thread(self.engine.store.due.rows):
            if time.monotonic() > deadline:
                raise RuntimeError("scale: tasks still live after 300 s")
            await asyncio.sleep(0.02)
        states = [(await self.engine.task(k)).state for k in keys]
        ended = [s for s in states if s != "completed"]
        if ended:
            raise RuntimeError(f"scale: {len(ended)} tasks ended otherwise: {ended[:3]}")
        self.last_keys = keys


async def get_each(client: Any, remote_ids: list[str]) -> int:
    """The drive-only ceiling: one GetTask per (completed) task, ``AT_ONCE`` at a time."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(remote_id: str) -> None:
        async with gate:
            try:
                task = await client.get_task(GetTaskRequest(id=remote_id, history_length=0))
            except A2AClientError as error:
                # A kept-alive connection the agent closed as it was reused: asked once more, as
                # the engine's own client replays a read (engine.http.pool); anything else stands.
                if not isinstance(error.__cause__, httpx.TransportError):
                    raise
                task = await client.get_task(GetTaskRequest(id=remote_id, history_length=0))
        if task.status.state != TaskState.TASK_STATE_COMPLETED:
            raise RuntimeError(f"bare: task {remote_id} is {task.status.state}")

    await asyncio.gather(*(one(r) for r in remote_ids))
    return len(remote_ids)


@register("scale")
def scale_section(ctx: BenchContext) -> list[Figure]:
    """Tasks completed per second by 1, 2 and 4 serve processes on one PostgreSQL store, as ratios
    to the agent alone."""
    if not ctx.pg_url:
        ctx.note("scale: needs PostgreSQL (--pg-url or $CARDFENCE_TEST_PG_URL): nothing measured")
        return []
    count = 60 if ctx.quick else 300
    runs = 1 if ctx.quick else ctx.runs
    counts = SERVE_COUNTS[:2] if ctx.quick else SERVE_COUNTS
    figures: list[Figure] = []
    with (
        tempfile.TemporaryDirectory(prefix="cardfence-bench-scale-") as name,
        demo_agent_process(Path(name) / "agent.log") as agent_url,
        postgres_database(ctx.pg_url) as database,
        asyncio.Runner() as runner,
        contextlib.ExitStack() as stack,
    ):
        folder = Path(name)
        db_url = database.url.render_as_string(hide_password=False)
        EventStore.open(db_url).close()  # migrated once, before the serves open it
        if not _track_statements(db_url):
            ctx.note("scale: pg_stat_statements is not preloaded: round trips not counted")

        http = httpx.AsyncClient(headers={"A2A-Version": "1.0"}, timeout=30)
        stack.callback(lambda: runner.run(http.aclose()))
        card = runner.run(A2ACardResolver(http, agent_url).get_agent_card())
        config = ClientConfig(streaming=False, polling=True, httpx_client=http)
        bare = BareAtOnce(
            ClientFactory(config).create(card),
            text=SLOW_SECONDS,
            first_poll=FIRST_POLL,
            max_poll=MAX_POLL,
            at_once=AT_ONCE,
        )
        runner.run(bare.run(min(count, 20)))  # warm up
        ceiling = statistics.median(
            _timed(lambda: runner.run(bare.run(count))) for _ in range(runs)
        )
        ctx.progress(f"scale: ceiling {ceiling:.1f} tasks/s")

        connected = Engine.connect(db_url)
        engine = runner.run(connected.__aenter__())
        stack.callback(lambda: runner.run(connected.__aexit__(None, None, None)))
        creator = Created(engine, agent_url)
        drive_ceiling: float | None = None
        for n in counts:
            with serves(n, db_url, folder) as processes:
                runner.run(creator.run(min(count, 20)))  # warm up: connections, leases
                before = _pg_counters(db_url)
                creator.creating_share.clear()
                rates = [runner.run(creator.run(count)) for _ in range(runs)]
                after = _pg_counters(db_url)
                driven = [runner.run(creator.drive_only(count, processes)) for _ in range(runs)]
            if drive_ceiling is None:  # the same agent answering GetTask for completed tasks
                views = [runner.run(engine.task(k)) for k in creator.last_keys]
                remote = [view.remote_task_id or "" for view in views]
                drive_ceiling = statistics.median(
                    _timed(lambda r=remote: runner.run(get_each(bare.client, r)))  # type: ignore[misc]
                    for _ in range(runs)
                )
            figures.append(
                Figure.compared(
                    _name(f"tasks driven by {n} serve process(es), created beforehand", ctx),
                    statistics.median(driven),
                    drive_ceiling,
                    "tasks/s",
                    None,
                )
            )
            rate = statistics.median(rates)
            done = count * runs
            statements, commits = ((a - b) / done for a, b in zip(after, before, strict=True))
            ctx.note(
                f"scale: {n} serve(s): {rate:.1f} tasks/s; per task {statements:.1f} statements "
                f"(round trips, pg_stat_statements), {commits:.1f} transactions; creating the "
                f"tasks took {statistics.median(creator.creating_share):.0%} of a run"
            )
            figures.append(
                Figure.compared(
                    _name(f"tasks completed by {n} serve process(es), vs the agent alone", ctx),
                    rate,
                    ceiling,
                    "tasks/s",
                    None,
                )
            )
            if not math.isnan(statements):
                figures.append(
                    Figure(
                        _name(f"database round trips per task, {n} serve(s)", ctx),
                        statements,
                        "round trips",
                    )
                )
            figures.append(
                Figure(
                    _name(f"database transactions per task, {n} serve(s)", ctx),
                    commits,
                    "transactions",
                )
            )
    ctx.note(
        f"scale: {count} 'slow {SLOW_SECONDS}' tasks a run, {AT_ONCE} created at once, "
        f"{runs} run(s) each; one agent process; every process on this machine's 2 cores"
    )
    return figures


def _timed(run: Callable[[], int]) -> float:
    """``run``'s tasks per second."""
    start = time.perf_counter()
    count = run()
    return count / (time.perf_counter() - start)


def _name(text: str, ctx: BenchContext) -> str:
    return f"{text} (--quick)" if ctx.quick else text
