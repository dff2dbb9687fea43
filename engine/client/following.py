"""Continuation (R1, R5, R7, R9, R12, R16): polls, ``drive`` and event streams. Card state
never gates any of it: R7's re-validation and R9's endpoint check run beside the polls and only
ever add diagnostics, flags or a switch to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from cardfence.engine.client._asking import Asking
from cardfence.engine.client._background import Background
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._observing import STREAM_FAILURES, Observing
from cardfence.engine.client._readahead import ready_batches
from cardfence.engine.client._records import TaskRecords, _authorization_failed
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.answers import StreamUpdate
from cardfence.engine.core.lifecycle import INTERRUPTED, TERMINAL
from cardfence.engine.core.observations import coalesced, from_task
from cardfence.engine.core.observations import from_update as observation_from_update
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import (
    AuthorizationFailedError,
    DeadlineExceeded,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    TaskOrphanedError,
    ThrottledError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.http.deadline import left as time_left
from cardfence.engine.http.deadline import within as deadline_within

UNTIL = ("interrupted", "terminal")
_STREAMED = frozenset({"submitted", "working"})
_E = TypeVar("_E", bound=BaseException)
# A task's stream is followed once its polls are this many seconds apart (never, when
# max_poll_interval keeps them closer): polls that close together already bring the news within
# that time, and a stream beside them only doubles the work, the agent's and ours.
_STREAM_AFTER = 1.0
# Seconds a poll is given at least (a quarter of a shorter timeout): no poll but the first
# starts closer to the deadline than that (R16).
_LAST_POLL = 1.0
# Seconds under which a next poll is not worth asking for: it would read the moment the last
# one read (and with a clock that stands still while a poll is made, it would be asked forever).
_TICK = 1e-3
# Streams drive() follows at once, the other tasks polled only until a slot frees: each stream
# holds a pooled connection of its own, and 200 at once left polls queued behind them.
_STREAMS = 32
_log = logging.getLogger("cardfence.engine")


@dataclass(slots=True)
class Pace:
    """Where one followed task stands between polls: the backoff (R5: never beyond
    ``max_poll_interval``), when R7's re-validation and R9's endpoint check are next due, the
    last poll's failure to reach the agent, and the time before which the agent asked not to
    be polled again (R5: its ``Retry-After``, capped)."""

    delay: float
    next_revalidation: float
    next_endpoint_check: float
    unreachable: EndpointUnreachableError | None = None
    throttled_until: float = 0.0

    @classmethod
    def start(cls, config: EngineConfig, now: float) -> Pace:
        return cls(config.first_poll_interval, now + config.max_card_age, now)

    def backoff(self, max_poll_interval: float) -> float:
        """The wait before the next poll; the one after it doubles, up to the bound."""
        wait = min(self.delay, max_poll_interval)
        self.delay = min(self.delay * 2, max_poll_interval)
        return wait


def _unwound(failure: _E) -> _E:
    """``failure`` kept beyond its handling (a followed task's last failed poll, for as long
    as the task is followed): its tracebacks, and those of its causes, are let go, with every
    frame and local of the failed request they held (some 40 KB a task; a `serve` following
    10,000 tasks of an agent that is down held 400 MB of them). Its type, message and fields
    are what is used of it; raised again, it gets a traceback from there. An exception it
    was raised in the handling of but does not show (``raise ... from None``: the HTTP client's
    error, holding its request, headers and socket) is let go too."""
    seen: BaseException | None = failure
    while seen is not None:
        seen.__traceback__ = None
        if seen.__suppress_context__:
            seen.__context__ = None  # never shown: `raise ... from` put another cause first
        seen = seen.__cause__ or seen.__context__
    return failure


def _event_bytes(update: StreamUpdate) -> int:
    return update.size


def reached(state: str, until: str) -> bool:
    """Whether a task in ``state`` is at the point ``until`` asks for."""
    if state in TERMINAL:
        return True
    return until == "interrupted" and state in INTERRUPTED


class Following:
    """Following live tasks: polls with backoff bounded by ``max_poll_interval``, streams."""

    def __init__(
        self,
        config: EngineConfig,
        records: TaskRecords,
        connections: Connections,
        background: Background,
        asking: Asking,
        observing: Observing,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.records = records
        self.connections = connections
        self.background = background
        self.asking = asking
        self.observing = observing
        self.clock = clock
        self.driving: Counter[str] = Counter()  # key -> drives following it now
        self.stream_slots = asyncio.Semaphore(_STREAMS)

    # -- continuation (R1, R5-R12) -------------------------------------------------------------

    async def poll(self, ref: str) -> TaskView:
        """One continuation step: GetTask on the task's recorded endpoint, applied. No discovery."""
        key = await self.records.find(ref)
        return await self.records.view(await self.poll_state(key, await self.records.state(key)))

    async def poll_state(self, key: str, state: State) -> State:
        remote = state.get("remote_task_id")
        if not remote:
            raise UsageError(f"task {key} has no remote task id: run `resume` to find it")
        async with self.observing.failures_recorded(key, "poll", wrong_source="poll"):
            task = await (await self.connections.task_transport(state)).get_task(remote)
        if time_left() <= 0:
            # R16: the answer came after the command's deadline. It is not applied (the next
            # poll reads it again), so applying an answer never starts past the deadline.
            return state
        return await self.observing.observe_state(key, from_task(task, "poll"))

    async def drive(
        self, ref: str, *, until: str = "interrupted", timeout: float = 300.0
    ) -> TaskView:
        """Follow the task until ``until`` or the deadline, polling with backoff bounded by
        ``max_poll_interval`` (R5). Every poll and card check ends by the deadline (R16): a task
        not yet ended is polled at least once (given a second if ``timeout`` is shorter) unless
        a deadline already in force has passed; later polls start only with a second left (a
        quarter of ``timeout`` if less), and the time after the last one is waited out for
        pushes. The deadline never ends the task (R10): it records ``DeadlineExceeded`` after a
        last poll and raises :class:`DeadlineExceeded`."""
        with deadline_within(max(timeout, _LAST_POLL)):
            return await self._drive(ref, until, timeout)

    async def _drive(self, ref: str, until: str, timeout: float) -> TaskView:
        if until not in UNTIL:
            raise UsageError(f"--until must be one of {', '.join(UNTIL)}, not {until!r}")
        key = await self.records.find(ref)
        # The task's stream, when its card offers one, is followed beside the polls (R12: one
        # observation path); the polls never wait on it.
        streamer = asyncio.ensure_future(self._stream_later(key))
        self.driving[key] += 1
        try:
            return await self._follow_until(key, until, timeout)
        finally:
            self.let_go(key)
            streamer.cancel()
            await asyncio.gather(streamer, return_exceptions=True)

    def let_go(self, key: str) -> None:
        """A drive of ``key`` ended: the last one lets go of its wake-up, so an engine that has
        driven a million tasks holds nothing for those no drive follows now."""
        self.driving[key] -= 1
        if self.driving[key] <= 0:
            del self.driving[key]
            self.observing.forget(key)

    async def _follow_until(self, key: str, until: str, timeout: float) -> TaskView:
        started = self.clock()
        deadline = started + timeout
        pace = Pace.start(self.config, started)
        pushed = self.observing.wakeup(key)
        asked = False
        # A poll after the first starts only with this much time left to answer in (R16).
        last_poll = min(_LAST_POLL, self.config.request_timeout, timeout / 4)
        next_poll = started  # the first poll at once
        while True:
            # Read from the store: another process (`serve`) may have applied a push.
            state = await self.records.state(key)
            if guards.never_created(state):
                return await self.records.view(
                    state
                )  # R3: the agent refused its creation; nothing to follow
            # The log may be stale (a reply answered after a crash): unless the task has ended,
            # ask the agent once before believing it is already where it was asked to stop.
            if state["state"] in TERMINAL or (asked and reached(state["state"], until)):
                return await self.observing.closed(key, state)
            # A push or stream event woke us before the poll was due: it was applied, and is all
            # the news there is; the poll stays where it was scheduled.
            # R16: a poll starts only with time left to answer (the first: any time at all).
            polled = False
            if self.clock() >= next_poll and time_left() > (last_poll / 2 if asked else 0.0):
                asked = polled = True
                state = await self.follow_step(key, state, pace)
                if reached(state["state"], until):
                    return await self.records.view(state)
            else:
                self._revalidate_when_due(key, pace)
            now = self.clock()
            room = time_left()
            if now >= deadline or room <= 0:
                await self.records.record(
                    key,
                    [ev.DeadlineExceeded(state=state["state"], seconds=timeout, until=until)],
                )  # fmt: skip
                if pace.unreachable is not None:
                    raise pace.unreachable  # the cause the caller can act on (CLI exit 9)
                raise DeadlineExceeded(key, state["state"], timeout)
            if polled:
                held = pace.throttled_until - now  # R5: the wait the agent asked for, capped
                backoff = max(pace.backoff(self.config.max_poll_interval), held)
                # The next poll starts by the drive's deadline, while it still has `last_poll`
                # seconds; after the last one, the rest of the time is waited out for pushes.
                # One that could only follow this one within a tick would read the same moment.
                # An agent that asked for more time than that is not asked again: the poll it
                # answered so was the last (R5 over R10's last poll).
                room_to_poll = min(deadline - now, room - last_poll)
                if room_to_poll > _TICK and held <= room_to_poll:  # (never past the deadline)
                    next_poll = min(now + min(backoff, room_to_poll), deadline)
                else:
                    next_poll = math.inf
            elif now >= next_poll:
                next_poll = math.inf  # too little time left to ask again: wait for pushes
            wait = min(next_poll - now, deadline - now, room)
            pushed.clear()
            with contextlib.suppress(TimeoutError):
                # A push applied in this process wakes us; the safety poll never waits longer.
                async with asyncio.timeout(max(wait, 0.0)):
                    await pushed.wait()

    async def follow_step(self, key: str, state: State, pace: Pace) -> State:
        """One step of following a live task (``drive``, and ``serve`` for every task): a poll
        on its recorded endpoint, applied; a bare 404 prompts R9's endpoint check (R11, once per
        ``max_card_age``); an agent asking for time sets when it may be polled again (R5); R7's
        re-validation is started off the critical path when due. Returns the state after the
        poll. Raises :class:`TaskOrphanedError` from the endpoint check."""
        try:
            state = await self.poll_state(key, state)
            pace.unreachable = None
        except ThrottledError as throttled:
            # R5: the agent was reached and asked for time; no poll before it has passed.
            pace.unreachable = None
            pace.throttled_until = self.clock() + self.asking.throttle_wait(throttled)
        except EndpointUnreachableError as failure:
            pace.unreachable = _unwound(failure)
            if failure.status == 404 and self.clock() >= pace.next_endpoint_check:
                pace.next_endpoint_check = self.clock() + self.config.max_card_age
                await self.reconcile_endpoint(key)
        except InvalidAgentResponseError:
            pass  # a malformed answer changes nothing; the next poll may be better
        self._revalidate_when_due(key, pace)
        return state

    def _revalidate_when_due(self, key: str, pace: Pace) -> None:
        now = self.clock()
        if now >= pace.next_revalidation:
            pace.next_revalidation = now + self.config.max_card_age
            self.background.spawn(self.observing.revalidate(key))  # R7: off the critical path

    # -- streams (R7, R12) -----------------------------------------------------------------------

    async def stream_offered(self, key: str, state: State | None = None) -> bool:
        """Whether to follow the task's event stream now: streams are followed, polls may grow
        :attr:`stream_after` apart, the card the task last saw advertises them (a card
        withdrawing them changes only the delivery path, R7), and the task is submitted or
        working (a stream ends at an interrupted state)."""
        if not self.config.follow_streams or self.config.max_poll_interval < _STREAM_AFTER:
            return False
        if state is None:
            state = await self.records.state(key)
        if state["state"] not in _STREAMED or not state.get("remote_task_id"):
            return False
        card = await self.records.calls.run(self.records.card, state.get("latest_card_revision"))
        return card is not None and card.streaming

    async def follow_stream(self, key: str) -> State:
        """Follow the task's event stream on its recorded endpoint: every update is applied as
        an observation (source ``stream``) like any other report (R12), and wakes :meth:`drive`.
        Returns the state once the stream ended at a final or interrupted state; raises
        :class:`StreamDroppedError` when it ended early, the errors of opening it otherwise."""
        state = await self.records.state(key)
        transport = await self.connections.task_transport(state)
        idle = self.config.stream_idle_timeout
        try:
            async with (
                transport.subscribe(state["remote_task_id"], idle_timeout=idle) as updates,
                aclosing(ready_batches(updates, weigh=_event_bytes)) as batches,
            ):
                # What came while the last was recorded is recorded together: a burst of an
                # answer's chunks is one append (coalesced), not one a token.
                async for batch in batches:
                    said = (observation_from_update(update, "stream") for update in batch)
                    for observation in coalesced(o for o in said if o is not None):
                        state = await self.observing.observe_state(key, observation)
                        self.observing.wake(key)
        except AuthorizationFailedError as refused:
            await self.records.record(key, [_authorization_failed(refused, "subscribe")])
            raise
        except WrongTaskAnswerError as wrong:
            await self.records.record_wrong_task(key, wrong, "stream")
            raise
        return state

    async def keep_streaming(
        self,
        key: str,
        *,
        retry_limit: float | None = None,
        after_each: Callable[[], None] | None = None,
    ) -> None:
        """Follow the task's stream while it is offered, subscribing again after a drop with
        backoff (1 s doubling to ``retry_limit``, default ``max_poll_interval``). Never decides
        anything: polls go on beside it, and every failure here only ends or delays the stream.
        ``after_each`` is called whenever a stream ended or could not be opened (the driver
        polls then: the stream may have missed the end). Returns when the stream is no longer
        offered (the task ended or was interrupted), or when the agent refused the subscription
        with an A2A error (a task already ended, or no streams for it): the polls carry on."""
        limit = self.config.max_poll_interval if retry_limit is None else retry_limit
        wait = min(1.0, limit)
        while await self.stream_offered(key):
            try:
                await self.follow_stream(key)
                wait = min(1.0, limit)
                continue  # ended at a final or interrupted state: offered no more
            except RemoteRefusedError as refused:
                _log.info(
                    "stream refused; polling goes on",
                    extra={"task": key, "event": "StreamRefused", "reason": str(refused)},
                )
                return
            except STREAM_FAILURES as failure:
                reason = getattr(failure, "reason", None) or type(failure).__name__
                _log.info(
                    "stream ended early; polling goes on",
                    extra={"task": key, "event": "StreamDropped", "reason": str(reason)},
                )
                if isinstance(failure, ThrottledError):  # R5: not asked again before its time
                    throttle = self.asking.throttle_wait(failure)
                    await self.records.record_throttled(key, failure, "subscribe", throttle)
                    wait = max(wait, throttle)
            finally:
                if after_each is not None:
                    after_each()
            await asyncio.sleep(wait)
            wait = min(wait * 2, limit)

    @property
    def stream_after(self) -> float:
        """How far apart a task's polls are before its stream is followed too: a task that ends
        within its first few polls never costs the agent a subscription, and with
        ``max_poll_interval`` below this no stream is followed at all (:meth:`stream_offered`)."""
        return _STREAM_AFTER

    async def _stream_later(self, key: str) -> None:
        await asyncio.sleep(self.stream_after)
        async with self.stream_slots:
            await self.keep_streaming(key)

    async def reconcile_endpoint(self, key: str) -> None:
        state = await self.records.state(key)
        card, failure, unread = await self.connections.task_card(state, fresh=True)
        insecure = self.connections.allow_insecure
        plan = (
            guards.resume_check(state, card, failure, allow_insecure=insecure)
            if unread is None
            else guards.resume_stand_in(state, card, failure, unread, allow_insecure=insecure)
        )
        await self.records.record(key, plan.events)
        if plan.orphaned:
            revision = card.revision if card else ""
            raise TaskOrphanedError(key, str(state["skill"]), revision, plan.detail)
