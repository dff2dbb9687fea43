"""R5 and R16 for ``drive``, for any pacing: the safety polls are never further apart than
``max_poll_interval``, and the deadline never comes unwatched -- read on a virtual clock
(``support.virtual_time``), so each poll's time is exactly the one the engine chose.

Any ``first_poll_interval``, ``max_poll_interval``, ``request_timeout`` and ``timeout``, and pushes
waking the drive at any times, against an agent whose task stays ``working``. Proved for every
draw, with L (the last poll's share) = min(1 s, ``request_timeout``, ``timeout`` / 4) and the
command's deadline D = max(``timeout``, 1 s):

- the first poll starts at once, and no two polls are further apart than ``max_poll_interval``;
- no poll after the first starts with less than L left before D, nor after ``timeout``;
- the last poll is no earlier than min(``timeout``, D - L), to a millisecond: the end is
  watched to the last;
- the drive ends at ``timeout`` exactly, and records ``DeadlineExceeded``;
- pushes move no poll: the polls are the same with or without them (incident 001's client
  trusted pushes and stopped looking).

Teeth: a planted backoff that doubles past the bound, and a planted drive that gives its last
poll no time, are each caught by ``hypothesis.find`` (no shrinking).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import find as hypothesis_find
from hypothesis import strategies as st
from support.cards import ORIGIN
from support.harness import hunt
from support.mocked import ScriptedAgent, answering
from support.virtual_time import run_virtual, virtual_deadlines, virtual_engine

from cardfence.engine.client import following
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.errors import DeadlineExceeded

EPSILON = 1e-9
TICK = 1e-3  # a poll that could only follow the last within this is not asked for
Scenario = tuple[float, float, float, float, tuple[float, ...]]

scenarios = st.tuples(
    st.floats(0.05, 5.0),  # first_poll_interval
    st.floats(0.2, 30.0),  # max_poll_interval
    st.sampled_from([0.1, 0.5, 30.0]),  # request_timeout
    st.floats(0.2, 90.0),  # timeout
    st.lists(st.floats(0.0, 1.0), max_size=4).map(tuple),  # pushes, as shares of the timeout
)


def _polls(scenario: Scenario, *, pushed: bool) -> tuple[list[float], float, str]:
    """Drive a task through ``scenario`` on a virtual clock: when each poll started, when the
    drive ended, and the task's last event."""
    first, bound, request_timeout, timeout, pushes = scenario
    config = EngineConfig(
        first_poll_interval=first,
        max_poll_interval=bound,
        request_timeout=request_timeout,
        follow_streams=False,
    )
    agent = ScriptedAgent(answering("working"))

    async def wake(engine: Engine, key: str, at: float) -> None:
        await asyncio.sleep(at)
        engine.observing.wake(key)  # a push applied: the drive looks at the task again

    async def job() -> tuple[float, str]:
        async with virtual_engine(agent.transport(), config) as engine:
            key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
            wakes = [
                asyncio.ensure_future(wake(engine, key, share * timeout))
                for share in (pushes if pushed else ())
            ]
            with suppress(DeadlineExceeded):
                await engine.drive(key, until="terminal", timeout=timeout)
            ended = engine.clock()
            for job in wakes:
                job.cancel()
            await asyncio.gather(*wakes, return_exceptions=True)
            return ended, engine.store.read_stream(f"task:{key}")[-1].type

    with virtual_deadlines(pytest.MonkeyPatch()):
        ended, last = run_virtual(job())
    return agent.times("GetTask"), ended, last


def play(scenario: Scenario) -> str | None:
    """What ``scenario`` shows wrong, or None."""
    _, bound, request_timeout, timeout, _ = scenario
    share = min(1.0, request_timeout, timeout / 4)
    command_deadline = max(timeout, 1.0)
    polls, ended, last = _polls(scenario, pushed=True)
    if not polls or polls[0] != 0.0:
        return f"the first poll started at {polls[:1]}, not at once"
    for earlier, later in itertools.pairwise(polls):
        if later - earlier > bound + EPSILON:
            return f"polls at {earlier} and {later}: further apart than {bound}"
    for when in polls[1:]:
        if when > command_deadline - share + EPSILON or when > timeout + EPSILON:
            return f"a poll at {when} with less than {share} s left of {command_deadline}"
    if polls[-1] < min(timeout, command_deadline - share) - TICK:
        return f"the last poll at {polls[-1]}: the end of {timeout} s was not watched"
    if abs(ended - timeout) > EPSILON or last != ev.DEADLINE_EXCEEDED:
        return f"the drive ended at {ended} with {last}, not at {timeout} with DeadlineExceeded"
    unpushed, _, _ = _polls(scenario, pushed=False)
    if len(unpushed) != len(polls) or any(
        abs(pushed - alone) > EPSILON for pushed, alone in zip(polls, unpushed, strict=True)
    ):
        return f"pushes moved the polls: {polls} against {unpushed}"
    return None


@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(scenarios)
@example((1.0, 8.0, 30.0, 30.0, (0.17,)))  # the schedule of test_following_pace: 0, 1, 3, ... 29
@example((0.05, 0.2, 0.1, 0.2, (0.5, 0.5)))  # a drive shorter than a second, pushes at once
@example((1.0, 8.0, 30.0, 0.9, ()))  # the command's second outlasts the drive: it ends at 0.9
def test_safety_polls_keep_their_bound_and_watch_the_deadline_whatever_the_pacing(
    scenario: Scenario,
) -> None:
    assert play(scenario) is None


# -- teeth ----------------------------------------------------------------------------------------


def catches() -> str | None:
    """A problem the property finds: a generated search, no shrinking, derandomised."""
    found = hypothesis_find(
        scenarios, lambda scenario: play(scenario) is not None, settings=hunt(200)
    )
    return play(found)


@contextmanager
def planted(target: Any, name: str, replacement: Any) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target, name, replacement)
        yield


def _unbounded_backoff(self: following.Pace, max_poll_interval: float) -> float:
    """The planted bug: the backoff doubles for ever, past ``max_poll_interval``."""
    wait = self.delay
    self.delay *= 2
    return wait


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_property_catches_a_backoff_past_the_bound() -> None:
    with planted(following.Pace, "backoff", _unbounded_backoff):
        problem = catches()
    assert problem is not None
    assert "further apart" in problem


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_property_catches_a_last_poll_given_no_time() -> None:
    # The planted bug: polls are scheduled up to the deadline itself, with no time to answer
    # (and a drive shorter than a second is no longer given one).
    with planted(following, "_LAST_POLL", 0.0):
        problem = catches()
    assert problem is not None
    assert "left of" in problem or "was not watched" in problem
