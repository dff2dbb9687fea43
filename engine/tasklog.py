"""Task streams in the event store: record events with their folded projection, look tasks up.

Every write goes through :meth:`TaskLog.record`: it reads the stream's head, asks ``decide`` for the
events to append given the current projection, folds them into the new projection
(:func:`engine.replay.apply_task_event`) and appends both in one transaction. When another writer
got there first, it reads again and asks again, so no decision is made on a stale projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cardfence.engine import events as ev
from cardfence.engine.errors import UsageError
from cardfence.engine.observations import Event
from cardfence.engine.replay import State, apply_task_event, initial_task_state
from cardfence.store import ConcurrencyError, EventStore, NewEvent, Projection, StreamRecord

_RETRIES = 50


@dataclass(frozen=True, slots=True)
class TaskHead:
    """A task's projection and stream version, as last read."""

    key: str
    version: int
    state: State
    updated_at: datetime | None


def task_stream_id(key: str) -> str:
    return f"{ev.TASK_STREAM_PREFIX}{key}"


def key_of(stream_id: str) -> str:
    return stream_id.removeprefix(ev.TASK_STREAM_PREFIX)


def projection_of(state: State) -> Projection:
    return Projection(
        state,
        category=ev.TASK_CATEGORY,
        alias=state.get("remote_task_id"),
        status=state.get("state"),
    )


class TaskLog:
    """The task streams of one store.

    Heads this log wrote or read are kept: a write starts from the kept head and the append's
    version check tells whether another writer moved it meanwhile (then it reads and decides
    again). Reads that must see other writers (``head``) always go to the store.
    """

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._heads: dict[str, TaskHead] = {}

    def create(self, key: str, events: Sequence[Event]) -> State:
        """Start a task's stream with ``events`` (it must not exist yet)."""
        state = initial_task_state(key)
        for type_, data in events:
            state = apply_task_event(state, type_, data)
        self.store.append(
            task_stream_id(key),
            0,
            [NewEvent(type_, data) for type_, data in events],
            projection=projection_of(state),
        )
        self._keep(TaskHead(key, len(events), state, None))
        return state

    def head(self, key: str) -> TaskHead:
        """The task's head as the store has it now (other writers included)."""
        record = self.store.stream(task_stream_id(key))
        if record is None:
            raise UsageError(f"unknown task {key!r}")
        return self._keep(_head(record))

    def _keep(self, head: TaskHead) -> TaskHead:
        if len(self._heads) > 10_000:
            self._heads.clear()
        self._heads[head.key] = head
        return head

    def record(self, key: str, decide: Callable[[State], Sequence[Event]]) -> tuple[State, State]:
        """Append what ``decide`` makes of the current projection; return (before, after)."""
        stream_id = task_stream_id(key)
        head = self._heads.get(key) or self.head(key)
        for _ in range(_RETRIES):
            before = head.state
            events = list(decide(before))
            if not events:
                return before, before
            after = before
            for type_, data in events:
                after = apply_task_event(after, type_, data)
            try:
                self.store.append(
                    stream_id,
                    head.version,
                    [NewEvent(type_, data) for type_, data in events],
                    projection=projection_of(after),
                )
            except ConcurrencyError:
                head = self.head(key)  # another writer moved it: decide again on what is there
                continue
            self._keep(TaskHead(key, head.version + len(events), after, None))
            return before, after
        raise ConcurrencyError(stream_id, -1, None)

    def find(self, ref: str) -> str:
        """The key of the task ``ref`` names: a local key, a remote task id, or an unambiguous
        prefix of either. Raises :class:`UsageError` when none or several match."""
        ref = ref.strip()
        if not ref:
            raise UsageError("no task named")
        if self.store.stream(task_stream_id(ref)) is not None:
            return ref
        by_alias = self.store.streams(category=ev.TASK_CATEGORY, alias=ref)
        if len(by_alias) == 1:
            return key_of(by_alias[0].stream_id)
        matches = {
            key_of(record.stream_id)
            for record in self.store.streams(category=ev.TASK_CATEGORY)
            if key_of(record.stream_id).startswith(ref) or (record.alias or "").startswith(ref)
        }
        if len(matches) == 1:
            return matches.pop()
        if not matches:
            raise UsageError(f"unknown task {ref!r}")
        raise UsageError(f"task {ref!r} is ambiguous: {len(matches)} tasks match")

    def find_remote(self, remote_task_id: str) -> str | None:
        """The key of the task with this remote id, if any."""
        found = self.store.streams(category=ev.TASK_CATEGORY, alias=remote_task_id)
        return key_of(found[0].stream_id) if len(found) == 1 else None

    def all(self, status: str | None = None) -> list[TaskHead]:
        return [
            _head(record) for record in self.store.streams(category=ev.TASK_CATEGORY, status=status)
        ]


def _head(record: StreamRecord) -> TaskHead:
    state: dict[str, Any] = record.state or initial_task_state(key_of(record.stream_id))
    return TaskHead(key_of(record.stream_id), record.version, state, record.updated_at)
