"""The event log, stream projections and card snapshots.

Revision ID: 0001_event_log
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from cardfence.store.schema import UTCDateTime

revision: str = "0001_event_log"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column(
            "position",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            nullable=False,
        ),
        sa.Column("stream_id", sa.String(512), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("schema_version", sa.SmallInteger(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("position", name=op.f("pk_events")),
        sa.UniqueConstraint("stream_id", "version", name=op.f("uq_events_stream_id_version")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "streams",
        sa.Column("stream_id", sa.String(512), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("category", sa.String(64), nullable=True),
        sa.Column("alias", sa.String(512), nullable=True),
        sa.Column("status", sa.String(64), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_streams")),
    )
    op.create_index(op.f("ix_streams_category"), "streams", ["category"])
    op.create_index(op.f("ix_streams_alias"), "streams", ["alias"])
    op.create_index(op.f("ix_streams_status"), "streams", ["status"])
    op.create_table(
        "card_snapshots",
        sa.Column("revision", sa.String(64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("source_url", sa.String(2048), nullable=False),
        sa.Column("etag", sa.String(512), nullable=True),
        sa.Column("http_status", sa.SmallInteger(), nullable=False),
        sa.Column("fetched_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_card_snapshots")),
    )


def downgrade() -> None:
    op.drop_table("card_snapshots")
    op.drop_index(op.f("ix_streams_status"), table_name="streams")
    op.drop_index(op.f("ix_streams_alias"), table_name="streams")
    op.drop_index(op.f("ix_streams_category"), table_name="streams")
    op.drop_table("streams")
    op.drop_table("events")
