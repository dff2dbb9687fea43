"""P8: a task's authorization is bound to its frozen contract, and decides nothing (R15, R1).

A task is created on a card carrying one of several security contracts (:data:`AUTH_CONTRACTS`:
a bearer token, an API key in a header, the query or a cookie, a bearer token and a key
together, alternatives, skill-level requirements replacing the card's, an optional one, none),
with credentials configured for the ``bearer``, ``key`` and ``basic`` schemes of the agent's
origin (and others for another origin, which no request of the task may ever carry). Then any
sequence of steps runs: the card rotates to any contract (one naming a scheme nobody
configured, one without security, one moving the API key elsewhere or renaming it), the
JSON-RPC endpoint moves (within the origin, or to another port, scheme or host: the old URL
then answers a bare 404), the agent starts or stops refusing every request with a bare 401 or
403, the remote task moves (working, input-required, auth-required, ... until it ends), and the
engine polls, drives (one poll, and a re-validation: the clock jumps ``max_card_age`` at every
reading), re-validates, resumes (R9 follows a moved endpoint), registers a webhook, and is
pushed the remote's current status.

Two engines run every step against identical remotes: the *subject*, whose agent refuses when
told to, and its *twin*, whose agent never refuses. After every step, for both:

1. Credentials (R15). Every request the fake saw carries exactly what the frozen alternative
   puts on it, where the FROZEN card puts it (the ``Authorization`` header's exact value, the
   API key under the frozen card's header, query parameter or cookie name), when it goes to
   the task's origin at creation and is not a card read; anything else -- a card read, a
   request to another origin -- carries no credential at all. "Carries" is read off the
   wire: any ``Authorization`` header, and any header, cookie, query parameter or body holding
   any configured secret (of any scheme, any origin). The grant recorded at creation
   (``TaskSubmitted.authorization``) names the alternative an independent table says the
   contract calls for.
2. Transitions (R1, R10). Every ``StateChanged`` recorded during the step is the remote's
   current report (its state and timestamp); no ``StateChanged`` is appended together with
   an ``AuthorizationFailed``; no ``CancelTask`` is ever sent; and after any step in which the
   subject's ``GetTask`` was answered, the subject's state is the twin's.

At the end (after the refusals stop, a resume and a poll): every refused request is recorded
once, as an ``AuthorizationFailed`` naming its status and the schemes the request carried, or
counted (``failures_repeated``) after one that named the same (the twin has none); every
failure the engine decided to record is appended or counted, none lost; the subject's
transitions (their ``to`` states) are a subsequence of the twin's; both stores pass the audit.
The property is one function, :func:`violation`.

Teeth: planted bugs -- credentials rebuilt from the latest card instead of the frozen one, sent
to whatever origin the endpoint moved to, a refusal applied as the task having failed, repeated
refusals counted and then forgotten, a refusal counted as a repeat of one of another status --
are each found by a derandomised hunt.

Not generated: replies and cancels. Pushes of a terminal state are: the closing read they
prompt is a request of the task like any other (it went out without the task's credentials
until this property's pinned case found it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from hypothesis import example, find, given, settings
from hypothesis import strategies as st
from support.fake_agent import (
    AGENT_URL,
    AUTH_CONTRACTS,
    SKILL,
    TERMINAL,
    FakeAgent,
    Seen,
    Variant,
    push_body,
)
from support.harness import CONFIG, audit_problems, hunt, open_engine, task_events

from cardfence.engine.auth.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.auth.config import ApiKey, Basic, Bearer, CredentialsConfig
from cardfence.engine.client import _connections, tasklog
from cardfence.engine.client import engine as engine_module
from cardfence.engine.client._connections import Connections
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import Following
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import Event
from cardfence.engine.core.observations import Observation
from cardfence.engine.core.replay import State, StoredEvent
from cardfence.engine.errors import (
    AuthorizationFailedError,
    DeadlineExceeded,
    EndpointUnreachableError,
    TaskOrphanedError,
)
from cardfence.store.records import NewEvent

# --- the credentials and the contracts -----------------------------------------------------------

TOKEN = "tok-b-3f9c1e7a"
API_KEY = "key-k-8d27a05b"
USER, PASSWORD = "u", "pw-b-51e6bd24"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
ELSEWHERE = "https://moved.test"  # another origin, with credentials of its own
OTHER_TOKEN, OTHER_KEY = "tok-m-c04e9d11", "key-m-7ab35f62"
SECRETS = (TOKEN, API_KEY, PASSWORD, BASIC, OTHER_TOKEN, OTHER_KEY)

CREDENTIALS = CredentialsConfig.of(
    {
        AGENT_URL: {
            "bearer": Bearer(TOKEN),
            "key": ApiKey(API_KEY),
            "basic": Basic(USER, PASSWORD),
        },
        ELSEWHERE: {"bearer": Bearer(OTHER_TOKEN), "key": ApiKey(OTHER_KEY)},
    }
)
P8_CONFIG = dataclasses.replace(
    CONFIG, credentials=CREDENTIALS, fingerprint_key=b"p8-fingerprint-key-0123456789"
)
CREATION_ORIGIN = AGENT_URL  # every task is created at an endpoint there

# What each contract grants, worked out by hand (requirements are in canonical order: an empty
# alternative first, then by scheme names; ``acme`` is not configured): the oracle for the
# grant, independent of the engine's choice.
GRANTED: dict[str, tuple[str, ...]] = {
    "none": (),
    "optional": (),  # [[], [bearer]]: the empty alternative comes first
    "bearer": ("bearer",),
    "basic": ("basic",),
    "key-header": ("key",),
    "key-renamed": ("key",),
    "key-query": ("key",),
    "key-cookie": ("key",),
    "bearer+key": ("bearer", "key"),
    "key|bearer": ("bearer",),  # [[bearer], [key]] once sorted
    "acme|key": ("key",),  # acme is not configured
    "skill-key": ("key",),  # the skill's [[key]] replaces the card's [[bearer]]
}
INITIAL = tuple(GRANTED)  # "acme" alone cannot be created on (CredentialsMissing)
assert set(AUTH_CONTRACTS) == {*GRANTED, "acme"}

Place = tuple[str, str]  # (where, name): ("header", lower-case name), ("query", …), ("cookie", …)


def placement(contract: str) -> dict[Place, str]:
    """What a request under ``contract``'s grant carries, and where, as its card says."""
    declared = AUTH_CONTRACTS[contract].schemes
    out: dict[Place, str] = {}
    for name in GRANTED[contract]:
        definition = declared[name]
        if "apiKeySecurityScheme" in definition:
            location, param = (definition["apiKeySecurityScheme"][k] for k in ("location", "name"))
            out[(location, param.lower() if location == "header" else param)] = API_KEY
        elif definition["httpAuthSecurityScheme"]["scheme"] == "bearer":
            out[("header", "authorization")] = f"Bearer {TOKEN}"
        else:
            out[("header", "authorization")] = f"Basic {BASIC}"
    return out


def _secret_in(text: str | bytes) -> bool:
    if isinstance(text, bytes):
        return any(secret.encode() in text for secret in SECRETS)
    return any(secret in text for secret in SECRETS)


def carried(seen: Seen) -> dict[Place, str]:
    """What the request carried as credentials: any Authorization header, any header, cookie
    or query parameter holding a configured secret; a secret anywhere else (path, body) too."""
    out: dict[Place, str] = {}
    for name, value in seen.headers:
        if name != "cookie" and (name == "authorization" or _secret_in(value)):
            out[("header", name)] = value
    for name, value in seen.cookies:
        if _secret_in(value):
            out[("cookie", name)] = value
    for name, value in seen.query:
        if _secret_in(value):
            out[("query", name)] = value
    if _secret_in(seen.endpoint):
        out[("url", "")] = seen.endpoint
    if _secret_in(seen.body):
        out[("body", "")] = "(a secret)"
    return out


# --- scenarios -----------------------------------------------------------------------------------

PLACES: dict[str, dict[str, Any]] = {  # where the JSON-RPC endpoint may be
    "home": {"origin": AGENT_URL, "moved": False},
    "path": {"origin": AGENT_URL, "moved": True},  # same origin, another path
    "port": {"origin": "http://agent.test:8443", "moved": False},
    "https": {"origin": "https://agent.test", "moved": False},
    "elsewhere": {"origin": ELSEWHERE, "moved": False},
}
REMOTE_STATES = (  # by repetition: the remote ends now and then, not at once
    *["working"] * 4, *["input-required"] * 3, "auth-required", "completed", "failed",
)  # fmt: skip
HOOK = "http://orchestrator.test/hook"

Step = tuple[Any, ...]
# A scenario is rounds: the remote may move, the world may change (refusals start or stop, the
# card rotates, the endpoint moves), then the engine acts.
remote_moves = st.none() | st.tuples(st.just("remote"), st.sampled_from(REMOTE_STATES))
world_changes = st.none() | st.one_of(
    st.tuples(st.just("refuse"), st.sampled_from([401, 403, None])),
    st.tuples(st.just("rotate"), st.sampled_from(sorted(AUTH_CONTRACTS))),
    st.tuples(st.just("move"), st.sampled_from(sorted(PLACES))),
)
actions: st.SearchStrategy[Step] = st.sampled_from(
    [("poll",), ("poll",), ("drive",), ("revalidate",), ("resume",), ("register",), ("push",)]
)
rounds = st.tuples(remote_moves, world_changes, actions).map(
    lambda drawn: tuple(step for step in drawn if step is not None)
)
# Every scenario ends so: the refusals stop, the task is reconciled with the card, polled.
FINAL: tuple[Step, ...] = (("refuse", None), ("resume",), ("poll",))


@dataclass(frozen=True, slots=True)
class Scenario:
    contract: str  # the contract the task is created under (frozen)
    place: str  # where its endpoint is at creation: at CREATION_ORIGIN
    registered: bool  # a webhook is registered first (pushes then reach the engines)
    steps: tuple[Step, ...]


scenarios = st.builds(
    Scenario,
    contract=st.sampled_from(INITIAL),
    place=st.sampled_from(["home", "path"]),
    registered=st.booleans(),
    steps=st.lists(rounds, min_size=2, max_size=10).map(lambda drawn: sum(drawn, ())),
)

# --- playing one ---------------------------------------------------------------------------------


@dataclass
class Side:
    """One engine and its agent: the ``subject`` (its agent refuses when told) or the ``twin``."""

    name: str
    agent: FakeAgent
    engine: Engine
    key: str = ""
    remote: str = ""
    hook: tuple[str, str] | None = None  # what a push must present, once registered
    appends: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    decided: Counter[str] = field(default_factory=Counter)  # failures to record: by type

    def state(self) -> State:
        return self.engine.log.head(self.key).state

    def changes(self, since: int = 0) -> list[dict[str, Any]]:
        events = task_events(self.engine.store, self.key, since)
        return [e.data for e in events if e.type == ev.STATE_CHANGED]

    def version(self) -> int:
        return len(task_events(self.engine.store, self.key))


def _watch_appends(side: Side) -> None:
    """Keep what each append to the store held (by stream), to tell what was appended together."""
    store = side.engine.store
    original = store.append

    def append(
        stream_id: str, expected_version: int, new_events: Sequence[NewEvent], **kw: Any
    ) -> list[int]:
        positions = original(stream_id, expected_version, new_events, **kw)
        side.appends.append((stream_id, tuple(e.type for e in new_events)))
        return positions

    store.append = append  # type: ignore[method-assign]

    log = side.engine.log
    record = log.record

    def counted_record(key: str, decide: Callable[[State], Sequence[Event]]) -> Any:
        decided: list[Sequence[Event]] = []

        def watched(state: State) -> Sequence[Event]:
            decided[:] = [events := decide(state)]
            return events

        outcome = record(key, watched)
        if key == side.key and decided:
            side.decided.update(e.type for e in decided[0] if e.type in FAILURES)
        return outcome

    log.record = counted_record  # type: ignore[method-assign]


def _moment(stamp: str | None) -> datetime | None:
    return None if stamp is None else datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def _act(side: Side, step: Step) -> str | None:
    """Run an engine step on ``side``; what went wrong that should not have, or None."""
    engine, key = side.engine, side.key
    try:
        if step[0] == "poll":
            await engine.poll(key)
        elif step[0] == "drive":
            await engine.drive(key, until="terminal", timeout=0)
        elif step[0] == "revalidate":
            await engine.observing.revalidate(key)
        elif step[0] == "resume":
            await engine.resume(key)
        elif step[0] == "register":
            outcome = await engine.register_webhook(key, HOOK)
            if outcome.registered:
                assert outcome.token is not None
                assert outcome.authorization is not None
                side.hook = (outcome.token, outcome.authorization)
        elif step[0] == "push" and side.hook is not None:
            body = push_body("1.0", side.agent.remote.tasks[side.remote])
            token, authorization = side.hook
            headers = {
                "content-type": "application/json",
                "x-a2a-notification-token": token,
                "authorization": authorization,
            }
            delivery = await engine.deliver(body, headers)
            if delivery.status != 200:
                return f"{side.name}: push refused: {delivery}"
    except AuthorizationFailedError:
        if side.agent.refuse is None:
            return f"{side.name}: AuthorizationFailedError, yet its agent refuses nothing"
    except EndpointUnreachableError as failure:
        if failure.status != 404:  # only a moved endpoint's old URL is unreachable
            return f"{side.name}: {failure!r}"
    except (TaskOrphanedError, DeadlineExceeded):
        pass  # R9: the card dropped the skill's compatibility; drive's deadline (timeout 0)
    except Exception as error:  # anything else is a finding, reported as one
        return f"{side.name}: {step[0]} raised {error!r}"
    try:
        await engine.settle()
    except Exception as error:  # a background job failed: that is the finding
        return f"{side.name}: background job raised {error!r}"
    return None


def _check_requests(side: Side, since: int, frozen: dict[Place, str]) -> str | None:
    for seen in side.agent.seen[since:]:
        at_origin = seen.origin == CREATION_ORIGIN and not seen.is_card
        expected = frozen if at_origin else {}
        got = carried(seen)
        if got != expected:
            what = "card read" if seen.is_card else (seen.rpc or seen.method)
            return (
                f"{side.name}: {what} to {seen.endpoint} carried {sorted(got.items())}, "
                f"expected {sorted(expected.items())}"
            )
        if seen.rpc == "CancelTask":
            return f"{side.name}: a CancelTask nobody asked for"
    return None


def _check_changes(side: Side, since: int) -> str | None:
    state, moment, _ = side.agent.remote.tasks[side.remote].current
    current = (state, moment)
    for change in side.changes(since):
        recorded = (change["to"], _moment(change.get("remote_timestamp")))
        if recorded != current:
            return f"{side.name}: StateChanged to {recorded} while the remote said {current}"
    return None


def _check_appends(side: Side) -> str | None:
    stream = task_stream_id(side.key)
    for stream_id, types in side.appends:
        if stream_id == stream and ev.STATE_CHANGED in types and ev.AUTHORIZATION_FAILED in types:
            return f"{side.name}: StateChanged appended with AuthorizationFailed: {types}"
    return None


def _is_subsequence(short: Sequence[str], long: Sequence[str]) -> bool:
    rest = iter(long)
    return all(item in rest for item in short)


# The failures a task's requests meet (R15's refusals, endpoints not reached, cards not read):
# each is recorded once, as an event or counted on a later one's ``failures_repeated``.
FAILURES = frozenset({ev.AUTHORIZATION_FAILED, ev.ENDPOINT_UNREACHABLE, ev.DISCOVERY_UNAVAILABLE})


def _check_refusals(side: Side, granted: tuple[str, ...]) -> str | None:
    """Every refused request recorded once, naming its status and what it carried: as an
    ``AuthorizationFailed`` of its own, or counted after one just like it (a poll refused
    again as the last one was)."""
    refused = [
        (s.answered, tuple(granted) if s.origin == CREATION_ORIGIN else ())
        for s in side.agent.seen
        if s.answered in (401, 403)
    ]
    events = task_events(side.engine.store, side.key)
    recorded = [(e.data["status"], tuple(e.data["schemes"])) for e in events
                if e.type == ev.AUTHORIZATION_FAILED]  # fmt: skip
    if not _is_subsequence(recorded, refused) or not set(refused) <= set(recorded):
        return f"{side.name}: refused requests {refused}, AuthorizationFailed events {recorded}"
    if len(refused) != side.decided[ev.AUTHORIZATION_FAILED]:
        return f"{side.name}: {len(refused)} refused requests, yet recorded as {side.decided}"
    appended = sum(1 for e in events if e.type in FAILURES)
    counted = sum(e.data.get(ev.FAILURES_REPEATED, 0) for e in events)
    counted += side.engine.log.failures_held(side.key)
    if appended + counted != side.decided.total():
        return f"{side.name}: failures {side.decided}, {appended} appended and {counted} counted"
    return None


async def _open_side(name: str, variant: Variant, stack: contextlib.AsyncExitStack) -> Side:
    agent = FakeAgent(default=variant)
    agent.only_at = variant.endpoint()
    engine = await stack.enter_async_context(open_engine(agent, config=P8_CONFIG))
    side = Side(name, agent, engine)
    _watch_appends(side)
    view = await engine.start_task(AGENT_URL, skill=SKILL, text="hello")
    assert view.remote_task_id is not None
    side.key, side.remote = view.task, view.remote_task_id
    return side


async def _play(scenario: Scenario) -> str | None:
    variant = Variant(auth=scenario.contract, **PLACES[scenario.place])
    granted, frozen = GRANTED[scenario.contract], placement(scenario.contract)
    async with contextlib.AsyncExitStack() as stack:
        subject = await _open_side("subject", variant, stack)
        twin = await _open_side("twin", variant, stack)
        sides = (subject, twin)
        for side in sides:
            recorded = side.state().get("authorization") or {}
            if recorded.get("schemes") != list(granted) or recorded.get("origin") != AGENT_URL:
                return f"{side.name}: granted {recorded}, expected {list(granted)} at {AGENT_URL}"
            problem = _check_requests(side, 0, frozen)
            if problem is not None:
                return f"creation: {problem}"
        first: tuple[Step, ...] = (("register",),) if scenario.registered else ()
        for number, step in enumerate((*first, *scenario.steps, *FINAL), start=1):
            marks = [len(side.agent.seen) for side in sides]
            versions = [side.version() for side in sides]
            if step[0] in WORLD_STEPS:
                variant = _change_world(step, variant, subject, twin)
            else:
                for side in sides:
                    problem = await _act(side, step)
                    if problem is not None:
                        return f"step {number} {step}: {problem}"
            same_story = subject.agent.remote.tasks[subject.remote].current
            assert same_story == twin.agent.remote.tasks[twin.remote].current, "remotes must agree"
            for side, mark, version in zip(sides, marks, versions, strict=True):
                problem = (
                    _check_requests(side, mark, frozen)
                    or _check_changes(side, version)
                    or _check_appends(side)
                )
                if problem is not None:
                    return f"step {number} {step}: {problem}"
            polled = any(
                s.rpc == "GetTask" and s.answered == 200 for s in subject.agent.seen[marks[0] :]
            )
            if polled and subject.state()["state"] != twin.state()["state"]:
                return (
                    f"step {number} {step}: the subject's poll was answered, yet it is "
                    f"{subject.state()['state']} and its twin {twin.state()['state']}"
                )
        subject_to = [change["to"] for change in subject.changes()]
        twin_to = [change["to"] for change in twin.changes()]
        if not _is_subsequence(subject_to, twin_to):
            return f"transitions {subject_to} are no subsequence of the twin's {twin_to}"
        for side in sides:
            problem = _check_refusals(side, granted) or audit_problems(side.engine.store)
            if problem is not None:
                return problem
    return None


WORLD_STEPS = ("rotate", "move", "refuse", "remote")


def _change_world(step: Step, variant: Variant, subject: Side, twin: Side) -> Variant:
    """The card rotates or its endpoint moves (for both), the subject's agent starts or stops
    refusing, or the remote task moves (both, unless it has ended); returns the card served."""
    if step[0] == "refuse":
        subject.agent.refuse = step[1]
        return variant
    if step[0] == "remote":
        for side in (subject, twin):
            if not _ended(side):
                side.agent.remote.step(side.remote, step[1])
        return variant
    changes = {"auth": step[1]} if step[0] == "rotate" else PLACES[step[1]]
    variant = dataclasses.replace(variant, **changes)
    for side in (subject, twin):
        side.agent.default = variant
        side.agent.only_at = variant.endpoint()  # the old URL answers a bare 404
    return variant


def _ended(side: Side) -> bool:
    return side.agent.remote.tasks[side.remote].current[0] in TERMINAL


def violation(scenario: Scenario) -> str | None:
    """What is wrong with the engine's authorization in ``scenario``, or None."""
    return asyncio.run(_play(scenario))


@pytest.fixture(autouse=True, scope="module")
def _one_tls_context() -> Iterator[None]:
    """Every engine makes a default TLS context (its token source's), which costs more than an
    example's requests: here, where every request goes to the fake and no contract asks for
    mutual TLS, they all share one."""
    shared = engine_module.tls_context(None)
    with pytest.MonkeyPatch.context() as patch:
        for module in (engine_module, _connections):
            patch.setattr(module, "tls_context", lambda ca_file=None: shared)
        yield


@given(scenarios)
@example(  # the key moved elsewhere by the latest card: still sent where the frozen card says
    Scenario("key-header", "home", False, (("rotate", "key-query"), ("revalidate",), ("poll",)))
)
@example(  # an endpoint moved to another origin, followed by resume: no credentials there
    Scenario("bearer+key", "home", False, (("move", "elsewhere"), ("resume",), ("poll",)))
)
@example(  # a refusal hides a transition; the subject catches up once it stops
    Scenario("basic", "path", True, (("remote", "working"), ("refuse", 401), ("poll",),
                                     ("remote", "input-required"), ("push",),
                                     ("refuse", None), ("poll",)))
)  # fmt: skip
def test_credentials_follow_the_frozen_contract_and_decide_nothing(scenario: Scenario) -> None:
    assert violation(scenario) is None


# --- teeth: the same property catches planted bugs -----------------------------------------------


def catches(max_examples: int = 200) -> str:
    """What the property finds wrong on the first scenario it rejects (hypothesis fails the test
    when none is found within ``max_examples``); the hunt is the same every run."""
    found = find(
        scenarios,
        lambda scenario: violation(scenario) is not None,
        settings=settings(hunt(max_examples), derandomize=True),
    )
    problem = violation(found)
    assert problem is not None
    return f"{problem}\n  in {found}"


def test_property_catches_credentials_rebuilt_from_the_latest_card(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: every request's credentials follow the card in force, not the frozen one."""
    original = Connections.task_transport

    async def latest_card_transport(self: Connections, state: State) -> Any:
        return await original(self, {**state, "card_revision": state["latest_card_revision"]})

    monkeypatch.setattr(Connections, "task_transport", latest_card_transport)
    problem = catches()
    assert "carried" in problem or "raised" in problem, problem
    # The quiet form of the bug: the key still sent, but where the latest card asks for it.
    moved_key = Scenario("key-header", "home", False, (("rotate", "key-query"), ("revalidate",),
                                                      ("poll",)))  # fmt: skip
    problem = violation(moved_key) or ""
    assert "carried [(('query', 'api_key'), 'key-k-8d27a05b')]" in problem, problem


def test_property_catches_credentials_sent_to_another_origin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: the credentials go wherever the task's endpoint is now."""

    def for_any_origin(self: Authorizer, grant: Grant, endpoint_url: str) -> Any:
        return TaskCredentials(self, grant) if grant.schemes else None

    monkeypatch.setattr(Authorizer, "for_task", for_any_origin)
    problem = catches()
    assert "carried" in problem, problem
    assert "expected []" in problem, problem  # a request to another origin with credentials


def test_property_catches_a_refusal_read_as_a_failed_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: "the agent no longer accepts us, so the task is dead" -- a 401 or 403 on a poll
    recorded, then applied as a report that the task failed."""
    original = Following.poll_state

    async def poll_failing_on_refusal(self: Following, key: str, state: State) -> State:
        try:
            return await original(self, key, state)
        except AuthorizationFailedError:
            return await self.observing.observe_state(key, Observation("poll", "failed", None))

    monkeypatch.setattr(Following, "poll_state", poll_failing_on_refusal)
    problem = catches()
    assert "StateChanged to ('failed'" in problem or "twin" in problem, problem


def test_property_catches_refusals_counted_and_never_carried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: the failures counted instead of appended are forgotten before the task's next
    event could carry them (the log no longer tells how often the agent refused)."""
    original = TaskLog.record

    def forgetting(self: TaskLog, key: str, decide: Callable[[State], Sequence[Event]]) -> Any:
        if (held := self._failing.get(key)) is not None:
            self._failing[key] = (held[0], held[1], 0)
        return original(self, key, decide)

    monkeypatch.setattr(TaskLog, "record", forgetting)
    problem = catches()
    assert "appended and 0 counted" in problem, problem


def test_property_catches_a_refusal_counted_as_another_of_a_different_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: a refusal counted as a repeat of the last one whatever its status (a 403
    hidden behind a recorded 401)."""

    def by_kind_only(events: Sequence[StoredEvent]) -> str | None:
        if len(events) != 1 or events[0][0] != ev.AUTHORIZATION_FAILED:
            return None
        return f"{events[0][0]} {events[0][1].get('during')}"

    monkeypatch.setattr(tasklog, "_repeatable_failure", by_kind_only)
    problem = catches()
    assert "refused requests" in problem, problem


# --- the closing read after a terminal push --------------------------------------------


def test_the_closing_read_after_a_terminal_push_carries_the_frozen_credentials() -> None:
    """A push that ends the task prompts one closing read (GetTask) of the task's endpoint: a
    request of the task like any other, so it carries the frozen alternative (found by this
    property: it once went out bare)."""
    scenario = Scenario(
        "bearer", "home", registered=True,
        steps=(("remote", "completed"), ("push",)),
    )  # fmt: skip
    problem = asyncio.run(_play(scenario))
    assert problem is None, problem
