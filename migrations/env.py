"""Alembic environment: always online, always on the connection the caller hands in."""

from __future__ import annotations

from alembic import context

from cardfence.migrations import VERSION_TABLE
from cardfence.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - cardfence always passes its connection
    raise RuntimeError("cardfence migrations run from code: pass a connection in attributes")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
