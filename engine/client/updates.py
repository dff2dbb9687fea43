"""Task updates an application awaits: each event recorded on a task, with the task as it stands
after it, read from the store's global log (what another process, ``cardfence serve``, recorded
included).

The log is tailed as ``cardfence events --follow`` tails it: by asking for what comes after the
last position handed out (``EventStore.read_all``). The store's ordering guarantee (no commit
ever lands below a position a reader has seen, on PostgreSQL too: ``store/event_store.py``) is
what makes that enough, so an application that resumes after the last position it handled
misses nothing and sees nothing twice.

The task each update carries is folded from the log with the replay's fold, the one every
stored projection is made with: incrementally from the update before it on the same task, or
by replaying the task's stream up to the update when it is the first of that task seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Collection
from dataclasses import dataclass
from typing import Final

from cardfence.engine.client._records import TaskRecords
from cardfence.engine.client.tasklog import AsOf, key_of, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import TERMINAL_STATES, TaskState
from cardfence.engine.core.replay import State, apply_task_event
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import DeadlineExceeded, TaskEndedError, UsageError
from cardfence.store.errors import CorruptRecordError
from cardfence.store.records import RecordedEvent

__all__ = ["POLL_INTERVAL", "TaskUpdate", "UpdateFeed"]

# How long the tail waits, once it has read everything there is, before it asks again.
POLL_INTERVAL: Final = 0.1
_PAGE: Final = 1000  # events read per query
# Tasks whose state the tail keeps folded; past it, the one seen longest ago is dropped and its
# next update replays its stream once.
_TASKS_KEPT: Final = 10_000


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """One event recorded on a task: ``event`` as its class (an :class:`UnknownEvent` for a type
    a newer cardfence wrote), ``task`` the task as it stands after it, and ``position`` its
    place in the store's global log: pass it as ``after=`` to resume after this update."""

    event: ev.TaskEvent | ev.UnknownEvent
    task: TaskView
    position: int

    @property
    def key(self) -> str:
        """The task's local key."""
        return self.task.task


class UpdateFeed:
    """The engine's part that tails the log for task updates, and waits on them."""

    def __init__(self, records: TaskRecords, *, interval: float = POLL_INTERVAL) -> None:
        self.records = records
        self.interval = interval

    async def updates(
        self, ref: str | None = None, *, after: int | None = None
    ) -> AsyncGenerator[TaskUpdate, None]:
        """Every update of the task ``ref`` names (of every task when ``None``), in the log's
        order, for as long as the caller iterates: those recorded after the global position
        ``after``, or, when it is ``None``, from now on."""
        if after is not None and after < 0:
            raise UsageError(f"after={after}: a global position is 0 or more")
        calls, store = self.records.calls, self.records.store
        only = None if ref is None else task_stream_id(await self.records.find(ref))
        position = await calls.run(store.last_position) if after is None else after
        folded: dict[str, tuple[int, State]] = {}
        while True:
            page = await calls.run(store.read_all, position, _PAGE)
            for recorded in page:
                position = recorded.position
                stream_id = recorded.stream_id
                if only is not None and stream_id != only:
                    continue
                if not stream_id.startswith(ev.TASK_STREAM_PREFIX):
                    continue
                yield await self._update(recorded, folded)
            if len(page) < _PAGE:
                await asyncio.sleep(self.interval)

    async def wait_for(
        self,
        ref: str,
        state: str | Collection[str],
        *,
        timeout: float | None = None,
    ) -> TaskView:
        """The task ``ref`` names once it is in ``state`` (a state, or any of several): at once
        when it is already, else as the update that brings it there is recorded (by this
        process or another). A task that ends in another state raises
        :class:`TaskEndedError` (its state and last message), and one not there by
        ``timeout`` seconds :class:`DeadlineExceeded`; the task itself is left as it is."""
        wanted = _states(state)
        key = await self.records.find(ref)
        # The position first, then the task: an update recorded in between is seen twice at
        # worst (in the view and as an update), never missed.
        position = await self.records.calls.run(self.records.store.last_position)
        view = await self.records.calls.run(self.records.task, key)
        try:
            async with asyncio.timeout(timeout):
                if _reached(view, wanted):
                    return view
                async with contextlib.aclosing(self.updates(key, after=position)) as updates:
                    async for update in updates:
                        view = update.task
                        if _reached(view, wanted):
                            return view
        except TimeoutError:
            raise DeadlineExceeded(
                key, view.state, timeout or 0.0, reason=f"not {' or '.join(sorted(wanted))}"
            ) from None
        raise AssertionError("the updates of a task never end")  # pragma: no cover

    async def _update(
        self, recorded: RecordedEvent, folded: dict[str, tuple[int, State]]
    ) -> TaskUpdate:
        stream_id, key = recorded.stream_id, key_of(recorded.stream_id)
        try:
            event = ev.task_event(recorded.type, recorded.data)
            held = folded.pop(stream_id, None)
            if held is not None and held[0] == recorded.version - 1:
                state = apply_task_event(held[1], recorded.type, recorded.data)
            else:  # the task's first update seen here: its stream replayed up to this one
                point = AsOf(position=recorded.position)
                head, _ = await self.records.calls.run(self.records.log.as_of, key, point)
                state = head.state
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CorruptRecordError.in_event(
                stream_id, recorded.version, recorded.position, recorded.type,
                f"its payload lacks what its type holds ({type(error).__name__})",
            ) from error  # fmt: skip
        folded[stream_id] = (recorded.version, state)
        if len(folded) > _TASKS_KEPT:
            del folded[next(iter(folded))]
        view = TaskView.of(state, recorded.recorded_at)
        return TaskUpdate(event=event, task=view, position=recorded.position)


def _states(state: str | Collection[str]) -> frozenset[TaskState]:
    """The states awaited, each one a task can be in; :class:`UsageError` names one it cannot."""
    names = [state] if isinstance(state, str) else list(state)
    if not names:
        raise UsageError("wait_for needs a state to wait for")
    known = {member.value for member in TaskState}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageError(
            f"cannot wait for {unknown[0]!r}: a task's states are {', '.join(sorted(known))}"
        )
    return frozenset(TaskState(name) for name in names)


def _reached(view: TaskView, wanted: frozenset[TaskState]) -> bool:
    """Whether ``view`` is in a state awaited; raises :class:`TaskEndedError` when it has ended
    in another."""
    if view.state in wanted:
        return True
    if view.state in TERMINAL_STATES:
        raise TaskEndedError(view.task, view.state, view.last_message)
    return False
