"""The driver ``cardfence serve`` runs: every live task in the store kept moving.

A live task is one the remote has not ended (and whose creation it did not refuse), with a
remote task id. The driver follows each with :meth:`Engine.follow_step` -- safety polls backing
off to at most ``max_poll_interval`` apart whether or not push is confirmed (R5), R7's
re-validation, R11's endpoint check -- and picks up tasks other processes start or reply to by
tailing the global log. R9's second trigger is wired here: when the agent's latest recorded card
revision differs from the one the task last saw (:func:`guards.card_is_stale`), the task is
reconciled with a fresh card before its next poll, at most once per ``max_card_age``.

Nothing here decides a task's state: polls are observations like any other (R12), and an
orphaned task (R9) keeps being polled on its recorded endpoint -- its contract is never switched,
and only the remote ends it (R1, R10).

Several drivers (``serve`` processes) may share one store: each live task is driven by exactly
one of them at a time, the one holding its lease (:mod:`cardfence.store.leases`). A driver
claims due tasks nobody holds, renews what it holds in one statement, lets go of everything on
a clean stop, and drops a task whose lease it lost. Every third of the lease time it also evens
the load: a driver holding fewer than its fair share of the leased tasks (see :func:`fair_share`)
takes the difference over from those holding more, so a process started beside a busy one gets
its share without waiting for tasks to end. Every append it makes for a task is made
under the lease (:func:`tasklog.driving`): it commits only while the lease is still this
driver's, and records the lease on its first event. Pushes are not leased: any process applies
any delivery. On SQLite the same code runs, with one process.

Scheduling is a heap of due times served by a fixed number of workers, so memory grows with
the number of held tasks by a heap entry and a :class:`Pace` each, not by a coroutine each.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import Pace
from cardfence.engine.client.tasklog import driving, key_of, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.guards import is_live
from cardfence.engine.core.lifecycle import ACTIVE
from cardfence.engine.core.replay import State
from cardfence.engine.errors import TaskOrphanedError, UsageError
from cardfence.engine.serve._metrics import Family
from cardfence.store.errors import CorruptRecordError, LeaseLostError, StoreError
from cardfence.store.event_store import EventStore
from cardfence.store.records import Lease

__all__ = ["Driver", "fair_share"]

_log = logging.getLogger("cardfence.driver")


# Events from other processes after which a followed task is polled again at once.
_PROMPT = frozenset({ev.TASK_SUBMITTED, ev.REPLY_SENT, ev.WEBHOOK_REGISTERED})


def fair_share(me: str, held: Mapping[str, int], limit: int) -> dict[str, int]:
    """How many leases ``me`` should take over, from which holders, so that the leased tasks are
    shared evenly among the drivers holding them (``held``: leases per owner; ``me`` counts with
    none). Nothing while ``me`` holds its fair share -- the ceiling of the mean -- or falls short
    of it by at most one task or a tenth, so that counts drifting as tasks end move nothing. Else
    ``me`` is brought up to the fair share, at most ``limit`` at once, taking from the holders
    above it, the fullest first and none below the fair share."""
    counts = {owner: n for owner, n in held.items() if n > 0}
    mine = counts.setdefault(me, 0)
    fair = -(-sum(counts.values()) // len(counts))
    if mine >= fair - max(1, fair // 10):
        return {}
    wanted = min(fair - mine, limit)
    moves: dict[str, int] = {}
    for owner, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if wanted <= 0 or count <= fair:
            break
        if owner != me:
            moves[owner] = min(count - fair, wanted)
            wanted -= moves[owner]
    return moves


class Driver:
    """Keeps every live task of ``engine``'s store moving until :meth:`stop`.

    ``workers`` bounds the polls in flight at once; ``max_streams`` the event streams followed at
    once (tasks beyond it are polled only); ``scan_interval`` is how often the global log is read
    for tasks replied to or registered by other processes, and due tasks are claimed;
    ``lease_ttl`` how long a claim holds without renewal (renewed every third of it): a crashed
    driver's tasks are taken over that long after its last renewal. ``owner`` names this driver
    in the leases (default: host, process id and a random part).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        workers: int = 32,
        max_streams: int = 64,
        scan_interval: float = 0.5,
        lease_ttl: float = 15.0,
        claim_batch: int = 256,
        owner: str | None = None,
    ) -> None:
        if lease_ttl <= 0:
            raise UsageError(f"the lease time must be positive, not {lease_ttl}")
        self.engine = engine
        self.workers = workers
        self.max_streams = max_streams
        self.lease_ttl = lease_ttl
        self.claim_batch = claim_batch
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._leases: dict[str, Lease] = {}  # task key -> the lease this driver holds on it
        self._row_gone: set[str] = set()  # tasks ended by an append, which removed their row
        self._finishing: set[str] = set()  # tasks whose row is being removed (``_finish``)
        self._renewed_at = -float("inf")
        self._claim_soon = asyncio.Event()
        self._streams: dict[str, asyncio.Task[None]] = {}
        self.scan_interval = scan_interval
        self._clock = engine.clock
        self._due: list[tuple[float, int, str]] = []  # (when, tie-break, task key)
        self._scheduled: dict[str, float] = {}  # key -> its due time in the heap (the live one)
        self._paces: dict[str, Pace] = {}
        self._in_flight: set[str] = set()
        # Tasks with events committed while a step read them: looked at again, never let go.
        self._touched: set[str] = set()
        self._orphaned_at: dict[str, str] = {}  # key -> the revision that orphaned it (R9)
        self._unreadable: dict[str, str] = {}  # key -> why its record could not be read, logged
        self._ticket = itertools.count()
        self._position = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._loaded = False
        self.polls = 0
        self.claimed = 0  # leases claimed since the start (nobody held them)
        self.taken_over = 0  # leases taken over from drivers holding more than their share
        self.lost = 0  # leases another driver claimed or took over

    @property
    def store(self) -> EventStore:
        return self.engine.store

    @property
    def followed(self) -> int:
        """How many tasks the driver follows now."""
        return len(self._paces)

    def families(self) -> list[Family]:
        """What this driver counts, for ``GET /metrics`` (``serve --metrics``)."""
        return [
            Family.single(
                "cardfence_tasks_followed", "Live tasks this driver follows.", "gauge",
                self.followed,
            ),
            Family.single(
                "cardfence_leases_held", "Task leases this driver holds.", "gauge",
                len(self._leases),
            ),
            Family.single(
                "cardfence_streams_followed", "Task event streams followed beside the polls.",
                "gauge", len(self._streams),
            ),
            Family.single(
                "cardfence_polls_total", "Safety polls made (GetTask).", "counter", self.polls
            ),
            Family(
                "cardfence_leases_total",
                "Task leases gained (claimed: nobody held them; taken_over: from a driver above "
                "its fair share) and lost (another driver claimed or took the task over).",
                "counter",
                [
                    ({"event": "claimed"}, self.claimed),
                    ({"event": "taken_over"}, self.taken_over),
                    ({"event": "lost"}, self.lost),
                ],
            ),
        ]  # fmt: skip

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow every live task until :meth:`stop`; the steps in flight then finish."""
        if not self._loaded:
            await self.load()
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=self.workers)
        workers = [asyncio.create_task(self._work(queue)) for _ in range(self.workers)]
        dispatcher = asyncio.create_task(self._dispatch(queue))
        scanner = asyncio.create_task(self._scan_forever())
        self._ready.set()
        _log.info("driver started", extra={"event": "DriverStarted", "tasks": self.followed})
        try:
            await self._stopping.wait()
        finally:
            jobs = (dispatcher, scanner, *self._streams.values())
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            # Keys queued but not started are let go; the steps in hand finish (their appends
            # commit whole), then the idle workers are cancelled.
            while not queue.empty():
                self._in_flight.discard(queue.get_nowait())
            while self._in_flight:
                await asyncio.sleep(0.01)
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await self._release_all()
            _log.info("driver stopped", extra={"event": "DriverStopped", "tasks": self.followed})

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def ready(self) -> None:
        """Wait until the driver has loaded the live tasks and is following them."""
        await self._ready.wait()

    # -- what to follow ------------------------------------------------------------------------

    async def load(self) -> None:
        """Claim the due tasks to follow (:meth:`run` does it if not done before)."""
        # The position first: an event committed while the tasks are claimed is scanned again.
        self._loaded = True
        self._position = await self.engine.records.calls.run(self.store.last_position)
        await self.engine.records.calls.run(self._backfill)
        await self._claim()

    def _backfill(self) -> None:
        """Give a due-work row to every live task that has none (a store written before the
        table existed); appends keep the rows in step from then on. Only the heads of tasks in
        a state the remote has not ended are read (the status index), not every task ever."""
        listed = {row.stream_id for row in self.store.due.rows()}
        live: list[str] = []
        for status in sorted(ACTIVE):
            heads, unreadable = self.engine.log.all_readable(status=status)
            live.extend(task_stream_id(head.key) for head in heads if is_live(head.state))
            for corrupt in unreadable:  # not driven, and no other task held up by it
                self._not_driven(key_of(corrupt.stream_id), corrupt)
        self.store.due.ensure(sid for sid in live if sid not in listed)

    async def _claim(self) -> int:
        """Renew the leases held (every third of their time) and claim due tasks nobody holds;
        tasks whose lease was lost are let go. After each renewal, even out the load
        (:meth:`_even_out`). Returns how many tasks were claimed or taken over."""
        due = self.store.due
        renewing = time.monotonic() - self._renewed_at >= self.lease_ttl / 3
        if renewing:
            held = await self.engine.records.calls.run(due.renew, self.owner, self.lease_ttl)
            self._renewed_at = time.monotonic()
            for key in [k for k in self._leases if task_stream_id(k) not in held]:
                self._lose(key, "lease not renewed: another process claimed the task")
            await self._release_strays(held)
        claimed = 0
        while not self._stopping.is_set():
            leases = await self.engine.records.calls.run(
                due.claim, self.owner, self.lease_ttl, self.claim_batch
            )
            self._take(leases)
            claimed += len(leases)
            self.claimed += len(leases)
            if len(leases) < self.claim_batch:
                break
        if claimed:
            _log.info(
                f"claimed {claimed} task(s)",
                extra={"event": "TasksClaimed", "tasks": self.followed},
            )
        if renewing and not self._stopping.is_set():
            claimed += await self._even_out()
        return claimed

    async def _even_out(self) -> int:
        """Take over this driver's fair share of the leased tasks from the drivers holding more
        (:func:`fair_share`), ``claim_batch`` at a time; their appends for those tasks are
        refused from then on, and their next renewal lets them go. Returns how many were taken."""
        due = self.store.due
        taken: dict[str, int] = {}
        while not self._stopping.is_set():
            held = await self.engine.records.calls.run(due.holdings)
            moves = fair_share(self.owner, held, self.claim_batch)
            got = 0
            for holder, count in moves.items():
                leases = await self.engine.records.calls.run(
                    due.take_over, self.owner, holder, self.lease_ttl, count
                )
                self._take(leases)
                taken[holder] = taken.get(holder, 0) + len(leases)
                got += len(leases)
                self.taken_over += len(leases)
            if not got:
                break
        for holder, count in taken.items():
            if count:
                _log.info(
                    f"took over {count} task(s) from {holder} to share the load",
                    extra={"event": "TasksRebalanced", "tasks": self.followed, "reason": holder},
                )
        return sum(taken.values())

    async def _release_strays(self, held: set[str]) -> None:
        """Let go of leases the store says this driver holds but it is not driving: renewed as
        they are, nobody would poll those tasks again. None should exist; should one (a claim
        whose answer was lost, a bug), it is due again at once, to whoever claims it next."""
        driven = {task_stream_id(key) for key in (*self._leases, *self._finishing)}
        strays = held - driven
        if not strays:
            return
        await self.engine.records.calls.run(
            self.store.due.release, self.owner, dict.fromkeys(strays, 0.0)
        )
        for stream_id in sorted(strays):
            _log.warning(
                "released a lease this driver held but was not driving",
                extra={"task": key_of(stream_id), "event": "StrayLeaseReleased"},
            )
        self._claim_soon.set()

    def _take(self, leases: Iterable[Lease]) -> None:
        now = self._clock()
        for lease in leases:
            key = key_of(lease.stream_id)
            self._leases[key] = lease
            self._follow(key, now, prompt=True)

    def _lose(self, key: str, reason: str, epoch: int | None = None) -> bool:
        """Stop driving ``key``: another process holds it now. ``epoch``: the lease an append
        was refused under; when this driver has claimed the task again since, under a newer
        lease, that one stands and nothing is let go. Whether ``key`` is let go."""
        held = self._leases.get(key)
        if held is not None and epoch is not None and held.epoch != epoch:
            return False
        self._row_gone.discard(key)
        if self._leases.pop(key, None) is None:
            return True
        self.lost += 1
        self._drop(key)
        stream = self._streams.pop(key, None)
        if stream is not None:
            stream.cancel()
        _log.info(reason, extra={"task": key, "event": "LeaseLost", "reason": reason})
        return True

    def _follow(self, key: str, when: float, *, prompt: bool = False) -> None:
        if key not in self._paces:
            self._paces[key] = Pace.start(self.engine.config, when)
            # R9, second trigger: checked before the first poll of a task picked up here.
            self._paces[key].next_endpoint_check = when
        elif prompt:
            self._paces[key].delay = self.engine.config.first_poll_interval
            if key in self._in_flight:
                self._touched.add(key)  # the step in hand reschedules it soon
        elif key in self._scheduled:
            return
        self._schedule(key, when)

    def _schedule(self, key: str, when: float) -> None:
        pace = self._paces.get(key)
        if pace is not None:  # R5: never before the time the agent asked for, whatever prompts
            when = max(when, pace.throttled_until)
        current = self._scheduled.get(key)
        if current is not None and current <= when:
            return
        self._scheduled[key] = when
        heapq.heappush(self._due, (when, next(self._ticket), key))
        self._wake.set()

    def _drop(self, key: str) -> None:
        self._paces.pop(key, None)
        self._orphaned_at.pop(key, None)
        self._scheduled.pop(key, None)

    async def _finish(self, key: str) -> None:
        """The task needs no driving: let go of it, and of its due-work row if it is still
        there (the append that ended the task removes it; a row added for a task that has
        ended meanwhile is removed here)."""
        self._drop(key)
        lease = self._leases.pop(key, None)
        if key in self._row_gone:
            self._row_gone.discard(key)
        elif lease is not None:
            self._finishing.add(key)  # still held in the store until ``done`` commits
            try:
                await self.engine.records.calls.run(self.store.due.done, lease)
            finally:
                self._finishing.discard(key)

    async def _scan_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.scan_interval):
                    await self._claim_soon.wait()
            try:
                await self.scan()
                self._claim_soon.clear()  # the claim below takes what the scan saw
                await self._claim()
            except StoreError:  # the store will answer again: the held tasks go on meanwhile
                _log.exception("claiming failed", extra={"event": "ClaimFailed"})

    async def scan(self) -> int:
        """Read the global log past the last position seen; follow tasks that appeared or were
        replied to elsewhere. Returns how many events were read."""
        read = 0
        while True:
            batch = await self.engine.records.calls.run(self.store.read_all, self._position, 1000)
            if not batch:
                return read
            read += len(batch)
            self._position = batch[-1].position
            self._note((e.stream_id, e.type) for e in batch)

    def _note(self, events: Iterable[tuple[str, str]]) -> None:
        now = self._clock()
        for stream_id, type_ in events:
            if not stream_id.startswith(ev.TASK_STREAM_PREFIX):
                continue
            key = key_of(stream_id)
            if key not in self._leases:
                self._claim_soon.set()  # a new task, or one whose driver let it go
                continue
            if key in self._in_flight:
                self._touched.add(key)
            if key not in self._paces or type_ in _PROMPT:
                self._follow(key, now, prompt=type_ in _PROMPT)

    # -- doing ---------------------------------------------------------------------------------

    async def _dispatch(self, queue: asyncio.Queue[str]) -> None:
        while True:
            now = self._clock()
            while self._due and self._due[0][0] <= now:
                when, _, key = heapq.heappop(self._due)
                if self._scheduled.get(key) != when:
                    continue  # superseded by an earlier time, or dropped
                del self._scheduled[key]
                if key in self._in_flight:
                    continue  # being stepped: the step schedules the next one when it ends
                self._in_flight.add(key)
                try:
                    await queue.put(key)
                except asyncio.CancelledError:
                    self._in_flight.discard(key)  # never handed to a worker: nothing to wait for
                    raise
            wait = self._due[0][0] - self._clock() if self._due else self.scan_interval
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await self._wake.wait()

    def _not_driven(self, key: str, corrupt: CorruptRecordError) -> None:
        """The task ``key`` is not driven: a record it needs was altered in the store (``corrupt``
        names which). The other tasks go on. Logged as an error once, and again only when the
        reason changes; each later step that meets the same record logs it at debug level."""
        reason = str(corrupt)
        repeated = self._unreadable.get(key) == reason
        self._unreadable[key] = reason
        _log.log(
            logging.DEBUG if repeated else logging.ERROR,
            "task still not driven: its record cannot be read"
            if repeated
            else "task not driven: its record cannot be read",
            extra={"task": key, "event": "RecordUnreadable", "reason": reason},
        )

    def _readable(self, key: str) -> None:
        """A step of ``key`` read its records: if they were unreadable before (repaired since,
        e.g. by ``audit --rebuild-projections``), say it is driven again."""
        if self._unreadable.pop(key, None) is not None:
            _log.info(
                "task driven again: its record can be read",
                extra={"task": key, "event": "RecordReadable"},
            )

    async def _work(self, queue: asyncio.Queue[str]) -> None:
        while True:
            key = await queue.get()
            self._touched.discard(key)
            wait: float | None = self.engine.config.max_poll_interval
            try:
                wait = await self._step(key)
                self._readable(key)
            except asyncio.CancelledError:
                raise
            except LeaseLostError as lost:
                self._unreadable.pop(key, None)  # another driver has it now
                let_go = self._lose(key, str(lost), lost.epoch)
                wait = None if let_go else self.engine.config.first_poll_interval
            except CorruptRecordError as corrupt:  # looked at again after max_poll_interval
                self._not_driven(key, corrupt)
            except Exception:  # a bug must not stop every other task from moving
                _log.exception("step failed", extra={"task": key, "event": "StepFailed"})
            finally:
                self._in_flight.discard(key)
            if key in self._touched:
                # Events were committed while the step read the task: its reading may predate
                # them (a remote id bound meanwhile), so it is never let go on it.
                self._touched.discard(key)
                wait = min(wait or 0.0, self.engine.config.first_poll_interval)
            if wait is None:
                if key in self._leases:
                    await self._finish(key)
            elif key in self._leases:
                self._reschedule(key, wait)

    async def _step(self, key: str) -> float | None:
        """One poll of the task under its lease; the wait before the next, or None to let it
        go. :class:`LeaseLostError`: another process claimed it meanwhile (nothing written)."""
        lease = self._leases.get(key)
        if lease is None:
            return None
        with driving(lease):
            return await self._step_leased(key)

    async def _step_leased(self, key: str) -> float | None:
        engine = self.engine
        try:
            state = await engine.records.state(key)
        except UsageError:  # the stream is gone (a store replaced under us): nothing to follow
            return None
        if not is_live(state):
            return None
        pace = self._paces.get(key)
        if pace is None:  # let go while its state was read: lost to another driver
            return None
        if self._clock() >= pace.next_endpoint_check:
            revision = await engine.records.calls.run(engine.records.agent_revision, state)
            stale = guards.card_is_stale(state, {"revision": revision})
            if stale and self._orphaned_at.get(key) != revision:
                pace.next_endpoint_check = self._clock() + engine.config.max_card_age
                state = await self._reconcile(key, revision)
        before = state["state"]
        state = await engine.follow_step(key, state, pace)
        self.polls += 1
        if not is_live(state):
            # Ended by an append (this poll's, or a push's meanwhile) that removed its row.
            self._row_gone.add(key)
            return None
        if state["state"] != before:
            pace.delay = engine.config.first_poll_interval  # moving: look again soon
        if (
            pace.delay >= engine.stream_after
            and key in self._leases  # not lost while it was polled
            and key not in self._streams
            and len(self._streams) < self.max_streams
            and not self._stopping.is_set()
            and await engine.stream_offered(key, state)
        ):
            self._streams[key] = asyncio.create_task(self._stream(key))
        return pace.backoff(engine.config.max_poll_interval)

    async def _stream(self, key: str) -> None:
        """The task's event stream beside its polls, until it is offered no more."""
        try:
            await self.engine.keep_streaming(key, after_each=lambda: self._poll_soon(key))
        except asyncio.CancelledError:
            raise
        except LeaseLostError as lost:
            self._lose(key, str(lost), lost.epoch)
        except Exception:  # a bug here must not stop the polls: they go on regardless
            _log.exception("stream follower failed", extra={"task": key, "event": "StepFailed"})
        finally:
            self._streams.pop(key, None)
        self._poll_soon(key)

    def _poll_soon(self, key: str) -> None:
        """A stream ended, dropped or was refused: it may have missed the end, so poll now."""
        if key in self._paces and not self._stopping.is_set():
            self._follow(key, self._clock(), prompt=True)

    async def _release_all(self) -> None:
        """A clean stop: every lease let go, each task due again when this driver would have
        polled it next, so another process takes it over at once."""
        if not self._leases:
            return
        now = self._clock()
        due_in = {
            task_stream_id(key): max(self._scheduled.get(key, now) - now, 0.0)
            for key in self._leases
        }
        try:
            await self.engine.records.calls.run(self.store.due.release, self.owner, due_in)
        except StoreError:  # the leases run out by themselves
            _log.exception("releasing leases failed", extra={"event": "ReleaseFailed"})
        self._leases.clear()

    def _reschedule(self, key: str, wait: float) -> None:
        if not self._stopping.is_set():
            self._paces.setdefault(key, Pace.start(self.engine.config, self._clock()))
            self._schedule(key, self._clock() + wait)

    async def _reconcile(self, key: str, revision: str | None) -> State:
        """R9 for a task whose card moved on since it last saw it: the endpoint follows a move;
        an orphaned task stays on its recorded endpoint and is polled on (R1), and is not
        checked again until the agent's card changes once more."""
        try:
            await self.engine.following.reconcile_endpoint(key)
        except TaskOrphanedError as orphaned:
            if revision is not None:
                self._orphaned_at[key] = revision
            _log.warning(
                "task orphaned by a card revision; polling on at its recorded endpoint",
                extra={"task": key, "event": ev.TASK_ORPHANED, "reason": str(orphaned)},
            )
        return await self.engine.records.state(key)
