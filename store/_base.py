"""What every part of the event store stands on: its configuration, its connections (one per
thread on a SQLite file, pooled elsewhere), transactions with their retry policy, and the shapes
an append takes on its way to a transaction.

The store is one class in layers, a module each: this one; ``_reading`` (streams, the global
log, card snapshots); ``_appending`` (optimistic concurrency, group commit, the hash chain); and
``event_store`` (:class:`~cardfence.store.event_store.EventStore`: opening and migrating). The
SQL the layers run on the driver's cursor is ``_cursor_sql``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self, TypeVar

import sqlalchemy as sa

from cardfence.store import _cursor_sql as cursor_sql
from cardfence.store.database import (
    WRITE,
    configure_sqlite,
    is_sqlite_busy,
    one_line,
    timeout_detail,
)
from cardfence.store.errors import StoreUnavailableError
from cardfence.store.groupcommit import GroupCommit, GroupCommitter
from cardfence.store.leases import DueWork
from cardfence.store.records import CardSnapshot, ContentRecord, Lease, NewEvent, Projection

_T = TypeVar("_T")

DEFAULT_GROUP_COMMIT = GroupCommit()

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# A projection is a cache of its stream's replay and may hold many events' worth (a task with
# 100,000 artifacts): it has a limit of its own, 64 times an event's (R16, docs/rules.md).
DEFAULT_MAX_PROJECTION_BYTES = 64 * DEFAULT_MAX_PAYLOAD_BYTES
PG_APPEND_LOCK = 0x63617264_66656E63 & 0x7FFF_FFFF_FFFF_FFFF  # "cardfenc"
PG_MIGRATE_LOCK = PG_APPEND_LOCK - 1
_SQLITE_BUSY_RETRIES = 8
HEAD_CACHE_LIMIT = 50_000


class StoreBase:
    """The store's configuration, connections and transactions (see the module docstring)."""

    # Off only in the test that shows a tailing reader skips events without the lock.
    _SERIALISE_POSITIONS = True

    def __init__(
        self,
        engine: sa.Engine,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        busy_timeout_ms: int = 5000,
        max_projection_bytes: int = DEFAULT_MAX_PROJECTION_BYTES,
        group_commit: GroupCommit | None = DEFAULT_GROUP_COMMIT,
    ) -> None:
        self.engine = engine
        self._busy_timeout_ms = busy_timeout_ms
        self.url = engine.url.render_as_string(hide_password=True)
        self.max_payload_bytes = max_payload_bytes
        self.max_projection_bytes = max_projection_bytes
        self._is_sqlite = engine.dialect.name == "sqlite"
        self._is_postgres = engine.dialect.name == "postgresql"
        self._dbapi: Any = engine.dialect.loaded_dbapi
        lock = PG_APPEND_LOCK if self._is_postgres and self._SERIALISE_POSITIONS else None
        self._sql = cursor_sql.build(engine.dialect.name, lock)
        self.due = DueWork(
            engine.dialect.name,
            connection=self._driver_connection,
            retrying=self._retrying,
            rollback=self._rollback,
        )
        """Due work and leases: which process drives which live stream (``store.leases``)."""
        # A transaction of several appends takes the position lock once, after all their head
        # rows: its head statements are these, without it.
        self._sql_unlocked = cursor_sql.build(engine.dialect.name, None)
        self._position_lock = None if lock is None else f"SELECT pg_advisory_xact_lock({int(lock)})"
        self.group_commit = group_commit
        self._group: GroupCommitter[Prepared, list[int]] | None = (
            None
            if group_commit is None
            else GroupCommitter(group_commit, self._commit_batch, _stream_of)
        )
        self._stats_lock = threading.Lock()
        self._appends = self._commits = self._splits = 0
        # (version -> hash) of stream heads this process wrote or read. An event at a given
        # (stream, version) never changes, so a cached pair stays true forever; the conditional
        # update of the head row decides whether it is still the head.
        self._heads: dict[str, Head] = {}
        # SQLite file: each thread keeps one connection for the hot path (appends, head reads);
        # a pool checkout and return cost a quarter of an append. None elsewhere.
        self._own: threading.local | None = None
        self._own_connections: list[Any] = []
        self._own_lock = threading.Lock()
        database = engine.url.database
        if self._is_sqlite and database not in (None, "", ":memory:") and not engine.url.query:
            self._own = threading.local()

    def close(self) -> None:
        with self._own_lock:
            for connection in self._own_connections:
                connection.close()
            self._own_connections.clear()
            self._own = threading.local() if self._own is not None else None
        self.engine.dispose()

    def _rollback(self, raw: Any) -> None:
        try:
            raw.rollback()
        except Exception:  # a broken connection: drop it rather than use it again
            if hasattr(raw, "invalidate"):
                raw.invalidate()
                return
            if self._own is not None and getattr(self._own, "connection", None) is raw:
                self._own.connection = None
            raw.close()

    @contextmanager
    def _driver_connection(self) -> Iterator[Any]:
        """A DBAPI connection for the hot path: this thread's own (SQLite file), else pooled."""
        if self._own is None:
            raw = self.engine.raw_connection()
            try:
                yield raw
            finally:
                raw.close()
            return
        connection = getattr(self._own, "connection", None)
        if connection is None:
            connection = self._dbapi.connect(
                self.engine.url.database, check_same_thread=False, isolation_level=None
            )
            configure_sqlite(connection, self._busy_timeout_ms, wal=True)
            with self._own_lock:
                self._own_connections.append(connection)
            self._own.connection = connection
        yield connection

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        try:
            with self.engine.connect() as conn:
                conn.execution_options(**{WRITE: True})
                with conn.begin():
                    yield conn
        except sa.exc.DBAPIError as exc:
            if isinstance(exc, sa.exc.OperationalError) and self._is_sqlite and is_sqlite_busy(exc):
                raise  # _retrying decides
            raise StoreUnavailableError(self.url, one_line(exc)) from exc

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        """A connection for reads. On PostgreSQL in autocommit: every read here is one statement
        (or independent ones), so BEGIN and COMMIT would only add two round trips to each."""
        try:
            with self.engine.connect() as conn:
                if self._is_postgres:
                    yield conn.execution_options(isolation_level="AUTOCOMMIT")
                    return
                with conn.begin():
                    yield conn
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailableError(self.url, one_line(exc)) from exc

    def _retrying(self, operation: Callable[[], _T]) -> _T:
        """Run a write, retrying a bounded number of times while SQLite reports it is busy, and
        once on PostgreSQL after a dropped connection (the pool does not ping on checkout)."""
        for attempt in range(_SQLITE_BUSY_RETRIES):
            try:
                return operation()
            except (sa.exc.DBAPIError, self._dbapi.Error) as exc:
                if not self._transient(exc, attempt):
                    raise StoreUnavailableError(self.url, one_line(exc)) from exc
                time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
        raise StoreUnavailableError(
            self.url, f"database stayed locked after {_SQLITE_BUSY_RETRIES} attempts"
        )

    def _transient(self, exc: BaseException, attempt: int) -> bool:
        original = getattr(exc, "orig", exc)
        if not isinstance(original, self._dbapi.OperationalError) or timeout_detail(exc):
            return False  # a timeout is not retried: it would only take as long again
        if self._is_sqlite:
            message = str(original).lower()
            return "locked" in message or "busy" in message
        return attempt == 0

    def _commit_batch(self, batch: list[Prepared]) -> list[list[int] | BaseException]:
        """Group commit's leader: the append path's (:mod:`cardfence.store._appending`)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Every argument of one :meth:`EventStore.append`."""

    stream_id: str
    expected_version: int
    new_events: Sequence[NewEvent]
    projection: Projection | None = None
    snapshots: Iterable[CardSnapshot] = ()
    lease: Lease | None = None
    contents: Iterable[ContentRecord] = ()

    @property
    def new_version(self) -> int:
        return self.expected_version + len(self.new_events)


@dataclass(frozen=True, slots=True)
class Prepared:
    """An append ready to write: its payloads and projection encoded and size-checked, its card
    snapshots and content records checked against their keys and put in order."""

    request: AppendRequest
    payloads: list[str]
    state: str | None
    cards: list[CardSnapshot]
    contents: list[ContentRecord] = field(default_factory=list)


def _stream_of(prepared: Prepared) -> str:
    return prepared.request.stream_id


# What an append wrote, kept once its transaction commits: positions, last hash, indexed keys.
Written = tuple[list[int], str, tuple[str | None, ...] | None]


class Head(NamedTuple):
    """What this store knows of a stream head it wrote: an event at a given (stream, version)
    never changes, so this stays true; the conditional head update decides if it is current."""

    version: int
    hash: str
    keys: tuple[str | None, ...] | None


def projection_keys(projection: Projection) -> tuple[str | None, ...]:
    """What a head row indexes of its projection, as :class:`Head` keeps it."""
    return (projection.category, projection.alias, projection.status)
