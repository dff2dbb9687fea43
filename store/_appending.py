"""Appending to the event log: optimistic concurrency on each stream's head row, the hash
chain, projections and due-work rows written in the same transaction, and group commit (appends
from concurrent threads share one transaction, each still getting exactly its own outcome).

Positions are committed in the order they are drawn (the module docstring of
:mod:`cardfence.store.event_store` says why that matters and how each database gives it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from cardfence.store import _cursor_sql as cursor_sql
from cardfence.store._base import (
    HEAD_CACHE_LIMIT,
    AppendRequest,
    Head,
    Prepared,
    Written,
    projection_keys,
)
from cardfence.store._reading import Reading
from cardfence.store.chain import content_hash, event_hash, salted_hash
from cardfence.store.database import one_line, snapshot_row
from cardfence.store.errors import (
    ConcurrencyError,
    ContentMismatchError,
    LeaseLostError,
    PayloadError,
    SnapshotMismatchError,
    StoreUnavailableError,
)
from cardfence.store.groupcommit import CommitStats
from cardfence.store.records import (
    GENESIS_HASH,
    CardSnapshot,
    ContentRecord,
    Lease,
    NewEvent,
    Projection,
)
from cardfence.store.schema import streams


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


class Appending(Reading):
    """Appends, alone or grouped, and what each one wrote."""

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
        contents: Iterable[ContentRecord] = (),
    ) -> list[int]:
        """Append ``new_events`` to a stream at ``expected_version``, atomically.

        The projection (if given), its due-work row (``Projection.live``), any card snapshots
        and the stream's content records (R17: what its events outline, each kept once) are
        written in the same transaction. Returns the events' global positions. Raises
        :class:`ConcurrencyError` when the stream is not at ``expected_version``,
        :class:`LeaseLostError` when ``lease`` is no longer the stream's current claim,
        :class:`PayloadError` when a payload or the projection cannot be stored,
        :class:`ContentMismatchError` when a content record is not its digest's; in each case
        nothing is written.

        With group commit (the default), appends from concurrent threads share one transaction;
        each still gets exactly its own outcome (see :mod:`cardfence.store.groupcommit`).
        """
        request = self._request(
            AppendRequest(
                stream_id, expected_version, new_events, projection, snapshots, lease, contents
            )
        )
        if self._group is not None:
            return self._group.submit(request)
        return self._retrying(lambda: self._commit_alone(request))

    def rewrite_projection(self, stream_id: str, version: int, projection: Projection) -> bool:
        """Replace a stream's stored projection -- its state, indexed keys and due-work row --
        while its head is still at ``version``; no event is appended, the head's version and
        time stay. For a projection altered in the store, rebuilt from the stream's events (the
        log is the truth, the projection derived from it). False, and nothing written, when the
        head has moved on or there is none. :class:`PayloadError` as for an append."""

        def update(conn: sa.Connection, values: dict[str, Any]) -> bool:
            at = (streams.c.stream_id == stream_id) & (streams.c.version == version)
            return conn.execute(streams.update().where(at).values(values)).rowcount == 1

        return self._write_head(stream_id, projection, update)

    def restore_head(
        self, stream_id: str, version: int, projection: Projection, updated_at: datetime
    ) -> bool:
        """Put back a stream's head row deleted from the store: at ``version`` (its last
        event's) with ``projection``, its keys and due-work row, and ``updated_at`` (its last
        event's time); no event is appended. False, and nothing written, when the stream has a
        head row. :class:`PayloadError` as for an append."""

        def insert(conn: sa.Connection, values: dict[str, Any]) -> bool:
            row = {"stream_id": stream_id, "version": version, "updated_at": updated_at}
            dialect_insert = postgresql.insert if self._is_postgres else sqlite.insert
            statement = dialect_insert(streams).values({**values, **row})
            # A head row there already (put back meanwhile): nothing inserted, False.
            statement = statement.on_conflict_do_nothing(index_elements=["stream_id"])
            return conn.execute(statement.returning(streams.c.stream_id)).first() is not None

        return self._write_head(stream_id, projection, insert)

    def _write_head(
        self,
        stream_id: str,
        projection: Projection,
        write: Callable[[sa.Connection, dict[str, Any]], bool],
    ) -> bool:
        """One transaction, outside any append: ``write`` the head row's projection columns
        (False: nothing written, and the transaction ends there), then the due-work row as
        ``projection.live`` says."""
        state = _encode(
            stream_id, "projection", projection.state, self.max_projection_bytes, sort_keys=False
        )
        values = {
            "state": state,
            "category": projection.category,
            "alias": projection.alias,
            "status": projection.status,
        }
        due = self.due.sql

        def run() -> bool:
            with self.engine.begin() as conn:
                if projection.live is not None and due.lock:  # appends' order: due, head
                    conn.exec_driver_sql(due.lock, {"stream_id": stream_id})
                if not write(conn, values):
                    return False
                if projection.live is not None:
                    statement = due.insert if projection.live else due.delete
                    conn.exec_driver_sql(statement, {"stream_id": stream_id})
            self._heads.pop(stream_id, None)  # its keys are the ones just written now
            return True

        return self._retrying(run)

    @property
    def stats(self) -> CommitStats:
        """Appends committed and the transactions that committed them, since opening."""
        with self._stats_lock:
            return CommitStats(self._appends, self._commits, self._splits)

    def _request(self, request: AppendRequest) -> Prepared:
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
        kept = sorted(request.contents, key=lambda c: c.digest)
        for content in kept:
            if content.stream_id != stream_id:
                raise PayloadError(stream_id, f"content of another stream, {content.stream_id!r}")
            actual = salted_hash(content.salt, content.body)
            if actual != content.digest:
                raise ContentMismatchError(stream_id, content.digest, actual)
        return Prepared(request, payloads, state, cards, kept)

    def _commit_alone(self, prepared: Prepared) -> list[int]:
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

    def _commit_batch(self, batch: list[Prepared]) -> list[list[int] | BaseException]:
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

    def _outcome_alone(self, prepared: Prepared) -> list[int] | BaseException:
        try:
            return self._retrying(lambda: self._commit_alone(prepared))
        except Exception as exc:  # this append's own outcome, for its caller
            return exc

    def _transaction(self, batch: Sequence[Prepared]) -> list[list[int] | BaseException]:
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
        written: list[tuple[int, Written]] = []
        with self._driver_connection() as raw:
            try:
                cursor = raw.cursor()
                if self._is_sqlite:
                    # Take the write lock up front: positions are drawn in commit order.
                    cursor.execute("BEGIN IMMEDIATE")
                staged: list[tuple[int, Callable[[], Written]]] = []
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
        if len(self._heads) + len(written) > HEAD_CACHE_LIMIT:
            self._heads.clear()
        for index, (positions, last_hash, keys) in written:
            request = batch[index].request
            self._heads[request.stream_id] = Head(request.new_version, last_hash, keys)
            outcomes[index] = positions
        with self._stats_lock:
            self._commits += 1
            self._appends += len(written)
        return [o for o in outcomes if o is not None]

    def _append_on(
        self, cursor: Any, prepared: Prepared, now: datetime, stamp: object, *, lock: bool
    ) -> Callable[[], Written]:
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
            projection_keys(projection)
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

        def finish() -> Written:
            sql = self._sql
            for card in prepared.cards:
                cursor.execute(sql.insert_snapshot, snapshot_row(card, sql.timestamp))
            for content in prepared.contents:
                cursor.execute(
                    sql.insert_content,
                    {
                        "stream_id": content.stream_id,
                        "digest": content.digest,
                        "salt": content.salt,
                        "body": content.body,
                        "recorded_at": stamp,
                    },
                )
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
        sql: cursor_sql.CursorSQL,
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
        elif self._cached_keys(stream_id, expected_version) == projection_keys(projection):
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
