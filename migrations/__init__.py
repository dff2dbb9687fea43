"""cardfence's schema migrations, shipped inside the wheel and run from code.

Alembic runs on the caller's connection, inside one transaction, and records its revision in a
private table (``cardfence_alembic_version``) so a host application's own alembic is untouched.
Logging is left to the host: no ``fileConfig``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "cardfence_alembic_version"
SCRIPT_LOCATION = str(Path(__file__).resolve().parent)

# The revisions in ``versions/``, oldest first. Opening a store that is already at the newest
# reads one row and compares it with this: alembic (a quarter of a second to import, with its
# dialect modules) is loaded only to migrate. A test holds this equal to the scripts' own chain.
REVISIONS: tuple[str, ...] = ("0001_event_log", "0002_due_work", "0003_contents")


def config(connection: sa.Connection | None = None) -> Config:
    """An alembic configuration for cardfence's scripts, bound to ``connection`` if given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this cardfence ships."""
    return REVISIONS[-1]


def known_revisions() -> frozenset[str]:
    """Every revision this cardfence ships."""
    return frozenset(REVISIONS)


def script_revisions() -> tuple[str, ...]:
    """The revisions alembic finds in ``versions/``, oldest first (what :data:`REVISIONS` must
    say)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(config())
    return tuple(reversed([rev.revision for rev in script.walk_revisions()]))


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is stamped with, or ``None`` for an empty database. A table
    holding several (a branched history, which cardfence never writes) reads as their names
    joined by ``+``: a revision no cardfence knows."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    table = sa.table(VERSION_TABLE, sa.column("version_num", sa.String))
    stamped = sorted(connection.execute(sa.select(table.c.version_num)).scalars())
    return "+".join(stamped) if stamped else None


def upgrade(connection: sa.Connection, revision: str = "head") -> None:
    """Run the migrations on ``connection`` (the caller owns the transaction)."""
    from alembic import command

    command.upgrade(config(connection), revision)
