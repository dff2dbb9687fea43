"""The engine's part that answers and cancels tasks that exist (R10): a reply to an interrupted
task, a cancel asked for; the state moves only when the remote reports it.
"""

from __future__ import annotations

import uuid

from cardfence.engine.client._asking import Asking
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._observing import Observing
from cardfence.engine.client._records import TaskRecords, _now_iso
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import RemoteTask
from cardfence.engine.core.lifecycle import INTERRUPTED
from cardfence.engine.core.observations import from_message, from_task
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import RemoteRefusedError, UsageError


class Conversation:
    """Replies and cancels, each asked again while the agent asks for time (R5)."""

    def __init__(
        self,
        records: TaskRecords,
        connections: Connections,
        asking: Asking,
        observing: Observing,
    ) -> None:
        self.records = records
        self.connections = connections
        self.asking = asking
        self.observing = observing

    # -- replies and cancels (R10) ------------------------------------------------------------

    async def reply(self, ref: str, text: str, *, media_type: str = "text/plain") -> TaskView:
        """Answer an input-required (or auth-required) task."""
        key = await self.records.find(ref)
        state = await self.records.state(key)
        if state["state"] not in INTERRUPTED:
            raise UsageError(f"task {key} is {state['state']}, not waiting for input")
        message_id = f"m-{uuid.uuid4().hex}"
        transport = await self.connections.task_transport(state)
        part = {"kind": "text", "media_type": media_type, "text": text}
        await self.records.record(
            key, [ev.ReplySent(message_id=message_id, chars=len(text), parts=[part])]
        )
        async with self.observing.failures_recorded(key, "reply", wrong_source="send"):
            # R5: a reply answered 429 was not taken: the same one goes again after the wait.
            answer = await self.asking.asked_again(
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
            return await self.observing.observe(key, from_task(answer, "send"))
        return await self.observing.observe(key, from_message(answer, "send"))

    async def cancel(self, ref: str) -> TaskView:
        """Ask the remote to cancel. The state moves only when the remote reports it (R10)."""
        key = await self.records.find(ref)
        state = await self.records.state(key)
        if not state.get("remote_task_id"):
            raise UsageError(f"task {key} has no remote task id: run `resume` first")
        transport = await self.connections.task_transport(state)
        await self.records.record(key, [ev.CancelRequested(at=_now_iso())])
        async with self.observing.failures_recorded(key, "cancel", wrong_source="send"):
            try:
                answer = await self.asking.asked_again(
                    key,
                    "cancel",
                    lambda: transport.cancel_task(state["remote_task_id"]),
                    "the cancel was not taken: `cardfence cancel` asks again",
                )
            except RemoteRefusedError as refusal:
                refused = ev.CancelRefused(code=refusal.code, detail=str(refusal))
                await self.records.record(key, [refused])
                raise
        return await self.observing.observe(key, from_task(answer, "send"))
