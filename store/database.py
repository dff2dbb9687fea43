"""Connecting to the database: the URL, the SQLAlchemy engine, SQLite's settings, and the rows
the driver's cursor returns turned into records.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import URL, make_url

from cardfence.store.records import CardSnapshot, RecordedEvent, StreamRecord

# Execution option marking a SQLAlchemy connection that will write (SQLite: BEGIN IMMEDIATE).
WRITE = "cardfence_write"


def normalise_url(url: str | URL) -> URL:
    """Pin the driver: PostgreSQL goes through psycopg 3, whatever the URL says."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite_busy(exc: sa.exc.OperationalError) -> bool:
    message = str(exc.orig).lower()
    return "locked" in message or "busy" in message


def snapshot_row(card: CardSnapshot, stamp: Callable[[datetime], object]) -> dict[str, Any]:
    return {
        "revision": card.revision,
        "body": card.body,
        "source_url": card.source_url,
        "etag": card.etag,
        "http_status": card.http_status,
        "fetched_at": stamp(card.fetched_at),
    }


def recorded_event(row: tuple[Any, ...]) -> RecordedEvent:
    """A row of the cursor queries (SQLite: timestamps as stored text, naive UTC)."""
    position, stream_id, version, type_, schema_version, payload, recorded_at, prev, digest = row
    moment = datetime.fromisoformat(recorded_at).replace(tzinfo=UTC)
    return RecordedEvent(
        position, stream_id, version, type_, schema_version, payload, moment, prev, digest
    )


def stream_record(row: sa.Row[Any]) -> StreamRecord:
    state = json.loads(row.state)
    return StreamRecord(
        stream_id=row.stream_id,
        version=row.version,
        state=state if isinstance(state, dict) else {},
        category=row.category,
        alias=row.alias,
        status=row.status,
        updated_at=row.updated_at,
    )


def one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def configure_sqlite(connection: Any, busy_timeout_ms: int, *, wal: bool) -> None:
    """Our settings on a pysqlite connection."""
    # We emit BEGIN ourselves (pysqlite's implicit transactions would defer the write lock and
    # make two writers deadlock-upgrade into SQLITE_BUSY).
    connection.isolation_level = None
    cursor = connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if wal:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def create_engine(url: URL, busy_timeout_ms: int) -> sa.Engine:
    if url.get_backend_name() != "sqlite":
        # No ping on checkout (a round trip per append): a dropped connection is invalidated
        # and the write retried once instead; see EventStore._retrying.
        return sa.create_engine(url, pool_recycle=600)
    memory = url.database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if memory:
        kwargs["poolclass"] = sa.pool.StaticPool
    engine = sa.create_engine(url, **kwargs)

    @sa_event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        configure_sqlite(dbapi_connection, busy_timeout_ms, wal=not memory)

    @sa_event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front, so positions are drawn in commit order.
        immediate = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
