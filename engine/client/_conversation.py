"""The engine's part that answers and cancels tasks that exist (R10): a reply to an interrupted
task, a cancel asked for; the state moves only when the remote reports it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from cardfence.engine.client._asking import Asking
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._observing import Observing
from cardfence.engine.client._records import TaskRecords, _now_iso
from cardfence.engine.client.config import DEFAULT_MAX_MESSAGE_BYTES
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import RemoteTask
from cardfence.engine.core.lifecycle import INTERRUPTED
from cardfence.engine.core.messages import Message, outgoing, recorded_parts
from cardfence.engine.core.observations import from_message, from_task
from cardfence.engine.core.parts import Part, Text
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import RemoteRefusedError, UsageError
from cardfence.engine.wire.transport import check_message_size


class Conversation:
    """Replies and cancels, each asked again while the agent asks for time (R5)."""

    def __init__(
        self,
        records: TaskRecords,
        connections: Connections,
        asking: Asking,
        observing: Observing,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.records = records
        self.connections = connections
        self.asking = asking
        self.observing = observing

    # -- replies and cancels (R10) ------------------------------------------------------------

    async def reply(
        self,
        ref: str,
        text: str | None = None,
        *,
        media_type: str = "text/plain",
        parts: Sequence[Part] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> TaskView:
        """Answer an input-required (or auth-required) task: ``text`` (a :class:`Text` of
        ``media_type``), then ``parts``, one at least, and ``metadata`` (a JSON object). A
        continuation: nothing of it is checked against the card (R1). A message over
        ``max_message_bytes`` encoded is :class:`MessageTooLargeError`: nothing recorded or
        sent."""
        given, sent_metadata = outgoing(text, media_type, parts, metadata)
        key = await self.records.find(ref)
        state = await self.records.state(key)
        if state["state"] not in INTERRUPTED:
            raise UsageError(f"task {key} is {state['state']}, not waiting for input")
        message = Message(given, sent_metadata)
        message_id = f"m-{uuid.uuid4().hex}"
        context_id = state.get("remote_context_id") or state["context_id"]
        ours = {"skillId": state["skill"]}
        check_message_size(
            message,
            self.max_message_bytes,
            message_id=message_id,
            context_id=context_id,
            task_id=state["remote_task_id"],
            metadata=ours,
        )
        transport = await self.connections.task_transport(state)
        chars = sum(len(part.text) for part in given if isinstance(part, Text))
        sent = ev.ReplySent(
            message_id=message_id,
            chars=chars,
            parts=recorded_parts(given),
            metadata=sent_metadata,
        )
        await self.records.record(key, [sent])
        async with self.observing.failures_recorded(key, "reply", wrong_source="send"):
            # R5: a reply answered 429 was not taken: the same one goes again after the wait.
            answer = await self.asking.asked_again(
                key,
                "reply",
                lambda: transport.send_message(
                    message=message,
                    message_id=message_id,
                    context_id=context_id,
                    task_id=state["remote_task_id"],
                    metadata=ours,
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
