"""Task updates read from the log (``engine/client/updates.py``): for one task or all, each with
the task as it stands after it and its global position; resumed after a position, nothing missed
and nothing seen twice; ``wait_for`` on top of them."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from support.cards import ORIGIN
from support.mocked import ScriptedAgent, answering, engine_on

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.updates import TaskUpdate
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import TaskState
from cardfence.engine.errors import DeadlineExceeded, TaskEndedError, UsageError
from cardfence.store.event_store import EventStore


async def _taken(
    engine: Engine, count: int, ref: str | None = None, after: int = 0
) -> list[TaskUpdate]:
    """The first ``count`` updates after ``after``, within a few seconds."""
    taken: list[TaskUpdate] = []
    async with asyncio.timeout(5):
        async with contextlib.aclosing(engine.updates(ref, after=after)) as updates:
            async for update in updates:
                taken.append(update)
                if len(taken) == count:
                    return taken
    return taken


async def test_each_update_carries_its_event_the_task_after_it_and_its_position(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("working", "completed"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        await engine.poll(key)
        await engine.poll(key)
        logged = store.read_stream(f"task:{key}")
        updates = await _taken(engine, len(logged), key)
    assert [u.position for u in updates] == [e.position for e in logged]
    assert [u.event.type for u in updates] == [e.type for e in logged]
    assert isinstance(updates[0].event, ev.TaskSubmitted)
    assert all(u.key == key for u in updates)
    # The task after each update is the stream replayed up to it, the last one the projection.
    head = store.stream(f"task:{key}")
    assert head is not None
    assert updates[-1].task.state is TaskState.COMPLETED
    assert updates[-1].task.updated_at == head.updated_at
    states = [u.task.state for u in updates]
    assert states[0] == "submitted"
    assert "working" in states


async def test_updates_of_every_task_come_in_the_logs_order_and_only_tasks(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("completed"))
    async with engine_on(store, agent.transport()) as engine:
        first = (await engine.start_task(ORIGIN, skill="echo", text="one")).key
        second = (await engine.start_task(ORIGIN, skill="echo", text="two")).key
        await engine.poll(first)
        await engine.poll(second)
        tasks = [e for e in store.read_all(limit=10_000) if e.stream_id.startswith("task:")]
        every = await _taken(engine, len(tasks))
        only_second = await _taken(engine, 2, second)
    assert [u.position for u in every] == [e.position for e in tasks]
    assert {u.key for u in every} == {first, second}
    assert [u.key for u in only_second] == [second, second]


async def test_resumed_after_the_last_position_handled_nothing_is_missed_or_seen_twice(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("working", "completed"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        before = await _taken(engine, 1, key)
        await engine.poll(key)
        await engine.poll(key)
        logged = store.read_stream(f"task:{key}")
        after = await _taken(engine, len(logged) - 1, key, after=before[-1].position)
        # Resumed mid-stream: the task is replayed up to the first update handed out.
        mid = await _taken(engine, 1, key, after=logged[1].position)
    assert [u.position for u in before + after] == [e.position for e in logged]
    assert mid[0].position == logged[2].position
    assert mid[0].task == after[1].task


async def test_updates_from_now_leave_out_what_was_recorded_before(store: EventStore) -> None:
    agent = ScriptedAgent(answering("completed"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        updates = engine.updates(key)
        reading = asyncio.ensure_future(anext(updates))
        await asyncio.sleep(0.2)  # the tail has taken the log's end as its start
        assert not reading.done()
        await engine.poll(key)
        update = await asyncio.wait_for(reading, 5)
        await updates.aclose()
    assert update.task.state == "completed"
    assert update.position == store.read_stream(f"task:{key}")[-1].position


async def test_a_negative_position_is_a_usage_error(store: EventStore) -> None:
    async with engine_on(store) as engine:
        with pytest.raises(UsageError, match="0 or more"):
            await anext(engine.updates(after=-1))


async def test_wait_for_returns_at_once_when_the_task_is_there(store: EventStore) -> None:
    agent = ScriptedAgent(answering("input-required"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        await engine.poll(key)
        view = await engine.wait_for(key[:8], "input-required", timeout=1)
    assert view.state is TaskState.INPUT_REQUIRED
    assert view.key == key


async def test_wait_for_returns_when_the_update_that_brings_the_task_there_is_recorded(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("working", "working", "input-required"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key

        async def poll_thrice() -> None:
            for _ in range(3):
                await asyncio.sleep(0.05)
                await engine.poll(key)

        polling = asyncio.create_task(poll_thrice())
        view = await engine.wait_for(key, {"input-required", "auth-required"}, timeout=5)
        await polling
    assert view.state == "input-required"


async def test_wait_for_a_task_ended_in_another_state_says_how_it_ended(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("failed"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        waiting = asyncio.create_task(engine.wait_for(key, "completed", timeout=5))
        await asyncio.sleep(0.05)
        await engine.poll(key)
        with pytest.raises(TaskEndedError, match="ended failed") as ended:
            await waiting
        assert ended.value.state == "failed"
        with pytest.raises(TaskEndedError):  # and at once, when it has ended already
            await engine.wait_for(key, "working")


async def test_wait_for_gives_up_at_its_timeout_leaving_the_task_as_it_is(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        recorded = store.read_stream(f"task:{key}")
        with pytest.raises(DeadlineExceeded, match="still submitted") as late:
            await engine.wait_for(key, "completed", timeout=0.2)
        assert late.value.task == key
        assert store.read_stream(f"task:{key}") == recorded


@pytest.mark.parametrize("state", ["done", "never_created", []])
async def test_wait_for_a_state_no_task_is_ever_in_is_a_usage_error(
    store: EventStore, state: str | list[str]
) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).key
        with pytest.raises(UsageError):
            await engine.wait_for(key, state)
