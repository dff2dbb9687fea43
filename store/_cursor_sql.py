"""The store's hot-path SQL, written once per dialect and run on the driver's cursor: the
append's statements, and the reads on every path (a stream's head, its events, the global log).

An append is on every path the engine takes, so it skips SQLAlchemy's statement building and
result machinery (measured at most of an append's cost) and runs fixed SQL text on the pooled
DBAPI connection: SQLite (named ``:param`` style) and psycopg 3 (``%(param)s`` style,
:func:`pyformat`). The statements are run by three layers of the one store class (``_base``
builds them, ``_appending`` and ``_reading`` run them), so they have this module of their own;
the leases' statements, which only :mod:`.leases` runs, are written there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

_EVENT_COLUMNS = (
    "stream_id", "version", "type", "schema_version", "payload", "recorded_at", "prev_hash", "hash",
)  # fmt: skip
_HEAD_COLUMNS = ("stream_id", "version", "state", "category", "alias", "status", "updated_at")
_SNAPSHOT_COLUMNS = ("revision", "body", "source_url", "etag", "http_status", "fetched_at")
_CONTENT_COLUMNS = ("stream_id", "digest", "salt", "body", "recorded_at")


@dataclass(frozen=True, slots=True)
class CursorSQL:
    """Statements of one dialect. On PostgreSQL the head statements may take the position lock
    too (:func:`build`'s ``lock_key``)."""

    dialect: str
    insert_head: str
    update_head: str
    update_head_keep_projection: str
    insert_event: str
    select_hash: str
    select_version: str
    insert_snapshot: str
    insert_content: str
    select_head: str
    select_heads_by_alias: str
    update_head_state: str
    select_stream: str
    select_after: str

    def timestamp(self, moment: datetime) -> object:
        """A bind value for a UTC timestamp column, as SQLAlchemy's UTCDateTime stores it."""
        if self.dialect == "sqlite":
            return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
        return moment


def build(dialect: str, lock_key: int | None) -> CursorSQL:
    """The append statements for ``dialect`` (``sqlite`` or ``postgresql``).

    On PostgreSQL the head update (or insert) also takes the transaction-scoped advisory lock
    ``lock_key`` through ``RETURNING``: after the stream's row lock and before the event insert
    draws its positions, so positions commit in the order they are drawn.
    """
    lock = "" if lock_key is None else f" RETURNING pg_advisory_xact_lock({int(lock_key)})"
    statements = CursorSQL(
        dialect=dialect,
        insert_head=(
            f"INSERT INTO streams ({', '.join(_HEAD_COLUMNS)}) "
            f"VALUES ({_params(_HEAD_COLUMNS)}) ON CONFLICT (stream_id) DO NOTHING{lock}"
        ),
        update_head=(
            "UPDATE streams SET version = :version, state = :state, category = :category, "
            "alias = :alias, status = :status, updated_at = :updated_at "
            f"WHERE stream_id = :stream_id AND version = :expected{lock}"
        ),
        update_head_keep_projection=(
            "UPDATE streams SET version = :version, updated_at = :updated_at "
            f"WHERE stream_id = :stream_id AND version = :expected{lock}"
        ),
        insert_event=(
            f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) VALUES ({_params(_EVENT_COLUMNS)})"
            + ("" if dialect == "sqlite" else " RETURNING position")
        ),
        select_hash="SELECT hash FROM events WHERE stream_id = :stream_id AND version = :version",
        select_version="SELECT version FROM streams WHERE stream_id = :stream_id",
        insert_snapshot=(
            f"INSERT INTO card_snapshots ({', '.join(_SNAPSHOT_COLUMNS)}) "
            f"VALUES ({_params(_SNAPSHOT_COLUMNS)}) ON CONFLICT (revision) DO NOTHING"
        ),
        insert_content=(
            f"INSERT INTO contents ({', '.join(_CONTENT_COLUMNS)}) "
            f"VALUES ({_params(_CONTENT_COLUMNS)}) ON CONFLICT (stream_id, digest) DO NOTHING"
        ),
        select_head=(
            "SELECT version, state, category, alias, status, updated_at FROM streams "
            "WHERE stream_id = :stream_id"
        ),
        select_heads_by_alias=(
            f"SELECT {', '.join(_HEAD_COLUMNS)} FROM streams "
            "WHERE alias = :alias ORDER BY stream_id"
        ),
        select_stream=(
            f"SELECT position, {', '.join(_EVENT_COLUMNS)} FROM events "
            "WHERE stream_id = :stream_id AND version >= :version ORDER BY version"
        ),
        select_after=(
            f"SELECT position, {', '.join(_EVENT_COLUMNS)} FROM events "
            "WHERE position > :position ORDER BY position LIMIT :limit"
        ),
        # The indexed keys unchanged: leave them alone, or SQLite rewrites three indexes.
        update_head_state=(
            "UPDATE streams SET version = :version, state = :state, updated_at = :updated_at "
            f"WHERE stream_id = :stream_id AND version = :expected{lock}"
        ),
    )
    if dialect == "sqlite":
        return statements
    return CursorSQL(
        dialect,
        *(
            pyformat(text)
            for text in (
                statements.insert_head,
                statements.update_head,
                statements.update_head_keep_projection,
                statements.insert_event,
                statements.select_hash,
                statements.select_version,
                statements.insert_snapshot,
                statements.insert_content,
                statements.select_head,
                statements.select_heads_by_alias,
                statements.update_head_state,
                statements.select_stream,
                statements.select_after,
            )
        ),
    )


def _params(columns: tuple[str, ...]) -> str:
    return ", ".join(f":{c}" for c in columns)


def pyformat(text: str) -> str:
    """``text`` with its ``:param`` placeholders in psycopg's ``%(param)s`` style."""
    return re.sub(r":([a-z_]+)", r"%(\1)s", text)
