"""The engine's part that applies every remote report on one path (R10, R12): a poll's answer, a
send's, a stream event, a push delivery -- through
:func:`engine.core.observations.apply_observation`, which takes no card. What a transition calls for
is started beside it: R6's boundary re-check, R7's re-validation, the closing read of a task a
push ended. The push ingress's engine half (:meth:`Observing.deliver`) lives here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime

from cardfence.engine.client._asking import Asking
from cardfence.engine.client._background import Background
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._records import TaskRecords, _authorization_failed, _unreachable
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.events import TaskEvent as Event
from cardfence.engine.core.lifecycle import TERMINAL
from cardfence.engine.core.observations import (
    FLAG_PAYLOAD_TRUNCATED,
    Observation,
    apply_observation,
    from_task,
)
from cardfence.engine.core.observations import from_update as observation_from_update
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import (
    AuthorizationFailedError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    ThrottledError,
    WrongTaskAnswerError,
)
from cardfence.engine.http.deadline import left as time_left
from cardfence.engine.wire import push as webhook
from cardfence.store.errors import PayloadError

# Closing GetTasks in flight at once, the others waiting their turn: many at once grew httpx's
# pool past its 20 kept-alive connections, and its bookkeeping scans every one per request.
_CLOSING_READS = 8
# What ends a stream early (a drop is an EndpointUnreachableError); polling goes on regardless.
STREAM_FAILURES = (EndpointUnreachableError, RemoteRefusedError, InvalidAgentResponseError)
_log = logging.getLogger("cardfence.engine")


class Observing:
    """Reports applied, and the card checks they set off (R6, R7)."""

    def __init__(
        self,
        config: EngineConfig,
        records: TaskRecords,
        connections: Connections,
        background: Background,
        asking: Asking,
    ) -> None:
        self.config = config
        self.records = records
        self.connections = connections
        self.background = background
        self.asking = asking
        # A drive's wake-up on a push or stream event, for as long as a drive follows the task.
        self.pushed: dict[str, asyncio.Event] = {}
        self.closing_slots = asyncio.Semaphore(_CLOSING_READS)

    def wake(self, key: str) -> None:
        """A report was applied outside the poll loop: a drive waiting on this task looks."""
        if key in self.pushed:
            self.pushed[key].set()

    def wakeup(self, key: str) -> asyncio.Event:
        """The event :meth:`wake` sets for ``key``, kept until :meth:`forget` lets it go."""
        return self.pushed.setdefault(key, asyncio.Event())

    def forget(self, key: str) -> None:
        """No drive follows ``key`` now: its wake-up is let go."""
        self.pushed.pop(key, None)

    async def observe(self, key: str, observation: Observation) -> TaskView:
        return await self.records.view(await self.observe_state(key, observation))

    async def observe_state(
        self,
        key: str,
        observation: Observation,
        recorded: list[Event] | None = None,
        *,
        whole: bool = False,
    ) -> State:
        """Apply one remote report (R10, R12), whatever its source, then schedule what the
        transition calls for. ``recorded`` receives the events written; ``whole``: the report
        was the whole task (every artifact), not one event of it."""
        before, after = await self.records.calls.run(self.apply, key, observation, recorded)
        self.observed(key, observation, before, after, whole=whole)
        return after

    def observed(
        self, key: str, observation: Observation, before: State, after: State, *, whole: bool
    ) -> None:
        """Schedule what an applied report's transition calls for (``whole``: see above)."""
        if guards.boundary_recheck_due(after, before["state"], after["state"]):
            self.background.spawn(
                self.boundary_recheck(key)
            )  # R6, after the transition is recorded
        if (
            not whole
            and (
                observation.source == "push" or (observation.source == "stream" and _chunked(after))
            )
            and after["state"] in TERMINAL
            and before["state"] not in TERMINAL
            and key not in self.background.closing
        ):
            # A push of one event: the task may have ended with artifacts whose own pushes were
            # lost (the agent tries each once). Nobody polls an ended task, so read it once now.
            # A push of the whole task (0.3 agents send nothing else) already holds them all.
            # A stream loses nothing once followed, but an artifact it brought in chunks is read
            # whole too: its first chunks may have come before the stream was followed (a 0.3
            # agent's starts with no snapshot), and a safety poll racing the stream may have
            # read chunks the stream then brought again. What the agent holds is the artifact.
            self.background.close_with(key, self.closing_read(key))

    def ingest(
        self,
        remote_id: str,
        headers: Mapping[str, str],
        observation: Observation | None,
        recorded: list[Event],
    ) -> tuple[str, tuple[State, State] | None]:
        """The store's half of :meth:`deliver` (on a store worker, one call): the task the
        delivery authenticates as, then its observation applied. :class:`webhook.Refused` when
        it is refused, with nothing written.

        R16: a remote task id is unique per agent only; the webhook configuration the delivery
        authenticates as names the task. The credentials are checked again against the head the
        append is decided on, so a webhook replaced since the lookup (by another process) is
        refused, never applied under the configuration it replaced."""
        heads = self.records.log.by_remote_id(remote_id)
        candidates = [(head.key, head.state.get("webhook")) for head in heads]
        key = webhook.match_task(remote_id, candidates, headers)
        if observation is None:
            return key, None

        def still_authenticates(state: State) -> None:
            webhook.check_credentials(state.get("webhook") or {}, headers)

        try:
            return key, self.apply(key, observation, recorded, still_authenticates)
        except PayloadError as too_large:  # R16: never raised at the agent
            raise webhook.Refused(413, str(too_large), key) from None

    async def closing_read(self, key: str) -> None:
        async with self.closing_slots:
            await self.closing_read_now(key)

    async def closing_read_now(self, key: str) -> None:
        state = await self.records.known_state(key)  # its remote id, endpoint and contract
        try:
            transport = await self.connections.task_transport(state)
            task = await transport.get_task(state["remote_task_id"])
        except AuthorizationFailedError as refused:  # R15: an annotation, the task has ended
            await self.records.record(key, [_authorization_failed(refused, "poll")])
            return
        except STREAM_FAILURES as failure:  # the task has ended all the same (R10)
            _log.info(
                "closing read failed",
                extra={"task": key, "event": "ClosingReadFailed", "reason": str(failure)},
            )
            return
        await self.observe_state(key, from_task(task, "poll"))

    async def closed(self, key: str, state: State) -> TaskView:
        """The view of an ended task, once its closing read (if one is running) is done."""
        job = self.background.closing.get(key)
        if job is not None:
            await asyncio.wait({job}, timeout=time_left())
            state = await self.records.state(key)
        return await self.records.view(state)

    def apply(
        self,
        key: str,
        observation: Observation,
        recorded: list[Event] | None,
        check: Callable[[State], None] | None = None,
    ) -> tuple[State, State]:
        """The store's half of :meth:`observe_state` (on a store worker thread). ``check``
        sees each state the append is decided on, and may refuse it by raising."""
        agent_revision: list[str | None] = []
        if observation.received_at is None:
            observation = dataclasses.replace(observation, received_at=datetime.now(UTC))
        skew = self.config.max_clock_skew
        decided: list[Event] = []  # what the last decision was (it may be asked again)

        def decide(state: State) -> list[Event]:
            if check is not None:
                check(state)
            out = apply_observation(state, observation, max_clock_skew=skew)
            if out:
                out += guards.context_check(state, observation.remote_context_id)
            for event in list(out):
                if isinstance(event, ev.StateChanged) and event.to == "failed":
                    if not agent_revision:
                        agent_revision.append(self.records.agent_revision(state))
                    message = None if event.message is ev.ABSENT else event.message
                    out += guards.failure_review(state, "failed", message, agent_revision[0])
            hook = state.get("webhook") or {}
            if observation.source == "push" and hook.get("status") == "provisional":
                # R5: the first valid delivery confirms the webhook.
                out.append(ev.WebhookConfirmed(config_id=hook.get("config_id")))
            if recorded is not None:
                recorded[:] = out
            decided[:] = out
            return out

        before, after = self.records.log.record(key, decide)
        if not decided and observation.state is not None:
            # R12: a report that repeats one already recorded: counted, not appended.
            self.records.log.count_repeat(key)
        return before, after

    async def boundary_recheck(self, key: str) -> None:
        agent_url = (await self.records.known_state(key))["agent_url"]
        # Many tasks of one agent cross a boundary at once: they share one read in flight.
        card, failure = await self.connections.read(agent_url, fresh=True, share=True)
        if failure is None and card is not None and card.push_notifications:
            return  # push still offered: nothing to record, whatever the task's state now
        # Decided on the task as it is when the outcome is appended, not as it was before the
        # read (another report may have switched it to polling meanwhile).
        await self.records.decide(key, lambda state: guards.push_recheck(state, card, failure))

    async def revalidate(self, key: str) -> None:
        state = await self.records.state(key)
        card, failure, unread = await self.connections.task_card(state, fresh=False, share=True)
        if unread is not None:  # the public card stands in for the extended one
            await self.records.decide(
                key, lambda s: guards.reconcile_stand_in(s, card, failure, unread)
            )
            return
        previous = await self.records.calls.run(
            self.records.card, state.get("latest_card_revision")
        )
        await self.records.decide(key, lambda s: guards.reconcile_card(s, card, failure, previous))

    @contextlib.asynccontextmanager
    async def failures_recorded(
        self, key: str, during: str, *, wrong_source: str
    ) -> AsyncIterator[None]:
        """Around one request of a live task (a poll, a reply, a cancel): a 401/403 is recorded
        as ``AuthorizationFailed`` (R15), an agent asking for time as ``Throttled`` (R5: once per
        task), an endpoint not reached as ``EndpointUnreachable``, an answer about another task
        as R12 says (from ``wrong_source``); each is raised on."""
        try:
            yield
        except AuthorizationFailedError as refused:
            await self.records.record(key, [_authorization_failed(refused, during)])
            raise
        except ThrottledError as throttled:
            await self.records.record_throttled(
                key, throttled, during, self.asking.throttle_wait(throttled)
            )
            raise
        except EndpointUnreachableError as failure:
            await self.records.record(key, [_unreachable(failure, during)])
            raise
        except WrongTaskAnswerError as wrong:
            await self.records.record_wrong_task(key, wrong, wrong_source)
            raise

    # -- push deliveries (R5, R12) -------------------------------------------------------------

    async def deliver(self, body: bytes, headers: Mapping[str, str]) -> webhook.Delivery:
        """Ingest one push delivery: checked (size, type, shape, credentials), then applied like
        any other observation. Refusals write nothing."""
        try:
            update = webhook.decode(body, headers)
        except webhook.Refused as refused:
            return refused.delivery
        observation = observation_from_update(update, "push")
        recorded: list[Event] = []
        try:
            key, moved = await self.records.calls.run(
                self.ingest, update.task_id or "", headers, observation, recorded
            )
        except webhook.Refused as refused:
            return refused.delivery
        if observation is None or moved is None:
            return webhook.Delivery(200, "ignored", "a message, not a task update", key)
        self.observed(key, observation, *moved, whole=update.kind == "task")
        self.wake(key)
        cut = any(_truncated(event) for event in recorded)
        detail = FLAG_PAYLOAD_TRUNCATED if cut else ""
        return webhook.Delivery(200, _delivery_outcome(recorded), detail, key)


def _truncated(event: Event) -> bool:
    """Whether an event kept part of a report as its size and SHA-256 only (R16)."""
    if isinstance(event, ev.ArtifactReceived):
        return bool(event.truncated)
    return isinstance(event, ev.StateChanged) and bool(event.payload_truncated)


def _delivery_outcome(recorded: Sequence[Event]) -> str:
    """``applied`` (a transition or a new artifact), ``duplicate``, ``stale`` or ``ignored``."""
    if any(isinstance(event, ev.StateChanged | ev.ArtifactReceived) for event in recorded):
        return "applied"
    reasons = {event.reason for event in recorded if isinstance(event, ev.ObservationIgnored)}
    for reason in ("duplicate", "stale"):
        if reason in reasons:
            return reason
    return "ignored" if reasons else "duplicate"


def _chunked(state: State) -> bool:
    """Whether the task holds an artifact put together from chunks (A2A ``append``)."""
    return any(a.get("chunks") or a.get("partial") for a in state.get("artifacts") or ())
