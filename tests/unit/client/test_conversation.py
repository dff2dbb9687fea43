"""Replies (engine/client/_conversation.py): a message of any parts to a task waiting for input,
recorded before it is sent, never checked against the card (R1), held to the bound on a
message."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support.cards import ORIGIN
from support.mocked import ScriptedAgent, engine_on, rpc_result, task_answer

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.core.content import MESSAGE_METADATA, resolved_parts
from cardfence.engine.core.messages import recorded_parts
from cardfence.engine.core.parts import Data, File, Text
from cardfence.engine.errors import MessageTooLargeError, UsageError
from cardfence.store.event_store import EventStore

PDF = File(data=b"%PDF\x00", filename="signed.pdf")


def _waiting_agent() -> ScriptedAgent:
    """An agent whose task ``r-1`` is answered ``working`` after a reply."""
    return ScriptedAgent(
        send=lambda call: rpc_result(
            call,
            {"task": task_answer("working")}
            if call["params"]["message"].get("taskId")
            else {"task": task_answer("submitted")},
        )
    )


async def _asking(engine: Any, key: str) -> None:
    await engine.start_task(ORIGIN, skill="echo", text="ask", key=key)
    asked = ev.StateChanged(
        from_="submitted", to="input-required", source="poll", remote_timestamp=None
    )
    engine.log.record(key, lambda state: [asked])


async def test_a_reply_of_parts_is_recorded_then_sent_and_no_card_is_read_for_it(
    store: EventStore,
) -> None:
    agent = _waiting_agent()
    async with engine_on(store, agent.transport()) as engine:
        await _asking(engine, "k-1")
        reads = agent.count("card")
        view = await engine.reply(
            "k-1", "signed", parts=[PDF, Data({"ok": True})], metadata={"round": 2}
        )
    assert view.state == "working"
    assert agent.count("card") == reads  # R1: a continuation is not checked against the card
    reply = store.read_stream("task:k-1")[-2]
    assert reply.type == ev.REPLY_SENT
    parts = [Text("signed"), PDF, Data({"ok": True})]
    assert set(reply.data) == {"message_id", "chars", "parts"}  # R17: content out of line
    assert reply.data["chars"] == 6
    kept = {digest: record.data for digest, record in store.contents("task:k-1").items()}
    resolved, around = resolved_parts(reply.data["parts"], kept)
    assert [{k: v for k, v in p.items() if k not in ("size", "sha256")} for p in resolved] == (
        recorded_parts(parts)
    )
    assert around == {MESSAGE_METADATA: {"round": 2}}
    message = agent.calls[-1]["params"]["message"]
    assert message["messageId"] == reply.data["message_id"]
    assert (message["taskId"], message["contextId"]) == ("r-1", "c-1")
    assert message["parts"] == [
        {"text": "signed", "mediaType": "text/plain"},
        {"raw": "JVBERgA=", "filename": "signed.pdf", "mediaType": "application/pdf"},
        {"data": {"ok": True}, "mediaType": "application/json"},
    ]
    assert message["metadata"] == {"round": 2, "skillId": "echo"}


async def test_a_reply_keeps_its_text_positional_and_its_media_type(store: EventStore) -> None:
    agent = _waiting_agent()
    async with engine_on(store, agent.transport()) as engine:
        await _asking(engine, "k-1")
        await engine.reply("k-1", '{"a": 1}', media_type="application/json")
    (part,) = agent.calls[-1]["params"]["message"]["parts"]
    assert part == {"text": '{"a": 1}', "mediaType": "application/json"}


async def test_a_reply_without_parts_or_over_the_bound_records_and_sends_nothing(
    store: EventStore,
) -> None:
    agent = _waiting_agent()
    async with engine_on(store, agent.transport(), EngineConfig(max_message_bytes=600)) as engine:
        await _asking(engine, "k-1")
        before, sends = store.last_position(), len(agent.calls)
        with pytest.raises(UsageError, match="at least one part"):
            await engine.reply("k-1")
        with pytest.raises(MessageTooLargeError, match="over the bound of 600"):
            await engine.reply("k-1", parts=[File(data=b"x" * 500)])
    assert store.last_position() == before
    assert len(agent.calls) == sends


async def test_a_reply_the_agent_throttles_goes_again_whole(store: EventStore) -> None:
    answers: list[Any] = [httpx.Response(429, headers={"Retry-After": "0"})]

    def send(call: dict[str, Any]) -> httpx.Response:
        if not call["params"]["message"].get("taskId"):
            return rpc_result(call, {"task": task_answer("submitted")})
        return answers.pop(0) if answers else rpc_result(call, {"task": task_answer("working")})

    agent = ScriptedAgent(send=send)
    async with engine_on(store, agent.transport()) as engine:
        await _asking(engine, "k-1")
        await engine.reply("k-1", parts=[PDF])
    sent = [c["params"]["message"] for c in agent.calls if c["method"] == "SendMessage"]
    first, again = sent[1:]
    assert first == again
