"""Due work: which live stream is driven by which process, until when (leases).

Revision ID: 0002_due_work
Revises: 0001_event_log
Create Date: 2026-12-01

Rows are added by the appends that make a task live. Tasks that were live before this revision
get theirs when a driver (``cardfence serve``) next loads the store.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_due_work"
down_revision: str | None = "0001_event_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "due_work",
        sa.Column("stream_id", sa.String(512), nullable=False),
        sa.Column("due_at", sa.Float(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_due_work")),
    )
    op.create_index(op.f("ix_due_work_due_at"), "due_work", ["due_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_due_work_due_at"), table_name="due_work")
    op.drop_table("due_work")
