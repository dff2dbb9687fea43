"""The event log: append with optimistic concurrency, read by stream and globally.

Ordering guarantee for tailing readers (``read_all(after=…)``): a reader that has seen position
``p`` will never later see a commit of a position below ``p``.

- SQLite gives this for free: one writer at a time, and writers take the lock up front with
  ``BEGIN IMMEDIATE``.
- On PostgreSQL, sequence values are drawn at insert but become visible at commit, so two writers
  could commit out of order and a tailing reader would skip the slower one's event. Every append
  therefore takes a transaction-scoped advisory lock right before inserting its events and holds
  it through commit: positions are drawn and committed in one order. It is the last lock an append
  takes and covers only the insert and the commit, so writers still prepare (hashing, projection,
  the row lock on their stream's head) in parallel. Gaps in positions (rolled-back inserts) are
  possible and harmless; versions within a stream are gap-free.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL

from cardfence import migrations
from cardfence.store import append_sql
from cardfence.store.chain import ChainBreak, content_hash, event_hash, verify_chain
from cardfence.store.database import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    WRITE,
    configure_sqlite,
    create_engine,
    cursor_stream_record,
    is_sqlite_busy,
    missing_driver,
    normalise_url,
    one_line,
    recorded_event,
    snapshot_row,
    stream_record,
    timeout_detail,
)
from cardfence.store.duework import DueWork
from cardfence.store.errors import (
    ConcurrencyError,
    LeaseLostError,
    PayloadError,
    SchemaTooNewError,
    SnapshotMismatchError,
    StoreUnavailableError,
)
from cardfence.store.groupcommit import CommitStats, GroupCommit, GroupCommitter
from cardfence.store.records import (
    GENESIS_HASH,
    CardSnapshot,
    Lease,
    NewEvent,
    Projection,
    RecordedEvent,
    StreamRecord,
)
from cardfence.store.schema import card_snapshots, events, streams

_T = TypeVar("_T")

DEFAULT_GROUP_COMMIT = GroupCommit()

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# A projection is a cache of its stream's replay and may hold many events' worth (a task with
# 100,000 artifacts): it has a limit of its own, 64 times an event's (R16, docs/rules.md).
DEFAULT_MAX_PROJECTION_BYTES = 64 * DEFAULT_MAX_PAYLOAD_BYTES
_PG_APPEND_LOCK = 0x63617264_66656E63 & 0x7FFF_FFFF_FFFF_FFFF  # "cardfenc"
_PG_MIGRATE_LOCK = _PG_APPEND_LOCK - 1
_SQLITE_BUSY_RETRIES = 8
_HEAD_CACHE_LIMIT = 50_000
# Built once: SQLAlchemy's statement building costs more than the indexed lookup it makes.
_HEADS_BY_ALIAS = (
    sa.select(streams).where(streams.c.alias == sa.bindparam("alias")).order_by(streams.c.stream_id)
)

_EVENT_COLUMNS = (
    events.c.position,
    events.c.stream_id,
    events.c.version,
    events.c.type,
    events.c.schema_version,
    events.c.payload,
    events.c.recorded_at,
    events.c.prev_hash,
    events.c.hash,
)


def _encode(stream_id: str, what: str, value: object, limit: int, *, sort_keys: bool = True) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(stream_id, f"{what} is not JSON-serialisable: {exc}") from exc
    if len(text) > limit:
        raise PayloadError(stream_id, f"{what} is {len(text)} bytes, over the {limit}-byte limit")
    return text


def _now() -> datetime:
    return datetime.now(UTC)


class EventStore:
    """An append-only, hash-chained event log with stream projections and card snapshots.

    Open it with :meth:`open`, which migrates the database to the newest schema first.
    """

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
        lock = _PG_APPEND_LOCK if self._is_postgres and self._SERIALISE_POSITIONS else None
        self._sql = append_sql.build(engine.dialect.name, lock)
        self.due = DueWork(self)
        """Due work and leases: which process drives which live stream (``store.duework``)."""
        # A transaction of several appends takes the position lock once, after all their head
        # rows: its head statements are these, without it.
        self._sql_unlocked = append_sql.build(engine.dialect.name, None)
        self._position_lock = None if lock is None else f"SELECT pg_advisory_xact_lock({int(lock)})"
        self.group_commit = group_commit
        self._group: GroupCommitter[_Prepared, list[int]] | None = (
            None
            if group_commit is None
            else GroupCommitter(group_commit, self._commit_batch, _stream_of)
        )
        self._stats_lock = threading.Lock()
        self._appends = self._commits = self._splits = 0
        # (version -> hash) of stream heads this process wrote or read. An event at a given
        # (stream, version) never changes, so a cached pair stays true forever; the conditional
        # update of the head row decides whether it is still the head.
        self._heads: dict[str, _Head] = {}
        # SQLite file: each thread keeps one connection for the hot path (appends, head reads);
        # a pool checkout and return cost a quarter of an append. None elsewhere.
        self._own: threading.local | None = None
        self._own_connections: list[Any] = []
        self._own_lock = threading.Lock()
        database = engine.url.database
        if self._is_sqlite and database not in (None, "", ":memory:") and not engine.url.query:
            self._own = threading.local()

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str | URL,
        *,
        migrate: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_projection_bytes: int = DEFAULT_MAX_PROJECTION_BYTES,
        busy_timeout_ms: int = 5000,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        group_commit: bool | GroupCommit = True,
    ) -> EventStore:
        """Connect to ``url`` and (by default) migrate it to the newest schema.

        PostgreSQL: connecting gives up after ``connect_timeout`` seconds and the server cancels
        any statement running past ``statement_timeout`` (None: no limit), unless the URL sets
        its own (``?connect_timeout=…``, ``options=-c statement_timeout=…``); either timing out
        raises :class:`StoreUnavailableError` saying which.

        ``group_commit``: appends from concurrent threads share one transaction (True: with
        :data:`DEFAULT_GROUP_COMMIT`'s bounds; a :class:`GroupCommit` sets them; False: one
        transaction per append).
        """
        parsed = normalise_url(url)
        shown = parsed.render_as_string(hide_password=True)
        try:
            engine = create_engine(
                parsed,
                busy_timeout_ms,
                connect_timeout=connect_timeout,
                statement_timeout=statement_timeout,
            )
        except ImportError as exc:  # the URL names a driver that is not installed
            raise StoreUnavailableError(shown, missing_driver(parsed, exc)) from exc
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
            raise StoreUnavailableError(shown, f"cannot use this URL: {exc}") from exc
        store = cls(
            engine,
            max_payload_bytes=max_payload_bytes,
            max_projection_bytes=max_projection_bytes,
            busy_timeout_ms=busy_timeout_ms,
            group_commit=(
                DEFAULT_GROUP_COMMIT
                if group_commit is True
                else None
                if group_commit is False
                else group_commit
            ),
        )
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> str:
        """Bring the schema to head (idempotent, safe when several processes race). Returns it."""
        head = migrations.head_revision()

        def run() -> str:
            # One transaction, under the write lock (SQLite) or an advisory lock (PostgreSQL):
            # two processes opening a fresh database at once migrate it exactly once.
            with self._write() as conn:
                if self._is_postgres:
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATE_LOCK)))
                current = migrations.current_revision(conn)
                if current is not None and current not in migrations.known_revisions():
                    raise SchemaTooNewError(self.url, current)
                if current != head:
                    migrations.upgrade(conn)
            return head

        return self._retrying(run)

    def schema_revision(self) -> str | None:
        """The revision the database is stamped with (``None`` if never migrated)."""
        with self._read() as conn:
            return migrations.current_revision(conn)

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

    def __enter__(self) -> EventStore:
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

    # -- appending -----------------------------------------------------------------------------

    def append(
        self,
        stream_id: str,
        expected_version: int,
        new_events: Sequence[NewEvent],
        *,
        projection: Projection | None = None,
        snapshots: Iterable[CardSnapshot] = (),
        lease: Lease | None = None,
    ) -> list[int]:
        """Append ``new_events`` to a stream at ``expected_version``, atomically.

        The projection (if given), its due-work row (``Projection.live``) and any card snapshots
        are written in the same transaction. Returns the events' global positions. Raises
        :class:`ConcurrencyError` when the stream is not at ``expected_version``,
        :class:`LeaseLostError` when ``lease`` is no longer the stream's current claim,
        :class:`PayloadError` when a payload or the projection cannot be stored; in each case
        nothing is written.

        With group commit (the default), appends from concurrent threads share one transaction;
        each still gets exactly its own outcome (see :mod:`cardfence.store.groupcommit`).
        """
        request = self._request(
            AppendRequest(stream_id, expected_version, new_events, projection, snapshots, lease)
        )
        if self._group is not None:
            return self._group.submit(request)
        return self._retrying(lambda: self._commit_alone(request))

    @property
    def stats(self) -> CommitStats:
        """Appends committed and the transactions that committed them, since opening."""
        with self._stats_lock:
            return CommitStats(self._appends, self._commits, self._splits)

    def _request(self, request: AppendRequest) -> _Prepared:
        """``request`` with its payloads encoded and checked, before it waits for a transaction."""
        stream_id = request.stream_id
        if not request.new_events:
            raise PayloadError(stream_id, "append of no events")
        if request.lease is not None and request.lease.stream_id != stream_id:
            raise PayloadError(stream_id, f"append under a lease on {request.lease.stream_id!r}")
        limit = self.max_payload_bytes
        payloads = [
            _encode(stream_id, f"{e.type} payload", e.data, limit) for e in request.new_events
        ]
        projection = request.projection
        state = (
            None
            if projection is None
            else _encode(
                stream_id,
                "projection",
                projection.state,
                self.max_projection_bytes,
                sort_keys=False,
            )
        )
        cards = sorted(request.snapshots, key=lambda s: s.revision)
        for card in cards:
            actual = content_hash(card.body)
            if actual != card.revision:
                raise SnapshotMismatchError(card.revision, actual)
        return _Prepared(request, payloads, state, cards)

    def _commit_alone(self, prepared: _Prepared) -> list[int]:
        """One append in a transaction of its own, its database errors said as the store's."""
        request = prepared.request
        try:
            (outcome,) = self._transaction([prepared])
        except self._dbapi.IntegrityError as exc:
            # A version another writer took first -- or a constraint or trigger refusing the
            # rows, which no retry would change: told apart by where the stream's head is now.
            head = self.stream(request.stream_id)
            actual = 0 if head is None else head.version
            if actual != request.expected_version:
                raise ConcurrencyError(request.stream_id, request.expected_version, actual) from exc
            raise StoreUnavailableError(
                self.url, f"the database refused the append to {request.stream_id!r}: "
                f"{one_line(exc)}"
            ) from exc  # fmt: skip
        except self._dbapi.DataError as exc:
            raise PayloadError(
                request.stream_id, f"the database refused a value: {one_line(exc)}"
            ) from exc
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _commit_batch(self, batch: list[_Prepared]) -> list[list[int] | BaseException]:
        """Group commit's leader: ``batch`` (one append per stream) in one transaction.

        Should anything but an append's own version check fail, the transaction is rolled back
        whole and each append is written alone, so each gets exactly its own outcome.
        """
        if len(batch) > 1:
            try:
                return self._retrying(lambda: self._transaction(batch))
            except Exception:  # rolled back whole: each append alone says what it was
                with self._stats_lock:
                    self._splits += 1
        return [self._outcome_alone(prepared) for prepared in batch]

    def _outcome_alone(self, prepared: _Prepared) -> list[int] | BaseException:
        try:
            return self._retrying(lambda: self._commit_alone(prepared))
        except Exception as exc:  # this append's own outcome, for its caller
            return exc

    def _transaction(self, batch: Sequence[_Prepared]) -> list[list[int] | BaseException]:
        """Write ``batch`` (one append per stream) in one transaction and commit it once.

        Every append takes its stream's head row first (in stream order, so two transactions
        never wait on each other's rows), then the position lock is taken, then every append
        writes its snapshots and events. An append whose version check fails has written nothing
        and is left out with its :class:`ConcurrencyError`; any other failure rolls the whole
        transaction back and is raised. Outcomes come in ``batch``'s order.
        """
        now = _now()
        stamp = self._sql.timestamp(now)
        alone = len(batch) == 1
        outcomes: list[list[int] | BaseException | None] = [None] * len(batch)
        written: list[tuple[int, _Written]] = []
        with self._driver_connection() as raw:
            try:
                cursor = raw.cursor()
                if self._is_sqlite:
                    # Take the write lock up front: positions are drawn in commit order.
                    cursor.execute("BEGIN IMMEDIATE")
                staged: list[tuple[int, Callable[[], _Written]]] = []
                for index in sorted(range(len(batch)), key=lambda i: batch[i].request.stream_id):
                    try:
                        finish = self._append_on(cursor, batch[index], now, stamp, lock=alone)
                    except (ConcurrencyError, LeaseLostError) as exc:
                        outcomes[index] = exc  # it wrote nothing: the others go on
                        continue
                    staged.append((index, finish))
                if not staged:
                    self._rollback(raw)
                    return [o for o in outcomes if o is not None]
                if not alone and self._position_lock is not None:
                    cursor.execute(self._position_lock)
                written = [(index, finish()) for index, finish in staged]
                raw.commit()
            except BaseException as exc:
                if isinstance(exc, self._dbapi.OperationalError) and self._is_postgres:
                    raw.invalidate()  # a dropped connection must not go back to the pool
                else:
                    self._rollback(raw)
                raise
        if len(self._heads) + len(written) > _HEAD_CACHE_LIMIT:
            self._heads.clear()
        for index, (positions, last_hash, keys) in written:
            request = batch[index].request
            self._heads[request.stream_id] = _Head(request.new_version, last_hash, keys)
            outcomes[index] = positions
        with self._stats_lock:
            self._commits += 1
            self._appends += len(written)
        return [o for o in outcomes if o is not None]

    def _append_on(
        self, cursor: Any, prepared: _Prepared, now: datetime, stamp: object, *, lock: bool
    ) -> Callable[[], _Written]:
        """One append's statements, in the caller's transaction, in two halves.

        The first half runs now: the version check and the move of the stream's head row (its
        row lock, on PostgreSQL; with ``lock``, the position lock too). It writes nothing before
        it may raise :class:`ConcurrencyError`. The second half is returned, to be called once
        every append of the transaction has its head row and the position lock is held: the
        card snapshots and the events. It returns the positions, the last event's hash and the
        head's indexed keys, for the caller to keep once the transaction has committed.
        """
        request = prepared.request
        stream_id, expected_version = request.stream_id, request.expected_version
        projection = request.projection
        keys = (
            _keys(projection)
            if projection is not None
            else self._cached_keys(stream_id, expected_version)
        )
        # The due-work row is locked before the stream's head row in every append (one lock
        # order), and written only once the version check has passed.
        live = None if projection is None else projection.live
        if request.lease is not None:
            self.due.fence(cursor, request.lease)
        elif live is not None:
            self.due.lock(cursor, stream_id)
        prev = self._prev_hash(cursor, stream_id, expected_version)
        self._advance_head(
            cursor,
            self._sql if lock else self._sql_unlocked,
            stream_id,
            expected_version,
            request.new_version,
            projection,
            prepared.state,
            stamp,
        )
        if live is not None:
            self.due.track(cursor, stream_id, live)

        def finish() -> _Written:
            sql = self._sql
            for card in prepared.cards:
                cursor.execute(sql.insert_snapshot, snapshot_row(card, sql.timestamp))
            rows: list[dict[str, Any]] = []
            link = prev
            for offset, (new, payload) in enumerate(
                zip(request.new_events, prepared.payloads, strict=True)
            ):
                version = expected_version + offset + 1
                digest = event_hash(
                    stream_id, version, new.type, new.schema_version, now, payload, link
                )
                rows.append(
                    {
                        "stream_id": stream_id,
                        "version": version,
                        "type": new.type,
                        "schema_version": new.schema_version,
                        "payload": payload,
                        "recorded_at": stamp,
                        "prev_hash": link,
                        "hash": digest,
                    }
                )
                link = digest
            return self._insert_events(cursor, rows), link, keys

        return finish

    def _prev_hash(self, cursor: Any, stream_id: str, expected_version: int) -> str:
        if expected_version == 0:
            return GENESIS_HASH
        cached = self._heads.get(stream_id)
        if cached is not None and cached.version == expected_version:
            return cached.hash
        cursor.execute(self._sql.select_hash, {"stream_id": stream_id, "version": expected_version})
        found = cursor.fetchone()
        if found is None:
            raise ConcurrencyError(
                stream_id, expected_version, self._head_version(cursor, stream_id)
            )
        return str(found[0])

    def _cached_keys(self, stream_id: str, version: int) -> tuple[str | None, ...] | None:
        """The indexed keys of the stream's head at ``version``, if this store wrote it."""
        cached = self._heads.get(stream_id)
        return cached.keys if cached is not None and cached.version == version else None

    def _head_version(self, cursor: Any, stream_id: str) -> int | None:
        cursor.execute(self._sql.select_version, {"stream_id": stream_id})
        found = cursor.fetchone()
        return None if found is None else int(found[0])

    def _advance_head(
        self,
        cursor: Any,
        sql: append_sql.AppendSQL,
        stream_id: str,
        expected_version: int,
        new_version: int,
        projection: Projection | None,
        state: str | None,
        stamp: object,
    ) -> None:
        """Move the stream's head row from ``expected_version`` on, or fail with a conflict.

        ``sql``'s head statements take the position lock too, or not (see :meth:`_transaction`).
        """
        values: dict[str, Any] = {
            "stream_id": stream_id,
            "version": new_version,
            "updated_at": stamp,
            "expected": expected_version,
        }
        if projection is not None:
            values.update(
                state=state,
                category=projection.category,
                alias=projection.alias,
                status=projection.status,
            )
        if expected_version == 0:
            values.setdefault("state", "{}")
            for name in ("category", "alias", "status"):
                values.setdefault(name, None)
            del values["expected"]
            statement = sql.insert_head
        elif projection is None:
            statement = sql.update_head_keep_projection
        elif self._cached_keys(stream_id, expected_version) == _keys(projection):
            statement = sql.update_head_state
        else:
            statement = sql.update_head
        cursor.execute(statement, values)
        if cursor.rowcount != 1:
            raise ConcurrencyError(
                stream_id, expected_version, self._head_version(cursor, stream_id)
            )

    def _insert_events(self, cursor: Any, rows: list[dict[str, Any]]) -> list[int]:
        sql = self._sql
        if self._is_sqlite:
            if len(rows) == 1:
                cursor.execute(sql.insert_event, rows[0])
                return [int(cursor.lastrowid)]
            cursor.executemany(sql.insert_event, rows)
            # We hold the write lock: the rows took consecutive positions ending at the last.
            cursor.execute("SELECT last_insert_rowid()")
            last = int(cursor.fetchone()[0])
            return list(range(last - len(rows) + 1, last + 1))
        if len(rows) == 1:
            cursor.execute(sql.insert_event, rows[0])
            return [int(cursor.fetchone()[0])]
        cursor.executemany(sql.insert_event, rows, returning=True)
        positions = []
        while True:
            positions.append(int(cursor.fetchone()[0]))
            if not cursor.nextset():
                break
        return positions

    def _insert_snapshot(self, conn: sa.Connection, card: CardSnapshot) -> bool:
        values = {
            "revision": card.revision,
            "body": card.body,
            "source_url": card.source_url,
            "etag": card.etag,
            "http_status": card.http_status,
            "fetched_at": card.fetched_at,
        }
        dialect_insert = postgresql.insert if self._is_postgres else sqlite.insert
        statement = (
            dialect_insert(card_snapshots)
            .values(**values)
            .on_conflict_do_nothing()
            .returning(card_snapshots.c.revision)
        )
        return conn.execute(statement).first() is not None

    # -- card snapshots ------------------------------------------------------------------------

    def put_snapshot(self, card: CardSnapshot) -> bool:
        """Store a card body under its content address; ``False`` if it was already there."""
        actual = content_hash(card.body)
        if actual != card.revision:
            raise SnapshotMismatchError(card.revision, actual)

        def put() -> bool:
            with self._write() as conn:
                return self._insert_snapshot(conn, card)

        return self._retrying(put)

    def get_snapshot(self, revision: str) -> CardSnapshot | None:
        with self._read() as conn:
            row = conn.execute(
                sa.select(card_snapshots).where(card_snapshots.c.revision == revision)
            ).one_or_none()
        if row is None:
            return None
        return CardSnapshot(
            revision=row.revision,
            body=row.body,
            source_url=row.source_url,
            etag=row.etag,
            http_status=row.http_status,
            fetched_at=row.fetched_at,
        )

    def snapshot_revisions(self) -> list[str]:
        with self._read() as conn:
            return list(conn.execute(sa.select(card_snapshots.c.revision)).scalars())

    # -- reading -------------------------------------------------------------------------------

    def read_stream(self, stream_id: str, from_version: int = 1) -> list[RecordedEvent]:
        """A stream's events from ``from_version`` on, in version order."""
        if self._is_sqlite:
            return self._events_on_cursor(
                self._sql.select_stream, {"stream_id": stream_id, "version": from_version}
            )
        with self._read() as conn:
            rows = conn.execute(
                sa.select(*_EVENT_COLUMNS)
                .where(events.c.stream_id == stream_id, events.c.version >= from_version)
                .order_by(events.c.version)
            ).all()
        return [RecordedEvent(*row) for row in rows]

    def read_all(self, after: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Up to ``limit`` events with a global position above ``after``, in position order.

        Safe to tail: see the module docstring for why no late commit is ever skipped.
        """
        if self._is_sqlite:
            return self._events_on_cursor(
                self._sql.select_after, {"position": after, "limit": limit}
            )
        with self._read() as conn:
            rows = conn.execute(
                sa.select(*_EVENT_COLUMNS)
                .where(events.c.position > after)
                .order_by(events.c.position)
                .limit(limit)
            ).all()
        return [RecordedEvent(*row) for row in rows]

    def last_position(self) -> int:
        with self._read() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.coalesce(sa.func.max(events.c.position), 0))
                ).scalar_one()
            )

    def stream(self, stream_id: str) -> StreamRecord | None:
        """A stream's head and projection, or ``None`` if it has no events."""
        if self._is_sqlite:
            return self._stream_on_cursor(stream_id)
        with self._read() as conn:
            row = conn.execute(
                sa.select(streams).where(streams.c.stream_id == stream_id)
            ).one_or_none()
        return None if row is None else stream_record(row)

    def _rows_on_cursor(self, query: str, params: dict[str, Any]) -> list[Any]:
        """SQLite: a fixed query (see append_sql) on the driver's cursor, for the reads on every
        engine step and push delivery (SQLAlchemy's statement building costs more than they)."""
        try:
            with self._driver_connection() as raw:
                cursor = raw.cursor()
                cursor.execute(query, params)
                return list(cursor.fetchall())
        except self._dbapi.Error as exc:
            raise StoreUnavailableError(self.url, one_line(exc)) from exc

    def _events_on_cursor(self, query: str, params: dict[str, Any]) -> list[RecordedEvent]:
        return [recorded_event(row) for row in self._rows_on_cursor(query, params)]

    def _stream_on_cursor(self, stream_id: str) -> StreamRecord | None:
        rows = self._rows_on_cursor(self._sql.select_head, {"stream_id": stream_id})
        return cursor_stream_record((stream_id, *rows[0])) if rows else None

    def _heads_by_alias_on_cursor(self, alias: str) -> list[StreamRecord]:
        # On every push delivery (R16: the task is found by its remote task id).
        rows = self._rows_on_cursor(self._sql.select_heads_by_alias, {"alias": alias})
        return [cursor_stream_record(row) for row in rows]

    def streams(
        self,
        *,
        category: str | None = None,
        status: str | None = None,
        alias: str | None = None,
    ) -> list[StreamRecord]:
        """Stream heads, optionally filtered by their indexed keys, ordered by stream id."""
        if alias is not None:
            # By the alias alone, the rest checked on the few rows it names: given the category
            # too, SQLite's planner picks the category's index and reads every stream of it.
            if self._is_sqlite:
                records = self._heads_by_alias_on_cursor(alias)
            else:
                with self._read() as conn:
                    found = conn.execute(_HEADS_BY_ALIAS, {"alias": alias})
                    records = [stream_record(row) for row in found]
        else:
            query = sa.select(streams).order_by(streams.c.stream_id)
            if category is not None:
                query = query.where(streams.c.category == category)
            if status is not None:
                query = query.where(streams.c.status == status)
            with self._read() as conn:
                return [stream_record(row) for row in conn.execute(query)]
        return [
            r
            for r in records
            if (category is None or r.category == category)
            and (status is None or r.status == status)
        ]

    def verify_stream(self, stream_id: str) -> ChainBreak | None:
        """Check a stream's hash chain, version sequence and head; the first break or ``None``."""
        head = self.stream(stream_id)
        return verify_chain(
            stream_id, self.read_stream(stream_id), None if head is None else head.version
        )

    def stream_ids(self) -> list[str]:
        """Every stream that has a head row or at least one event."""
        with self._read() as conn:
            heads = set(conn.execute(sa.select(streams.c.stream_id)).scalars())
            logged = set(conn.execute(sa.select(events.c.stream_id).distinct()).scalars())
        return sorted(heads | logged)


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Every argument of one :meth:`EventStore.append`."""

    stream_id: str
    expected_version: int
    new_events: Sequence[NewEvent]
    projection: Projection | None = None
    snapshots: Iterable[CardSnapshot] = ()
    lease: Lease | None = None

    @property
    def new_version(self) -> int:
        return self.expected_version + len(self.new_events)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """An append ready to write: its payloads and projection encoded and size-checked, its card
    snapshots checked against their revisions and put in order."""

    request: AppendRequest
    payloads: list[str]
    state: str | None
    cards: list[CardSnapshot]


def _stream_of(prepared: _Prepared) -> str:
    return prepared.request.stream_id


# What an append wrote, kept once its transaction commits: positions, last hash, indexed keys.
_Written = tuple[list[int], str, tuple[str | None, ...] | None]


class _Head(NamedTuple):
    """What this store knows of a stream head it wrote: an event at a given (stream, version)
    never changes, so this stays true; the conditional head update decides if it is current."""

    version: int
    hash: str
    keys: tuple[str | None, ...] | None


def _keys(projection: Projection) -> tuple[str | None, ...]:
    return (projection.category, projection.alias, projection.status)


def iter_all(store: EventStore, after: int = 0, batch: int = 1000) -> Iterator[RecordedEvent]:
    """Every event after ``after`` in position order, read in batches."""
    while True:
        page = store.read_all(after=after, limit=batch)
        if not page:
            return
        yield from page
        after = page[-1].position


__all__ = [
    "AppendRequest",
    "CommitStats",
    "EventStore",
    "GroupCommit",
    "iter_all",
    "normalise_url",
]
