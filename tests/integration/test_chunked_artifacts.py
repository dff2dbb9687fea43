"""An artifact streamed in chunks (A2A ``append``) by the official a2a-sdk agents, 1.3 and 0.3,
as an agent streams a model's answer. The agent sends two words, then waits (held) while the
engine subscribes to the task, then sends the rest: every chunk the stream brings is recorded
with only its own parts, and the task ends holding the artifact the agent holds.

Once the stream ends the task, the engine reads it whole (one closing ``GetTask``): what the
agent holds is the artifact, recorded once, its parts as the agent holds them. a2a-sdk 1.3
starts a subscription with the task as it is (the first two words), so the chunks after it
make up the whole answer. a2a-sdk 0.3 starts it with nothing: the first chunk the engine meets
extends an artifact it never saw (``partial``). (That 0.3 agent also stores each chunk twice
while a client is subscribed, so the artifact it holds is not the text it streamed:
docs/wire.md. The engine keeps what it holds.)
"""

from __future__ import annotations

import asyncio

import pytest
from support import Peer
from support.engine_fixtures import Agent, data_of

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.content import resolved_parts
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.demo import executor

WORDS = "alpha beta gamma delta epsilon zeta eta theta"


async def _agent_holds(engine: Engine, key: str) -> list[str]:
    """The text parts of the artifact the agent holds now (a read recorded nowhere)."""
    state = await engine.records.state(key)
    transport = await engine.connections.task_transport(state)
    task = await transport.get_task(state["remote_task_id"])
    return [part.text or "" for artifact in task.artifacts for part in artifact.parts]


async def _subscribed(agent: Agent, before: int) -> None:
    for _ in range(200):
        if any("ubscribe" in call for _, call in agent.calls[before:]):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no subscription reached the agent: {agent.calls[before:]}")


async def _written_while_followed(
    agent: Agent, engine: Engine, text: str
) -> tuple[TaskView, int, State]:
    """A ``write`` task whose agent holds after two words while the engine subscribes to the
    task, then sends the rest: the task, the agent's calls before the subscription, and the
    state the stream ended at."""
    agent.hold()
    view = await engine.start_task(agent.base_url, skill="write", text=text)
    for _ in range(200):  # the first two words sent, the agent held
        if len(await _agent_holds(engine, view.task)) == 2:
            break
        await asyncio.sleep(0.02)
    before = len(agent.calls)
    following = asyncio.create_task(engine.follow_stream(view.task))
    await _subscribed(agent, before)
    agent.release()
    return view, before, await following


async def test_an_artifact_streamed_in_chunks_is_recorded_chunk_by_chunk_and_held_whole(
    agent: Agent, engine: Engine
) -> None:
    view, before, followed = await _written_while_followed(agent, engine, WORDS)
    await engine.settle()  # the closing read
    reads = [call for _, call in agent.calls[before:] if call in ("GetTask", "tasks/get")]
    done = await engine.task(view.task)
    held = await _agent_holds(engine, view.task)

    assert followed["state"] == "completed"
    assert len(reads) == 1, agent.calls[before:]  # the closing read, and no poll
    (artifact,) = done.artifacts
    assert [part["text"] for part in artifact["parts"]] == held
    received = data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)
    chunks = [r for r in received if r.get("append")]
    assert chunks  # the six words after the hold came as chunks, each its own event
    assert all(r["source"] == "stream" and len(r["parts"]) == 1 for r in chunks)
    closing = received[-1]  # the agent's whole artifact, once
    assert (closing["source"], closing.get("replaces")) == ("poll", True)
    assert "partial" not in artifact
    if isinstance(agent, Peer):  # a subscription that starts with the task as it is
        assert "".join(held) == WORDS
        assert len(chunks) == 6
    else:  # one that starts with nothing: its first chunk extended nothing held
        assert received[0].get("partial") is True
    count = len(received)
    await engine.poll(view.task)  # the agent's artifact again: the same, nothing appended
    assert len(data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)) == count


async def test_a_burst_of_chunks_is_appended_in_fewer_events_and_every_chunk_is_held(
    peer: Peer, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent streaming as fast as a model writes (a2a-sdk 1.3, no pause between chunks):
    what the stream brings while the last chunk is being recorded is appended at once, one
    event for the burst, counted. The task holds every word, the count of the chunks is the
    count the agent sent, and the audit passes."""
    monkeypatch.setattr(executor, "_CHUNK_SECONDS", 0.0)
    words = [f"w{n}" for n in range(400)]
    view, _, followed = await _written_while_followed(peer, engine, " ".join(words))
    assert followed["state"] == "completed"

    received = data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)
    streamed = [r for r in received if r["source"] == "stream" and r.get("append")]
    assert sum(r.get("chunks", 1) for r in streamed) == len(words) - 2  # every chunk, once
    assert len(streamed) < len(words) - 2  # bursts were appended at once
    assert max(r.get("chunks", 1) for r in streamed) > 1
    kept = {d: c.data for d, c in engine.store.contents(f"task:{view.task}").items()}
    text = "".join(p["text"] for r in streamed for p in resolved_parts(r["parts"], kept)[0])
    assert text == " ".join(words[2:])
    await engine.settle()  # the closing read: the agent's whole artifact
    (artifact,) = (await engine.task(view.task)).artifacts
    assert "".join(p["text"] for p in artifact["parts"]) == " ".join(words)
