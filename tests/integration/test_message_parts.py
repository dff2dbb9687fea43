"""A message of any parts, against real agents of both generations (the a2a-sdk 1.3 agent, the
official a2a-sdk 0.3 agent over each of its bindings): the parts reach the agent and come back
intact, a second task continues the first one's conversation, referenced tasks and accepted
output modes reach the agent, and what R2 refuses or the bound on a message holds back sends
nothing and records only the refusal.

Each agent's ``parts`` script (engine/demo/executor.py, tests/support/agent03/server.py) answers
with an artifact ``parts`` holding the parts as it received them and an artifact ``request``
holding the message's metadata, its ``referenceTaskIds`` and the ``acceptedOutputModes``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import Peer, Peer03
from support.cli import cardfence, document
from support.engine_fixtures import Agent, agent_events, binding_in_use, calls, data_of

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.content import MESSAGE_METADATA, resolved_parts
from cardfence.engine.core.parts import Data, File, Part, Text, from_recorded
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import (
    EndpointUnreachableError,
    MessageTooLargeError,
    SkillUnavailableError,
    UsageError,
)
from cardfence.engine.wire.transport import A2ATransport

ALL_BYTES = File(data=bytes(range(256)) * 3, filename="all.bin", media_type="image/x-test")
LINK = File(
    url="https://files.example/report.pdf", filename="report.pdf", media_type="application/pdf"
)
FORM = Data({"form": {"answer": "yes", "sure": True, "list": [1, "two", None]}})


def _with_parts_skill(card: dict[str, Any]) -> None:
    """The card with a skill ``parts`` that takes and gives any media type."""
    card["skills"].append(
        {"id": "parts", "name": "Parts", "description": "Sends back what it got.",
         "tags": ["test"], "inputModes": ["*/*"], "outputModes": ["*/*"]}
    )  # fmt: skip


def _artifact(view: TaskView, name: str) -> list[Part]:
    (artifact,) = [a for a in view.artifacts if a.get("name") == name]
    parts = [from_recorded(p) for p in artifact["parts"]]
    assert None not in parts, artifact
    return [p for p in parts if p is not None]


def _request(view: TaskView) -> dict[str, Any]:
    (data,) = _artifact(view, "request")
    assert isinstance(data, Data)
    return dict(data.data)


async def _done(engine: Engine, view: TaskView) -> TaskView:
    return await engine.drive(view.task, until="terminal", timeout=10)


async def test_every_kind_of_part_and_the_metadata_reach_the_agent_and_come_back_intact(
    agent: Agent, engine: Engine
) -> None:
    agent.mutate_card(_with_parts_skill)
    view = await engine.start_task(
        agent.base_url,
        skill="parts",
        text="hello, ünïcode",
        parts=[ALL_BYTES, LINK, FORM],
        metadata={"trace": "t-1", "depth": 2, "tags": ["a", "b"]},
    )
    done = await _done(engine, view)

    assert done.state == "completed"
    text, data_file, link, form = _artifact(done, "parts")
    assert isinstance(text, Text)
    assert text.text == "hello, ünïcode"
    assert isinstance(data_file, File)
    assert (data_file.data, data_file.filename, data_file.media_type) == (
        ALL_BYTES.data,
        "all.bin",
        "image/x-test",
    )
    assert isinstance(link, File)
    assert (link.url, link.filename, link.media_type) == (
        LINK.url,
        "report.pdf",
        "application/pdf",
    )
    assert isinstance(form, Data)
    assert form.data == FORM.data
    assert _request(done)["metadata"] == {
        "trace": "t-1",
        "depth": 2,
        "tags": ["a", "b"],
        "skillId": "parts",
    }


async def test_a_reply_of_parts_reaches_the_agent_as_it_was_sent(
    agent: Agent, engine: Engine
) -> None:
    asked = await engine.start_task(agent.base_url, skill="ask", text="ask")
    asked = await engine.drive(asked.task, until="interrupted", timeout=10)
    assert asked.state == "input-required"
    replied = await engine.reply(asked.task, "my answer", parts=[FORM], metadata={"r": 1})
    done = await _done(engine, replied)
    assert done.state == "completed"
    (answer,) = _artifact(done, "answer")
    assert isinstance(answer, Text)
    assert answer.text.startswith("answer: my answer")
    (sent,) = data_of(engine.store, asked.task, ev.REPLY_SENT)
    assert "metadata" not in sent  # R17: content, out of line with the parts
    kept = {d: r.data for d, r in engine.store.contents(f"task:{asked.task}").items()}
    parts, around = resolved_parts(sent["parts"], kept)
    assert [from_recorded(p) for p in parts] == [Text("my answer"), FORM]
    assert around[MESSAGE_METADATA] == {"r": 1}


async def test_a_second_task_continues_the_conversation_and_references_the_first(
    agent: Agent, engine: Engine
) -> None:
    agent.mutate_card(_with_parts_skill)
    first = await _done(engine, await engine.start_task(agent.base_url, skill="echo", text="one"))
    second = await engine.start_task(
        agent.base_url,
        skill="parts",
        text="two",
        context=first.task,
        references=[first.task],
        accept=["text/plain", "application/json"],
    )
    done = await _done(engine, second)

    assert done.state == "completed"
    assert first.context_id
    assert done.context_id == first.context_id  # one conversation, two tasks
    assert done.remote_task_id != first.remote_task_id
    assert done.references == (first.task,)
    request = _request(done)
    by_rest_03 = isinstance(agent, Peer03) and binding_in_use(agent) == "HTTP+JSON"
    # The 0.3 proto has no referenceTaskIds: over HTTP+JSON 0.3 they are not sent.
    assert request["referenceTaskIds"] == ([] if by_rest_03 else [first.remote_task_id])
    assert request["acceptedOutputModes"] == ["text/plain", "application/json"]


@pytest.mark.parametrize(
    ("message", "accept", "reason"),
    [
        ({"text": "hi", "parts": [ALL_BYTES]}, (), "media_type_not_accepted"),
        ({"parts": [FORM]}, (), "media_type_not_accepted"),
        ({"text": "hi"}, ("image/png",), "output_mode_not_accepted"),
    ],
)
async def test_a_part_or_an_accepted_mode_the_skill_refuses_sends_nothing_and_records_the_refusal(
    agent: Agent,
    engine: Engine,
    message: dict[str, Any],
    accept: tuple[str, ...],
    reason: str,
) -> None:
    with pytest.raises(SkillUnavailableError, match="nothing was sent"):
        await engine.start_task(agent.base_url, skill="echo", accept=accept, **message)
    assert calls(agent, "SendMessage") == 0
    assert [s for s in engine.store.stream_ids() if s.startswith("task:")] == []
    refusals = [d for t, d in agent_events(engine.store, agent) if t == ev.TASK_CREATION_REFUSED]
    assert [(r["reason"], r["skill"]) for r in refusals] == [(reason, "echo")]


async def test_a_message_over_the_bound_or_a_context_elsewhere_reads_records_and_sends_nothing(
    agent: Agent, tmp_path: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'bound.db'}"
    config = EngineConfig(max_message_bytes=64 * 1024)
    async with Engine.connect(url, config=config) as engine:
        with pytest.raises(MessageTooLargeError):
            await engine.start_task(
                agent.base_url, skill="echo", parts=[File(data=b"\0" * 64 * 1024)]
            )
        first = await engine.start_task(agent.base_url, skill="echo", text="one")
        before = engine.store.last_position()
        with pytest.raises(UsageError, match="a conversation goes on at one agent"):
            await engine.start_task("http://127.0.0.9:1", text="x", context=first.task)
        assert engine.store.last_position() == before
    assert calls(agent, "SendMessage") == 1
    assert agent.card_requests == 1


async def test_the_skill_may_be_left_out_when_the_card_offers_only_one(
    agent: Agent, engine: Engine
) -> None:
    agent.mutate_card(
        lambda card: card.update(skills=[s for s in card["skills"] if s["id"] == "echo"])
    )
    done = await _done(engine, await engine.start_task(agent.base_url, text="echo alone"))
    assert (done.skill, done.state) == ("echo", "completed")


# 1.3 only: resume finds a send whose outcome is unknown through ListTasks, which 0.3 lacks.
async def test_a_send_lost_inside_a_conversation_is_found_again_by_its_message_id_not_sent_twice(
    peer: Peer, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await _done(engine, await engine.start_task(peer.base_url, skill="echo", text="one"))
    sent = A2ATransport.send_message

    async def answer_lost(self: A2ATransport, **kwargs: Any) -> Any:
        await sent(self, **kwargs)  # it reached the agent; its answer never came back
        raise EndpointUnreachableError(self.interface.url, "network error: the answer was lost")

    monkeypatch.setattr(A2ATransport, "send_message", answer_lost)
    with pytest.raises(EndpointUnreachableError):
        await engine.start_task(
            peer.base_url, skill="echo", text="echo two", context=first.task, key="k-2"
        )
    monkeypatch.undo()
    assert engine.store.read_stream("task:k-2")[-1].type == ev.ENDPOINT_UNREACHABLE

    resumed = await engine.resume("k-2")
    done = await _done(engine, resumed)

    assert resumed.remote_task_id not in (None, first.remote_task_id)  # ours, not the first
    assert done.context_id == first.context_id
    assert calls(peer, "SendMessage") == 2  # one per task: found, not sent again
    assert calls(peer, "ListTasks") == 1
    assert [p.text for p in _artifact(done, "echo") if isinstance(p, Text)] == ["two"]


async def test_the_files_an_agent_of_either_generation_sends_back_are_written_by_artifacts(
    agent: Agent, engine: Engine, tmp_path: Path
) -> None:
    agent.mutate_card(_with_parts_skill)
    view = await engine.start_task(
        agent.base_url, skill="parts", text="files", parts=[ALL_BYTES, LINK, FORM]
    )
    done = await _done(engine, view)
    [returned] = [a for a in await engine.artifacts(done.task) if a.name == "parts"]
    assert [type(part) for part in returned.parts] == [Text, File, File, Data]

    out = tmp_path / "out"
    written = cardfence(
        f"sqlite:///{tmp_path / 'engine.db'}", "artifacts", done.task, "--out", str(out), "--json"
    )
    assert written.returncode == 0, written.stderr
    assert (out / "all.bin").read_bytes() == ALL_BYTES.data
    listed = [p for a in document(written)["artifacts"] if a["name"] == "parts" for p in a["parts"]]
    assert [p["kind"] for p in listed] == ["text", "file", "url", "data"]
    assert [p["path"] is None for p in listed] == [False, False, True, False]  # no --fetch
