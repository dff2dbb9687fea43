"""Continuation read on its own (R1, R5, R7, R9, R16): one poll, one step of following, the drive
loop's ends, and a task's event stream beside the polls -- with a mock agent whose answers each
test scripts. Card state never gates any of it: what a card says here only adds diagnostics or
changes how the news arrives."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.events import stored
from support.hostile import completed_event, sse, working_event
from support.mocked import (
    Answer,
    ScriptedAgent,
    answering,
    engine_on,
    events_streamed,
    rpc_error,
    rpc_result,
    submitted_task,
    task_answer,
    task_card_as,
)
from support.virtual_time import run_virtual, virtual_engine

from cardfence.engine.cards.model import parse_card
from cardfence.engine.client import following
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import Pace, _event_bytes, _unwound, reached
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.observations import from_update
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CreationRefusedError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    StreamDroppedError,
    TaskOrphanedError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.http import deadline
from cardfence.engine.wire.push import decode
from cardfence.store.event_store import EventStore

ENDPOINT = f"{ORIGIN}/a2a"


async def _started(engine: Engine) -> str:
    return (await engine.start_task(ORIGIN, skill="echo", text="hi")).task


def _types(store: EventStore, key: str) -> list[str]:
    return [e.type for e in store.read_stream(f"task:{key}")]


# -- the pure pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "until", "stop"),
    [
        ("completed", "terminal", True),
        ("failed", "interrupted", True),
        ("input-required", "interrupted", True),
        ("auth-required", "interrupted", True),
        ("input-required", "terminal", False),
        ("working", "interrupted", False),
        ("submitted", "terminal", False),
    ],
)
def test_a_task_has_reached_the_point_asked_for(state: str, until: str, stop: bool) -> None:
    assert reached(state, until) is stop


def test_polls_back_off_doubling_up_to_the_bound() -> None:
    config = EngineConfig(first_poll_interval=0.5, max_poll_interval=3.0, max_card_age=60.0)
    pace = Pace.start(config, now=100.0)
    assert (pace.next_revalidation, pace.next_endpoint_check, pace.unreachable) == (
        160.0,
        100.0,
        None,
    )
    waits = [pace.backoff(config.max_poll_interval) for _ in range(5)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_first_poll_interval_over_the_bound_waits_the_bound() -> None:
    pace = Pace(delay=10.0, next_revalidation=0.0, next_endpoint_check=0.0)
    assert pace.backoff(2.0) == 2.0
    assert pace.delay == 2.0


def test_a_failure_kept_lets_go_of_its_tracebacks_and_of_a_context_it_does_not_show() -> None:
    def failing() -> EndpointUnreachableError:
        try:
            try:
                raise ConnectionError("socket")
            except ConnectionError:
                raise KeyError("shown") from None
        except KeyError as shown:
            try:
                raise EndpointUnreachableError(ENDPOINT, "connect: refused") from shown
            except EndpointUnreachableError as failure:
                return failure

    failure = failing()
    cause = failure.__cause__
    assert cause is not None
    assert cause.__context__ is not None
    assert _unwound(failure) is failure
    assert failure.__traceback__ is None
    assert cause.__traceback__ is None
    assert cause.__context__ is None  # suppressed: `raise ... from None`
    assert failure.__cause__ is cause  # the cause shown is kept


def test_a_shown_context_is_kept_with_its_traceback_let_go() -> None:
    try:
        try:
            raise ConnectionError("socket")
        except ConnectionError:
            raise EndpointUnreachableError(ENDPOINT, "connect: refused")  # noqa: B904
    except EndpointUnreachableError as failure:
        kept = _unwound(failure)
    assert isinstance(kept.__context__, ConnectionError)
    assert kept.__context__.__traceback__ is None


# -- one poll ------------------------------------------------------------------------------------


async def test_a_poll_applies_the_agents_answer_with_no_card_read(store: EventStore) -> None:
    agent = ScriptedAgent(answering("working"))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        reads = agent.count("card")
        view = await engine.poll(key)
    assert view.state == "working"
    assert agent.count("card") == reads  # continuation reads no card (R1)
    changed = store.read_stream(f"task:{key}")[-1]
    assert (changed.type, changed.data["to"], changed.data["source"]) == (
        ev.STATE_CHANGED,
        "working",
        "poll",
    )


@pytest.mark.parametrize(
    ("answer", "failure", "event", "field"),
    [
        (lambda call: httpx.Response(403), AuthorizationFailedError, ev.AUTHORIZATION_FAILED,
         "during"),
        (lambda call: httpx.Response(503), EndpointUnreachableError, ev.ENDPOINT_UNREACHABLE,
         "during"),
        (lambda call: rpc_result(call, {**task_answer("working"), "id": "r-2"}),
         WrongTaskAnswerError, ev.OBSERVATION_IGNORED, "source"),
    ],
)  # fmt: skip
async def test_a_failed_poll_is_recorded_as_made_by_a_poll(
    store: EventStore, answer: Answer, failure: type[Exception], event: str, field: str
) -> None:
    async with engine_on(store, ScriptedAgent(answer).transport()) as engine:
        key = await _started(engine)
        with pytest.raises(failure):
            await engine.poll(key)
    recorded = [e.data for e in store.read_stream(f"task:{key}") if e.type == event]
    assert [r[field] for r in recorded if r.get("reason", "wrong_task") == "wrong_task"] == ["poll"]


async def test_a_task_without_a_remote_id_cannot_be_polled(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        key = await _started(engine)
        state = await engine.records.state(key)
        with pytest.raises(UsageError) as raised:
            await engine.following.poll_state(key, {**state, "remote_task_id": None})
    assert str(raised.value) == f"task {key} has no remote task id: run `resume` to find it"


async def test_an_answer_read_when_no_time_is_left_is_not_applied(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = ScriptedAgent(answering("completed"))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        recorded = len(store.read_stream(f"task:{key}"))
        state = await engine.records.state(key)
        # The answer came as the deadline passed (R16): the next poll reads it again.
        monkeypatch.setattr(following, "time_left", lambda: 0.0)
        after = await engine.following.poll_state(key, state)
    assert after["state"] == "submitted"
    assert len(store.read_stream(f"task:{key}")) == recorded


# -- one step of following ------------------------------------------------------------------------


async def _step(engine: Engine, key: str, pace: Pace) -> dict[str, Any]:
    return await engine.follow_step(key, await engine.records.state(key), pace)


async def test_a_step_that_reaches_the_agent_forgets_the_last_failure(store: EventStore) -> None:
    agent = ScriptedAgent(answering("working"))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        pace = Pace.start(engine.config, engine.clock())
        pace.unreachable = EndpointUnreachableError(ENDPOINT, "connect: refused")
        state = await _step(engine, key, pace)
    assert state["state"] == "working"
    assert pace.unreachable is None


async def test_a_step_that_fails_keeps_the_failure_and_checks_no_endpoint_on_a_503(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(503))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        pace = Pace.start(engine.config, engine.clock())
        reads = agent.count("card")
        state = await _step(engine, key, pace)
    assert state["state"] == "submitted"
    assert isinstance(pace.unreachable, EndpointUnreachableError)
    assert pace.unreachable.status == 503
    assert pace.unreachable.__traceback__ is None  # kept unwound
    assert agent.count("card") == reads
    assert _types(store, key)[-1] == ev.ENDPOINT_UNREACHABLE


async def test_a_bare_404_checks_the_endpoint_once_per_max_card_age(store: EventStore) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(404))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        pace = Pace.start(engine.config, engine.clock())
        reads = agent.count("card")
        await _step(engine, key, pace)
        checked = agent.count("card")
        next_check = pace.next_endpoint_check
        await _step(engine, key, pace)
    assert checked == reads + 1  # R9: the card read again for the endpoint
    assert agent.count("card") == checked  # not again within max_card_age
    assert next_check > engine.clock() + engine.config.max_card_age - 5.0


async def test_a_bare_404_from_an_endpoint_the_card_dropped_orphans_the_task(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(404))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        moved = card_document()
        moved["supportedInterfaces"][0]["url"] = f"{ORIGIN}/v2/a2a"
        moved["skills"][0]["id"] = "translate"
        agent.card = moved
        pace = Pace.start(engine.config, engine.clock())
        with pytest.raises(TaskOrphanedError) as raised:
            await _step(engine, key, pace)
    assert raised.value.task == key
    (orphaned,) = [e.data for e in store.read_stream(f"task:{key}") if e.type == ev.TASK_ORPHANED]
    # The error names the task's skill, the revision that dropped it and why, as recorded.
    assert raised.value.skill == "echo"
    assert raised.value.revision == orphaned["revision"] != ""
    assert f"{orphaned['detail']} in card revision {orphaned['revision'][:12]}" in str(raised.value)


async def test_a_bare_404_with_the_card_unreadable_records_the_failed_read_and_orphans_nothing(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(404))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        agent.card = 503
        pace = Pace.start(engine.config, engine.clock())
        await _step(engine, key, pace)
    events = store.read_stream(f"task:{key}")
    unavailable = [e.data for e in events if e.type == ev.DISCOVERY_UNAVAILABLE]
    assert [(u["during"], u["url"]) for u in unavailable] == [
        ("resume", f"{ORIGIN}/.well-known/agent-card.json")
    ]
    assert ev.TASK_ORPHANED not in [e.type for e in events]


@pytest.mark.parametrize("allowed", [True, False])
async def test_a_bare_404_follows_a_move_to_plain_http_only_where_it_is_allowed(
    store: EventStore, allowed: bool
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(404))
    config = EngineConfig(card_limits=CardLimits(allow_insecure=allowed))
    async with engine_on(store, agent.transport(), config) as engine:
        key = await _started(engine)
        moved = card_document()
        moved["supportedInterfaces"][0]["url"] = "http://agent.example/v2/a2a"
        agent.card = moved
        await _step(engine, key, Pace.start(engine.config, engine.clock()))
        endpoint = (await engine.records.state(key))["endpoint"]["url"]
    assert endpoint == ("http://agent.example/v2/a2a" if allowed else ENDPOINT)
    assert (ev.ENDPOINT_MOVED in _types(store, key)) is allowed


async def test_a_bare_404_of_a_task_under_the_extended_card_has_the_public_card_stand_in(
    store: EventStore,
) -> None:
    """R9 for a task created under the authenticated extended card, which could not be read
    again: what is recorded is what ``guards.resume_stand_in`` decides on the task -- the public
    card's endpoint (plain http allowed here), or both failures -- and the task is never
    orphaned."""
    unread = DiscoveryError(f"{ORIGIN}/a2a", "extended_card", "AuthorizationFailedError: 401")
    failure = DiscoveryError(ORIGIN, "network", "connection refused")
    document = card_document()
    document["supportedInterfaces"][0]["url"] = "http://agent.example/v2/a2a"
    document["skills"][0]["id"] = "translate"  # the public card need not carry the skill
    public = parse_card(json.dumps(document).encode())
    config = EngineConfig(card_limits=CardLimits(allow_insecure=True))
    decided = []
    async with engine_on(store, ScriptedAgent().transport(), config) as engine:
        key = await _started(engine)
        for card, failed in ((None, failure), (public, None)):
            fresh = task_card_as(engine, card, failed, unread)
            state = await engine.records.state(key)
            mark = len(store.read_stream(f"task:{key}"))
            await engine.following.reconcile_endpoint(key)
            assert fresh == [True]  # R9 reads the card again
            recorded = store.read_stream(f"task:{key}")[mark:]
            plan = guards.resume_stand_in(state, card, failed, unread, allow_insecure=True)
            assert [(e.type, e.data) for e in recorded] == stored(plan.events)
            decided.append([e.type for e in recorded])
        endpoint = (await engine.records.state(key))["endpoint"]["url"]
    unavailable = ev.DISCOVERY_UNAVAILABLE
    assert decided == [[unavailable, unavailable], [unavailable, ev.ENDPOINT_MOVED]]
    assert endpoint == "http://agent.example/v2/a2a"


async def test_a_malformed_answer_changes_nothing_and_is_not_raised(store: EventStore) -> None:
    agent = ScriptedAgent(lambda call: rpc_result(call, 7))
    async with engine_on(store, agent.transport()) as engine:
        key = await _started(engine)
        pace = Pace.start(engine.config, engine.clock())
        state = await _step(engine, key, pace)
    assert state["state"] == "submitted"
    assert pace.unreachable is None


@pytest.mark.parametrize("due", [True, False])
async def test_a_step_starts_a_revalidation_only_when_one_is_due(
    store: EventStore, due: bool
) -> None:
    agent = ScriptedAgent(answering("working"))
    config = EngineConfig(max_card_age=0.01)  # the memo of the card is stale at once
    async with engine_on(store, agent.transport(), config) as engine:
        key = await _started(engine)
        await asyncio.sleep(0.02)
        now = engine.clock()
        pace = Pace(0.1, now - 1 if due else now + 60, now + 60)
        reads = agent.count("card")
        await _step(engine, key, pace)
        await engine.settle()
    assert (agent.count("card") > reads) is due  # R7: re-validated with a card read
    if due:
        assert now + 0.01 <= pace.next_revalidation <= engine.clock() + 0.01
    else:
        assert pace.next_revalidation == now + 60


# -- drive -----------------------------------------------------------------------------------------

FAST = EngineConfig(first_poll_interval=0.01, max_poll_interval=0.05, follow_streams=False)


async def test_drive_asks_for_a_point_it_knows(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent().transport(), FAST) as engine:
        key = await _started(engine)
        with pytest.raises(UsageError) as raised:
            await engine.drive(key, until="done")
    assert str(raised.value) == "--until must be one of interrupted, terminal, not 'done'"


async def test_drive_follows_until_the_point_asked_and_lets_go_of_the_task(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("working", "working", "input-required", "completed"))
    async with engine_on(store, agent.transport(), FAST) as engine:
        key = await _started(engine)
        asked = await engine.drive(key, timeout=5)  # until an interrupted state, by default
        assert (key in engine.following.driving, key in engine.observing.pushed) == (False, False)
        done = await engine.drive(key, until="terminal", timeout=5)
    assert (asked.state, done.state) == ("input-required", "completed")


async def test_a_task_the_log_shows_interrupted_is_asked_once_before_drive_believes_it(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("input-required", "working", "completed"))
    async with engine_on(store, agent.transport(), FAST) as engine:
        key = await _started(engine)
        await engine.poll(key)  # input-required, as the log says
        polls = agent.count("GetTask")
        view = await engine.drive(key, until="interrupted", timeout=5)
    assert agent.count("GetTask") > polls
    assert view.state == "completed"  # it had moved on: the log was stale


async def test_drive_at_the_deadline_records_it_and_never_ends_the_task(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(answering("working"))
    async with engine_on(store, agent.transport(), FAST) as engine:
        key = await _started(engine)
        with pytest.raises(DeadlineExceeded) as raised:
            await engine.drive(key, until="terminal", timeout=0.3)
        state = await engine.records.state(key)
    last = store.read_stream(f"task:{key}")[-1]
    assert last.type == ev.DEADLINE_EXCEEDED
    assert {k: last.data[k] for k in ("state", "seconds", "until")} == {
        "state": "working",
        "seconds": 0.3,
        "until": "terminal",
    }
    assert (raised.value.task, raised.value.state) == (key, "working")
    assert state["state"] == "working"  # R10: the deadline ends the wait, not the task
    assert agent.count("GetTask") >= 2  # polled on after the first poll


async def test_drive_at_the_deadline_of_an_unreachable_agent_raises_what_it_met(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(503))
    async with engine_on(store, agent.transport(), FAST) as engine:
        key = await _started(engine)
        with pytest.raises(EndpointUnreachableError):
            await engine.drive(key, until="terminal", timeout=0.3)
    assert _types(store, key)[-1] == ev.DEADLINE_EXCEEDED


async def test_a_push_applied_wakes_drive_before_its_next_poll(store: EventStore) -> None:
    slow = EngineConfig(first_poll_interval=30, max_poll_interval=30, follow_streams=False)
    agent = ScriptedAgent(answering("working"))
    async with engine_on(store, agent.transport(), slow) as engine:
        key = await _started(engine)
        driving = asyncio.ensure_future(engine.drive(key, until="terminal", timeout=20))
        while agent.count("GetTask") < 1:
            await asyncio.sleep(0.01)
        stamp = "2026-01-01T00:00:30Z"
        completed = ev.StateChanged(
            from_="working", to="completed", source="push", remote_timestamp=stamp
        )
        await engine.records.record(key, [completed])
        engine.observing.wake(key)
        view = await asyncio.wait_for(driving, 5)
    assert view.state == "completed"
    assert agent.count("GetTask") == 1


# -- streams beside the polls -------------------------------------------------------------------


STREAMING = EngineConfig(max_poll_interval=30.0)


@pytest.mark.parametrize(
    ("config", "state", "streaming", "offered"),
    [
        (STREAMING, "working", True, True),
        (STREAMING, "submitted", True, True),
        (STREAMING, "input-required", True, False),  # a stream ends at an interrupted state
        (STREAMING, "completed", True, False),
        (STREAMING, "working", False, False),  # the card the task last saw has no streams
        (EngineConfig(follow_streams=False), "working", True, False),
        (EngineConfig(max_poll_interval=0.5), "working", True, False),  # polls close enough
        (EngineConfig(max_poll_interval=1.0), "working", True, True),  # a second apart: offered
    ],
)
async def test_a_tasks_stream_is_offered_when_its_card_and_its_state_allow(
    store: EventStore, config: EngineConfig, state: str, streaming: bool, offered: bool
) -> None:
    card = card_document()
    card["capabilities"]["streaming"] = streaming
    async with engine_on(store, ScriptedAgent(card=card).transport(), config) as engine:
        key = await _started(engine)
        stored = await engine.records.state(key)
        assert await engine.stream_offered(key, {**stored, "state": state}) is offered
        assert await engine.stream_offered(key) is await engine.stream_offered(key, stored)


async def test_a_task_without_a_remote_id_is_offered_no_stream(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent().transport(), STREAMING) as engine:
        key = await _started(engine)
        state = {**(await engine.records.state(key)), "remote_task_id": None}
        assert await engine.stream_offered(key, state) is False


async def test_streams_follow_tasks_whose_polls_are_a_second_apart(store: EventStore) -> None:
    async with engine_on(store) as engine:
        assert engine.stream_after == 1.0


async def test_a_followed_stream_applies_each_event_as_a_stream_report(store: EventStore) -> None:
    agent = ScriptedAgent(subscribe=events_streamed(working_event("r-1"), completed_event("r-1")))
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        woken = engine.observing.pushed[key] = asyncio.Event()
        state = await engine.follow_stream(key)
    assert state["state"] == "completed"
    assert woken.is_set()
    changed = [
        (e.data["to"], e.data["source"])
        for e in store.read_stream(f"task:{key}")
        if e.type == ev.STATE_CHANGED
    ]
    assert changed[-2:] == [("working", "stream"), ("completed", "stream")]


async def test_a_stream_the_agent_does_not_authorize_is_recorded_during_subscribe(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(subscribe=lambda call: httpx.Response(401))
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        with pytest.raises(AuthorizationFailedError):
            await engine.follow_stream(key)
    last = store.read_stream(f"task:{key}")[-1]
    assert (last.type, last.data["during"]) == (ev.AUTHORIZATION_FAILED, "subscribe")


async def test_a_stream_about_another_task_is_recorded_as_a_stream_answer(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(subscribe=events_streamed(working_event("r-other")))
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        with pytest.raises(WrongTaskAnswerError):
            await engine.follow_stream(key)
    ignored = store.read_stream(f"task:{key}")[-2]
    assert ignored.type == ev.OBSERVATION_IGNORED
    assert {k: ignored.data[k] for k in ("reason", "source", "asked", "answered", "state")} == {
        "reason": "wrong_task",
        "source": "stream",
        "asked": "r-1",
        "answered": "r-other",
        "state": "working",
    }


async def test_a_refused_subscription_leaves_the_task_to_its_polls(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(call: dict[str, Any]) -> httpx.Response:
        return rpc_error(call, -32004, "streams not supported for this task")

    ended: list[int] = []
    agent = ScriptedAgent(subscribe=refused)
    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        await asyncio.wait_for(engine.keep_streaming(key, after_each=lambda: ended.append(1)), 5)
    assert agent.count("SubscribeToTask") == 1
    assert ended == [1]
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "StreamRefused"]
    assert line.getMessage() == "stream refused; polling goes on"
    assert line.task == key  # type: ignore[attr-defined]
    assert "streams not supported for this task" in line.reason  # type: ignore[attr-defined]


async def test_a_dropped_stream_is_followed_again_after_a_backoff_until_the_task_ends(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    streams = [
        events_streamed(working_event("r-1")),
        events_streamed(working_event("r-1")),
        events_streamed(completed_event("r-1")),
    ]

    def subscribe(call: dict[str, Any]) -> httpx.Response:
        return streams.pop(0)(call)

    ended: list[float] = []
    agent = ScriptedAgent(subscribe=subscribe)
    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(
            engine.keep_streaming(key, retry_limit=0.05, after_each=lambda: ended.append(
                loop.time())), 5,
        )  # fmt: skip
        state = await engine.records.state(key)
    assert agent.count("SubscribeToTask") == 3
    assert len(ended) == 3
    assert ended[2] - ended[0] < 1.0  # waits of retry_limit (0.05 s), not of a second
    assert state["state"] == "completed"
    dropped = [r for r in caplog.records if getattr(r, "event", None) == "StreamDropped"]
    assert len(dropped) == 2
    assert dropped[0].getMessage() == "stream ended early; polling goes on"
    assert dropped[0].task == key  # type: ignore[attr-defined]
    assert dropped[0].reason == "closed"  # type: ignore[attr-defined]


async def test_a_followed_stream_reads_ahead_by_the_bytes_of_its_events(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # R16: what is read ahead of the store is bounded in bytes as each event weighs, not only
    # in count (a hostile agent's large events would otherwise queue 256 deep).
    weighed: list[tuple[int | None, int]] = []
    real = following.ready_batches

    def spy(source: Any, *args: Any, weigh: Any = None, **kwargs: Any) -> Any:
        async def watched() -> Any:
            async for update in source:
                weighed.append((None if weigh is None else weigh(update), update.size))
                yield update

        return real(watched(), *args, weigh=weigh, **kwargs)

    monkeypatch.setattr(following, "ready_batches", spy)
    agent = ScriptedAgent(subscribe=events_streamed(working_event("r-1"), completed_event("r-1")))
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        await engine.follow_stream(key)
    assert len(weighed) == 2
    assert all(weight == size > 0 for weight, size in weighed)


def test_an_event_weighs_its_size() -> None:
    class Sized:
        size = 1234

    assert _event_bytes(Sized()) == 1234  # type: ignore[arg-type]


async def test_the_last_drive_of_a_task_lets_go_of_its_wake_up(store: EventStore) -> None:
    async with engine_on(store) as engine:
        engine.following.driving["k"] += 2  # two drives of one task at once
        engine.observing.pushed["k"] = asyncio.Event()
        engine.following.let_go("k")
        assert (engine.following.driving["k"], "k" in engine.observing.pushed) == (1, True)
        engine.following.let_go("k")
        assert ("k" in engine.following.driving, "k" in engine.observing.pushed) == (False, False)
        engine.following.driving["j"] += 1  # a drive that never waited: no wake-up to let go
        engine.following.let_go("j")
        assert "j" not in engine.following.driving


async def test_a_silent_stream_is_dropped_after_the_idle_timeout(store: EventStore) -> None:
    class Silent(httpx.AsyncByteStream):
        def __init__(self, first: bytes) -> None:
            self.first = first

        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield self.first
            await asyncio.sleep(30)

    def subscribe(call: dict[str, Any]) -> httpx.Response:
        frame = sse(
            json.dumps({"jsonrpc": "2.0", "id": call["id"], "result": working_event("r-1")})
        )
        return httpx.Response(
            200, stream=Silent(frame), headers={"content-type": "text/event-stream"}
        )

    config = EngineConfig(max_poll_interval=30.0, stream_idle_timeout=0.2)
    async with engine_on(store, ScriptedAgent(subscribe=subscribe).transport(), config) as engine:
        key = await _started(engine)
        with pytest.raises(StreamDroppedError):
            await asyncio.wait_for(engine.follow_stream(key), 5)
        assert (await engine.records.state(key))["state"] == "working"  # what came was applied


async def test_a_stream_that_cannot_be_opened_is_logged_by_its_error_and_tried_again(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    streams = [lambda call: httpx.Response(503), events_streamed(completed_event("r-1"))]
    agent = ScriptedAgent(subscribe=lambda call: streams.pop(0)(call))
    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store, agent.transport(), STREAMING) as engine:
        key = await _started(engine)
        await asyncio.wait_for(engine.keep_streaming(key, retry_limit=0.05), 5)
    (dropped,) = [r for r in caplog.records if getattr(r, "event", None) == "StreamDropped"]
    assert dropped.reason == "EndpointUnreachableError"  # type: ignore[attr-defined]
    assert agent.count("SubscribeToTask") == 2


async def test_drive_of_a_task_the_agent_refused_to_create_returns_it_without_a_poll(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(send=lambda call: rpc_error(call, -32602, "no"))
    async with engine_on(store, agent.transport(), FAST) as engine:
        with pytest.raises(CreationRefusedError):
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
        view = await engine.drive("k-1", until="terminal", timeout=5)
    assert view.task == "k-1"
    assert agent.count("GetTask") == 0  # R3: nothing to follow


async def test_drive_follows_the_tasks_stream_once_its_polls_are_a_second_apart(
    store: EventStore,
) -> None:
    slow = EngineConfig(first_poll_interval=30, max_poll_interval=30)
    agent = ScriptedAgent(subscribe=events_streamed(working_event("r-1"), completed_event("r-1")))
    async with engine_on(store, agent.transport(), slow) as engine:
        key = await _started(engine)
        view = await engine.drive(key, until="terminal", timeout=20)
    assert view.state == "completed"
    assert agent.count("SubscribeToTask") == 1
    assert agent.count("GetTask") <= 2  # the first poll, and at most the closing read


# --------------------------------------------------------------------------------------------------
# The drive loop's timing, read exactly on a virtual clock (``support.virtual_time``): when each
# safety poll starts (R5: backoff doubling from ``first_poll_interval``, never further apart than
# ``max_poll_interval``), the last poll's share of the time left (R16), the wait for pushes after
# it, when R7's re-validation falls due, and the stream back-off. The seconds here are the ones the
# engine asks for; none is waited out.


_T = TypeVar("_T")

# No streams: the polls alone, unless a test asks for them.
POLLS = EngineConfig(first_poll_interval=1.0, max_poll_interval=8.0, follow_streams=False)


def _driven(
    agent: ScriptedAgent,
    config: EngineConfig,
    drive: Callable[[Engine, str], Awaitable[_T]],
) -> tuple[_T | BaseException, float, tuple[str, dict[str, Any]]]:
    """Start a task at virtual time 0, then ``drive(engine, key)``: what it returned (or raised),
    the virtual time it ended at, and the task's last event (type, data)."""

    async def job() -> tuple[_T | BaseException, float, tuple[str, dict[str, Any]]]:
        async with virtual_engine(agent.transport(), config) as engine:
            key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
            started = asyncio.get_running_loop().time()
            assert started == 0.0
            try:
                outcome: _T | BaseException = await drive(engine, key)
            except (DeadlineExceeded, EndpointUnreachableError) as failure:
                outcome = failure
            ended = asyncio.get_running_loop().time()
            last = engine.store.read_stream(f"task:{key}")[-1]
            return outcome, ended, (last.type, dict(last.data))

    return run_virtual(job())


# -- the safety polls (R5) -----------------------------------------------------------------------


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_polls_double_to_the_bound_and_the_last_starts_a_second_before_the_deadline() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, last = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=30)
    )
    # 0, +1, +2, +4, +8 (the bound), +8; the next would start at 31, past the last second
    # before the deadline (30 - 1): it starts at 29 instead, and none after it.
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 29.0]
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 30.0  # the time after the last poll is waited out for pushes
    assert last == (
        ev.DEADLINE_EXCEEDED,
        {"state": "working", "seconds": 30, "until": "terminal", "repeats_ignored": 6},
    )  # the six polls after the first read the same moment again: counted, not recorded


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_no_two_polls_are_further_apart_than_the_bound_however_long_the_drive() -> None:
    config = EngineConfig(first_poll_interval=0.5, max_poll_interval=3.0, follow_streams=False)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=60))
    polls = agent.times("GetTask")
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert gaps[:4] == [0.5, 1.0, 2.0, 3.0]
    assert max(gaps) == 3.0
    assert polls[-1] == 59.0  # the last starts with a second to answer in


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_short_drive_gives_its_last_poll_a_quarter_of_the_timeout() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=2)
    )
    # A quarter of 2 s is 0.5 s: the poll due at 3 starts at 1.5 instead, and then no more.
    assert agent.times("GetTask") == [0.0, 1.0, 1.5]
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 2.0


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_the_last_poll_is_given_no_more_than_the_request_timeout() -> None:
    config = dataclasses.replace(POLLS, request_timeout=0.25)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=10))
    # The poll due at 15 starts at 9.75: a request ends within 0.25 s, by the deadline.
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 9.75]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_drive_follows_five_minutes_unless_told_otherwise() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, last = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal")
    )
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 300.0
    assert agent.times("GetTask")[-1] == 299.0
    assert last[1]["seconds"] == 300.0


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_the_task_reaching_the_point_asked_ends_the_drive_at_that_poll() -> None:
    agent = ScriptedAgent(answering("working", "working", "working", "completed"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=30)
    )
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0]
    assert ended == 7.0


# -- pushes between the polls -------------------------------------------------------------------


async def _pushed_at(engine: Engine, key: str, when: float, state: str) -> None:
    """At virtual time ``when``: a push of ``state`` applied, and the drive woken as a push does."""
    await asyncio.sleep(when - asyncio.get_running_loop().time())
    stamp = f"2026-01-01T00:01:{int(when):02d}Z"
    report = ev.StateChanged(from_="working", to=state, source="push", remote_timestamp=stamp)
    await engine.records.record(key, [report])
    engine.observing.wake(key)


def _drive_with_push(
    when: float, state: str, timeout: float = 30
) -> Callable[[Engine, str], Awaitable[TaskView]]:
    async def drive(engine: Engine, key: str) -> TaskView:
        push = asyncio.ensure_future(_pushed_at(engine, key, when, state))
        try:
            return await engine.drive(key, until="terminal", timeout=timeout)
        finally:
            await push

    return drive


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_push_between_polls_leaves_the_next_poll_where_it_was_scheduled() -> None:
    agent = ScriptedAgent(answering("working"))
    _driven(agent, POLLS, _drive_with_push(5.0, "working"))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 29.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_push_that_ends_the_task_ends_the_drive_when_it_is_applied() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(agent, POLLS, _drive_with_push(5.0, "completed"))
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert ended == 5.0
    assert agent.times("GetTask") == [0.0, 1.0, 3.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_after_the_last_poll_a_push_still_ends_the_drive() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(agent, POLLS, _drive_with_push(29.5, "completed"))
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert ended == 29.5


# -- R7's re-validation beside the polls ---------------------------------------------------------


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_revalidation_falls_due_every_max_card_age_at_the_next_step() -> None:
    config = dataclasses.replace(POLLS, max_card_age=10.0)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=40))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0]
    # The card read at creation (0), then one at the first poll 10 s or more after the last:
    # at 15 (due at 10), at 31 (due at 25), and none at 39 (due at 41).
    assert agent.times("card") == [0.0, 15.0, 31.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_push_between_polls_starts_a_revalidation_that_is_due() -> None:
    config = dataclasses.replace(POLLS, max_card_age=10.0)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, _drive_with_push(12.0, "working", timeout=14))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 13.0]
    assert agent.times("card") == [0.0, 12.0]


# -- the stream back-off (R12) -------------------------------------------------------------------


def _dropping(drops: int) -> ScriptedAgent:
    """An agent whose task's stream ends early ``drops`` times (a `working` event, then the end),
    then carries the task to `completed`."""
    streams = [events_streamed(working_event("r-1")) for _ in range(drops)]
    streams.append(events_streamed(completed_event("r-1")))

    def subscribe(call: dict[str, Any]) -> httpx.Response:
        return streams.pop(0)(call)

    return ScriptedAgent(subscribe=subscribe)


STREAMS = EngineConfig(first_poll_interval=1.0, max_poll_interval=8.0)


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
@pytest.mark.parametrize(
    ("retry_limit", "config", "subscribed"),
    [
        (4.0, STREAMS, [0.0, 1.0, 3.0, 7.0, 11.0]),  # 1 s, doubling to the limit
        (None, EngineConfig(max_poll_interval=2.0), [0.0, 1.0, 3.0, 5.0, 7.0]),  # the poll bound
        (0.5, STREAMS, [0.0, 0.5, 1.0, 1.5, 2.0]),  # a limit under a second: the limit
    ],
)
def test_a_dropped_stream_is_subscribed_again_after_a_doubling_wait(
    retry_limit: float | None, config: EngineConfig, subscribed: list[float]
) -> None:
    agent = _dropping(4)
    _driven(agent, config, lambda engine, key: engine.keep_streaming(key, retry_limit=retry_limit))
    assert agent.times("SubscribeToTask") == subscribed


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_drive_follows_the_stream_a_second_after_it_starts() -> None:
    agent = ScriptedAgent(answering("working"), subscribe=events_streamed(completed_event("r-1")))
    outcome, ended, _ = _driven(
        agent, STREAMS, lambda engine, key: engine.drive(key, until="terminal", timeout=30)
    )
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert agent.times("SubscribeToTask") == [1.0]
    assert ended == 1.0


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_stream_that_ended_at_an_interruption_is_followed_again_at_once_after_a_reply() -> None:
    # Dropped, then ended at input-required (and the task replied to, working again), then
    # dropped again, then completed: after the interruption the stream is followed again at
    # once, and the back-off starts over from a second.
    asked = {
        "statusUpdate": {
            "taskId": "r-1",
            "contextId": "c-1",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "2026-01-01T00:00:00.5Z"},
        }
    }
    streams = [
        events_streamed(working_event("r-1")),
        events_streamed(asked),
        events_streamed(working_event("r-1")),
        events_streamed(completed_event("r-1")),
    ]

    def subscribe(call: dict[str, Any]) -> httpx.Response:
        return streams.pop(0)(call)

    agent = ScriptedAgent(subscribe=subscribe)

    async def follow(engine: Engine, key: str) -> None:
        ended = 0

        def replied() -> None:  # a reply sent meanwhile, by another process: working again
            nonlocal ended
            ended += 1
            if ended == 2:
                change = ev.StateChanged(
                    from_="input-required",
                    to="working",
                    source="poll",
                    remote_timestamp="2026-01-01T00:00:00.7Z",
                )
                engine.log.record(key, lambda state: [change])

        await engine.keep_streaming(key, retry_limit=4.0, after_each=replied)

    _driven(agent, STREAMS, follow)
    assert agent.times("SubscribeToTask") == [0.0, 1.0, 1.0, 2.0]


# -- what a drive leaves behind -------------------------------------------------------------------


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_two_drives_of_one_task_are_both_woken_by_a_push_after_one_of_them_ended() -> None:
    agent = ScriptedAgent(answering("working"))

    async def both(engine: Engine, key: str) -> TaskView:
        short = asyncio.ensure_future(engine.drive(key, until="terminal", timeout=5))
        long = asyncio.ensure_future(engine.drive(key, until="terminal", timeout=30))
        with contextlib.suppress(DeadlineExceeded):
            await short
        await _pushed_at(engine, key, 10.0, "completed")
        return await long

    outcome, ended, _ = _driven(agent, POLLS, both)
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert ended == 10.0  # woken by the push, not at its next poll (15)


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_leaves_no_task_of_its_own_running() -> None:
    agent = ScriptedAgent(answering("working", "completed"))

    async def drive(engine: Engine, key: str) -> list[asyncio.Task[Any]]:
        await engine.drive(key, until="terminal", timeout=30)
        here = asyncio.current_task()
        return [task for task in asyncio.all_tasks() if task is not here and not task.done()]

    left, _, _ = _driven(agent, STREAMS, drive)
    assert left == []


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_revalidation_due_at_a_poll_is_made_at_that_poll() -> None:
    config = dataclasses.replace(POLLS, max_poll_interval=3.0, max_card_age=9.0)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=30))
    assert agent.times("GetTask")[:6] == [0.0, 1.0, 3.0, 6.0, 9.0, 12.0]
    assert agent.times("card") == [0.0, 9.0, 18.0, 27.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_bare_404_at_the_first_poll_checks_the_endpoint_at_once_then_once_per_max_card_age() -> (
    None
):
    config = dataclasses.replace(POLLS, max_card_age=20.0)
    agent = ScriptedAgent(lambda call: httpx.Response(404))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=30))
    # The card read at creation, R9's check at the first 404 (at once), then at the first 404
    # 20 s or more after it (R7's re-validation, due at 20 too, takes the card it read).
    assert agent.times("card") == [0.0, 0.0, 23.0]


# -- an agent asking for time (R5) ---------------------------------------------------------------


def _throttling(seconds: str) -> ScriptedAgent:
    """Every GetTask answered 429 with ``Retry-After: seconds``."""
    return ScriptedAgent(lambda call: httpx.Response(429, headers={"Retry-After": seconds}))


def _recording(
    timeout: float, seen: list[tuple[str, dict[str, Any]]]
) -> Callable[[Engine, str], Awaitable[TaskView]]:
    """A drive until terminal; the task's events, after it, put in ``seen``."""

    async def drive(engine: Engine, key: str) -> TaskView:
        try:
            return await engine.drive(key, until="terminal", timeout=timeout)
        finally:
            seen.extend((e.type, dict(e.data)) for e in engine.store.read_stream(f"task:{key}"))

    return drive


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_polls_answered_429_wait_as_asked_and_the_wait_is_recorded_once() -> None:
    agent, seen = _throttling("20"), []
    outcome, ended, _ = _driven(agent, POLLS, _recording(70, seen))
    # 20 s apart (the backoff alone would have polled at 1, 3, 7, ...); the next after 60 would
    # start at 80, past the last poll's second (69): none.
    assert agent.times("GetTask") == [0.0, 20.0, 40.0, 60.0]
    assert isinstance(outcome, DeadlineExceeded)  # the agent was reached: not unreachable
    assert ended == 70.0
    # One annotation for four 429s; the state is the send's, untouched.
    assert [t for t, _ in seen] == [
        ev.TASK_SUBMITTED, ev.OBSERVATION_IGNORED, ev.THROTTLED, ev.DEADLINE_EXCEEDED
    ]  # fmt: skip
    throttled = {"url": f"{ORIGIN}/a2a", "status": 429, "asked": 20.0, "wait": 20.0}
    assert seen[2][1] == {**throttled, "during": "poll"}
    assert seen[3][1]["state"] == "submitted"


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_wait_asked_beyond_max_retry_after_is_cut_to_it() -> None:
    config = dataclasses.replace(POLLS, max_retry_after=30.0)
    agent, seen = _throttling("1000"), []
    _driven(agent, config, _recording(100, seen))
    assert agent.times("GetTask") == [0.0, 30.0, 60.0, 90.0]
    [throttled] = [d for t, d in seen if t == ev.THROTTLED]
    assert (throttled["asked"], throttled["wait"]) == (1000.0, 30.0)


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_wait_asked_past_the_deadline_makes_the_throttled_poll_the_last() -> None:
    agent, seen = _throttling("20"), []
    outcome, ended, _ = _driven(agent, POLLS, _recording(10, seen))
    assert agent.times("GetTask") == [0.0]
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 10.0
    [throttled] = [d for t, d in seen if t == ev.THROTTLED]
    assert throttled["wait"] == 10.0  # what was left of the drive


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_wait_asked_below_the_backoff_leaves_the_backoff_in_force() -> None:
    answers = iter([httpx.Response(429, headers={"Retry-After": "0"})])
    agent = ScriptedAgent(lambda call: next(answers, None) or answering("working")(call))
    _driven(agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=10))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 9.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_card_endpoint_asking_for_time_never_delays_the_polls() -> None:
    config = dataclasses.replace(POLLS, max_card_age=10.0)
    agent = ScriptedAgent(answering("working"))
    honest = agent.transport().handler

    def answer(request: httpx.Request) -> Any:
        answered = honest(request)  # counted
        if request.method == "GET" and asyncio.get_running_loop().time() > 0:  # R7's reads
            return httpx.Response(429, headers={"Retry-After": "100"})
        return answered

    agent.transport = lambda: httpx.MockTransport(answer)  # type: ignore[method-assign]
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=40))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0]
    assert agent.times("card") == [0.0, 15.0, 31.0]  # asked, answered 429, and kept to its pace


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_reply_or_a_cancel_answered_429_goes_again_after_the_wait() -> None:
    def busy(seconds: str) -> Callable[[dict[str, Any]], httpx.Response]:
        return lambda call: httpx.Response(429, headers={"Retry-After": seconds})

    def done(state: str) -> Callable[[dict[str, Any]], httpx.Response]:
        return lambda call: rpc_result(call, {"task": task_answer(state)})

    sends = [submitted_task, busy("5"), done("working")]
    cancels = [busy("3"), lambda call: rpc_result(call, task_answer("canceled"))]
    agent = ScriptedAgent(lambda call: cancels.pop(0)(call), send=lambda c: sends.pop(0)(c))

    async def act(engine: Engine, key: str) -> TaskView:
        asked = ev.StateChanged(
            from_="submitted", to="input-required", source="poll", remote_timestamp=None
        )
        engine.log.record(key, lambda state: [asked])
        await engine.reply(key, "yes")
        return await engine.cancel(key)

    outcome, _, _ = _driven(agent, POLLS, act)
    assert isinstance(outcome, TaskView)
    assert outcome.state == "canceled"
    assert agent.times("SendMessage") == [0.0, 0.0, 5.0]  # the creation, the reply twice
    assert agent.times("CancelTask") == [5.0, 8.0]
    assert "throttled" in outcome.flags


# -- where a drive stops ---------------------------------------------------------------------------


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_of_a_task_the_log_shows_ended_asks_the_agent_nothing() -> None:
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        await _pushed_at(engine, key, 0.0, "completed")
        return await engine.drive(key, until="terminal", timeout=30)

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert (agent.times("GetTask"), ended) == ([], 0.0)


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_push_that_interrupts_the_task_ends_a_drive_until_interrupted_when_applied() -> None:
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        push = asyncio.ensure_future(_pushed_at(engine, key, 5.0, "input-required"))
        try:
            return await engine.drive(key, until="interrupted", timeout=30)
        finally:
            await push

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, TaskView)
    assert (outcome.state, ended) == ("input-required", 5.0)
    assert agent.times("GetTask") == [0.0, 1.0, 3.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_poll_that_finds_the_task_interrupted_ends_the_drive_at_that_poll() -> None:
    agent = ScriptedAgent(answering("working", "working", "input-required"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="interrupted", timeout=30)
    )
    assert isinstance(outcome, TaskView)
    assert (outcome.state, ended) == ("input-required", 3.0)
    assert agent.times("GetTask") == [0.0, 1.0, 3.0]


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_ended_by_a_push_returns_the_task_as_its_closing_read_found_it() -> None:
    # A push of one status update ends the task at 5; the closing read, answered 2 s later,
    # brings its artifact: the drive returns the task as that read found it.
    pushed = False

    def get(call: dict[str, Any]) -> Any:
        if not pushed:
            return rpc_result(call, task_answer("working"))
        ended = task_answer("completed", "2026-01-01T00:00:09Z")
        ended["artifacts"] = [{"artifactId": "a-1", "parts": [{"text": "the answer"}]}]

        async def later() -> httpx.Response:
            await asyncio.sleep(2.0)
            return rpc_result(call, ended)

        return later()

    agent = ScriptedAgent(get)

    async def drive(engine: Engine, key: str) -> TaskView:
        async def push() -> None:
            nonlocal pushed
            await asyncio.sleep(5.0)
            pushed = True
            status = {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-01T00:00:08Z"}
            update = {"taskId": "r-1", "contextId": "c-1", "status": status}
            body = json.dumps({"statusUpdate": update}).encode()
            observation = from_update(decode(body, {"content-type": "application/json"}), "push")
            assert observation is not None
            before_after = await engine.records.calls.run(
                engine.observing.apply, key, observation, None
            )
            engine.observing.observed(key, observation, *before_after, whole=False)
            engine.observing.wake(key)

        pushing = asyncio.ensure_future(push())
        try:
            return await engine.drive(key, until="terminal", timeout=30)
        finally:
            await pushing

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, TaskView)
    assert (outcome.state, ended) == ("completed", 7.0)
    assert [artifact["artifact_id"] for artifact in outcome.artifacts] == ["a-1"]


# -- the deadlines a drive keeps ------------------------------------------------------------------


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_under_a_second_ends_at_its_timeout_not_at_the_second_it_gives_its_poll() -> None:
    # 0.9 s: the command's deadline is a second (a poll is given that long), the last poll's
    # share a quarter of 0.9 (0.225 s): the poll due at 1 starts at 0.775, then the drive ends
    # at 0.9 -- its own timeout, not the command's second.
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=0.9)
    )
    assert isinstance(outcome, DeadlineExceeded)
    assert agent.times("GetTask") == [0.0, 0.775]
    assert ended == 0.9


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_ends_at_a_deadline_already_in_force_when_it_is_earlier() -> None:
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        with deadline.within(5.0):  # the command's --timeout, shorter than the drive's
            return await engine.drive(key, until="terminal", timeout=30)

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, DeadlineExceeded)
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 4.0]  # the last with its second to answer
    assert ended == 5.0


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_drive_polls_once_when_a_deadline_in_force_leaves_less_than_its_last_polls_share() -> (
    None
):
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        with deadline.within(0.3):
            return await engine.drive(key, until="terminal", timeout=30)

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, DeadlineExceeded)
    assert (agent.times("GetTask"), ended) == ([0.0], 0.3)
