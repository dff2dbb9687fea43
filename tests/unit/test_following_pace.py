"""The drive loop's timing, read exactly on a virtual clock (``support.virtual_time``): when each
safety poll starts (R5: backoff doubling from ``first_poll_interval``, never further apart than
``max_poll_interval``), the last poll's share of the time left (R16), the wait for pushes after
it, when R7's re-validation falls due, and the stream back-off. The seconds here are the ones
the engine asks for; none is waited out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from support.cards import ORIGIN
from support.hostile import completed_event, working_event
from support.mocked import (
    ScriptedAgent,
    answering,
    events_streamed,
    rpc_result,
    submitted_task,
    task_answer,
)
from support.virtual_time import run_virtual, virtual_deadlines, virtual_engine

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.observations import from_update
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import DeadlineExceeded, EndpointUnreachableError
from cardfence.engine.http import deadline
from cardfence.engine.wire.push import decode

_T = TypeVar("_T")

# No streams: the polls alone, unless a test asks for them.
POLLS = EngineConfig(first_poll_interval=1.0, max_poll_interval=8.0, follow_streams=False)


@pytest.fixture(autouse=True)
def _deadlines_on_the_virtual_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    with virtual_deadlines(monkeypatch):
        yield


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


def test_no_two_polls_are_further_apart_than_the_bound_however_long_the_drive() -> None:
    config = EngineConfig(first_poll_interval=0.5, max_poll_interval=3.0, follow_streams=False)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=60))
    polls = agent.times("GetTask")
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert gaps[:4] == [0.5, 1.0, 2.0, 3.0]
    assert max(gaps) == 3.0
    assert polls[-1] == 59.0  # the last starts with a second to answer in


def test_a_short_drive_gives_its_last_poll_a_quarter_of_the_timeout() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=2)
    )
    # A quarter of 2 s is 0.5 s: the poll due at 3 starts at 1.5 instead, and then no more.
    assert agent.times("GetTask") == [0.0, 1.0, 1.5]
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 2.0


def test_the_last_poll_is_given_no_more_than_the_request_timeout() -> None:
    config = dataclasses.replace(POLLS, request_timeout=0.25)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=10))
    # The poll due at 15 starts at 9.75: a request ends within 0.25 s, by the deadline.
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 9.75]


def test_drive_follows_five_minutes_unless_told_otherwise() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, last = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="terminal")
    )
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 300.0
    assert agent.times("GetTask")[-1] == 299.0
    assert last[1]["seconds"] == 300.0


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
    report = {"from": "working", "to": state, "source": "push", "remote_timestamp": stamp}
    await engine.records.record(key, [(ev.STATE_CHANGED, report)])
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


def test_a_push_between_polls_leaves_the_next_poll_where_it_was_scheduled() -> None:
    agent = ScriptedAgent(answering("working"))
    _driven(agent, POLLS, _drive_with_push(5.0, "working"))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 29.0]


def test_a_push_that_ends_the_task_ends_the_drive_when_it_is_applied() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(agent, POLLS, _drive_with_push(5.0, "completed"))
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert ended == 5.0
    assert agent.times("GetTask") == [0.0, 1.0, 3.0]


def test_after_the_last_poll_a_push_still_ends_the_drive() -> None:
    agent = ScriptedAgent(answering("working"))
    outcome, ended, _ = _driven(agent, POLLS, _drive_with_push(29.5, "completed"))
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert ended == 29.5


# -- R7's re-validation beside the polls ---------------------------------------------------------


def test_revalidation_falls_due_every_max_card_age_at_the_next_step() -> None:
    config = dataclasses.replace(POLLS, max_card_age=10.0)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=40))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0]
    # The card read at creation (0), then one at the first poll 10 s or more after the last:
    # at 15 (due at 10), at 31 (due at 25), and none at 39 (due at 41).
    assert agent.times("card") == [0.0, 15.0, 31.0]


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


def test_drive_follows_the_stream_a_second_after_it_starts() -> None:
    agent = ScriptedAgent(answering("working"), subscribe=events_streamed(completed_event("r-1")))
    outcome, ended, _ = _driven(
        agent, STREAMS, lambda engine, key: engine.drive(key, until="terminal", timeout=30)
    )
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert agent.times("SubscribeToTask") == [1.0]
    assert ended == 1.0


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
                change = {"from": "input-required", "to": "working", "source": "poll",
                          "remote_timestamp": "2026-01-01T00:00:00.7Z"}  # fmt: skip
                engine.log.record(key, lambda state: [(ev.STATE_CHANGED, change)])

        await engine.keep_streaming(key, retry_limit=4.0, after_each=replied)

    _driven(agent, STREAMS, follow)
    assert agent.times("SubscribeToTask") == [0.0, 1.0, 1.0, 2.0]


# -- what a drive leaves behind -------------------------------------------------------------------


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


def test_a_drive_leaves_no_task_of_its_own_running() -> None:
    agent = ScriptedAgent(answering("working", "completed"))

    async def drive(engine: Engine, key: str) -> list[asyncio.Task[Any]]:
        await engine.drive(key, until="terminal", timeout=30)
        here = asyncio.current_task()
        return [task for task in asyncio.all_tasks() if task is not here and not task.done()]

    left, _, _ = _driven(agent, STREAMS, drive)
    assert left == []


def test_revalidation_due_at_a_poll_is_made_at_that_poll() -> None:
    config = dataclasses.replace(POLLS, max_poll_interval=3.0, max_card_age=9.0)
    agent = ScriptedAgent(answering("working"))
    _driven(agent, config, lambda engine, key: engine.drive(key, until="terminal", timeout=30))
    assert agent.times("GetTask")[:6] == [0.0, 1.0, 3.0, 6.0, 9.0, 12.0]
    assert agent.times("card") == [0.0, 9.0, 18.0, 27.0]


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


def test_a_wait_asked_beyond_max_retry_after_is_cut_to_it() -> None:
    config = dataclasses.replace(POLLS, max_retry_after=30.0)
    agent, seen = _throttling("1000"), []
    _driven(agent, config, _recording(100, seen))
    assert agent.times("GetTask") == [0.0, 30.0, 60.0, 90.0]
    [throttled] = [d for t, d in seen if t == ev.THROTTLED]
    assert (throttled["asked"], throttled["wait"]) == (1000.0, 30.0)


def test_a_wait_asked_past_the_deadline_makes_the_throttled_poll_the_last() -> None:
    agent, seen = _throttling("20"), []
    outcome, ended, _ = _driven(agent, POLLS, _recording(10, seen))
    assert agent.times("GetTask") == [0.0]
    assert isinstance(outcome, DeadlineExceeded)
    assert ended == 10.0
    [throttled] = [d for t, d in seen if t == ev.THROTTLED]
    assert throttled["wait"] == 10.0  # what was left of the drive


def test_a_wait_asked_below_the_backoff_leaves_the_backoff_in_force() -> None:
    answers = iter([httpx.Response(429, headers={"Retry-After": "0"})])
    agent = ScriptedAgent(lambda call: next(answers, None) or answering("working")(call))
    _driven(agent, POLLS, lambda engine, key: engine.drive(key, until="terminal", timeout=10))
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 7.0, 9.0]


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


def test_a_reply_or_a_cancel_answered_429_goes_again_after_the_wait() -> None:
    def busy(seconds: str) -> Callable[[dict[str, Any]], httpx.Response]:
        return lambda call: httpx.Response(429, headers={"Retry-After": seconds})

    def done(state: str) -> Callable[[dict[str, Any]], httpx.Response]:
        return lambda call: rpc_result(call, {"task": task_answer(state)})

    sends = [submitted_task, busy("5"), done("working")]
    cancels = [busy("3"), lambda call: rpc_result(call, task_answer("canceled"))]
    agent = ScriptedAgent(lambda call: cancels.pop(0)(call), send=lambda c: sends.pop(0)(c))

    async def act(engine: Engine, key: str) -> TaskView:
        asked = {"from": "submitted", "to": "input-required", "source": "poll"}
        engine.log.record(key, lambda state: [(ev.STATE_CHANGED, asked)])
        await engine.reply(key, "yes")
        return await engine.cancel(key)

    outcome, _, _ = _driven(agent, POLLS, act)
    assert isinstance(outcome, TaskView)
    assert outcome.state == "canceled"
    assert agent.times("SendMessage") == [0.0, 0.0, 5.0]  # the creation, the reply twice
    assert agent.times("CancelTask") == [5.0, 8.0]
    assert "throttled" in outcome.flags


# -- where a drive stops ---------------------------------------------------------------------------


def test_a_drive_of_a_task_the_log_shows_ended_asks_the_agent_nothing() -> None:
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        await _pushed_at(engine, key, 0.0, "completed")
        return await engine.drive(key, until="terminal", timeout=30)

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, TaskView)
    assert outcome.state == "completed"
    assert (agent.times("GetTask"), ended) == ([], 0.0)


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


def test_a_poll_that_finds_the_task_interrupted_ends_the_drive_at_that_poll() -> None:
    agent = ScriptedAgent(answering("working", "working", "input-required"))
    outcome, ended, _ = _driven(
        agent, POLLS, lambda engine, key: engine.drive(key, until="interrupted", timeout=30)
    )
    assert isinstance(outcome, TaskView)
    assert (outcome.state, ended) == ("input-required", 3.0)
    assert agent.times("GetTask") == [0.0, 1.0, 3.0]


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


def test_a_drive_ends_at_a_deadline_already_in_force_when_it_is_earlier() -> None:
    agent = ScriptedAgent(answering("working"))

    async def drive(engine: Engine, key: str) -> TaskView:
        with deadline.within(5.0):  # the command's --timeout, shorter than the drive's
            return await engine.drive(key, until="terminal", timeout=30)

    outcome, ended, _ = _driven(agent, POLLS, drive)
    assert isinstance(outcome, DeadlineExceeded)
    assert agent.times("GetTask") == [0.0, 1.0, 3.0, 4.0]  # the last with its second to answer
    assert ended == 5.0


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
