"""Due work and leases: which process drives which live stream, and until when.

Every stream that needs driving (a task the remote has not ended) has one row in ``due_work``,
added and removed by the very appends that make it live or end it (``Projection.live``), so the
table never disagrees with the log. A driver *claims* rows -- ``SELECT … FOR UPDATE SKIP LOCKED``
on PostgreSQL, under SQLite's one write lock elsewhere -- and holds them for ``ttl`` seconds,
renewing all it holds in one statement. A crashed process renews nothing: its leases run out and
the next claim takes them over. A driver holding less than its fair share while another holds
more *takes over* the difference from it (:meth:`DueWork.take_over`): the same fencing makes the
previous holder's appends for those streams fail, and its next renewal tells it what it lost.

Each claim raises the row's ``epoch``, the fencing token. An append made under a lease
(``EventStore.append(..., lease=...)``) first reads the row (``FOR SHARE`` on PostgreSQL, so no
claim can slip in before it commits) and commits only if the row still names the same owner and
epoch: a process that lost its lease cannot append for that stream. Pushes are appended without a
lease: any process applies any delivery, under optimistic concurrency.

Times are seconds since the epoch on the database's clock, which every process shares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from cardfence.store._cursor_sql import pyformat
from cardfence.store.errors import LeaseLostError
from cardfence.store.records import Lease

__all__ = ["DueRow", "DueWork"]

_NOW = {
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "postgresql": "CAST(extract(epoch FROM clock_timestamp()) AS double precision)",
}


@dataclass(frozen=True, slots=True)
class DueRow:
    """One row of due work as stored."""

    stream_id: str
    due_at: float
    owner: str | None
    epoch: int
    lease_until: float | None


_Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class _SQL:
    insert: str
    delete: str
    fence: str
    lock: str
    claim: str
    renew: str
    release_one: str
    done: str
    release_all: str
    rows: str
    holdings: str
    take_over: str
    now: str


def _statements(dialect: str) -> _SQL:
    now = _NOW[dialect]
    postgres = dialect == "postgresql"
    skip_locked = " FOR UPDATE SKIP LOCKED" if postgres else ""
    sql = _SQL(
        insert=(
            "INSERT INTO due_work (stream_id, due_at, epoch) "
            f"VALUES (:stream_id, {now}, 0) ON CONFLICT (stream_id) DO NOTHING"
        ),
        delete="DELETE FROM due_work WHERE stream_id = :stream_id",
        fence=(
            "SELECT owner, epoch FROM due_work WHERE stream_id = :stream_id"
            + (" FOR SHARE" if postgres else "")
        ),
        lock=("SELECT 1 FROM due_work WHERE stream_id = :stream_id FOR UPDATE" if postgres else ""),
        claim=(
            f"UPDATE due_work SET owner = :owner, epoch = epoch + 1, lease_until = {now} + :ttl "
            "WHERE stream_id IN (SELECT stream_id FROM due_work "
            f"WHERE due_at <= {now} AND (owner IS NULL OR lease_until < {now}) "
            f"ORDER BY due_at LIMIT :limit{skip_locked}) "
            "RETURNING stream_id, epoch"
        ),
        renew=(
            f"UPDATE due_work SET lease_until = {now} + :ttl WHERE owner = :owner "
            "RETURNING stream_id"
        ),
        release_one=(
            f"UPDATE due_work SET owner = NULL, lease_until = NULL, due_at = {now} + :delay "
            "WHERE stream_id = :stream_id AND owner = :owner"
        ),
        done=(
            "DELETE FROM due_work "
            "WHERE stream_id = :stream_id AND owner = :owner AND epoch = :epoch"
        ),
        release_all=("UPDATE due_work SET owner = NULL, lease_until = NULL WHERE owner = :owner"),
        rows=(
            "SELECT stream_id, due_at, owner, epoch, lease_until FROM due_work ORDER BY stream_id"
        ),
        holdings=(
            "SELECT owner, COUNT(*) FROM due_work "
            f"WHERE owner IS NOT NULL AND lease_until >= {now} GROUP BY owner"
        ),
        take_over=(
            f"UPDATE due_work SET owner = :owner, epoch = epoch + 1, lease_until = {now} + :ttl "
            "WHERE stream_id IN (SELECT stream_id FROM due_work "
            f"WHERE owner = :holder AND lease_until >= {now} "
            f"ORDER BY due_at, stream_id LIMIT :limit{skip_locked}) "
            "RETURNING stream_id, epoch"
        ),
        now=f"SELECT {now}",
    )
    if not postgres:
        return sql
    return _SQL(*(pyformat(text) for text in (getattr(sql, f) for f in _SQL.__slots__)))


class DueWork:
    """The due-work table of one store: claims, renewals and releases of leases.

    ``store.due`` is the instance; the append path calls :meth:`track` and :meth:`fence` on its
    own cursor, inside the append's transaction (or runs :attr:`sql` on its own connection).
    The store gives it what it runs on: its database's ``dialect``, a DBAPI ``connection`` for the
    hot path, the store's ``retrying`` policy for a write, and its ``rollback`` (which drops a
    broken connection).
    """

    def __init__(
        self,
        dialect: str,
        *,
        connection: Callable[[], AbstractContextManager[Any]],
        retrying: Callable[[Callable[[], _Rows]], _Rows],
        rollback: Callable[[Any], None],
    ) -> None:
        self.sql = _statements(dialect)
        self._is_sqlite = dialect == "sqlite"
        self._connection = connection
        self._retrying = retrying
        self._rollback = rollback

    # -- inside an append's transaction --------------------------------------------------------

    def track(self, cursor: Any, stream_id: str, live: bool) -> None:
        """Add (``live``) or remove the stream's row, in the caller's transaction."""
        cursor.execute(self.sql.insert if live else self.sql.delete, {"stream_id": stream_id})

    def lock(self, cursor: Any, stream_id: str) -> None:
        """Lock the stream's row (PostgreSQL; SQLite's write lock covers it) before the append
        that will write it moves the stream's head: every append takes the two in that order."""
        if self.sql.lock:
            cursor.execute(self.sql.lock, {"stream_id": stream_id})

    def fence(self, cursor: Any, lease: Lease) -> None:
        """Raise :class:`LeaseLostError` unless ``lease`` is still the stream's current claim."""
        cursor.execute(self.sql.fence, {"stream_id": lease.stream_id})
        row = cursor.fetchone()
        if row is None or row[0] != lease.owner or int(row[1]) != lease.epoch:
            held_by = None if row is None else row[0]
            raise LeaseLostError(lease.stream_id, lease.owner, lease.epoch, held_by)

    # -- a driver's calls ----------------------------------------------------------------------

    def claim(self, owner: str, ttl: float, limit: int) -> list[Lease]:
        """Take up to ``limit`` due rows nobody holds (or whose lease ran out) for ``ttl`` s."""
        if limit <= 0:
            return []
        found = self._write(self.sql.claim, {"owner": owner, "ttl": ttl, "limit": limit})
        return [Lease(str(stream_id), owner, int(epoch)) for stream_id, epoch in found]

    def holdings(self) -> dict[str, int]:
        """How many leases each owner holds that have not run out."""
        return {str(owner): int(n) for owner, n in self._run(self.sql.holdings, {}, write=False)}

    def take_over(self, owner: str, holder: str, ttl: float, limit: int) -> list[Lease]:
        """Take up to ``limit`` of the leases ``holder`` holds for ``owner``, for ``ttl`` s, each
        with a new epoch (rows being appended under ``holder``'s lease right now are skipped).
        ``holder``'s appends for them are refused from then on (:class:`LeaseLostError`)."""
        if limit <= 0 or holder == owner:
            return []
        params = {"owner": owner, "holder": holder, "ttl": ttl, "limit": limit}
        found = self._write(self.sql.take_over, params)
        return [Lease(str(stream_id), owner, int(epoch)) for stream_id, epoch in found]

    def renew(self, owner: str, ttl: float) -> set[str]:
        """Extend every lease ``owner`` still holds by ``ttl`` s; the streams it still holds."""
        found = self._write(self.sql.renew, {"owner": owner, "ttl": ttl})
        return {str(row[0]) for row in found}

    def release(self, owner: str, due_in: Mapping[str, float] | None = None) -> None:
        """Let go of leases: each stream of ``due_in`` due again that many seconds from now, or
        (``None``) every lease ``owner`` holds, due as before. Another process may claim them at
        once."""
        if due_in is None:
            self._write(self.sql.release_all, {"owner": owner}, rows=False)
            return
        params = [
            {"stream_id": stream_id, "owner": owner, "delay": max(delay, 0.0)}
            for stream_id, delay in due_in.items()
        ]
        if params:
            self._write(self.sql.release_one, params, rows=False)

    def done(self, lease: Lease) -> None:
        """Remove the row of a stream that needs no driving, if ``lease`` still holds it."""
        params = {"stream_id": lease.stream_id, "owner": lease.owner, "epoch": lease.epoch}
        self._write(self.sql.done, params, rows=False)

    def ensure(self, stream_ids: Iterable[str]) -> None:
        """Add rows for live streams that have none (streams live before the table existed)."""
        params = [{"stream_id": stream_id} for stream_id in stream_ids]
        if params:
            self._write(self.sql.insert, params, rows=False)

    def rows(self) -> list[DueRow]:
        """Every row, by stream id (for tools and tests)."""
        return [
            DueRow(str(s), float(d), o, int(e), None if u is None else float(u))
            for s, d, o, e, u in self._run(self.sql.rows, {}, write=False)
        ]

    def now(self) -> float:
        """The database's clock, in the table's unit."""
        return float(self._run(self.sql.now, {}, write=False)[0][0])

    # -- running -------------------------------------------------------------------------------

    def _write(
        self, statement: str, params: dict[str, Any] | list[dict[str, Any]], *, rows: bool = True
    ) -> list[tuple[Any, ...]]:
        return self._retrying(lambda: self._run(statement, params, write=True, rows=rows))

    def _run(
        self,
        statement: str,
        params: dict[str, Any] | list[dict[str, Any]],
        *,
        write: bool,
        rows: bool = True,
    ) -> list[tuple[Any, ...]]:
        with self._connection() as raw:
            try:
                cursor = raw.cursor()
                if write and self._is_sqlite:
                    cursor.execute("BEGIN IMMEDIATE")
                if isinstance(params, list):
                    cursor.executemany(statement, params)
                    found: list[tuple[Any, ...]] = []
                else:
                    cursor.execute(statement, params)
                    found = [tuple(r) for r in cursor.fetchall()] if rows else []
                raw.commit()
                return found
            except BaseException:
                self._rollback(raw)
                raise  # _retrying decides: SQLite busy, a dropped connection, or a failure
