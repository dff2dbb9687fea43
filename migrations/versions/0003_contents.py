"""Content out of line: message and artifact parts kept apart from the events that outline them.

Revision ID: 0003_contents
Revises: 0002_due_work
Create Date: 2026-12-07

Events recorded before this revision keep their content inline; they are read as they were.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from cardfence.store.schema import UTCDateTime

revision: str = "0003_contents"
down_revision: str | None = "0002_due_work"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "contents",
        sa.Column("stream_id", sa.String(512), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("salt", sa.String(64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", "digest", name=op.f("pk_contents")),
    )


def downgrade() -> None:
    op.drop_table("contents")
