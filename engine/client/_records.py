"""The engine's part that reads and writes the log: a task's state, what is decided on it, the
agent's card revision in force, the card stored under a revision (R7, R9, R15), and the events
several parts build (an authorization refused, an endpoint not reached).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.client.tasklog import AsOf, TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.events import TaskEvent as Event
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import AuthorizationFailedError, ThrottledError, WrongTaskAnswerError
from cardfence.engine.http.offload import StoreCalls
from cardfence.store.errors import CorruptRecordError
from cardfence.store.event_store import EventStore

_CARDS_KEPT = 64  # parsed card revisions kept in memory
_log = logging.getLogger("cardfence.engine")


class TaskRecords:
    """The task log and the store behind it, read and written off the event loop (``calls``)."""

    def __init__(self, store: EventStore, calls: StoreCalls) -> None:
        self.store = store
        self.log = TaskLog(store)
        self.calls = calls
        self.cards: dict[str, AgentCard] = {}  # revision -> its card, parsed
        self.cards_lock = threading.Lock()

    # -- reading -------------------------------------------------------------------------------

    def task(self, ref: str, *, as_of: AsOf | None = None) -> TaskView:
        """The task ``ref`` names (key, remote id, or a prefix of either); with ``as_of``, as
        it stood at that point of the log, by replaying its events up to there."""
        key = self.log.find(ref)
        head = self.log.head(key) if as_of is None else self.log.as_of(key, as_of)[0]
        return self.log.view(head.state, head.updated_at)

    def tasks(self, state: str | None = None, *, as_of: AsOf | None = None) -> list[TaskView]:
        """Every task (only those in ``state`` if given); with ``as_of``, as they stood then."""
        heads = self.log.all(status=state) if as_of is None else self.log.all_as_of(as_of, state)
        return [self.log.view(h.state, h.updated_at) for h in heads]

    async def view(self, state: State) -> TaskView:
        """The view of a task's state, its content read back (off the event loop)."""
        return await self.calls.run(self.log.view, state)

    async def find(self, ref: str) -> str:
        return await self.calls.run(self.log.find, ref)

    async def state(self, key: str) -> State:
        """The task's state as the store has it now (other writers included)."""
        return (await self.calls.run(self.log.head, key)).state

    async def known_state(self, key: str) -> State:
        """The task's state as this engine last wrote or read it, read from the store only when
        it is not kept: for what follow-up work needs of a task that was just written (its
        agent, remote id, endpoint and contract), without a store call."""
        kept = self.log.kept(key)
        return kept if kept is not None else await self.state(key)

    def card(self, revision: str | None) -> AgentCard | None:
        """The card stored under ``revision`` (parsed once: a revision never changes)."""
        if not revision:
            return None
        card = self.cards.get(revision)
        if card is None:
            snapshot = self.store.get_snapshot(revision)
            if snapshot is None:
                return None
            body = snapshot.body.encode()
            card = parse_card(body, url=snapshot.source_url, max_bytes=1 << 30)
            with self.cards_lock:  # store workers call this concurrently
                if len(self.cards) >= _CARDS_KEPT:
                    self.cards.pop(next(iter(self.cards)))
                self.cards[revision] = card
        return card

    def agent_revision(self, state: Mapping[str, Any]) -> str | None:
        """The card revision the agent's stream holds (on a store worker); None when none is
        recorded, or its record was altered in the store -- logged, and never a reason to hold
        up the task (its report is recorded all the same)."""
        try:
            head = self.store.stream(ev.agent_stream_id(str(state.get("agent"))))
        except CorruptRecordError as corrupt:
            _log.warning(
                "the agent's record cannot be read: the task's card is not compared",
                extra={"task": state.get("task"), "event": "RecordUnreadable",
                       "reason": str(corrupt)},
            )  # fmt: skip
            return None
        revision = None if head is None else head.state.get("revision")
        return revision if isinstance(revision, str) else None

    # -- writing -------------------------------------------------------------------------------

    async def decide(self, key: str, decide: Callable[[State], Sequence[Event]]) -> None:
        """Append what ``decide`` makes of the task's current state."""
        await self.calls.run(self.log.record, key, decide)

    async def record(self, key: str, events: Sequence[Event]) -> None:
        if events:
            await self.decide(key, lambda _state: events)

    async def record_throttled(
        self, key: str, throttled: ThrottledError, during: str, wait: float | None
    ) -> None:
        """``Throttled`` on the task, unless it was recorded already (R5: once per task);
        ``wait``: the seconds waited before the next request (None: none is made)."""
        asked, url, status = throttled.retry_after, throttled.url, throttled.status
        await self.decide(key, lambda s: guards.throttled(s, url, status, asked, wait, during))

    async def record_wrong_task(self, key: str, wrong: WrongTaskAnswerError, source: str) -> None:
        """R12: an answer about another task than the one asked about, to GetTask, SendMessage
        or CancelTask: nothing of it is applied; the first is recorded and flagged."""
        asked, answered, said = wrong.asked, wrong.answered, wrong.answered_state
        await self.decide(key, lambda s: guards.wrong_task(s, asked, answered, said, source))


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _authorization_failed(refused: AuthorizationFailedError, during: str) -> Event:
    """R15: a 401/403 (or no token to be had) is an annotation, never a transition (R1)."""
    return ev.AuthorizationFailed(
        url=refused.url,
        status=refused.status,
        schemes=list(refused.schemes),
        detail=str(refused),
        during=during,
        at=_now_iso(),
    )


def _unreachable(failure: Exception, during: str) -> ev.EndpointUnreachable:
    return ev.EndpointUnreachable(
        url=getattr(failure, "url", ""), detail=str(failure), during=during
    )
