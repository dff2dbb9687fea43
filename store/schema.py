"""The SQL schema of the event store: the event log, stream projections, card snapshots, the
work due on live streams, and content kept out of line.

Five tables (``events``, ``streams``, ``card_snapshots``, ``due_work``, ``contents``), named
without a prefix but migrated under a private alembic version table
(``cardfence_alembic_version``) so a host application's own migrations are untouched.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite has no time zones: values are stored as naive UTC there and marked UTC on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# SQLite only aliases the rowid for a column declared exactly INTEGER PRIMARY KEY.
Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "events",
    metadata,
    # Global position: strictly increasing in commit order (see EventStore.append), never reused.
    sa.Column("position", Position, sa.Identity(), primary_key=True),
    sa.Column("stream_id", sa.String(512), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("type", sa.String(128), nullable=False),
    sa.Column("schema_version", sa.SmallInteger, nullable=False),
    # JSON text exactly as hashed: the chain is verified over these bytes, not a re-encoding.
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("recorded_at", UTCDateTime, nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.UniqueConstraint("stream_id", "version"),
    sqlite_autoincrement=True,
)

streams = sa.Table(
    "streams",
    metadata,
    sa.Column("stream_id", sa.String(512), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    # The projection: what a replay of the stream's events must reproduce (R13).
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("category", sa.String(64), nullable=True, index=True),
    sa.Column("alias", sa.String(512), nullable=True, index=True),
    sa.Column("status", sa.String(64), nullable=True, index=True),
    sa.Column("updated_at", UTCDateTime, nullable=False),
)

card_snapshots = sa.Table(
    "card_snapshots",
    metadata,
    # Content address: SHA-256 of ``body`` as the engine canonicalised it (R14).
    sa.Column("revision", sa.String(64), primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("source_url", sa.String(2048), nullable=False),
    sa.Column("etag", sa.String(512), nullable=True),
    sa.Column("http_status", sa.SmallInteger, nullable=False),
    sa.Column("fetched_at", UTCDateTime, nullable=False),
)

due_work = sa.Table(
    "due_work",
    metadata,
    # One row per live stream that some process must drive (a task the remote has not ended);
    # inserted and deleted by the appends that make the stream live or end it.
    sa.Column("stream_id", sa.String(512), primary_key=True),
    # Seconds since the epoch, on the database's clock (every process shares it).
    sa.Column("due_at", sa.Float, nullable=False, index=True),
    sa.Column("owner", sa.String(128), nullable=True),
    # The fencing token: raised by every claim, so an append made under an older claim is refused.
    sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lease_until", sa.Float, nullable=True),
)

contents = sa.Table(
    "contents",
    metadata,
    # Content kept out of line (R17): one row per part a stream's events outline, under the
    # digest they carry, SHA-256(salt ‖ body). Erasing content deletes rows; no event changes.
    sa.Column("stream_id", sa.String(512), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("salt", sa.String(64), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("recorded_at", UTCDateTime, nullable=False),
    sa.PrimaryKeyConstraint("stream_id", "digest"),
)
