"""P4: a webhook is registered only when the read made inside that registration said push (R4).

A task is created on a healthy card; then any sequence of steps — polls that move the remote task
(and, once push is on, the boundary re-checks they trigger, R6), ``drive`` with its re-validation
(R7), ``resume`` (R9) and registrations — runs against a card endpoint whose answer to each request
is drawn: a card variant (push on or off, skill present or absent, contract rotated, endpoint
moved), a network error, a timeout, a 503, invalid JSON or a body over the size limit.

For every ``register_webhook`` call, judged by what the fake agent saw during that call alone: a
``WebhookRegistered`` event and a ``CreateTaskPushNotificationConfig`` request happen if and only
if the last card request made during the call was answered with a card saying
``pushNotifications: true``; otherwise ``DeliveryDowngraded`` is recorded (with the reason), no
config request is sent, and the task's state is untouched. The property is one function,
:func:`violation`, checked against the engine and, to show it has teeth, against a planted bug.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from support.fake_agent import AGENT_URL, FAILURES, SKILL, VARIANTS, Behaviour, FakeAgent, Variant
from support.harness import audit_problems, hunt, open_engine, task_events, task_version

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import card_urls
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import DeadlineExceeded, TaskOrphanedError

# --- strategies ----------------------------------------------------------------------------------

REMOTE_STATES = ("working", "input-required", "auth-required", "completed")
HOOK = "http://orchestrator.test/hook"

Step = tuple[str, ...]  # ("register",) | ("poll", remote state) | ("drive",) | ("resume",)


@dataclass(frozen=True, slots=True)
class Scenario:
    creation: Variant  # the card the task is created on (healthy, with the skill)
    steps: tuple[Step, ...]  # always ends with a registration
    script: tuple[Behaviour, ...]  # the answers to the card requests after creation, in order
    default: Behaviour  # the answer once the script is used up


behaviours: st.SearchStrategy[Behaviour] = st.sampled_from(VARIANTS) | st.sampled_from(FAILURES)
steps = st.one_of(
    st.just(("register",)),
    st.tuples(st.just("poll"), st.sampled_from(REMOTE_STATES)),
    st.just(("drive",)),
    st.just(("resume",)),
)
scenarios = st.builds(
    Scenario,
    creation=st.sampled_from([v for v in VARIANTS if v.skill]),
    steps=st.lists(steps, max_size=6).map(lambda drawn: (*drawn, ("register",))),
    script=st.lists(behaviours, max_size=10).map(tuple),
    default=behaviours,
)

# --- the property --------------------------------------------------------------------------------


async def _register(engine: Engine, agent: FakeAgent, key: str) -> str | None:
    """One registration, judged by what happened during it."""
    store = engine.store
    mark, version = agent.mark(), task_version(store, key)
    before = engine.log.head(key).state
    outcome = await engine.register_webhook(key, HOOK)
    await engine.settle()
    after = engine.log.head(key).state
    cards = agent.card_requests(since=mark)
    creates = agent.rpc_requests("CreateTaskPushNotificationConfig", since=mark)
    new_events = task_events(store, key, since=version)
    recorded = [e.type for e in new_events]
    last = cards[-1] if cards else None
    said = "no card request" if last is None else f"last card request answered {last.served!r}"
    if after["state"] != before["state"]:
        return f"registration moved the task from {before['state']} to {after['state']}"
    if last is not None and last.said_push:
        assert isinstance(last.served, Variant)
        if not outcome.registered or recorded != [ev.WEBHOOK_REGISTERED]:
            return f"{said} (push), yet outcome {outcome.reason!r} and events {recorded}"
        if len(creates) != 1 or creates[0].params.get("id") != outcome.config_id:
            return f"registered with {len(creates)} config requests: {creates}"
        if creates[0].path != httpx.URL(before["endpoint"]["url"]).path:
            return f"config sent to {creates[0].path}, not the task's endpoint"
        if new_events[0].data["card_revision"] != last.served.card.revision:
            return "WebhookRegistered names another card revision than the one read"
        return None
    if outcome.registered or ev.WEBHOOK_REGISTERED in recorded or creates:
        return f"REGISTERED although {said}: outcome {outcome}, events {recorded}, {creates}"
    if recorded != [ev.DELIVERY_DOWNGRADED]:
        return f"{said}, not registered, but recorded {recorded} (expected DeliveryDowngraded)"
    reason = new_events[0].data["reason"]
    expected = "discovery_failed" if last is None or not last.healthy else "push_not_advertised"
    if reason != expected:
        return f"{said}: DeliveryDowngraded says {reason!r}, not {expected!r}"
    return None


async def _play(scenario: Scenario) -> str | None:
    agent = FakeAgent([scenario.creation, *scenario.script], scenario.default)
    async with open_engine(agent) as engine:
        view = await engine.start_task(AGENT_URL, skill=SKILL, text="hello")
        key, remote = view.task, view.remote_task_id
        assert remote is not None
        registrations = 0
        for step in scenario.steps:
            if step[0] == "register":
                registrations += 1
                problem = await _register(engine, agent, key)
                if problem is not None:
                    return f"registration {registrations}: {problem}"
                continue
            if step[0] == "poll":
                agent.remote.step(remote, step[1])
                await engine.poll(key)
            elif step[0] == "drive":
                # One poll and, the clock having jumped past max_card_age, a re-validation.
                with contextlib.suppress(DeadlineExceeded):  # unless the task has ended
                    await engine.drive(key, until="terminal", timeout=0)
            else:
                # TaskOrphanedError: the skill is gone from the card (R9); the task keeps its state.
                with contextlib.suppress(TaskOrphanedError):
                    await engine.resume(key)
            await engine.settle()
        # Nowhere else: every WebhookRegistered and config request came from a registration
        # whose read said push (checked above), so their counts agree.
        registered = [e for e in task_events(engine.store, key) if e.type == ev.WEBHOOK_REGISTERED]
        creates = agent.rpc_requests("CreateTaskPushNotificationConfig")
        if len(registered) != len(creates):
            return f"{len(registered)} WebhookRegistered but {len(creates)} config requests"
        return audit_problems(engine.store)


def violation(scenario: Scenario) -> str | None:
    """What is wrong with the engine's registrations in ``scenario``, or None."""
    return asyncio.run(_play(scenario))


@given(scenarios)
def test_a_webhook_is_registered_only_when_the_read_inside_that_registration_said_push(
    scenario: Scenario,
) -> None:
    assert violation(scenario) is None


# --- teeth: the same property catches a planted bug ----------------------------------------------


def catches() -> Scenario:
    """A scenario on which the property rejects the engine (hypothesis fails the test if none)."""
    return find(scenarios, lambda scenario: violation(scenario) is not None, settings=hunt(300))


def test_property_catches_a_registration_that_trusts_the_memo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_read = Discovery.read

    async def trusting_read(self: Discovery, agent_url: str, *, fresh: bool = True) -> CardRead:
        memo = self._memo.get(card_urls(agent_url)[0])
        if fresh and memo is not None:
            return memo[0]  # the planted bug: "fresh" answered from the memo
        return await real_read(self, agent_url, fresh=fresh)

    monkeypatch.setattr(Discovery, "read", trusting_read)
    problem = violation(catches())
    assert problem is not None
    assert "REGISTERED although" in problem or "no card request" in problem
