"""The agent's behaviour: each task follows the script its first message selects.

Skill selection (A2A v1.0 has no skill field on a message): the executor reads
``metadata["skillId"]`` from the message, then from the SendMessage request; if neither is set,
the first word of the message text names the script when it is one of `SCRIPTS`, and anything
else is echoed. The script's argument is the text after the script name (the whole text when the
skill came from metadata and the text does not start with the skill name). A ``skillId`` that
names no script fails the task with no diagnostic, like the gateway in incident 002.

Scripts: ``echo TEXT`` completes at once with an artifact holding TEXT; ``ask`` goes working,
then input-required with a question (``ask form``: the question also carries a form to fill, as
a data part, as agents that want structured input ask), and the next message on that task (same
``taskId``) completes it with an artifact; ``authorize`` goes working, then auth-required with a
message asking for a sign-in, and the next message completes it the same way; ``slow N`` goes
working and completes after N seconds (float, default 1) -- or, while its `Hold` is held, once
released -- cancellable meanwhile; ``fail`` fails with no status message; ``fail-diag`` fails
with a status message; ``reject`` is rejected with a status message; ``write TEXT`` goes
working, sends TEXT back word by word as one artifact in chunks (A2A ``append``, the last one
``lastChunk``), as an agent streaming a model's answer does, and completes -- while its `Hold`
is held, it stops after two words until released; ``parts`` completes at once with an artifact
``parts`` holding every part of the message as it came (text, file by bytes or URL, data, each
with its media type and filename) and an artifact ``request`` holding, as a data part, the
message's ``metadata``, its ``referenceTaskIds`` and the request's ``acceptedOutputModes`` (a
skill whose card entry takes any input lets any part reach it).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

__all__ = ["SCRIPTS", "SKILL_METADATA_KEY", "Hold", "ScriptedExecutor", "select_script"]

SCRIPTS = ("echo", "ask", "authorize", "slow", "fail", "fail-diag", "reject", "write", "parts")
SKILL_METADATA_KEY = "skillId"
_HOLD_CHECK_SECONDS = 0.01
# What ``ask form`` asks to be filled: a JSON Schema, as a data part of the question.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
    "required": ["answer"],
}
_CHUNK_SECONDS = 0.02  # between a `write` task's chunks: each its own stream event


def select_script(message: Message | None, request_metadata: dict[str, Any]) -> tuple[str, str]:
    """Return ``(script, argument)`` for a message (see the module docstring).

    ``script`` is ``"unknown"`` when a ``skillId`` in metadata names no script.
    """
    text = ""
    skill: Any = None
    if message is not None:
        text = "\n".join(part.text for part in message.parts if part.HasField("text")).strip()
        skill = MessageToDict(message.metadata).get(SKILL_METADATA_KEY)
    if skill is None:
        skill = request_metadata.get(SKILL_METADATA_KEY)
    first, _, rest = text.partition(" ")
    if skill is not None:
        skill = str(skill)
        argument = rest.strip() if first == skill else text
        return (skill if skill in SCRIPTS else "unknown"), argument
    if first in SCRIPTS:
        return first, rest.strip()
    return "echo", text


class Hold:
    """Keeps ``slow`` tasks working past their N seconds until released.

    It lets a caller stage an incident while a task is certainly still live (a card change, a
    restart), whatever the machine's load, then let the task finish. Released by default; safe to
    use from any thread.
    """

    def __init__(self) -> None:
        self._released = threading.Event()
        self._released.set()

    @property
    def held(self) -> bool:
        return not self._released.is_set()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def passed(self) -> None:
        """Return once released (at once when not held)."""
        while not self._released.is_set():
            await asyncio.sleep(_HOLD_CHECK_SECONDS)


def _text(updater: TaskUpdater, text: str) -> Message:
    return updater.new_agent_message([Part(text=text)])


def _request_of(context: RequestContext) -> dict[str, Any]:
    """What the ``parts`` script sends back of a request beside its parts."""
    message = context.message
    configuration = context.configuration
    return {
        "metadata": MessageToDict(message.metadata) if message is not None else {},
        "referenceTaskIds": list(message.reference_task_ids) if message is not None else [],
        "acceptedOutputModes": (
            list(configuration.accepted_output_modes) if configuration is not None else []
        ),
    }


def _seconds(argument: str) -> float:
    try:
        return max(0.0, float(argument.split()[0]))
    except (IndexError, ValueError):
        return 1.0


class ScriptedExecutor(AgentExecutor):
    """Drives each task through the script its first message selects."""

    def __init__(self, hold: Hold | None = None) -> None:
        self.hold = hold or Hold()
        self.tenants: list[str] = []  # the tenant each execution was asked for ("": none)
        self.extensions: list[set[str]] = []  # the extensions each one's request activated

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.tenants.append(context.tenant)
        self.extensions.append(set(context.requested_extensions))
        task_id, context_id = context.task_id, context.context_id
        assert task_id is not None
        assert context_id is not None
        updater = TaskUpdater(event_queue, task_id, context_id)
        current = context.current_task
        script, argument = select_script(context.message, context.metadata)

        if current is None:
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            status.timestamp.FromDatetime(datetime.now(UTC))
            task = Task(id=task_id, context_id=context_id, status=status)
            if context.message is not None:
                task.history.append(context.message)
            await event_queue.enqueue_event(task)
        elif current.status.state in (
            TaskState.TASK_STATE_INPUT_REQUIRED,
            TaskState.TASK_STATE_AUTH_REQUIRED,
        ):
            # The reply to `ask` or `authorize`.
            reply = context.get_user_input().strip()
            await updater.start_work()
            await updater.add_artifact([Part(text=f"answer: {reply}")], name="answer")
            await updater.complete()
            return

        if script == "echo":
            await updater.add_artifact([Part(text=argument)], name="echo")
            await updater.complete()
        elif script == "parts":
            received = list(context.message.parts) if context.message is not None else []
            await updater.add_artifact(received, name="parts")
            request = Value()
            request.struct_value.update(_request_of(context))
            data = Part(data=request, media_type="application/json")
            await updater.add_artifact([data], name="request")
            await updater.complete()
        elif script == "ask":
            await updater.start_work()
            question = [Part(text="What is your answer?")]
            if argument == "form":
                form = Value()
                form.struct_value.update(FORM)
                question.append(Part(data=form, media_type="application/json"))
            await updater.requires_input(updater.new_agent_message(question))
        elif script == "authorize":
            await updater.start_work()
            await updater.requires_auth(_text(updater, "Sign in at https://id.example/device"))
        elif script == "slow":
            seconds = _seconds(argument)
            await updater.start_work()
            await asyncio.sleep(seconds)
            await self.hold.passed()
            await updater.add_artifact([Part(text=f"slept {seconds:g}s")], name="slow")
            await updater.complete()
        elif script == "write":
            await updater.start_work()
            words = argument.split(" ") or [""]
            for number, word in enumerate(words):
                last = number == len(words) - 1
                piece = word if last else word + " "
                await asyncio.sleep(_CHUNK_SECONDS)
                if number == 2:
                    await self.hold.passed()
                await updater.add_artifact(
                    [Part(text=piece)], artifact_id="text", name="text",
                    append=number > 0, last_chunk=last,
                )  # fmt: skip
            await updater.complete()
        elif script == "fail":
            await updater.start_work()
            await updater.failed()
        elif script == "fail-diag":
            await updater.start_work()
            await updater.failed(_text(updater, f"scripted failure: {argument or 'fail-diag'}"))
        elif script == "reject":
            await updater.reject(_text(updater, f"scripted rejection: {argument or 'reject'}"))
        else:  # a skillId in metadata that names no script (incident 002's gateway)
            await updater.failed()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
