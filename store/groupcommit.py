"""Group commit: appends from many threads share one transaction, each keeping its own outcome.

A caller hands :meth:`GroupCommitter.submit` its request and blocks. If no batch is being
committed, the caller becomes the *leader*: it takes up to ``max_batch`` queued requests (those
that queued while the previous batch committed, after waiting up to ``max_wait`` seconds for more
when fewer are queued), commits them in one transaction, and hands every waiter its own outcome.
Once its own request is settled, the leader hands the lead to the oldest request still queued and
returns; the others (*followers*) block on their own event until settled or handed the lead.

Two requests with the same key (the stream) never share a batch: the later one stays queued, in
order, for the next. The commit function decides what a batch does and what each request gets;
:class:`~cardfence.store.event_store.EventStore` writes a batch in one transaction and, when
anything
but a request's own version check fails, rolls it back and writes its requests one by one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CommitStats", "GroupCommit", "GroupCommitter"]

_R = TypeVar("_R")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class GroupCommit:
    """How appends from concurrent threads are grouped into one transaction.

    ``max_batch``: the most appends in one transaction. ``max_wait``: seconds a leader waits for
    more appends when fewer than ``max_batch`` are queued (0: take what queued while the previous
    batch committed, and no more; the default, as it never delays a lone writer). Measured by
    ``scripts/bench.py group``: a 1 ms wait gained 64 writers nothing, and cost a lone writer the
    whole wait on every append.
    """

    max_batch: int = 64
    max_wait: float = 0.0

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("GroupCommit.max_batch must be at least 1")
        if self.max_wait < 0:
            raise ValueError("GroupCommit.max_wait must not be negative")


@dataclass(frozen=True, slots=True)
class CommitStats:
    """Counts since the store was opened: ``appends`` committed, in ``commits`` transactions;
    ``splits``: batches rolled back because one of their appends failed, then written one by one."""

    appends: int
    commits: int
    splits: int


class _Waiter(Generic[_R, _T]):
    __slots__ = ("key", "leads", "outcome", "request", "settled", "wake")

    def __init__(self, request: _R, key: Hashable) -> None:
        self.request = request
        self.key = key
        self.wake = threading.Event()
        self.leads = False
        self.settled = False
        self.outcome: _T | BaseException | None = None

    def settle(self, outcome: _T | BaseException) -> None:
        self.outcome = outcome
        self.settled = True
        self.wake.set()

    def result(self) -> _T:
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]


class GroupCommitter(Generic[_R, _T]):
    """Leader/follower batching of ``commit`` calls (see the module docstring).

    ``commit(batch)`` returns one outcome per request, in order: a result or the exception that
    request's caller gets. If it raises instead, every request of the batch gets that exception.
    """

    def __init__(
        self,
        config: GroupCommit,
        commit: Callable[[list[_R]], Sequence[_T | BaseException]],
        key: Callable[[_R], Hashable],
    ) -> None:
        self.config = config
        self._commit = commit
        self._key = key
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._queue: deque[_Waiter[_R, _T]] = deque()
        self._leading = False

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not those being committed)."""
        with self._lock:
            return len(self._queue)

    def submit(self, request: _R) -> _T:
        """Commit ``request`` with whatever else is queued; its own outcome (or exception)."""
        key = self._key(request)
        waiter: _Waiter[_R, _T] | None = None
        with self._lock:
            if self._leading:
                waiter = _Waiter(request, key)
                self._queue.append(waiter)
                if len(self._queue) >= self.config.max_batch:
                    self._more.notify()
            elif self.config.max_wait > 0:  # lead, after waiting for company
                waiter = _Waiter(request, key)
                waiter.leads = True
                self._queue.append(waiter)
            self._leading = True
        if waiter is None:
            # Nothing queued and no wait: lead a batch of this request alone, without queueing.
            try:
                outcomes = self._commit([request])
            finally:
                self._hand_on()
            outcome = outcomes[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        if not waiter.leads:
            waiter.wake.wait()
        if waiter.leads:
            self._lead(waiter)
        return waiter.result()

    def _lead(self, own: _Waiter[_R, _T]) -> None:
        while not own.settled:
            batch = self._take()
            try:
                outcomes: Sequence[_T | BaseException] = self._commit([w.request for w in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError("group commit: one outcome per request expected")
            except BaseException as exc:  # every waiter must hear, whatever happened
                outcomes = [exc] * len(batch)
            for waiter, outcome in zip(batch, outcomes, strict=True):
                waiter.settle(outcome)
        self._hand_on()

    def _hand_on(self) -> None:
        """The lead goes to the oldest request still queued, if any."""
        with self._lock:
            if self._queue:
                successor = self._queue[0]
                successor.leads = True
                successor.wake.set()
            else:
                self._leading = False

    def _take(self) -> list[_Waiter[_R, _T]]:
        """The next batch: queued requests in order, at most one per key, at most max_batch."""
        limit = self.config.max_batch
        with self._lock:
            if self.config.max_wait > 0 and len(self._queue) < limit:
                self._more.wait_for(lambda: len(self._queue) >= limit, self.config.max_wait)
            batch: list[_Waiter[_R, _T]] = []
            keys: set[Hashable] = set()
            later: list[_Waiter[_R, _T]] = []
            while self._queue and len(batch) < limit:
                waiter = self._queue.popleft()
                if waiter.key in keys:
                    later.append(waiter)
                else:
                    keys.add(waiter.key)
                    batch.append(waiter)
            self._queue.extendleft(reversed(later))
            return batch
