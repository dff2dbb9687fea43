"""Task streams in the event store: record events with their folded projection, look tasks up.

A task's stream is begun by :meth:`TaskLog.create`; every later write goes through
:meth:`TaskLog.record`: it asks ``decide`` for the events to append given the head it holds (the
one this process last wrote or read, else read from the store), folds them into the new
projection (:func:`engine.core.replay.apply_task_events`) and appends both in one transaction. When
another writer got there first, it reads the head again and asks again, so no decision is made
on a stale projection.

Reads of the past (:meth:`TaskLog.as_of`, :meth:`TaskLog.all_as_of`) replay a stream's events up to
an :class:`AsOf` point with the same fold the audit uses; nothing stored is consulted but the log.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from cardfence.engine.core import content
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import TaskEvent
from cardfence.engine.core.guards import is_live
from cardfence.engine.core.replay import (
    TASK_FIELDS,
    State,
    StoredEvent,
    apply_task_events,
    fold_task,
    initial_task_state,
    lacking,
)
from cardfence.engine.core.views import TaskView, digests_named
from cardfence.engine.errors import UsageError
from cardfence.store.errors import ConcurrencyError, CorruptRecordError
from cardfence.store.event_store import EventStore, iter_all
from cardfence.store.records import (
    ContentRecord,
    Lease,
    NewEvent,
    Projection,
    RecordedEvent,
    StreamRecord,
)

_log = logging.getLogger("cardfence.tasks")
_V = TypeVar("_V")

_RETRIES = 50
# Repeat counts, and failures being counted, held for tasks whose next event has not come yet
# (R12), at most.
_COUNTS_KEPT = 10_000
# Task heads kept (the ones written or read last): past it, the one used longest ago is dropped,
# and its next append reads its head from the store once.
_HEADS_KEPT = 10_000
_SALT_BYTES = 16


@dataclass(frozen=True, slots=True)
class TaskHead:
    """A task's projection and stream version, as last read."""

    key: str
    version: int
    state: State
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class AsOf:
    """A point in the log's past: a global position (``@N``) or a recording time (UTC).

    A stream as it stood then is the prefix of its events recorded at or before that point
    (``position <= N``, or ``recorded_at <= time``): a prefix, never a selection, so what is
    replayed is always a gap-free start of the stream.
    """

    position: int | None = None
    time: datetime | None = None

    FORMS = "an ISO 8601 time (2025-01-31T12:00:00Z; without an offset, UTC) or a position @N"

    def __post_init__(self) -> None:
        if (self.position is None) == (self.time is None):
            raise ValueError("an AsOf names a position or a time, exactly one")
        if self.time is not None and self.time.tzinfo is None:
            raise ValueError("an AsOf time must be timezone-aware")

    @classmethod
    def parse(cls, text: str) -> AsOf:
        """``@N`` (a global position, N >= 0) or an ISO 8601 time (naive means UTC).

        Raises :class:`UsageError` naming the accepted forms when ``text`` is neither.
        """
        value = text.strip()
        if value.startswith("@"):
            digits = value[1:].strip()
            if digits.isdigit():
                return cls(position=int(digits))
        else:
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                pass
            else:
                if moment.tzinfo is None:
                    return cls(time=moment.replace(tzinfo=UTC))
                return cls(time=moment.astimezone(UTC))
        raise UsageError(f"--as-of {text!r} is not {cls.FORMS}")

    def includes(self, event: RecordedEvent) -> bool:
        """Whether ``event`` was recorded at or before this point."""
        if self.position is not None:
            return event.position <= self.position
        assert self.time is not None
        return event.recorded_at <= self.time

    def __str__(self) -> str:
        if self.position is not None:
            return f"@{self.position}"
        assert self.time is not None
        return self.time.isoformat()


def _decided(key: str, events: Sequence[StoredEvent]) -> None:
    """One log line per recorded decision: the task, the event, and its reason if it has one
    (``cardfence serve`` writes them as JSON lines)."""
    if _log.isEnabledFor(logging.INFO):
        for type_, data in events:
            reason = data.get("reason") or data.get("to")
            _log.info("%s %s", key, type_, extra={"task": key, "event": type_, "reason": reason})


def task_stream_id(key: str) -> str:
    return f"{ev.TASK_STREAM_PREFIX}{key}"


def key_of(stream_id: str) -> str:
    return stream_id.removeprefix(ev.TASK_STREAM_PREFIX)


def status_of(state: State) -> str | None:
    """The projection's status: the lifecycle state, or ``never_created`` for a task whose
    creation the agent refused (R3) -- a status of the record, not a state the remote reported."""
    closed = state.get("closed")
    return str(closed) if closed else state.get("state")


def projection_of(state: State, before: State | None = None) -> Projection:
    """The stream's projection; it adds or removes the task's due-work row when the task starts
    or stops needing a driver (``before``: the projection the append starts from)."""
    # The alias indexes the remote task id, which is unique per agent only (R16): several tasks
    # may share one, told apart by their agent (``find``) or their webhook (``Engine.deliver``).
    live = is_live(state)
    return Projection(
        state,
        category=ev.TASK_CATEGORY,
        alias=state.get("remote_task_id"),
        status=status_of(state),
        live=live if live != (before is not None and is_live(before)) else None,
    )


_LEASE: ContextVar[Lease | None] = ContextVar("cardfence_lease", default=None)


@contextmanager
def driving(lease: Lease) -> Iterator[None]:
    """Within this block, appends to ``lease``'s task stream are made under the lease: each
    commits only while the lease is still this process's (else :class:`LeaseLostError`), and
    its first event records the lease (``ev.LEASE``). Other streams are untouched."""
    token = _LEASE.set(lease)
    try:
        yield
    finally:
        _LEASE.reset(token)


class TaskLog:
    """The task streams of one store.

    Heads this log wrote or read are kept: a write starts from the kept head and the append's
    version check tells whether another writer moved it meanwhile (then it reads and decides
    again). Reads that must see other writers (``head``) always go to the store.
    """

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._heads: dict[str, TaskHead] = {}
        # R12: repeats counted out of the log, per task, until its next event carries them.
        self._uncounted: dict[str, int] = {}
        # A task whose last events are failed polls or card reads: their fingerprints, the
        # stream's version after them, and how many since failed as one of them did (counted,
        # not appended, until the task's next event carries the count).
        self._failing: dict[str, tuple[frozenset[str], int, int]] = {}
        # R17: the salt each task's content records are kept under (one per task).
        self._salts: dict[str, str] = {}

    def _outlined(
        self, key: str, events: Sequence[TaskEvent]
    ) -> tuple[list[StoredEvent], list[ContentRecord]]:
        """The events as the store appends them, their content out of line (R17), and the
        content records to append with them."""
        stored: list[StoredEvent] = []
        contents: list[ContentRecord] = []
        stream_id = task_stream_id(key)
        for event in events:
            payload = event.payload()
            if content.carries_content(event.type, payload):
                payload, kept = content.outlined(event.type, payload, self._salt(key))
                contents.extend(
                    ContentRecord(stream_id, k.digest, self._salt(key), k.body) for k in kept
                )
            stored.append((event.type, payload))
        return stored, contents

    def view(self, state: State, updated_at: datetime | None = None) -> TaskView:
        """The view of a task's state, its content read back from the records kept (R17)."""
        digests = digests_named(state)
        if not digests:
            return TaskView.of(state, updated_at, {})
        kept = self.store.contents(task_stream_id(state["task"]), digests)
        contents: dict[str, dict[str, Any]] = {}
        for digest, record in kept.items():
            with suppress(CorruptRecordError):  # read as erased; the audit names it
                contents[digest] = record.data
        return TaskView.of(state, updated_at, contents)

    def first_event(self, key: str) -> dict[str, Any]:
        """The payload of the task's first event (``TaskSubmitted``) with its message's content
        back in line from its content records (R17): its parts whole, its metadata."""
        recorded = self.store.read_stream(task_stream_id(key))[0]
        first = content.upcast(recorded.type, recorded.schema_version, recorded.data)
        parts = first.get("parts")
        if not isinstance(parts, list):
            return first
        digests = [str(p["sha256"]) for p in parts if content.is_outline(p)]
        kept = self.store.contents(task_stream_id(key), digests)
        inline, around = content.resolved_parts(parts, {d: r.data for d, r in kept.items()})
        first["parts"] = inline
        if content.MESSAGE_METADATA in around:
            first["metadata"] = around[content.MESSAGE_METADATA]
        return first

    def _salt(self, key: str) -> str:
        """The task's salt: the one its content records are kept under, else a new one (a task
        recorded before content moved out of line gets one with its first content)."""
        salt = self._salts.get(key)
        if salt is None:
            salt = self.store.content_salt(task_stream_id(key)) or secrets.token_hex(_SALT_BYTES)
            _hold(self._salts, key, salt, _HEADS_KEPT)
        return salt

    def count_repeat(self, key: str) -> None:
        """Count one report that repeated what was already recorded and appended nothing (R12).

        The count is carried, as ``repeats_ignored``, on the next event this log appends to the
        task's stream, and the fold adds it to the projection's ``repeats_ignored``: the log
        stays the truth (R13) and grows by no event for a repeat.
        """
        # An ended task's count waits for an event that seldom comes (its closing read repeats
        # its end).
        _hold(self._uncounted, key, self._uncounted.get(key, 0) + 1, _COUNTS_KEPT)

    def failures_held(self, key: str) -> int:
        """How many failed polls or card reads of the task this log has counted and not yet
        carried on an event (``failures_repeated`` of the task's next event)."""
        return self._failing.get(key, (frozenset(), 0, 0))[2]

    def create(self, key: str, events: Sequence[TaskEvent]) -> State:
        """Start a task's stream with ``events`` (it must not exist yet)."""
        self._salts[key] = secrets.token_hex(_SALT_BYTES)  # a new stream: a salt of its own
        stored, contents = self._outlined(key, events)
        state = apply_task_events(initial_task_state(key), stored)
        self.store.append(
            task_stream_id(key),
            0,
            [NewEvent(type_, data, content.schema_version(type_)) for type_, data in stored],
            projection=projection_of(state),
            contents=contents,
        )
        self._keep(TaskHead(key, len(stored), state, None))
        _decided(key, stored)
        return state

    def head(self, key: str) -> TaskHead:
        """The task's head as the store has it now (other writers included)."""
        record = self.store.stream(task_stream_id(key))
        if record is None:
            raise UsageError(f"unknown task {key!r}")
        return self._keep(_head(record))

    def kept(self, key: str) -> State | None:
        """The task's state as this log last wrote or read it, if it still keeps it (no store
        read: other writers' appends since are not in it)."""
        head = self._heads.get(key)
        return None if head is None else head.state

    def _keep(self, head: TaskHead) -> TaskHead:
        # Least recently kept first: a task written again moves to the end, so the tasks being
        # driven stay kept however many others were read meanwhile.
        self._heads.pop(head.key, None)
        _hold(self._heads, head.key, head, _HEADS_KEPT)
        return head

    def record(
        self, key: str, decide: Callable[[State], Sequence[TaskEvent]]
    ) -> tuple[State, State]:
        """Append what ``decide`` makes of the current projection; return (before, after).

        Inside :func:`driving` for this task, the append is made under the driver's lease and
        :class:`LeaseLostError` says another process has claimed the task (nothing written)."""
        stream_id = task_stream_id(key)
        lease = _LEASE.get()
        if lease is not None and lease.stream_id != stream_id:
            lease = None
        head = self._heads.get(key) or self.head(key)
        for _ in range(_RETRIES):
            before = head.state
            events, contents = self._outlined(key, decide(before))
            if not events:
                return before, before
            failure = _repeatable_failure(events)
            failing, version, repeated = self._failing.get(key, (frozenset(), 0, 0))
            if failure in failing and self.head(key).version == version:
                # It fails as it did at one of the task's last events, all failures like it
                # (read again: no other writer appended since): counted, not appended, so an
                # outage grows the log by an event or two a task, not one a poll.
                self._failing[key] = (failing, version, repeated + 1)
                return before, before
            # Carried on the first event: the counts held since the stream's previous event,
            # and the lease the append is made under.
            carried: dict[str, Any] = {}
            if uncounted := self._uncounted.get(key, 0):
                carried[ev.REPEATS_IGNORED] = uncounted
            if repeated:
                carried[ev.FAILURES_REPEATED] = repeated
            if lease is not None:
                carried[ev.LEASE] = {"owner": lease.owner, "epoch": lease.epoch}
            if carried:
                first_type, first_data = events[0]
                events[0] = (first_type, {**first_data, **carried})
            after = apply_task_events(before, events)  # linear in the events (R16)
            try:
                self.store.append(
                    stream_id,
                    head.version,
                    [
                        NewEvent(type_, data, content.schema_version(type_))
                        for type_, data in events
                    ],
                    projection=projection_of(after, before),
                    lease=lease,
                    contents=contents,
                )
            except ConcurrencyError as lost:
                conflict = lost
                head = self.head(key)  # another writer moved it: decide again on what is there
                continue
            self._keep(TaskHead(key, head.version + len(events), after, None))
            self._uncounted.pop(key, None)
            if failure is None:
                self._failing.pop(key, None)
            else:
                since = failing if version == head.version else frozenset()
                # A task driven elsewhere since (its lease taken over) never carries them here.
                _hold(
                    self._failing,
                    key,
                    (since | {failure}, head.version + len(events), 0),
                    _COUNTS_KEPT,
                )
            _decided(key, events)
            return before, after
        raise conflict  # the last race lost: the version it expected and the one it found

    def find(self, ref: str) -> str:
        """The key of the task ``ref`` names: a local key, a remote task id, or an unambiguous
        prefix of either. A local key always wins. Raises :class:`UsageError` when none match, or
        when several do -- a remote id two agents share (R16) included -- naming each candidate's
        key and agent."""
        ref = ref.strip()
        if not ref:
            raise UsageError("no task named")
        if self.store.stream(task_stream_id(ref)) is not None:
            return ref
        by_alias = self.store.streams(category=ev.TASK_CATEGORY, alias=ref)
        if len(by_alias) == 1:
            return key_of(by_alias[0].stream_id)
        if len(by_alias) > 1:
            raise _ambiguous(ref, by_alias)
        matches = self.store.streams_starting(
            id_prefix=task_stream_id(ref), alias_prefix=ref, category=ev.TASK_CATEGORY
        )
        if len(matches) == 1:
            return key_of(matches[0].stream_id)
        if not matches:
            raise UsageError(f"unknown task {ref!r}")
        raise _ambiguous(ref, matches)

    def by_remote_id(self, remote_task_id: str) -> list[TaskHead]:
        """Every task with this remote id: one per agent at most, so possibly several (R16)."""
        found = self.store.streams(category=ev.TASK_CATEGORY, alias=remote_task_id)
        return [self._keep(_head(record)) for record in found]

    def all(self, status: str | None = None) -> list[TaskHead]:
        """Every task (in ``status`` if given), ordered by stream id; a record altered in the
        store raises :class:`CorruptRecordError` (the first, by stream id)."""
        heads, unreadable = self.all_readable(status)
        if unreadable:
            raise unreadable[0]
        return heads

    def all_readable(
        self, status: str | None = None
    ) -> tuple[list[TaskHead], list[CorruptRecordError]]:
        """:meth:`all`, with the tasks whose record was altered in the store set apart, each as
        the error it raises: one such task keeps no other from being listed or driven."""
        heads: list[TaskHead] = []
        unreadable: list[CorruptRecordError] = []
        found = self.store.streams(category=ev.TASK_CATEGORY, status=status, lenient=True)
        for record in found:
            try:
                heads.append(_head(record))
            except CorruptRecordError as corrupt:
                unreadable.append(corrupt)
        return heads, unreadable

    def as_of(self, key: str, point: AsOf) -> tuple[TaskHead, list[RecordedEvent]]:
        """The task as it stood at ``point`` and the events that made it so (versions 1..k).

        The head's ``updated_at`` is the recording time of the last of those events. Raises
        :class:`UsageError` when the task did not exist yet at ``point``.
        """
        logged = self.store.read_stream(task_stream_id(key))
        kept = list(_prefix(logged, point))
        if not kept:
            if not logged:
                raise UsageError(f"unknown task {key!r}")
            first = logged[0]
            raise UsageError(
                f"task {key} did not exist yet at {point}: its first event was recorded at "
                f"{first.recorded_at.isoformat()} (position {first.position})"
            )
        state = _fold_stored(key, kept)
        return TaskHead(key, len(kept), state, kept[-1].recorded_at), kept

    def all_as_of(self, point: AsOf, status: str | None = None) -> list[TaskHead]:
        """Every task as it stood at ``point`` (tasks that did not exist yet are left out),
        optionally only those then in ``status``; ordered by stream id, like :meth:`all`.

        One pass over the global log (up to ``point`` when it is a position) collects each task
        stream's prefix; each prefix is then folded once with the linear fold
        (:func:`engine.core.replay.fold_task`, R16): no read per task, no copy per event.
        """
        kept: dict[str, list[RecordedEvent]] = {}
        closed: set[str] = set()  # streams already past the point: the rest is not theirs then
        for event in iter_all(self.store):
            if point.position is not None and event.position > point.position:
                break
            stream_id = event.stream_id
            if not stream_id.startswith(ev.TASK_STREAM_PREFIX) or stream_id in closed:
                continue
            if not point.includes(event):
                closed.add(stream_id)
                continue
            kept.setdefault(stream_id, []).append(event)
        heads: list[TaskHead] = []
        for stream_id in sorted(kept):
            prefix, key = kept[stream_id], key_of(stream_id)
            state = _fold_stored(key, prefix)
            if status is None or status_of(state) == status:
                heads.append(TaskHead(key, prefix[-1].version, state, prefix[-1].recorded_at))
        return heads


def _prefix(events: Iterable[RecordedEvent], point: AsOf) -> Iterable[RecordedEvent]:
    """The leading events of a stream recorded at or before ``point``."""
    for event in events:
        if not point.includes(event):
            return
        yield event


# The failures a followed task meets again and again while its agent is down or refuses its
# credentials: a poll that got no answer, a re-validation (R7) that could not read the card, a
# poll or a stream refused with 401/403 (R15: revoked credentials, until someone renews them).
_REPEATABLE: Final = frozenset(
    {
        (ev.ENDPOINT_UNREACHABLE, "poll"),
        (ev.DISCOVERY_UNAVAILABLE, "revalidation"),
        (ev.AUTHORIZATION_FAILED, "poll"),
        (ev.AUTHORIZATION_FAILED, "subscribe"),
    }
)


def _hold(held: dict[str, _V], key: str, value: _V, kept: int) -> None:
    """``held[key] = value``; past ``kept`` tasks, the one held longest is dropped (a count: as
    if its process had restarted, its next repeat or failure is recorded anew)."""
    held[key] = value
    if len(held) > kept:
        del held[next(iter(held))]


def _repeatable_failure(events: Sequence[StoredEvent]) -> str | None:
    """The fingerprint of a decision that is one repeatable failure (its type and every field:
    URL, status, error, ... -- all but the moment, ``at``, that the store records anyway),
    else None."""
    if len(events) != 1:
        return None
    type_, data = events[0]
    if (type_, data.get("during")) not in _REPEATABLE:
        return None
    fields = {name: value for name, value in data.items() if name != "at"}
    return json.dumps([type_, fields], sort_keys=True, default=str)


def _ambiguous(ref: str, records: Sequence[StreamRecord]) -> UsageError:
    """A usage error naming every task ``ref`` may mean: its key and its agent."""
    shown = sorted(records, key=lambda r: r.stream_id)[:10]
    candidates = "; ".join(
        f"{key_of(r.stream_id)} (agent {(r.state or {}).get('agent') or '?'}, "
        f"remote {r.alias or '-'})"
        for r in shown
    )
    more = f"; and {len(records) - len(shown)} more" if len(records) > len(shown) else ""
    return UsageError(
        f"task {ref!r} is ambiguous: {len(records)} tasks match: {candidates}{more}; "
        "name one by its local key"
    )


def _head(record: StreamRecord) -> TaskHead:
    if record.unreadable is not None:
        raise CorruptRecordError.in_projection(
            record.stream_id, f"the stored text {record.unreadable}"
        )
    missing = lacking(record.state, TASK_FIELDS)
    if missing is not None:
        raise CorruptRecordError.in_projection(record.stream_id, f"the stored task {missing}")
    return TaskHead(key_of(record.stream_id), record.version, record.state, record.updated_at)


def _fold_stored(key: str, logged: Iterable[RecordedEvent]) -> State:
    """:func:`fold_task` over a task's stored events; an event the fold cannot read (a payload
    lacking what its type holds) raises :class:`CorruptRecordError` naming it."""
    at: RecordedEvent | None = None

    def pairs() -> Iterator[tuple[str, dict[str, Any]]]:
        nonlocal at
        for event in logged:
            at = event
            yield event.type, event.data

    try:
        return fold_task(key, pairs())
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        assert at is not None  # the fold of no event reads nothing
        raise CorruptRecordError.in_event(
            at.stream_id, at.version, at.position, at.type,
            f"its payload lacks what its type holds ({type(error).__name__}: {str(error)[:120]})",
        ) from error  # fmt: skip
