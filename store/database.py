"""Connecting to the database: the URL, the SQLAlchemy engine, SQLite's settings, and the rows
the driver's cursor returns turned into records.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import URL, make_url

from cardfence.store.errors import CorruptRecordError
from cardfence.store.records import CardSnapshot, RecordedEvent, StreamRecord, json_object

# Execution option marking a SQLAlchemy connection that will write (SQLite: BEGIN IMMEDIATE).
WRITE = "cardfence_write"
# PostgreSQL: a server that accepts the connection and never answers must not hang us.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_STATEMENT_TIMEOUT = 30.0


def normalise_url(url: str | URL) -> URL:
    """Pin the driver of a bare ``postgresql://`` (or ``postgres://``) URL to psycopg 3; a URL
    that names its driver keeps it."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def missing_driver(url: URL, exc: ImportError) -> str:
    """What to install when the driver for ``url`` cannot be imported."""
    if url.get_backend_name() == "postgresql":
        return (
            f"PostgreSQL needs the psycopg driver, which is not installed ({exc}): "
            "pip install 'cardfence[postgres]'"
        )
    return f"the driver for {url.drivername} is not installed ({exc})"


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


def cursor_stream_record(row: tuple[Any, ...], *, lenient: bool = False) -> StreamRecord:
    """A stream head from a cursor query's row (``_cursor_sql``'s head columns; SQLite: the time
    as stored text, naive UTC); ``lenient`` as in :func:`stream_record`."""
    stream_id, version, state, category, alias, status, updated_at = row
    moment = datetime.fromisoformat(updated_at).replace(tzinfo=UTC)
    return _head(stream_id, version, state, category, alias, status, moment, lenient)


def stream_record(row: sa.Row[Any], *, lenient: bool = False) -> StreamRecord:
    """A stream head from a ``streams`` row. A projection that is not a JSON object raises
    :class:`CorruptRecordError`, unless ``lenient``: then its ``state`` is empty and
    ``unreadable`` says why."""
    return _head(
        row.stream_id, row.version, row.state, row.category, row.alias, row.status,
        row.updated_at, lenient,
    )  # fmt: skip


def _head(
    stream_id: str, version: int, stored: str, category: str | None, alias: str | None,
    status: str | None, updated_at: datetime, lenient: bool,
) -> StreamRecord:  # fmt: skip
    state = json_object(stored)
    if isinstance(state, dict):
        return StreamRecord(stream_id, version, state, category, alias, status, updated_at)
    if not lenient:
        raise CorruptRecordError.in_projection(stream_id, f"the stored text {state}")
    return StreamRecord(stream_id, version, {}, category, alias, status, updated_at, state)


def postgres_connect_args(
    url: URL, connect_timeout: float | None, statement_timeout: float | None
) -> dict[str, Any]:
    """psycopg's connection timeout and the server's statement timeout, unless the URL (or
    libpq's environment) sets its own; None or 0 sets none."""
    args: dict[str, Any] = {}
    if (
        connect_timeout
        and "connect_timeout" not in url.query
        and not os.environ.get("PGCONNECT_TIMEOUT")
    ):
        args["connect_timeout"] = max(math.ceil(connect_timeout), 2)  # libpq: seconds, >= 2
    given = url.query.get("options")
    options = " ".join(given) if isinstance(given, tuple) else given
    if options is None:
        options = os.environ.get("PGOPTIONS", "")
    if statement_timeout and "statement_timeout" not in options:
        setting = f"-c statement_timeout={math.ceil(statement_timeout * 1000)}"
        args["options"] = f"{options} {setting}".strip()
    return args


def timeout_detail(exc: BaseException) -> str | None:
    """What timed out, when ``exc`` is PostgreSQL's connect or statement timeout."""
    original = getattr(exc, "orig", None) or exc
    if getattr(original, "sqlstate", None) == "57014" and "statement timeout" in str(original):
        return "a statement timed out: it ran past statement_timeout and was cancelled"
    if type(original).__name__ == "ConnectionTimeout" or "timeout expired" in str(original):
        return "connecting timed out: no answer from the server within connect_timeout"
    return None


def one_line(exc: BaseException) -> str:
    timed_out = timeout_detail(exc)
    if timed_out is not None:
        return timed_out
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


def create_engine(
    url: URL,
    busy_timeout_ms: int,
    *,
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
) -> sa.Engine:
    if url.get_backend_name() != "sqlite":
        connect_args = (
            postgres_connect_args(url, connect_timeout, statement_timeout)
            if url.get_backend_name() == "postgresql"
            else {}
        )
        # No ping on checkout (a round trip per append): a dropped connection is invalidated
        # and the write retried once instead; see EventStore._retrying.
        return sa.create_engine(url, pool_recycle=600, connect_args=connect_args)
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
