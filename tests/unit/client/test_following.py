"""Continuation read on its own (R1, R5, R7, R9, R16): one poll, one step of following, the drive
loop's ends, and a task's event stream beside the polls -- with a mock agent whose answers each
test scripts. Card state never gates any of it: what a card says here only adds diagnostics or
changes how the news arrives."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.hostile import completed_event, sse, working_event
from support.mocked import (
    Answer,
    ScriptedAgent,
    answering,
    engine_on,
    events_streamed,
    rpc_error,
    rpc_result,
    task_answer,
    task_card_as,
)

from cardfence.engine.cards.model import parse_card
from cardfence.engine.client import following
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import Pace, _event_bytes, _unwound, reached
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
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
            assert [(e.type, e.data) for e in recorded] == list(plan.events)
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
        await engine.records.record(key, [(ev.STATE_CHANGED, {"from": "working", "to": "completed",
                                                        "source": "push",
                                                        "remote_timestamp": stamp})])  # fmt: skip
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
