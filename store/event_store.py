"""The event log: append with optimistic concurrency, read by stream and globally.

Ordering guarantee for tailing readers (``read_all(after=…)``): a reader that has seen position
``p`` will never later see a commit of a position below ``p``.

- SQLite gives this for free: one writer at a time, and writers take the lock up front with
  ``BEGIN IMMEDIATE``.
- On PostgreSQL, sequence values are drawn at insert but become visible at commit, so two writers
  could commit out of order and a tailing reader would skip the slower one's event. Every
  transaction of appends therefore takes a transaction-scoped advisory lock once its streams'
  head rows (and due-work rows) are locked and before any event is inserted, and holds it through
  commit: positions are drawn and committed in one order. A lone append takes it with its head
  update (``RETURNING pg_advisory_xact_lock``, no extra round trip); a group commit's batch, once
  after all its head rows. Writers still prepare (encoding, hashing, projections) in parallel.
  Gaps in positions (rolled-back inserts) are possible and harmless; versions within a stream are
  gap-free.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import URL

from cardfence import migrations
from cardfence.store._appending import Appending
from cardfence.store._base import (
    DEFAULT_GROUP_COMMIT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_PROJECTION_BYTES,
    PG_MIGRATE_LOCK,
)
from cardfence.store.database import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    create_engine,
    missing_driver,
    normalise_url,
)
from cardfence.store.errors import SchemaTooNewError, StoreUnavailableError
from cardfence.store.groupcommit import GroupCommit
from cardfence.store.records import RecordedEvent


class EventStore(Appending):
    """An append-only, hash-chained event log with stream projections and card snapshots.

    Open it with :meth:`open`, which migrates the database to the newest schema first.
    """

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str | URL,
        *,
        migrate: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_projection_bytes: int = DEFAULT_MAX_PROJECTION_BYTES,
        busy_timeout_ms: int = 5000,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        group_commit: bool | GroupCommit = True,
    ) -> EventStore:
        """Connect to ``url`` and (by default) migrate it to the newest schema.

        PostgreSQL: connecting gives up after ``connect_timeout`` seconds and the server cancels
        any statement running past ``statement_timeout`` (None: no limit), unless the URL sets
        its own (``?connect_timeout=…``, ``options=-c statement_timeout=…``); either timing out
        raises :class:`StoreUnavailableError` saying which.

        ``group_commit``: appends from concurrent threads share one transaction (True: with
        :data:`DEFAULT_GROUP_COMMIT`'s bounds; a :class:`GroupCommit` sets them; False: one
        transaction per append).
        """
        parsed = normalise_url(url)
        shown = parsed.render_as_string(hide_password=True)
        try:
            engine = create_engine(
                parsed,
                busy_timeout_ms,
                connect_timeout=connect_timeout,
                statement_timeout=statement_timeout,
            )
        except ImportError as exc:  # the URL names a driver that is not installed
            raise StoreUnavailableError(shown, missing_driver(parsed, exc)) from exc
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
            raise StoreUnavailableError(shown, f"cannot use this URL: {exc}") from exc
        store = cls(
            engine,
            max_payload_bytes=max_payload_bytes,
            max_projection_bytes=max_projection_bytes,
            busy_timeout_ms=busy_timeout_ms,
            group_commit=(
                DEFAULT_GROUP_COMMIT
                if group_commit is True
                else None
                if group_commit is False
                else group_commit
            ),
        )
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> str:
        """Bring the schema to head (idempotent, safe when several processes race). Returns it."""
        head = migrations.head_revision()
        # Every open but the first after an upgrade finds the schema at head: one read, and no
        # write lock taken (a `cardfence tasks` beside a busy `serve` waits for no writer).
        if self._retrying(self.schema_revision) == head:
            return head

        def run() -> str:
            # One transaction, under the write lock (SQLite) or an advisory lock (PostgreSQL):
            # two processes opening a fresh database at once migrate it exactly once.
            with self._write() as conn:
                if self._is_postgres:
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(PG_MIGRATE_LOCK)))
                current = migrations.current_revision(conn)
                if current is not None and current not in migrations.known_revisions():
                    raise SchemaTooNewError(self.url, current)
                if current != head:
                    migrations.upgrade(conn)
            return head

        return self._retrying(run)

    def schema_revision(self) -> str | None:
        """The revision the database is stamped with (``None`` if never migrated)."""
        with self._read() as conn:
            return migrations.current_revision(conn)


def iter_all(store: EventStore, after: int = 0, batch: int = 1000) -> Iterator[RecordedEvent]:
    """Every event after ``after`` in position order, read in batches."""
    while True:
        page = store.read_all(after=after, limit=batch)
        if not page:
            return
        yield from page
        after = page[-1].position


__all__ = ["EventStore", "iter_all"]
