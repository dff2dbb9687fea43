"""P5: no ``SendMessage`` leaves after a failed read, an absent skill or an unaccepted contract
change (R2, R3).

A scenario is a sequence of ``start_task`` attempts on one agent, each with its own card answer
(a card variant — push on or off, skill present or absent, contract rotated, endpoint moved — a
network error, a timeout, a 503, invalid JSON or a body over the size limit), its own media type
and its own ``accept_contract``; the contract pinned by earlier attempts carries over, so every
attempt meets any previously pinned (or accepted) contract, or none.

Each attempt, judged by what the fake agent saw during it: either it raises ``DiscoveryError`` /
``CardInvalidError`` / ``SkillUnavailableError`` / ``ContractChangedError`` with no
``SendMessage`` at the agent, a ``TaskCreationRefused`` in the agent stream and nothing written
outside the agent stream; or it sends exactly one ``SendMessage``, after a card read that was
healthy, carried the skill for the media type, and showed the pinned contract (or one accepted),
and the task records that card. Which of the two, and which error, is also checked against a
model of R2/R3. The property is one function, :func:`violation`, checked against the engine and,
to show it has teeth, against two planted bugs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from store_marks import write_marks
from support.fake_agent import (
    AGENT_URL,
    FAILURES,
    INVALID_BODIES,
    ORIGIN,
    SKILL,
    VARIANTS,
    Behaviour,
    FakeAgent,
    Seen,
    Variant,
)
from support.harness import (
    agent_events,
    agent_version,
    audit_problems,
    hunt,
    open_engine,
    task_events,
    task_streams,
)

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import key_of
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards as guards_module
from cardfence.engine.core.guards import Decision
from cardfence.engine.discovery.card_read import CardRead, ContractCheck
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import (
    CardInvalidError,
    ContractChangedError,
    DiscoveryError,
    SkillUnavailableError,
)

REFUSALS = (DiscoveryError, SkillUnavailableError, ContractChangedError)  # CardInvalid: Discovery
ACCEPTED_MEDIA = "text/plain"  # what the fake's skill takes

# --- strategies ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    card: Behaviour  # the answer to the card request(s) made for this attempt
    media_type: str
    accept_contract: bool


# Biased towards cards that carry the skill, so that attempts get as far as the contract check.
with_skill = st.sampled_from([v for v in VARIANTS if v.skill])
behaviours: st.SearchStrategy[Behaviour] = st.one_of(
    with_skill, with_skill, st.sampled_from(VARIANTS), st.sampled_from(FAILURES)
)
attempts = st.builds(
    Attempt,
    card=behaviours,
    media_type=st.sampled_from([ACCEPTED_MEDIA] * 3 + ["image/png"]),
    accept_contract=st.sampled_from([False, False, True]),
)
scenarios = st.lists(attempts, min_size=1, max_size=5).map(tuple)

# --- the model: what R2 and R3 say the attempt must come to --------------------------------------


def expected_outcome(served: Seen | None, attempt: Attempt, pinned: str | None) -> type | None:
    """The error R2/R3 call for (``None``: the task is created and sent)."""
    if served is None or not served.healthy:
        kind = served.served if served is not None else None
        return CardInvalidError if kind in INVALID_BODIES else DiscoveryError
    assert isinstance(served.served, Variant)
    card = served.served.card
    skill = card.skill(SKILL)
    if skill is None or not skill.accepts(attempt.media_type):
        return SkillUnavailableError
    if pinned is not None and card.contract_hash != pinned and not attempt.accept_contract:
        return ContractChangedError
    return None


# --- the property --------------------------------------------------------------------------------


async def _attempt(engine: Engine, agent: FakeAgent, attempt: Attempt) -> str | None:
    store = engine.store
    agent.serve(attempt.card)
    mark, since = agent.mark(), agent_version(store)
    pinned = (await engine.discovery.agent_state(AGENT_URL))["pinned_contract"]
    streams, versions = set(task_streams(store)), write_marks(store)[1]
    error: Exception | None = None
    try:
        view = await engine.start_task(
            AGENT_URL,
            skill=SKILL,
            text="hello",
            media_type=attempt.media_type,
            accept_contract=attempt.accept_contract,
        )
    except REFUSALS as refused:
        error = refused
    cards = agent.card_requests(since=mark)
    sends = agent.rpc_requests("SendMessage", since=mark)
    recorded = [e.type for e in agent_events(store, since=since)]
    new_streams = set(task_streams(store)) - streams
    served = cards[-1] if cards else None
    said = "no card request" if served is None else f"card answered {served.served!r}"
    expected = expected_outcome(served, attempt, pinned)

    if error is not None:
        if sends:
            return f"SENT {len(sends)} SendMessage and then raised {error!r} ({said})"
        if ev.TASK_CREATION_REFUSED not in recorded:
            return f"refused ({type(error).__name__}) without TaskCreationRefused: {recorded}"
        now = write_marks(store)[1]
        written = {stream for stream, version in now.items() if version != versions.get(stream)}
        if written - {ev.agent_stream_id(ORIGIN)}:
            return f"refused ({type(error).__name__}) but wrote to {sorted(written)}"
        if type(error) is not expected:
            wanted = expected.__name__ if expected else "a task"
            return f"{said}: raised {type(error).__name__}, expected {wanted}"
        return None

    # Sent: exactly once, after a healthy read that allowed it.
    if len(sends) != 1:
        return f"created a task with {len(sends)} SendMessage requests ({said})"
    if served is None or agent.seen.index(served) > agent.seen.index(sends[0]):
        return "SENT without a card read before it"
    if not served.healthy:
        return f"SENT although the card read failed: {said}"
    if expected is not None:
        return f"SENT although {said} called for {expected.__name__} (pinned {pinned})"
    assert isinstance(served.served, Variant)
    card = served.served.card
    if sends[0].endpoint != served.served.endpoint():
        return f"sent to {sends[0].path}, not the endpoint of the card read ({said})"
    if sends[0].params["message"].get("metadata", {}).get("skillId") != SKILL:
        return "SendMessage does not name the skill"
    if len(new_streams) != 1 or view.remote_task_id is None:
        return f"sent, but task streams created: {sorted(new_streams)}"
    submitted = task_events(store, key_of(new_streams.pop()))[0].data
    if (submitted["card_revision"], submitted["contract_hash"]) != (
        card.revision,
        card.contract_hash,
    ):
        return "TaskSubmitted records another card or contract than the one read"
    now_pinned = (await engine.discovery.agent_state(AGENT_URL))["pinned_contract"]
    if now_pinned != card.contract_hash:
        return f"sent on contract {card.contract_hash[:12]} but the pin is {now_pinned}"
    return None


async def _play(scenario: tuple[Attempt, ...]) -> str | None:
    agent = FakeAgent(default=Variant())
    async with open_engine(agent) as engine:
        for number, attempt in enumerate(scenario, 1):
            problem = await _attempt(engine, agent, attempt)
            if problem is not None:
                return f"attempt {number}: {problem}"
        return audit_problems(engine.store)


def violation(scenario: tuple[Attempt, ...]) -> str | None:
    """What is wrong with the engine's creations in ``scenario``, or None."""
    return asyncio.run(_play(scenario))


@given(scenarios)
def test_no_send_message_leaves_after_a_failed_read_an_absent_skill_or_an_unaccepted_contract_change(  # noqa: E501
    scenario: tuple[Attempt, ...],
) -> None:
    assert violation(scenario) is None


# --- teeth: the same property catches planted bugs -----------------------------------------------


def catches() -> tuple[Attempt, ...]:
    """A scenario on which the property rejects the engine (hypothesis fails the test if none)."""
    return find(scenarios, lambda scenario: violation(scenario) is not None, settings=hunt(300))


def test_property_catches_a_creation_guard_that_ignores_the_skill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def allow_all(
        card: object,
        skill_id: str,
        media_type: object,
        extensions: object = (),
        accept: object = (),
    ) -> Decision:
        return Decision(True, "ok")  # the planted bug: no skill or media-type check

    monkeypatch.setattr(guards_module, "creation_check", allow_all)
    problem = violation(catches())
    assert problem is not None
    assert "SkillUnavailableError" in problem  # sent, or refused for another reason


def test_property_catches_a_creation_that_skips_the_contract_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_check = Discovery.check_contract

    async def waved_through(
        self: Discovery, read: CardRead, *, accept: bool = False
    ) -> ContractCheck:
        # The planted bug: the pin is kept, but a changed contract is never refused.
        return await real_check(self, read, accept=True)

    monkeypatch.setattr(Discovery, "check_contract", waved_through)
    problem = violation(catches())
    assert problem is not None
    assert "SENT although" in problem
    assert "ContractChangedError" in problem
