"""The demo's a2a-sdk 1.3 agent answering with content of every kind: files, links, data.

`ContentAgent` is `cardfence.engine.demo.agent.DemoAgent` whose ``echo`` skill knows a few more
arguments (`CONTENT_SCRIPTS`); any other message follows the demo's scripts. It also serves
`FILE_BODY` at `FILE_PATH`, on its own origin and on 127.0.0.2 (another origin), so an artifact
may name a file by URL that can be fetched, and it logs the ``Authorization`` each such GET
presented (`file_requests`).

- ``echo parts``: completes with four artifacts: ``report`` (a Markdown text part and a PDF by
  its bytes, with a filename), ``link`` (a file by URL on the agent's origin, and one on the
  other origin), ``form`` (a data part), ``mixed`` (one part of each kind).
- ``echo question``: input-required, asking with text, a file by bytes and a data part; the
  reply completes it.
- ``echo big-artifact``: completes with an artifact of 300 KiB, larger than the engine kept
  whole before content was kept out of line (R17).
- ``echo big-file``: completes with an artifact holding `BIG_FILE`, a file of 1 MiB by its bytes.
- ``echo big-question``: input-required, asking with a message larger than the engine records
  whole; the reply completes it.
- ``echo bundle``: one artifact sent in three chunks (text, then a file, then data); while the
  agent's `Hold` is held it stops after the first until released, as ``write`` does.
"""

from __future__ import annotations

import asyncio
import random
import types
from datetime import UTC, datetime
from typing import Any, Final

from a2a.server.agent_execution import RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, Task, TaskState, TaskStatus
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from cardfence.engine.demo.agent import DemoAgent
from cardfence.engine.demo.executor import ScriptedExecutor, select_script

__all__ = [
    "BIG_BYTES",
    "BIG_FILE",
    "CONTENT_SCRIPTS",
    "FILE_BODY",
    "FILE_PATH",
    "FORM_DATA",
    "OTHER_HOST",
    "PDF_BYTES",
    "ContentAgent",
]

CONTENT_SCRIPTS: Final = (
    "parts",
    "question",
    "big-artifact",
    "big-question",
    "bundle",
    "big-file",
)
FILE_PATH: Final = "/files/report.txt"
FILE_BODY: Final = b"the report, fetched by its URL\n"
OTHER_HOST: Final = "127.0.0.2"
PDF_BYTES: Final = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
FORM_DATA: Final[dict[str, Any]] = {"answer": "yes", "sure": True, "count": 3}
BIG_BYTES: Final = 300 * 1024  # over the 256 KiB an artifact was kept whole up to, before R17
BIG_FILE: Final = random.Random(48).randbytes(1 << 20)
"""The 1 MiB file the ``big-file`` script returns as an artifact (bytes no pattern repeats)."""


def _data(value: dict[str, Any]) -> Value:
    out = Value()
    out.struct_value.update(value)
    return out


def _parts_artifacts(base_url: str, port: int) -> list[tuple[str, list[Part]]]:
    own = base_url + FILE_PATH
    other = f"http://{OTHER_HOST}:{port}{FILE_PATH}"
    return [
        (
            "report",
            [
                Part(text="# Summary\n\nAll good.", media_type="text/markdown"),
                Part(raw=PDF_BYTES, filename="report.pdf", media_type="application/pdf"),
            ],
        ),
        (
            "link",
            [
                Part(url=own, filename="report.txt", media_type="text/plain"),
                Part(url=other, filename="elsewhere.txt", media_type="text/plain"),
            ],
        ),
        ("form", [Part(data=_data(FORM_DATA), media_type="application/json")]),
        (
            "mixed",
            [
                Part(text="plain words"),
                Part(raw=b"\x00\x01\x02binary", filename="../../etc/passwd"),
                Part(url=own),
                Part(data=_data({"n": 1})),
            ],
        ),
    ]


async def _content(
    agent: ContentAgent, script: str, updater: TaskUpdater, queue: EventQueue, task: Task
) -> None:
    await queue.enqueue_event(task)
    if script == "parts":
        for name, parts in _parts_artifacts(agent.base_url, agent.port):
            await updater.add_artifact(parts, artifact_id=name, name=name)
        await updater.complete()
    elif script == "question":
        await updater.start_work()
        question = [
            Part(text="Which of these?"),
            Part(raw=b"a,b\n1,2\n", filename="choices.csv", media_type="text/csv"),
            Part(data=_data(FORM_DATA), media_type="application/json"),
        ]
        await updater.requires_input(updater.new_agent_message(question))
    elif script == "big-artifact":
        big = Part(raw=bytes(range(256)) * (BIG_BYTES // 256), filename="big.bin")
        await updater.add_artifact([big], artifact_id="big", name="big")
        await updater.complete()
    elif script == "big-file":
        big_file = Part(raw=BIG_FILE, filename="big.bin", media_type="application/octet-stream")
        await updater.add_artifact([big_file], artifact_id="file", name="file")
        await updater.complete()
    elif script == "big-question":
        await updater.start_work()
        question = [Part(text="Read this first."), Part(raw=b"q" * (80 * 1024), filename="q.txt")]
        await updater.requires_input(updater.new_agent_message(question))
    else:  # bundle
        await updater.start_work()
        chunks = [
            Part(text="part one"),
            Part(raw=b"part two", filename="two.bin", media_type="application/octet-stream"),
            Part(data=_data({"part": 3})),
        ]
        for number, chunk in enumerate(chunks):
            if number == 1:
                await agent.holding.passed()
            await asyncio.sleep(0.02)
            await updater.add_artifact(
                [chunk], artifact_id="bundle", name="bundle",
                append=number > 0, last_chunk=number == len(chunks) - 1,
            )  # fmt: skip
        await updater.complete()


class ContentAgent(DemoAgent):
    """The demo agent whose ``echo`` also answers `CONTENT_SCRIPTS`; use as ``with
    ContentAgent() as agent:``. ``file_requests``: the ``(host, Authorization or None)`` of each
    GET of `FILE_PATH`."""

    card_paths = (*DemoAgent.card_paths, FILE_PATH)

    def __init__(self) -> None:
        super().__init__(name="cardfence-content", extra_hosts=[OTHER_HOST])
        self.file_requests: list[tuple[str, str | None]] = []
        scripted = self.executor

        async def execute(
            _self: ScriptedExecutor, context: RequestContext, queue: EventQueue
        ) -> None:
            script, argument = select_script(context.message, context.metadata)
            if context.current_task is not None or script != "echo":
                await ScriptedExecutor.execute(scripted, context, queue)
                return
            if argument not in CONTENT_SCRIPTS:
                await ScriptedExecutor.execute(scripted, context, queue)
                return
            assert context.task_id is not None
            assert context.context_id is not None
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            status.timestamp.FromDatetime(datetime.now(UTC))
            task = Task(id=context.task_id, context_id=context.context_id, status=status)
            if context.message is not None:
                task.history.append(context.message)
            updater = TaskUpdater(queue, context.task_id, context.context_id)
            await _content(self, argument, updater, queue, task)

        # The handler holds this executor already: its ``execute`` is what changes.
        scripted.execute = types.MethodType(execute, scripted)  # type: ignore[method-assign]

    @property
    def other_origin_served(self) -> bool:
        """Whether 127.0.0.2:PORT could be bound (another origin serving `FILE_PATH`)."""
        return OTHER_HOST in self._server.bound_hosts

    async def _answer_card(
        self, request: Request, path: str, host: str, fault: str | None
    ) -> Response:
        if path == FILE_PATH:
            self.file_requests.append((host, request.headers.get("authorization")))
            return Response(FILE_BODY, media_type="text/plain")
        if host == OTHER_HOST:
            return PlainTextResponse("Not Found", status_code=404)
        return await super()._answer_card(request, path, host, fault)
