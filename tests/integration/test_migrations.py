"""Shipped migrations, run from code against both databases (fixture ``db_url``)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import cardfence.migrations as migrations
from cardfence.store._base import PG_MIGRATE_LOCK
from cardfence.store.errors import SchemaTooNewError, StoreUnavailableError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent
from cardfence.store.schema import metadata


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_opening_an_empty_database_migrates_it_to_head(db_url: str) -> None:
    with EventStore.open(db_url) as store:
        assert store.schema_revision() == migrations.head_revision()
    assert {"events", "streams", "card_snapshots", "cardfence_alembic_version"} <= _tables(db_url)


def test_migrating_twice_changes_nothing(db_url: str) -> None:
    with EventStore.open(db_url) as store:
        store.append("s", 0, [NewEvent("A")])
        assert store.migrate() == migrations.head_revision()
    with EventStore.open(db_url) as again:
        assert [e.type for e in again.read_stream("s")] == ["A"]


def test_models_and_migrations_agree(db_url: str) -> None:
    with EventStore.open(db_url) as store, store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table": migrations.VERSION_TABLE, "compare_type": True}
        )
        assert compare_metadata(context, metadata) == []


def test_a_host_applications_alembic_table_is_untouched(db_url: str) -> None:
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('hostapp0001')")
    with EventStore.open(db_url):
        pass
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").all() == [
            ("hostapp0001",)
        ]
    engine.dispose()


def test_a_database_from_a_newer_cardfence_is_refused_untouched(db_url: str) -> None:
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {migrations.VERSION_TABLE} SET version_num = 'from_the_future'")
        )
    with pytest.raises(SchemaTooNewError, match="from_the_future"):
        EventStore.open(db_url)
    with EventStore.open(db_url, migrate=False) as store:
        assert store.schema_revision() == "from_the_future"


def _open_and_append(url: str, writer: int) -> None:
    with EventStore.open(url) as store:
        store.append(f"w{writer}", 0, [NewEvent("A")])


def test_two_processes_opening_a_fresh_database_at_once_both_succeed(db_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_append, args=(db_url, w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with EventStore.open(db_url) as store:
        assert store.schema_revision() == migrations.head_revision()
        assert len(store.read_all()) == 3


def test_a_file_that_is_not_a_database_gives_a_typed_error(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-db.db"
    bogus.write_bytes(b"this is not a sqlite database" * 100)
    with pytest.raises(StoreUnavailableError, match=r"not-a-db\.db"):
        EventStore.open(f"sqlite:///{bogus}")


def test_an_unreachable_postgres_gives_a_typed_error() -> None:
    with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1:1"):
        EventStore.open("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


def test_an_unknown_database_url_gives_a_typed_error() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot use this URL"):
        EventStore.open("nosuchdb://x/y")


def test_the_shipped_revision_list_is_the_scripts_own_chain() -> None:
    assert migrations.script_revisions() == migrations.REVISIONS
    assert migrations.head_revision() == migrations.script_revisions()[-1]


def test_a_store_at_head_opens_while_another_connection_holds_the_write_lock(
    db_url: str,
) -> None:
    """Opening a store already at head reads its revision and takes no lock: a `cardfence
    tasks` beside a writer does not queue behind it (on SQLite, every append's write lock; on
    PostgreSQL, the lock under which a store is migrated)."""
    EventStore.open(db_url).close()
    holder = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with holder.connect() as conn:
            if db_url.startswith("sqlite"):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.execute(sa.select(sa.func.pg_advisory_lock(PG_MIGRATE_LOCK)))
            # Short waits: a store that took the lock to open would fail here, not hang.
            with EventStore.open(db_url, busy_timeout_ms=100, statement_timeout=2.0) as store:
                assert store.schema_revision() == migrations.head_revision()
            conn.rollback()
    finally:
        holder.dispose()


def test_opening_a_store_at_head_loads_no_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cardfence.db'}"
    EventStore.open(url).close()
    probe = (
        "import sys\n"
        "from cardfence.store.event_store import EventStore\n"
        f"EventStore.open({url!r}).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_version_table_holding_two_revisions_is_refused_untouched(db_url: str) -> None:
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {migrations.VERSION_TABLE} VALUES ('a_branch')"))
    with pytest.raises(SchemaTooNewError, match=r"0003_contents\+a_branch"):
        EventStore.open(db_url)
    with EventStore.open(db_url, migrate=False) as store:
        assert store.schema_revision() == "0003_contents+a_branch"
