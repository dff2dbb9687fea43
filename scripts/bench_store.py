"""The ``store`` benchmark section: the event store against raw SQLAlchemy Core and two peers.

For SQLite (a file in a temporary folder) and, when a server is given, PostgreSQL (a fresh
database, dropped afterwards), in one process and one database per engine:

1. ``append`` one event per transaction (hash chain and projection update included), round-robin
   over 50 streams, vs a raw Core ``insert`` of an equally sized row into ``raw_events`` (same
   columns, same index on ``(stream_id, version)``), one ``engine.begin()`` per row.
2. ``append`` of 100 events per transaction vs a raw Core executemany of 100 such rows.
3. ``read_stream`` of 200-event streams, every event decoded (``.data``) vs a raw Core select of
   the same rows by the indexed key with ``json.loads`` of each payload.
4. ``read_all`` paging through the whole log 1000 at a time, decoded, vs raw paging by primary key.
5. Peers on the same database, against the same raw baselines: the eventsourcing library's
   ``Application`` saving one event per save (its SQLite connections switched to
   ``synchronous=NORMAL`` like ours) and rebuilding a 200-event aggregate with
   ``repository.get``; the a2a-sdk's ``DatabaseTaskStore.save`` of a task's status change.

The raw baselines use their own plain engine (no pre-ping, no event hooks) on the same database
with the same durability: WAL and ``synchronous=NORMAL`` on SQLite, the server's defaults on
PostgreSQL. Workload data (payloads, projections, rows, tasks) is built before the clock starts.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import sqlalchemy as sa
from a2a.server.context import ServerCallContext
from a2a.server.tasks import DatabaseTaskStore
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from bench import BenchContext, Figure, Workload, median_rates, register
from eventsourcing import sqlite as es_sqlite
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from sqlalchemy import event as sa_event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from cardfence.store.database import normalise_url
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, Projection

_T = TypeVar("_T")

STREAMS = 50
BATCH = 100
PAGE = 1000
APPEND_TARGET = 0.6
STREAM_READ_TARGET = 0.5
READ_ALL_TARGET = 0.5


@dataclass(frozen=True, slots=True)
class Sizes:
    """Work per timed run (each figure is the median of ``ctx.runs`` such runs)."""

    single: int  # events appended one per transaction
    batches: int  # transactions of BATCH events
    read_streams: int  # streams read whole
    stream_length: int  # events per stream read
    task_saves: int  # a2a-sdk saves (about 30x slower than a raw insert)

    @classmethod
    def for_context(cls, ctx: BenchContext) -> Sizes:
        if ctx.quick:
            return cls(single=50, batches=2, read_streams=2, stream_length=200, task_saves=10)
        return cls(single=1000, batches=20, read_streams=20, stream_length=200, task_saves=100)


# -- the raw baseline table ----------------------------------------------------------------------

raw_metadata = sa.MetaData()
raw_events = sa.Table(
    "raw_events",
    raw_metadata,
    sa.Column(
        "position",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("stream_id", sa.String(512), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("type", sa.String(128), nullable=False),
    sa.Column("schema_version", sa.SmallInteger, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Index("ix_raw_events_stream_id_version", "stream_id", "version"),
)
_RAW_INSERT = raw_events.insert()


# -- realistic data ------------------------------------------------------------------------------

_STATES = ("working", "input-required")
_REMOTE_TS = "2025-06-01T12:34:56.789012+00:00"


def _hex(n: int) -> str:
    return (uuid.uuid4().hex * (n // 32 + 1))[:n]


def state_changed(version: int) -> dict[str, Any]:
    """A StateChanged payload (about 200 bytes of JSON)."""
    before, after = _STATES[version % 2], _STATES[(version + 1) % 2]
    return {
        "from": before,
        "to": after,
        "source": "poll",
        "remote_timestamp": _REMOTE_TS,
        "message_id": str(uuid.uuid4()),
        "reason": "remote status changed",
        "remote_version": version,
    }


@dataclass(frozen=True, slots=True)
class TaskStream:
    stream_id: str
    task_id: str
    context_id: str
    card_revision: str

    @classmethod
    def new(cls, prefix: str) -> TaskStream:
        return cls(f"{prefix}:{uuid.uuid4()}", str(uuid.uuid4()), str(uuid.uuid4()), _hex(64))

    def projection(self, version: int, data: dict[str, Any]) -> Projection:
        """A task's projection: a 10-field state dict plus its indexed keys."""
        state = {
            "task_id": self.task_id,
            "context_id": self.context_id,
            "agent_url": "http://127.0.0.1:9999",
            "state": data["to"],
            "card_revision": self.card_revision,
            "push_url": f"https://hooks.example.com/cardfence/{self.task_id}",
            "last_source": data["source"],
            "last_remote_timestamp": data["remote_timestamp"],
            "version": version,
            "terminal": False,
        }
        return Projection(state, category="task", alias=self.task_id, status=data["to"])


def raw_row(stream_id: str, version: int, now: datetime) -> dict[str, Any]:
    """A row the size of one of our events."""
    return {
        "stream_id": stream_id,
        "version": version,
        "type": "StateChanged",
        "schema_version": 1,
        "payload": json.dumps(state_changed(version), separators=(",", ":"), sort_keys=True),
        "recorded_at": now,
        "prev_hash": _hex(64),
        "hash": _hex(64),
    }


Append = tuple[str, int, list[NewEvent], Projection]


class AppendPlan:
    """Appends round-robin over some streams, each at the version it will then be at."""

    def __init__(self, streams: Sequence[TaskStream], events_per_append: int) -> None:
        self.streams = list(streams)
        self.per = events_per_append
        self.versions = {s.stream_id: 0 for s in self.streams}
        self._next = 0

    def take(self, appends: int) -> list[Append]:
        out: list[Append] = []
        for _ in range(appends):
            stream = self.streams[self._next % len(self.streams)]
            self._next += 1
            expected = self.versions[stream.stream_id]
            datas = [state_changed(expected + i + 1) for i in range(self.per)]
            new = [NewEvent("StateChanged", d) for d in datas]
            out.append(
                (stream.stream_id, expected, new, stream.projection(expected + self.per, datas[-1]))
            )
            self.versions[stream.stream_id] = expected + self.per
        return out


class RawPlan:
    """Raw rows grouped per transaction, round-robin over as many stream keys as ours."""

    def __init__(self, streams: int, rows_per_txn: int, prefix: str) -> None:
        self.keys = [f"{prefix}:{uuid.uuid4()}" for _ in range(streams)]
        self.per = rows_per_txn
        self.versions = dict.fromkeys(self.keys, 0)
        self._next = 0

    def take(self, transactions: int) -> list[list[dict[str, Any]]]:
        now = datetime.now(UTC)
        out: list[list[dict[str, Any]]] = []
        for _ in range(transactions):
            key = self.keys[self._next % len(self.keys)]
            self._next += 1
            first = self.versions[key]
            out.append([raw_row(key, first + i + 1, now) for i in range(self.per)])
            self.versions[key] = first + self.per
        return out


def runs_of(prepared: list[_T], work: Callable[[_T], int]) -> Workload:
    """A workload whose i-th call does ``work(prepared[i])``: fresh, pre-built data every run."""
    items = iter(prepared)
    return lambda: work(next(items))


# -- our store and the raw baseline --------------------------------------------------------------


def ours_append(store: EventStore) -> Callable[[list[Append]], int]:
    def work(appends: list[Append]) -> int:
        count = 0
        for stream_id, expected, new, projection in appends:
            store.append(stream_id, expected, new, projection=projection)
            count += len(new)
        return count

    return work


def raw_insert_each(engine: sa.Engine) -> Callable[[list[list[dict[str, Any]]]], int]:
    def work(transactions: list[list[dict[str, Any]]]) -> int:
        for rows in transactions:
            with engine.begin() as conn:
                conn.execute(_RAW_INSERT, rows[0])
        return len(transactions)

    return work


def raw_insert_many(engine: sa.Engine) -> Callable[[list[list[dict[str, Any]]]], int]:
    def work(transactions: list[list[dict[str, Any]]]) -> int:
        count = 0
        for rows in transactions:
            with engine.begin() as conn:
                conn.execute(_RAW_INSERT, rows)
            count += len(rows)
        return count

    return work


def ours_read_streams(store: EventStore, stream_ids: list[str]) -> Workload:
    def work() -> int:
        count = 0
        for stream_id in stream_ids:
            for recorded in store.read_stream(stream_id):
                recorded.data  # noqa: B018 - decoding is the point
                count += 1
        return count

    return work


def raw_read_streams(engine: sa.Engine, keys: list[str]) -> Workload:
    query = (
        sa.select(*raw_events.c)
        .where(raw_events.c.stream_id == sa.bindparam("key"))
        .order_by(raw_events.c.version)
    )

    def work() -> int:
        count = 0
        for key in keys:
            with engine.connect() as conn:
                rows = conn.execute(query, {"key": key}).all()
            for row in rows:
                json.loads(row.payload)
                count += 1
        return count

    return work


def ours_read_all(store: EventStore) -> Workload:
    def work() -> int:
        count, after = 0, 0
        while page := store.read_all(after=after, limit=PAGE):
            for recorded in page:
                recorded.data  # noqa: B018
            count += len(page)
            after = page[-1].position
        return count

    return work


def raw_read_all(engine: sa.Engine) -> Workload:
    query = (
        sa.select(*raw_events.c)
        .where(raw_events.c.position > sa.bindparam("after"))
        .order_by(raw_events.c.position)
        .limit(PAGE)
    )

    def work() -> int:
        count, after = 0, 0
        while True:
            with engine.connect() as conn:
                page = conn.execute(query, {"after": after}).all()
            if not page:
                return count
            for row in page:
                json.loads(row.payload)
            count += len(page)
            after = page[-1].position

    return work


# -- peer: the eventsourcing library -------------------------------------------------------------


class BenchTask(Aggregate):
    """An aggregate with one event-decorated command, its event about our payload's size."""

    status: str = "submitted"

    @event("StateChanged")
    def change_state(
        self,
        from_state: str,
        to_state: str,
        source: str,
        remote_timestamp: str,
        message_id: str,
        reason: str,
        remote_version: int,
    ) -> None:
        self.status = to_state


class BenchApp(Application[UUID]):
    name = "BenchApp"


@contextmanager
def eventsourcing_sqlite_synchronous_normal() -> Iterator[None]:
    """Make eventsourcing's SQLite connections use ``synchronous=NORMAL``, like ours.

    Its pool (``SQLiteConnectionPool._create_connection``) turns WAL on but leaves SQLite's default
    ``synchronous=FULL``; wrapped here, for this process only, while the context is open.
    """
    pool = es_sqlite.SQLiteConnectionPool
    original = pool._create_connection

    def create(self: es_sqlite.SQLiteConnectionPool) -> es_sqlite.SQLiteConnection:
        connection = original(self)
        connection._sqlite_conn.execute("PRAGMA synchronous = NORMAL")
        return connection

    pool._create_connection = create  # type: ignore[method-assign]
    try:
        yield
    finally:
        pool._create_connection = original  # type: ignore[method-assign]


def eventsourcing_sqlite_pragmas(app: Application[UUID]) -> str:
    datastore = app.factory.datastore  # type: ignore[attr-defined]
    with datastore.transaction(commit=False) as cursor:
        cursor.execute("PRAGMA journal_mode")
        mode = cursor.fetchone()[0]
        cursor.execute("PRAGMA synchronous")
        sync = cursor.fetchone()[0]
    return f"journal_mode={mode}, synchronous={_sync_name(sync)}"


def _sync_name(value: object) -> str:
    """SQLite's ``PRAGMA synchronous`` number as its name."""
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return names.get(value, str(value)) if isinstance(value, int) else str(value)


def es_command_args(version: int) -> dict[str, Any]:
    data = state_changed(version)
    return {
        "from_state": data["from"],
        "to_state": data["to"],
        "source": data["source"],
        "remote_timestamp": data["remote_timestamp"],
        "message_id": data["message_id"],
        "reason": data["reason"],
        "remote_version": version,
    }


def es_save_each(app: Application[UUID]) -> Callable[[list[tuple[Any, dict[str, Any]]]], int]:
    def work(commands: list[tuple[Any, dict[str, Any]]]) -> int:
        for aggregate, kwargs in commands:
            aggregate.change_state(**kwargs)
            app.save(aggregate)
        return len(commands)

    return work


def es_reconstruct(app: Application[UUID], ids: list[Any]) -> Workload:
    def work() -> int:
        count = 0
        for aggregate_id in ids:
            count += app.repository.get(aggregate_id).version
        return count

    return work


# -- peer: the a2a-sdk's DatabaseTaskStore -------------------------------------------------------


def a2a_task(task_id: str, context_id: str, version: int) -> Task:
    """A task whose status just changed: state, timestamp and a short agent message."""

    state = (TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_INPUT_REQUIRED)[version % 2]
    status = TaskStatus(
        state=state,
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_AGENT,
            parts=[Part(text=f"status change {version}: remote status changed (poll)")],
        ),
    )
    status.timestamp.FromDatetime(datetime.now(UTC))
    return Task(id=task_id, context_id=context_id, status=status)


class TaskStorePeer:
    """The a2a-sdk store on its own event loop, driven synchronously by the bench."""

    def __init__(self, async_url: URL, sqlite: bool, runner: asyncio.Runner) -> None:
        self.runner = runner
        self.engine: AsyncEngine = create_async_engine(async_url)
        if sqlite:

            @sa_event.listens_for(self.engine.sync_engine, "connect")
            def _pragmas(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
                cursor.close()

        self.store: DatabaseTaskStore = DatabaseTaskStore(self.engine)
        self.context: ServerCallContext = ServerCallContext()
        self.tasks = [(str(uuid.uuid4()), str(uuid.uuid4())) for _ in range(STREAMS)]
        self.versions = [0] * STREAMS
        self._next = 0
        self.runner.run(self._save_all(self.take(STREAMS)))  # creates the table and the tasks

    def take(self, saves: int) -> list[Task]:
        out: list[Task] = []
        for _ in range(saves):
            i = self._next % STREAMS
            self._next += 1
            self.versions[i] += 1
            out.append(a2a_task(*self.tasks[i], self.versions[i]))
        return out

    async def _save_all(self, tasks: list[Task]) -> int:
        for task in tasks:
            await self.store.save(task, self.context)
        return len(tasks)

    def save_each(self, tasks: list[Task]) -> int:
        return self.runner.run(self._save_all(tasks))

    def close(self) -> None:
        self.runner.run(self.engine.dispose())


# -- databases -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Database:
    label: str
    url: URL  # sync, for our store and the raw engine
    async_url: URL  # for the a2a-sdk store
    eventsourcing_env: dict[str, str]

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"


@contextmanager
def sqlite_database() -> Iterator[Database]:
    with tempfile.TemporaryDirectory(prefix="cardfence-bench-") as folder:
        path = Path(folder) / "bench.db"
        yield Database(
            label="sqlite",
            url=sa.make_url(f"sqlite:///{path}"),
            async_url=sa.make_url(f"sqlite+aiosqlite:///{path}"),
            eventsourcing_env={
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(path),
            },
        )


@contextmanager
def postgres_database(admin_url: str) -> Iterator[Database]:
    """A fresh database on the server, dropped afterwards (even if connections linger)."""
    admin = normalise_url(admin_url)
    name = f"cardfence_bench_{uuid.uuid4().hex[:12]}"
    admin_engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with admin_engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            url = admin.set(database=name)
            yield Database(
                label="postgresql",
                url=url,
                async_url=url.set(drivername="postgresql+asyncpg", query={}),
                eventsourcing_env={
                    "PERSISTENCE_MODULE": "eventsourcing.postgres",
                    "POSTGRES_DBNAME": name,
                    "POSTGRES_HOST": url.host or "127.0.0.1",
                    "POSTGRES_PORT": str(url.port or 5432),
                    "POSTGRES_USER": url.username or "postgres",
                    "POSTGRES_PASSWORD": url.password or "unused-with-trust-auth",
                },
            )
        finally:
            with admin_engine.connect() as conn:
                try:  # FORCE (PostgreSQL 13+) also ends connections a peer's pool left open
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                except sa.exc.ProgrammingError:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        admin_engine.dispose()


def raw_engine(db: Database) -> sa.Engine:
    """A plain engine: same database, same durability as the store's, nothing else."""
    engine = sa.create_engine(db.url)
    if db.is_sqlite:

        @sa_event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.close()

    return engine


def durability(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
            sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
            return f"journal_mode={mode}, synchronous={_sync_name(sync)}"
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
        fsync = conn.exec_driver_sql("SHOW fsync").scalar()
        return f"synchronous_commit={sync}, fsync={fsync}"


# -- the section ---------------------------------------------------------------------------------


def bench_database(ctx: BenchContext, db: Database, sizes: Sizes) -> list[Figure]:
    runs = ctx.runs
    label = db.label
    with ExitStack() as stack:
        ctx.progress(f"{label}: setting up")
        store = EventStore.open(db.url)
        stack.callback(store.close)
        raw = raw_engine(db)
        stack.callback(raw.dispose)
        raw_metadata.create_all(raw)
        if db.is_sqlite:
            stack.enter_context(eventsourcing_sqlite_synchronous_normal())
        app = BenchApp(env=db.eventsourcing_env)
        stack.callback(app.close)
        runner = stack.enter_context(asyncio.Runner())
        tasks = TaskStorePeer(db.async_url, db.is_sqlite, runner)
        stack.callback(tasks.close)

        ctx.note(f"{label}: our store {durability(store.engine)}; raw {durability(raw)}")
        if db.is_sqlite:
            ctx.note(
                f"{label}: eventsourcing {eventsourcing_sqlite_pragmas(app)} "
                "(patched from its default synchronous=FULL)"
            )

        # Per-event appends: streams and aggregates exist already (the steady state of a task
        # receiving status changes), so every timed append updates a head.
        single = AppendPlan([TaskStream.new("task") for _ in range(STREAMS)], 1)
        ours_append(store)(single.take(STREAMS))
        raw_single = RawPlan(STREAMS, 1, "raw-task")
        raw_insert_each(raw)(raw_single.take(STREAMS))
        aggregates = _new_aggregates(app, STREAMS)
        es_plan = _EsPlan(aggregates)

        batched = AppendPlan([TaskStream.new("batch") for _ in range(STREAMS)], BATCH)
        ours_append(store)(batched.take(STREAMS // 10))
        raw_batched = RawPlan(STREAMS, BATCH, "raw-batch")
        raw_insert_many(raw)(raw_batched.take(STREAMS // 10))

        # Whole streams to read, for us, the raw table and the eventsourcing aggregates.
        length = sizes.stream_length
        read_streams = [TaskStream.new("read") for _ in range(sizes.read_streams)]
        read_plan = AppendPlan(read_streams, BATCH)
        ours_append(store)(read_plan.take(sizes.read_streams * length // BATCH))
        raw_read_plan = RawPlan(sizes.read_streams, BATCH, "raw-read")
        raw_insert_many(raw)(raw_read_plan.take(sizes.read_streams * length // BATCH))
        es_read_ids = _long_aggregates(app, sizes.read_streams, length)

        ctx.progress(f"{label}: appending one event per transaction")
        one = median_rates(
            {
                "raw": runs_of(
                    [raw_single.take(sizes.single) for _ in range(runs)], raw_insert_each(raw)
                ),
                "ours": runs_of(
                    [single.take(sizes.single) for _ in range(runs)], ours_append(store)
                ),
                "eventsourcing": runs_of(
                    [es_plan.take(sizes.single) for _ in range(runs)], es_save_each(app)
                ),
                "a2a": runs_of(
                    [tasks.take(sizes.task_saves) for _ in range(runs)], tasks.save_each
                ),
            },
            runs,
        )
        ctx.progress(f"{label}: appending {BATCH} events per transaction")
        many = median_rates(
            {
                "raw": runs_of(
                    [raw_batched.take(sizes.batches) for _ in range(runs)], raw_insert_many(raw)
                ),
                "ours": runs_of(
                    [batched.take(sizes.batches) for _ in range(runs)], ours_append(store)
                ),
            },
            runs,
        )
        ctx.progress(f"{label}: reading streams")
        ids = [s.stream_id for s in read_streams]
        reads = median_rates(
            {
                "raw": raw_read_streams(raw, raw_read_plan.keys),
                "ours": ours_read_streams(store, ids),
                "eventsourcing": es_reconstruct(app, es_read_ids),
            },
            runs,
        )
        ctx.progress(f"{label}: reading the whole log")
        log = median_rates({"raw": raw_read_all(raw), "ours": ours_read_all(store)}, runs)

    ev = "events/s"
    es_sync = " (synchronous=NORMAL)" if db.is_sqlite else ""
    return [
        Figure.compared(
            f"{label} append 1 event/txn (chain+projection)",
            one["ours"],
            one["raw"],
            ev,
            APPEND_TARGET,
        ),
        Figure.compared(f"{label} append {BATCH} events/txn", many["ours"], many["raw"], ev, None),
        Figure.compared(
            f"{label} read_stream {length}-event streams (decoded)",
            reads["ours"],
            reads["raw"],
            ev,
            STREAM_READ_TARGET,
        ),
        Figure.compared(
            f"{label} read_all pages of {PAGE} (decoded)",
            log["ours"],
            log["raw"],
            ev,
            READ_ALL_TARGET,
        ),
        Figure.compared(
            f"{label} peer eventsourcing save 1 event/save{es_sync}",
            one["eventsourcing"],
            one["raw"],
            ev,
            None,
        ),
        Figure.compared(
            f"{label} peer a2a-sdk DatabaseTaskStore.save (status change)",
            one["a2a"],
            one["raw"],
            "saves/s",
            None,
        ),
        Figure.compared(
            f"{label} peer eventsourcing repository.get ({length}-event aggregate)",
            reads["eventsourcing"],
            reads["raw"],
            ev,
            None,
        ),
    ]


def _new_aggregates(app: Application[UUID], count: int) -> list[Any]:
    aggregates = [BenchTask() for _ in range(count)]
    for aggregate in aggregates:
        app.save(aggregate)
    return aggregates


def _long_aggregates(app: Application[UUID], count: int, length: int) -> list[Any]:
    ids: list[Any] = []
    for _ in range(count):
        aggregate = BenchTask()
        for version in range(2, length + 1):
            aggregate.change_state(**es_command_args(version))
        app.save(aggregate)
        ids.append(aggregate.id)
    return ids


class _EsPlan:
    """Commands round-robin over live aggregates, arguments built ahead of time."""

    def __init__(self, aggregates: list[Any]) -> None:
        self.aggregates = aggregates
        self._next = 0

    def take(self, commands: int) -> list[tuple[Any, dict[str, Any]]]:
        out: list[tuple[Any, dict[str, Any]]] = []
        for _ in range(commands):
            aggregate = self.aggregates[self._next % len(self.aggregates)]
            out.append((aggregate, es_command_args(self._next)))
            self._next += 1
        return out


@register("store")
def store_section(ctx: BenchContext) -> list[Figure]:
    """The event store against raw Core, eventsourcing and the a2a-sdk store, per database."""
    sizes = Sizes.for_context(ctx)
    ctx.note(
        "baselines: raw SQLAlchemy Core on a plain table of equal rows (same columns, index on "
        "(stream_id, version)) in the same database, plain engine; raw reads json.loads each row"
    )
    return on_each_database(ctx, lambda db: bench_database(ctx, db, sizes))


def on_each_database(ctx: BenchContext, bench: Callable[[Database], list[Figure]]) -> list[Figure]:
    """``bench`` on a fresh SQLite file, then on a fresh PostgreSQL database when a URL is given
    (an unreachable server is a note, not a failure)."""
    figures = []
    with sqlite_database() as db:
        figures += bench(db)
    if ctx.pg_url:
        with ExitStack() as stack:
            try:
                db = stack.enter_context(postgres_database(ctx.pg_url))
            except sa.exc.OperationalError as exc:
                reason = str(exc.orig).strip().splitlines()[0]
                ctx.note(f"PostgreSQL unreachable ({reason}): PostgreSQL figures omitted")
                return figures
            figures += bench(db)
    return figures
