"""A question that carries a form (a data part beside its text), as agents that want structured
input ask, from the official a2a-sdk agents 1.3 and 0.3 on both bindings: the task keeps the
whole message, the form included, and an answer sent as JSON completes it."""

from __future__ import annotations

import json

from support.engine_fixtures import Agent, data_of
from support.events import read_back, without_outline

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.demo.executor import FORM


async def test_a_question_carrying_a_form_is_kept_whole_and_a_json_answer_completes_it(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="ask", text="ask form")
    waiting = await engine.drive(view.task, until="interrupted", timeout=10)
    answered = await engine.reply(
        view.task, json.dumps({"answer": "42", "sure": True}), media_type="application/json"
    )
    done = await engine.drive(answered.task, until="terminal", timeout=10)

    assert waiting.state == "input-required"
    assert waiting.last_message == "What is your answer?"
    kinds = [part["kind"] for part in waiting.last_message_parts]
    assert kinds == ["text", "data"]
    assert waiting.last_message_parts[1]["data"] == FORM
    (asked,) = [d for d in data_of(engine.store, view.task, ev.STATE_CHANGED)
                if d["to"] == "input-required"]  # fmt: skip
    # R17: the event holds each part's outline; the view, its content read back
    assert read_back(engine.store, view.task, asked["message_parts"]) == [
        without_outline(part) for part in waiting.last_message_parts
    ]
    assert done.state == "completed"


async def test_a_question_in_text_alone_reads_as_its_text_with_no_parts(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="ask", text="ask")
    waiting = await engine.drive(view.task, until="interrupted", timeout=10)

    assert waiting.last_message == "What is your answer?"
    assert waiting.last_message_parts == ()
    (asked,) = [d for d in data_of(engine.store, view.task, ev.STATE_CHANGED)
                if d["to"] == "input-required"]  # fmt: skip
    assert "message" not in asked  # R17: its one text part, out of line
    assert read_back(engine.store, view.task, asked["message_parts"]) == [
        {"kind": "text", "media_type": "text/plain", "text": "What is your answer?"}
    ]
