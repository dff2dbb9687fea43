"""cardfence's schema migrations, shipped inside the wheel and run from code.

Alembic runs on the caller's connection, inside one transaction, and records its revision in a
private table (``cardfence_alembic_version``) so a host application's own alembic is untouched.
Logging is left to the host: no ``fileConfig``.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

VERSION_TABLE = "cardfence_alembic_version"
SCRIPT_LOCATION = str(Path(__file__).resolve().parent)


def config(connection: sa.Connection | None = None) -> Config:
    """An alembic configuration for cardfence's scripts, bound to ``connection`` if given."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this cardfence ships."""
    head = ScriptDirectory.from_config(config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> frozenset[str]:
    """Every revision this cardfence ships."""
    script = ScriptDirectory.from_config(config())
    return frozenset(rev.revision for rev in script.walk_revisions())


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is stamped with, or ``None`` for an empty database."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade(connection: sa.Connection, revision: str = "head") -> None:
    """Run the migrations on ``connection`` (the caller owns the transaction)."""
    from alembic import command

    command.upgrade(config(connection), revision)
