"""The Engine: start, follow, reply to, cancel and resume A2A tasks, recording everything.

Card state may gate task creation (:meth:`Engine.start_task`, R2, R3) and webhook registration
(:meth:`Engine.register_webhook`, R4). It never gates continuation: every remote report goes
through :func:`engine.core.observations.apply_observation`, which takes no card. Card re-checks (R6)
and re-validation (R7, R8) run beside the polling, and only ever add diagnostics, flags or a switch
to polling.

The class is built in layers, a module each: ``base`` (configuration, plumbing, the card a task is
compared with), ``observing`` (the one observation path and the push ingress), ``creation``
(what card state may gate), ``following`` (polls, drives, streams), and here the commands on a
task that exists: reply, cancel, resume.
"""

from __future__ import annotations

import uuid

from cardfence.engine.auth.config import normalise_origin
from cardfence.engine.client._base import EngineConfig, _now_iso
from cardfence.engine.client.creation import Creation, WebhookOutcome
from cardfence.engine.client.following import UNTIL, Following, Pace, reached
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.answers import RemoteTask
from cardfence.engine.core.lifecycle import INTERRUPTED, TERMINAL
from cardfence.engine.core.observations import from_message, from_task
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import CredentialsMissingError, RemoteRefusedError, UsageError

__all__ = ["UNTIL", "Engine", "EngineConfig", "Pace", "WebhookOutcome", "reached"]


class Engine(Following, Creation):
    """An asyncio engine over an event store. Use :meth:`open`, then ``async with``."""

    # -- replies and cancels (R10) ------------------------------------------------------------

    async def reply(self, ref: str, text: str, *, media_type: str = "text/plain") -> TaskView:
        """Answer an input-required (or auth-required) task."""
        key = await self._find(ref)
        state = await self._state(key)
        if state["state"] not in INTERRUPTED:
            raise UsageError(f"task {key} is {state['state']}, not waiting for input")
        message_id = f"m-{uuid.uuid4().hex}"
        transport = await self._task_transport(state)
        await self._record(key, [ev.ReplySent(message_id=message_id, chars=len(text))])
        async with self._failures_recorded(key, "reply", wrong_source="send"):
            # R5: a reply answered 429 was not taken: the same one goes again after the wait.
            answer = await self._asked_again(
                key,
                "reply",
                lambda: transport.send_message(
                    text=text,
                    message_id=message_id,
                    context_id=state.get("remote_context_id") or state["context_id"],
                    task_id=state["remote_task_id"],
                    metadata={"skillId": state["skill"]},
                    media_type=media_type,
                ),
                "the reply was not taken: `cardfence reply` sends it again",
            )
        if isinstance(answer, RemoteTask):
            return await self._observe(key, from_task(answer, "send"))
        return await self._observe(key, from_message(answer, "send"))

    async def cancel(self, ref: str) -> TaskView:
        """Ask the remote to cancel. The state moves only when the remote reports it (R10)."""
        key = await self._find(ref)
        state = await self._state(key)
        if not state.get("remote_task_id"):
            raise UsageError(f"task {key} has no remote task id: run `resume` first")
        transport = await self._task_transport(state)
        await self._record(key, [ev.CancelRequested(at=_now_iso())])
        async with self._failures_recorded(key, "cancel", wrong_source="send"):
            try:
                answer = await self._asked_again(
                    key,
                    "cancel",
                    lambda: transport.cancel_task(state["remote_task_id"]),
                    "the cancel was not taken: `cardfence cancel` asks again",
                )
            except RemoteRefusedError as refusal:
                refused = ev.CancelRefused(code=refusal.code, detail=str(refusal))
                await self._record(key, [refused])
                raise
        return await self._observe(key, from_task(answer, "send"))

    # -- resume (R9) ---------------------------------------------------------------------------

    async def resume(self, ref: str, *, accept_contract: bool = False) -> TaskView:
        """Reconcile the task with a fresh card before any request to its endpoint (R9), and
        find its remote id if a crash fell between send and record. Raises
        :class:`TaskOrphanedError` (the state untouched) when the card no longer carries its
        skill compatibly. Does not drive; call :meth:`drive` next.

        R15: when the endpoint moved to another origin than the one the task's credentials were
        granted for, they are not sent there; ``accept_contract`` accepts the fresh card's
        contract (R3, ``ContractAccepted`` when it changed) and moves the credentials to the
        endpoint's origin (``CredentialsMoved``)."""
        key = await self._find(ref)
        state = await self._state(key)
        if state["state"] in TERMINAL or guards.never_created(state):
            return TaskView.of(state)  # R3: a refused creation is final, never sent again
        await self._reconcile_endpoint(key)
        state = await self._state(key)
        if accept_contract:
            await self._move_credentials(key, state)
            state = await self._state(key)
        if not state.get("remote_task_id"):
            await self._rebind(key, state)
        return TaskView.of(await self._state(key))

    async def _move_credentials(self, key: str, state: State) -> None:
        """R15: the caller accepts the origin the task's endpoint moved to, under the contract
        a fresh read finds there (accepted for the agent, R3)."""
        recorded = state.get("authorization") or {}
        old = recorded.get("origin")
        new = normalise_origin(str(state["endpoint"]["url"]))
        if not recorded.get("schemes") or old == new:
            return
        missing = [name for name in recorded["schemes"] if not self.authorizer.has(new, name)]
        if missing:  # the same schemes, never others (R3): each must be configured there
            needs = "; or ".join(f"[{name}]: not configured for {new}" for name in missing)
            raise CredentialsMissingError(new, str(state["skill"]), needs)
        read = await self.discovery.read(str(state["agent_url"]), fresh=True)
        await self.discovery.check_contract(read, accept=True)
        moved = ev.CredentialsMoved(old=old, new=new, revision=read.card.revision, at=_now_iso())
        await self._record(key, [moved])

    async def _rebind(self, key: str, state: State) -> None:
        """The send may or may not have reached the agent: ask it for our context's tasks."""
        if await self._found_sent(key, state):
            return
        # Never reached the agent: sending it now is a creation (R3), gated like one: a fresh
        # card (R2) that still offers the skill for the media type, under the task's frozen
        # contract -- wherever the endpoint now is. Same messageId, so an agent that did get
        # the first send can tell. Its text lives in TaskSubmitted only (kept out of the
        # projection, rewritten every step).
        await self._resend_gate(key, state)
        state = await self._state(key)
        submitted = (await self._calls.run(self.store.read_stream, task_stream_id(key)))[0].data
        await self._send_creation(
            key,
            await self._task_transport(state),
            submitted["text"],
            state["message_id"],
            state["context_id"],
            state["skill"],
            state.get("media_type") or "text/plain",
        )
