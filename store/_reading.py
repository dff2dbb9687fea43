"""Reading the event log: a stream's events, the global log in position order (safe to tail:
see :mod:`cardfence.store.event_store`), stream heads by their indexed keys, and card snapshots by
their content address. On a SQLite file the reads on every engine step go straight to the
driver's cursor (SQLAlchemy's statement building costs more than they).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from cardfence.store._base import StoreBase
from cardfence.store.chain import ChainBreak, content_hash, verify_chain
from cardfence.store.database import cursor_stream_record, one_line, recorded_event, stream_record
from cardfence.store.errors import SnapshotMismatchError, StoreUnavailableError
from cardfence.store.records import CardSnapshot, ContentRecord, RecordedEvent, StreamRecord
from cardfence.store.schema import card_snapshots, contents, events, streams

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


class Reading(StoreBase):
    """Streams, the global log, stream heads and card snapshots, read."""

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

    # -- content out of line (R17) ---------------------------------------------------------------

    def contents(
        self, stream_id: str, digests: Iterable[str] | None = None
    ) -> dict[str, ContentRecord]:
        """A stream's content records by digest: those of ``digests`` that are kept (an erased
        one is missing), or every one when ``digests`` is None."""
        query = sa.select(contents).where(contents.c.stream_id == stream_id)
        wanted = None if digests is None else sorted(set(digests))
        found: dict[str, ContentRecord] = {}
        with self._read() as conn:
            for chunk in [None] if wanted is None else _chunks(wanted):
                at = query if chunk is None else query.where(contents.c.digest.in_(chunk))
                for row in conn.execute(at):
                    found[row.digest] = ContentRecord(row.stream_id, row.digest, row.salt, row.body)
        return found

    def content_salt(self, stream_id: str) -> str | None:
        """The salt a stream's content records are kept under (one per stream, drawn when its
        first content was recorded); None when it has none."""
        with self._read() as conn:
            return conn.execute(
                sa.select(contents.c.salt).where(contents.c.stream_id == stream_id).limit(1)
            ).scalar_one_or_none()

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
        """SQLite: a fixed query (``_cursor_sql``) on the driver's cursor, for the reads on every
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

    def _heads_by_alias_on_cursor(self, alias: str, lenient: bool) -> list[StreamRecord]:
        # On every push delivery (R16: the task is found by its remote task id).
        rows = self._rows_on_cursor(self._sql.select_heads_by_alias, {"alias": alias})
        return [cursor_stream_record(row, lenient=lenient) for row in rows]

    def streams(
        self,
        *,
        category: str | None = None,
        status: str | None = None,
        alias: str | None = None,
        lenient: bool = False,
    ) -> list[StreamRecord]:
        """Stream heads, optionally filtered by their indexed keys, ordered by stream id. A
        head whose stored projection is not a JSON object raises :class:`CorruptRecordError`;
        with ``lenient``, it is given with an empty ``state`` and ``unreadable`` saying why."""
        if alias is not None:
            # By the alias alone, the rest checked on the few rows it names: given the category
            # too, SQLite's planner picks the category's index and reads every stream of it.
            if self._is_sqlite:
                records = self._heads_by_alias_on_cursor(alias, lenient)
            else:
                with self._read() as conn:
                    found = conn.execute(_HEADS_BY_ALIAS, {"alias": alias})
                    records = [stream_record(row, lenient=lenient) for row in found]
        else:
            query = sa.select(streams).order_by(streams.c.stream_id)
            if category is not None:
                query = query.where(streams.c.category == category)
            if status is not None:
                query = query.where(streams.c.status == status)
            with self._read() as conn:
                return [stream_record(row, lenient=lenient) for row in conn.execute(query)]
        return [
            r
            for r in records
            if (category is None or r.category == category)
            and (status is None or r.status == status)
        ]

    def streams_starting(
        self, *, id_prefix: str, alias_prefix: str, category: str | None = None
    ) -> list[StreamRecord]:
        """Stream heads whose id starts with ``id_prefix`` or whose alias starts with
        ``alias_prefix`` (an empty prefix matches nothing), ordered by stream id. Prefixes are
        text, never patterns (``%`` and ``_`` match only themselves), and case-sensitive. The
        database picks the rows: only those matching are read and decoded."""
        pairs = ((streams.c.stream_id, id_prefix), (streams.c.alias, alias_prefix))
        wanted = [column.startswith(prefix, autoescape=True) for column, prefix in pairs if prefix]
        if not wanted:
            return []
        query = sa.select(streams).where(sa.or_(*wanted)).order_by(streams.c.stream_id)
        if category is not None:
            query = query.where(streams.c.category == category)
        with self._read() as conn:
            found = [stream_record(row) for row in conn.execute(query)]
        # SQLite's LIKE ignores the case of ASCII letters: the rows it gave are checked again.
        return [
            r
            for r in found
            if (id_prefix and r.stream_id.startswith(id_prefix))
            or (alias_prefix and (r.alias or "").startswith(alias_prefix))
        ]

    def read_as_of_head(self, stream_id: str) -> tuple[StreamRecord | None, list[RecordedEvent]]:
        """A stream's head and its events up to the head's version, consistent while other
        processes append. The head is read first: every event up to it is committed with it, so
        the events read next hold them all. Events beyond it are left out when the head has
        moved since (appended meanwhile), and kept when it has not (written without moving the
        head: a chain check reports them). Made for audits: a head whose stored projection is
        not a JSON object is given with an empty ``state`` and ``unreadable`` saying why, where
        every other read raises :class:`CorruptRecordError`."""
        return self.read_as_of_heads([stream_id])[stream_id]

    def read_as_of_heads(
        self, stream_ids: Sequence[str]
    ) -> dict[str, tuple[StreamRecord | None, list[RecordedEvent]]]:
        """:meth:`read_as_of_head` for many streams in a few queries, not a few per stream (an
        audit of a PostgreSQL store reads every stream): their heads, then their events, then
        once more the heads of the streams that have events beyond their head."""
        heads = self._heads_of(stream_ids)
        logged = self._events_of(stream_ids)
        beyond = [
            stream_id
            for stream_id, head in heads.items()
            if logged[stream_id] and logged[stream_id][-1].version > head.version
        ]
        now = self._heads_of(beyond) if beyond else {}
        for stream_id in beyond:
            moved = now.get(stream_id)
            if moved is not None and moved.version != heads[stream_id].version:
                kept = heads[stream_id].version
                logged[stream_id] = [event for event in logged[stream_id] if event.version <= kept]
        return {stream_id: (heads.get(stream_id), logged[stream_id]) for stream_id in stream_ids}

    def _heads_of(self, stream_ids: Sequence[str]) -> dict[str, StreamRecord]:
        found: dict[str, StreamRecord] = {}
        with self._read() as conn:
            for chunk in _chunks(stream_ids):
                query = sa.select(streams).where(streams.c.stream_id.in_(chunk))
                found.update(
                    (row.stream_id, stream_record(row, lenient=True)) for row in conn.execute(query)
                )
        return found

    def _events_of(self, stream_ids: Sequence[str]) -> dict[str, list[RecordedEvent]]:
        found: dict[str, list[RecordedEvent]] = {stream_id: [] for stream_id in stream_ids}
        with self._read() as conn:
            for chunk in _chunks(stream_ids):
                query = (
                    sa.select(*_EVENT_COLUMNS)
                    .where(events.c.stream_id.in_(chunk))
                    .order_by(events.c.stream_id, events.c.version)
                )
                for row in conn.execute(query):
                    found[row.stream_id].append(RecordedEvent(*row))
        return found

    def verify_stream(self, stream_id: str) -> ChainBreak | None:
        """Check a stream's hash chain, version sequence and head (as of
        :meth:`read_as_of_head`); the first break or ``None``."""
        head, logged = self.read_as_of_head(stream_id)
        return verify_chain(stream_id, logged, None if head is None else head.version)

    def stream_ids(self) -> list[str]:
        """Every stream that has a head row or at least one event."""
        with self._read() as conn:
            heads = set(conn.execute(sa.select(streams.c.stream_id)).scalars())
            logged = set(conn.execute(sa.select(events.c.stream_id).distinct()).scalars())
        return sorted(heads | logged)


_IN_LIST: Final = 500  # stream ids named in one query (SQLite allows 32,766 parameters; kept small)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _IN_LIST):
        yield items[start : start + _IN_LIST]
