"""Rules R1-R12 of docs/rules.md against real agents, one incident at a time.

Each test replays what a incident did (a card that breaks, changes or withdraws something
while a task is live; a webhook that goes silent; an endpoint that moves) and asserts the bad
outcome of the seed does not happen: no cancel is sent, no task is failed or ended locally, nothing
is sent or registered on a card that could not confirm it, every remote report is applied once.
Every test that drives tasks ends with the audit (replay == projection, chains intact).

The tests taking ``agent`` run against both generations: the a2a-sdk 1.3 agent (`Peer`, A2A 1.0)
and the official a2a-sdk 0.3 agent (`Peer03`, A2A 0.3) over each of its bindings, ids ``1.3``,
``0.3-jsonrpc`` and ``0.3-http+json`` (its card prefers that binding, and the engine takes the
card's preference). Those taking ``peer`` rely on something only the 1.3 agent offers, said at
each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from store_marks import write_marks
from support import Peer
from support.engine_fixtures import (
    FAST,
    Agent,
    MovableEndpoint,
    PushReceiver,
    agent_events,
    audited_engine,
    calls,
    data_of,
    delivered_state,
    drop_skill,
    endpoint_in_use,
    events,
    headers_for,
    logged,
    other_endpoint,
    point_jsonrpc_at,
    push_headers,
    retire_binding,
    rotate_security,
    rotate_to_bearer,
    sends_status_timestamps,
    state_of,
    status_update_body,
    transitions,
    types,
    wait_until,
    wire_version,
    withdraw_push,
)

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import Pace
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.messages import submitted_message
from cardfence.engine.errors import (
    CardInvalidError,
    ContractChangedError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    RemoteRefusedError,
    SkillUnavailableError,
    TaskOrphanedError,
)
from cardfence.engine.wire.transport import A2ATransport

# What the agent reports for `slow N` when nothing interferes: the reference for R1.
SLOW = [("submitted", "working"), ("working", "completed")]
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


@pytest.fixture
async def engine(db: str) -> AsyncIterator[Engine]:
    """An engine on a fresh SQLite store (FAST intervals); audited when the test is done."""
    async with audited_engine(db) as running:
        yield running


@pytest.fixture
def fault(request: pytest.FixtureRequest, agent: Agent) -> str:
    """A card fault (parametrised indirectly), one that both generations' agents serve."""
    kind = str(request.param)
    assert kind in agent.card_faults, f"{type(agent).__name__} serves no card fault {kind!r}"
    return kind


@pytest.fixture
def hook() -> Iterator[PushReceiver]:
    with PushReceiver() as receiver:
        yield receiver


async def healthy_reference(engine: Engine, peer: Agent, text: str) -> list[tuple[str, str]]:
    """The StateChanged sequence of a run with the card left alone."""
    view = await engine.start_task(peer.base_url, skill="slow", text=text)
    done = await engine.drive(view.task, until="terminal", timeout=10)
    assert done.state == "completed"
    return transitions(engine.store, view.task)


# -- R1: continuation is never gated by discovery (incident 000 #2) --------------------------------


async def test_card_503_mid_task_never_sends_cancel(agent: Agent, db_url: str) -> None:
    async with audited_engine(db_url) as engine:
        reference = await healthy_reference(engine, agent, "slow 0.8")
        view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.8")
        agent.set_card_fault("503")  # the agent is being redeployed: its card answers 503

        done = await engine.drive(view.task, until="terminal", timeout=10)
        await engine.settle()

        assert done.state == "completed"
        assert calls(agent, "CancelTask") == 0
        unavailable = data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)
        assert unavailable, "the failed re-validation was not recorded"
        assert {u["kind"] for u in unavailable} == {"http_status"}
        assert transitions(engine.store, view.task) == reference == SLOW


# -- R2: creation is gated by fresh discovery (incident 000) ---------------------------------------


@pytest.mark.parametrize(
    ("fault", "error", "kind"),
    [
        ("503", DiscoveryError, "http_status"),
        ("hang", DiscoveryError, "timeout"),
        ("invalid_json", CardInvalidError, "invalid_card"),
        ("huge", CardInvalidError, "too_large"),
    ],
    indirect=["fault"],
)
async def test_creation_refused_when_the_card_read_fails_sends_nothing(
    agent: Agent, fault: str, engine: Engine, error: type[DiscoveryError], kind: str
) -> None:
    agent.set_card_fault(fault)
    with pytest.raises(DiscoveryError) as caught:
        await engine.start_task(agent.base_url, skill="echo", text="echo hi")

    assert type(caught.value) is error
    assert caught.value.kind == kind
    assert "nothing was sent" in str(caught.value)
    assert agent.calls == []
    assert await engine.tasks() == []
    recorded = agent_events(engine.store, agent)
    assert [t for t, _ in recorded] == [ev.DISCOVERY_FAILED, ev.TASK_CREATION_REFUSED]
    assert recorded[0][1]["kind"] == kind
    assert recorded[1][1]["reason"] == "discovery_failed"


@pytest.mark.parametrize(
    ("skill", "media_type", "reason"),
    [
        ("translate", "text/plain", "skill_absent"),
        ("echo", "image/png", "media_type_not_accepted"),
    ],
)
async def test_creation_refused_when_skill_or_media_type_unavailable_sends_nothing(
    agent: Agent, engine: Engine, skill: str, media_type: str, reason: str
) -> None:
    with pytest.raises(SkillUnavailableError) as caught:
        await engine.start_task(agent.base_url, skill=skill, text="hi", media_type=media_type)

    assert "nothing was sent" in str(caught.value)
    assert calls(agent, "SendMessage") == 0
    assert await engine.tasks() == []
    refusals = [d for t, d in agent_events(engine.store, agent) if t == ev.TASK_CREATION_REFUSED]
    assert [(r["reason"], r["skill"]) for r in refusals] == [(reason, skill)]


# 1.3 only: it checks the conditional re-read, and a2a-sdk 0.3 serves its card without an ETag.
async def test_creation_reads_the_card_fresh_so_a_skill_dropped_since_the_last_task_is_refused(
    peer: Peer, engine: Engine
) -> None:
    first_etag = peer.card_etag
    first = await engine.start_task(peer.base_url, skill="echo", text="echo one")
    await engine.drive(first.task, until="terminal", timeout=5)
    peer.mutate_card(drop_skill("echo"))  # a memoised card would still offer it (incident 000)

    with pytest.raises(SkillUnavailableError):
        await engine.start_task(peer.base_url, skill="echo", text="echo two")

    assert calls(peer, "SendMessage") == 1
    assert len(await engine.tasks()) == 1
    assert peer.card_requests == 2
    assert peer.card_log[-1].if_none_match == first_etag  # conditional, on the wire all the same


# -- R3: the contract is frozen at send (incident 004) ---------------------------------------------


async def test_contract_rotated_between_reads_sends_nothing(agent: Agent, engine: Engine) -> None:
    first = await engine.start_task(agent.base_url, skill="echo", text="echo pinned")
    await engine.drive(first.task, until="terminal", timeout=5)
    agent.mutate_card(rotate_security)

    with pytest.raises(ContractChangedError) as caught:
        await engine.start_task(agent.base_url, skill="echo", text="echo rotated")

    assert "nothing was sent" in str(caught.value)
    assert caught.value.pinned == first.contract_hash
    assert calls(agent, "SendMessage") == 1  # the first task's only
    assert calls(agent, "CancelTask") == 0  # never send and then cancel
    assert [v.task for v in await engine.tasks()] == [first.task]
    recorded = agent_events(engine.store, agent)
    assert [t for t, _ in recorded if t.startswith("Contract")] == [ev.CONTRACT_PINNED]
    assert recorded[-1][0] == ev.TASK_CREATION_REFUSED
    assert recorded[-1][1]["reason"] == "ContractChangedError"


async def test_rotated_contract_accepted_explicitly_is_recorded_then_sent(
    agent: Agent, db: str
) -> None:
    # The new contract requires a bearer token: configured, so only R3 stands in the way.
    token = CredentialsConfig.of({agent.base_url: {"bearer": Bearer("t-rotated")}})
    async with audited_engine(db, dataclasses.replace(FAST, credentials=token)) as engine:
        await _rotated_contract_accepted(agent, engine)


async def _rotated_contract_accepted(agent: Agent, engine: Engine) -> None:
    first = await engine.start_task(agent.base_url, skill="echo", text="echo pinned")
    agent.mutate_card(rotate_to_bearer)

    accepted = await engine.start_task(
        agent.base_url, skill="echo", text="echo accepted", accept_contract=True
    )
    done = await engine.drive(accepted.task, until="terminal", timeout=5)
    again = await engine.start_task(agent.base_url, skill="echo", text="echo again")  # new pin

    assert done.state == "completed"
    assert calls(agent, "SendMessage") == 3
    assert accepted.contract_hash != first.contract_hash
    assert again.contract_hash == accepted.contract_hash
    contracts = [(t, d) for t, d in agent_events(engine.store, agent) if t.startswith("Contract")]
    assert [t for t, _ in contracts] == [ev.CONTRACT_PINNED, ev.CONTRACT_ACCEPTED]
    assert contracts[1][1]["previous"] == first.contract_hash
    assert contracts[1][1]["contract_hash"] == accepted.contract_hash


async def test_contract_rotated_mid_task_is_recorded_as_diverged_and_the_task_completes(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.8")
    agent.mutate_card(rotate_security)

    done = await engine.drive(view.task, until="terminal", timeout=10)
    await engine.settle()

    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW
    assert calls(agent, "CancelTask") == 0
    diverged = data_of(engine.store, view.task, ev.CONTRACT_DIVERGED)
    assert diverged
    assert diverged[0]["frozen"] == view.contract_hash
    assert diverged[0]["observed"] != view.contract_hash
    state = state_of(engine, view.task)
    assert state["contract_hash"] == view.contract_hash  # the frozen contract still governs
    assert state["endpoint"] == endpoint_in_use(agent)
    assert "contract_diverged" in done.flags


# -- R4: webhook registration is gated by an unconditional fresh read (incidents 000 #1, 001) ------


@pytest.mark.parametrize(
    ("break_card", "reason"),
    [("push_withdrawn", "push_not_advertised"), ("card_503", "discovery_failed")],
)
async def test_registration_without_fresh_push_registers_nothing_and_polls_to_the_end(
    agent: Agent, engine: Engine, hook: PushReceiver, break_card: str, reason: str
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.4")
    reads_before = agent.card_requests
    if break_card == "push_withdrawn":
        agent.mutate_card(withdraw_push)  # the card read at creation still said push: true
    else:
        agent.set_card_fault("503")
    before = state_of(engine, view.task)["state"]

    outcome = await engine.register_webhook(view.task, hook.url)

    assert (outcome.registered, outcome.reason) == (False, reason)
    assert agent.card_requests == reads_before + 1  # read for this registration, not memoised
    assert calls(agent, "CreateTaskPushNotificationConfig") == 0
    [downgraded] = data_of(engine.store, view.task, ev.DELIVERY_DOWNGRADED)
    assert (downgraded["reason"], downgraded["to"]) == (reason, "polling")
    after = state_of(engine, view.task)
    assert after["state"] == before
    assert (after["delivery_mode"], after["webhook"]) == ("polling", None)
    assert ev.STATE_CHANGED not in types(engine.store, view.task)

    done = await engine.drive(view.task, until="terminal", timeout=10)
    assert done.state == "completed"
    assert done.delivery_mode == "polling"
    assert hook.deliveries == []


# 1.3 only: it lists the configs through the 1.0 HTTP+JSON route (0.3 has another).
async def test_registration_with_push_advertised_is_provisional_and_uses_our_config_id(
    peer: Peer, engine: Engine, hook: PushReceiver
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.4")

    outcome = await engine.register_webhook(view.task, hook.url)

    assert outcome.registered
    assert outcome.config_id is not None
    assert outcome.config_id != view.remote_task_id  # a2a-sdk's default would be the task id
    [registered] = data_of(engine.store, view.task, ev.WEBHOOK_REGISTERED)
    assert registered["status"] == "provisional"
    assert registered["config_id"] == outcome.config_id
    assert outcome.token is not None
    assert outcome.token not in json.dumps(registered)  # only its digest is kept
    assert state_of(engine, view.task)["delivery_mode"] == "push"
    async with httpx.AsyncClient() as client:
        listed = await client.get(
            f"{peer.rest_url}/tasks/{view.remote_task_id}/pushNotificationConfigs",
            headers={"A2A-Version": "1.0"},
        )
    assert [c["id"] for c in listed.json()["configs"]] == [outcome.config_id]
    done = await engine.drive(view.task, until="terminal", timeout=10)
    assert done.state == "completed"


# -- R5: push is provisional until the first delivery (incident 001) -------------------------------


async def test_push_withdrawn_after_registration_still_reaches_terminal_within_max_poll_interval(
    agent: Agent, engine: Engine, hook: PushReceiver
) -> None:
    hook.forward_to(engine)
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.6")
    outcome = await engine.register_webhook(view.task, hook.url)
    assert outcome.registered
    agent.set_push_dropped(True)  # registrations accepted, deliveries silently dropped

    done = await engine.drive(view.task, until="terminal", timeout=30)

    assert done.state == "completed"  # not failed, not left waiting for the timeout
    assert transitions(engine.store, view.task) == SLOW
    assert agent.pushes_dropped >= 1
    assert hook.deliveries == []
    recorded = events(engine.store, view.task)
    [completed] = [e for e in recorded if e.type == ev.STATE_CHANGED][1:]
    assert completed.data["source"] == "poll"
    if sends_status_timestamps(agent):
        remote_done = datetime.fromisoformat(completed.data["remote_timestamp"])
    else:  # no status timestamps: the task ended no sooner than its 0.6 s after the send
        assert completed.data["remote_timestamp"] is None
        assert recorded[0].type == ev.TASK_SUBMITTED  # recorded before the send
        remote_done = recorded[0].recorded_at + timedelta(seconds=0.6)
    noticed_after = (completed.recorded_at - remote_done).total_seconds()
    assert noticed_after < 10 * FAST.max_poll_interval  # safety polls: at most 0.2 s apart
    assert ev.WEBHOOK_CONFIRMED not in types(engine.store, view.task)
    assert state_of(engine, view.task)["webhook"]["status"] == "provisional"


# 1.3 only: 0.3 pushes carry the token alone, no Authorization (test_wire03 covers them).
async def test_first_valid_delivery_confirms_the_webhook(
    peer: Peer, engine: Engine, hook: PushReceiver
) -> None:
    hook.forward_to(engine)
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
    registered = await engine.register_webhook(
        view.task, hook.url, auth_scheme="Bearer", auth_credentials="hook-secret"
    )
    assert registered.registered

    await wait_until(lambda: "TASK_STATE_COMPLETED" in hook.states_delivered(), what="pushes")
    await wait_until(lambda: len(hook.answers) == len(hook.deliveries), what="answers")

    assert {h["authorization"] for _, h in hook.deliveries} == {"Bearer hook-secret"}
    assert {a.status for a in hook.answers} == {200}
    assert types(engine.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
    state = state_of(engine, view.task)
    assert state["webhook"]["status"] == "confirmed"
    assert state["state"] == "completed"  # driven by push alone: nothing polled
    await engine.settle()
    assert calls(peer, "GetTask") == 1  # the closing read after the push that ended it
    assert data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)  # the task's output is kept


# 1.3 only: it picks the status-update push; 0.3 pushes the whole task each time.
async def test_a_push_that_ends_the_task_is_followed_by_one_read_that_keeps_its_artifacts(
    peer: Peer, engine: Engine, hook: PushReceiver
) -> None:
    """The agent tries each push once: when the one carrying the artifact is lost, the push that
    ends the task still does, and nobody polls an ended task. One closing read keeps the output."""
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.2")
    registered = await engine.register_webhook(view.task, hook.url)  # not forwarded: all lost
    await wait_until(lambda: "TASK_STATE_COMPLETED" in hook.states_delivered(), what="pushes")
    [ending] = [
        (body, headers)
        for body, headers in hook.deliveries
        if b"statusUpdate" in body and b"TASK_STATE_COMPLETED" in body
    ]
    assert registered.registered

    delivery = await engine.deliver(*ending)  # only the push that ended the task arrives
    await engine.settle()

    assert delivery.outcome == "applied"
    assert state_of(engine, view.task)["state"] == "completed"
    [artifact] = data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)
    assert artifact["source"] == "poll"
    assert calls(peer, "GetTask") == 1


# -- R6: capability re-checks are bound to state boundaries (incident 001) -------------------------


# 1.3 only: it checks the re-check is conditional, and a2a-sdk 0.3 sends no card ETag.
async def test_push_withdrawn_before_submitted_to_working_downgrades_after_the_transition(
    peer: Peer, db: str, hook: PushReceiver
) -> None:
    # No periodic re-validation here: only the boundary re-check may notice the withdrawal.
    config = dataclasses.replace(FAST, max_card_age=60.0)
    async with audited_engine(db, config) as engine:
        view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.5")
        assert (await engine.register_webhook(view.task, hook.url)).registered
        assert state_of(engine, view.task)["state"] == "submitted"
        peer.mutate_card(withdraw_push)
        reads_before = peer.card_requests

        await engine.poll(view.task)  # sees working: the boundary
        await engine.settle()

        recorded = types(engine.store, view.task)
        assert transitions(engine.store, view.task) == [("submitted", "working")]
        assert recorded.index(ev.DELIVERY_DOWNGRADED) > recorded.index(ev.STATE_CHANGED)
        [downgraded] = data_of(engine.store, view.task, ev.DELIVERY_DOWNGRADED)
        assert downgraded["reason"] == "push_withdrawn"
        assert state_of(engine, view.task)["delivery_mode"] == "polling"
        assert peer.card_requests == reads_before + 1  # once for this boundary
        assert peer.card_log[-1].if_none_match is not None  # conditional

        done = await engine.drive(view.task, until="terminal", timeout=10)
        await engine.settle()
        assert done.state == "completed"
        assert peer.card_requests == reads_before + 1  # into a terminal state: no re-check


# -- R7: a card change mid-task is reconciled, never acted on by cancelling (incident 004 #2) ------


async def test_skill_dropped_mid_task_never_cancels(agent: Agent, engine: Engine) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.8")
    agent.mutate_card(drop_skill("slow"))

    done = await engine.drive(view.task, until="terminal", timeout=10)
    await engine.settle()

    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW
    assert calls(agent, "CancelTask") == 0
    [changed] = data_of(engine.store, view.task, ev.CARD_REVISION_CHANGED)
    assert changed["old"] == view.card_revision
    assert changed["changes"]["skills"] == {"removed": ["slow"]}
    flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
    assert [f["reason"] for f in flagged] == ["skill_withdrawn"]
    assert flagged[0]["revision"] == changed["new"]
    assert "skill_withdrawn" in done.flags


async def test_endpoint_moved_mid_task_is_recorded_but_the_task_stays_on_its_endpoint(
    agent: Agent, engine: Engine
) -> None:
    used, other = endpoint_in_use(agent), other_endpoint(agent)
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.8")
    agent.mutate_card(retire_binding(used["binding"]))

    done = await engine.drive(view.task, until="terminal", timeout=10)
    await engine.settle()

    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW
    [changed] = data_of(engine.store, view.task, ev.CARD_REVISION_CHANGED)
    new_endpoints = [(i["url"], i["binding"]) for i in changed["changes"]["endpoints"]["new"]]
    assert new_endpoints == [(other["url"], other["binding"])]
    assert "contract" not in changed["changes"]
    assert ev.ENDPOINT_MOVED not in types(engine.store, view.task)  # not until R9
    assert calls(agent, "GetTask", logged(other["binding"])) == 0
    assert calls(agent, "GetTask", logged(used["binding"])) > 0


# -- R8: a discovery failure mid-task is an annotation (incident 000) ------------------------------


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("503", "http_status"),
        ("hang", "timeout"),
        ("invalid_json", "invalid_card"),
        ("huge", "too_large"),
    ],
    indirect=["fault"],
)
async def test_discovery_failing_mid_task_only_annotates(
    agent: Agent, fault: str, engine: Engine, kind: str
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.8")
    agent.set_card_fault(fault)

    done = await engine.drive(view.task, until="terminal", timeout=10)
    await engine.settle()

    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW
    recorded = set(types(engine.store, view.task))
    observations = {ev.STATE_CHANGED, ev.OBSERVATION_IGNORED, ev.ARTIFACT_RECEIVED}
    assert recorded - observations == {ev.TASK_SUBMITTED, ev.DISCOVERY_UNAVAILABLE}
    kinds = {d["kind"] for d in data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)}
    assert kinds == {kind}
    assert done.flags == ()
    assert done.delivery_mode == "polling"
    assert calls(agent, "CancelTask") == 0


# -- R9: resume reconciles the task with a fresh card (incident 002) -------------------------------


async def test_resume_after_skill_vanished_raises_orphaned_and_leaves_state(
    agent: Agent, engine: Engine, db: str
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 5")
    working = await engine.poll(view.task)
    assert working.state == "working"
    agent.mutate_card(drop_skill("slow"))

    async with audited_engine(db) as restarted:  # a new process on the same store
        sent_before = len(agent.calls)
        with pytest.raises(TaskOrphanedError) as caught:
            await restarted.resume(view.task)

        assert caught.value.skill == "slow"
        assert agent.calls[sent_before:] == []  # no GetTask after the fresh read
        after = await restarted.task(view.task)
        assert after.state == "working"  # its last observed state, never failed
        [orphaned] = data_of(restarted.store, view.task, ev.TASK_ORPHANED)
        assert (orphaned["reason"], orphaned["skill"]) == ("skill_absent", "slow")
        assert "orphaned" in after.flags
        assert transitions(restarted.store, view.task) == [("submitted", "working")]
    await engine.cancel(view.task)  # let the agent stop working on it


@pytest.mark.parametrize(
    ("edit", "orphaned"),
    [
        ("descriptive", False),  # name, description, tags, examples: not part of compatibility
        ("input_modes", True),
    ],
)
async def test_resume_tells_compatible_skill_edits_from_incompatible_ones(
    agent: Agent, engine: Engine, edit: str, orphaned: bool
) -> None:
    view = await engine.start_task(agent.base_url, skill="ask", text="ask")
    await engine.drive(view.task, until="interrupted", timeout=5)

    def change(card: dict[str, Any]) -> None:
        [skill] = [s for s in card["skills"] if s["id"] == "ask"]
        if edit == "descriptive":
            skill.update(name="Ask v2", description="Reworded.", tags=["x"], examples=["ask me"])
        else:
            skill["inputModes"] = ["application/json"]
        card["version"] = "1.0.1"

    agent.mutate_card(change)
    if orphaned:
        with pytest.raises(TaskOrphanedError):
            await engine.resume(view.task)
        [data] = data_of(engine.store, view.task, ev.TASK_ORPHANED)
        assert data["reason"] == "skill_incompatible"
        assert (await engine.task(view.task)).state == "input-required"  # untouched, not failed
    else:
        resumed = await engine.resume(view.task)
        assert ev.TASK_ORPHANED not in types(engine.store, view.task)
        assert ev.CARD_REVISION_CHANGED in types(engine.store, view.task)
        replied = await engine.reply(resumed.task, "42")
        done = await engine.drive(replied.task, until="terminal", timeout=5)
        assert done.state == "completed"


async def test_resume_follows_an_endpoint_moved_for_the_same_skill(
    agent: Agent, engine: Engine
) -> None:
    used, other = endpoint_in_use(agent), other_endpoint(agent)
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.6")
    assert (await engine.poll(view.task)).state == "working"
    agent.mutate_card(retire_binding(used["binding"]))  # same skills and contract, one endpoint

    resumed = await engine.resume(view.task)
    done = await engine.drive(resumed.task, until="terminal", timeout=10)

    [moved] = data_of(engine.store, view.task, ev.ENDPOINT_MOVED)
    assert (moved["old"], moved["new"]) == (used, other)
    assert state_of(engine, view.task)["endpoint"] == moved["new"]
    assert done.state == "completed"
    assert (logged(other["binding"]), "GetTask") in agent.calls
    assert transitions(engine.store, view.task) == SLOW
    assert ev.TASK_ORPHANED not in types(engine.store, view.task)


async def test_resume_with_the_card_unreadable_goes_on_at_the_recorded_endpoint(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.5")
    agent.set_card_fault("503")

    resumed = await engine.resume(view.task)
    [unavailable] = data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)
    done = await engine.drive(resumed.task, until="terminal", timeout=10)

    assert (unavailable["during"], unavailable["kind"]) == ("resume", "http_status")
    assert done.state == "completed"
    used = endpoint_in_use(agent)
    assert state_of(engine, view.task)["endpoint"] == used
    assert calls(agent, "GetTask", logged(used["binding"])) > 0
    assert ev.TASK_ORPHANED not in types(engine.store, view.task)


# -- R10: only the remote ends a task (incident 000) -----------------------------------------------


async def test_deadline_records_deadline_exceeded_and_does_not_fail_the_task(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="ask", text="ask")

    with pytest.raises(DeadlineExceeded) as caught:
        await engine.drive(view.task, until="terminal", timeout=0.3)

    assert caught.value.state == "input-required"
    assert "not marked failed" in str(caught.value)
    recorded = events(engine.store, view.task)
    assert recorded[-1].type == ev.DEADLINE_EXCEEDED
    assert recorded[-1].data["state"] == "input-required"
    assert recorded[-2].data.get("source") == "poll"  # after a last poll
    assert (await engine.task(view.task)).state == "input-required"
    assert "deadline_exceeded" in (await engine.task(view.task)).flags
    assert calls(agent, "CancelTask") == 0
    assert all(to not in ("failed", "canceled") for _, to in transitions(engine.store, view.task))


async def test_cancel_is_requested_and_the_state_moves_only_from_the_remote_answer(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 2")
    assert (await engine.poll(view.task)).state == "working"

    canceled = await engine.cancel(view.task)

    assert canceled.state == "canceled"
    assert calls(agent, "CancelTask", logged(endpoint_in_use(agent)["binding"])) == 1
    recorded = events(engine.store, view.task)
    requested = [e.type for e in recorded].index(ev.CANCEL_REQUESTED)
    [to_canceled] = [
        e for e in recorded if e.type == ev.STATE_CHANGED and e.data["to"] == "canceled"
    ]
    assert to_canceled.version > recorded[requested].version
    assert (to_canceled.data["from"], to_canceled.data["source"]) == ("working", "send")
    # What the remote said, and when: with the time it stamped the status, where it stamps one.
    stamped = to_canceled.data["remote_timestamp"] is not None
    assert stamped == sends_status_timestamps(agent)

    with pytest.raises(RemoteRefusedError) as caught:
        await engine.cancel(view.task)

    assert caught.value.code == TASK_NOT_CANCELABLE
    [refused] = data_of(engine.store, view.task, ev.CANCEL_REFUSED)
    assert refused["code"] == TASK_NOT_CANCELABLE
    assert (await engine.task(view.task)).state == "canceled"


# 1.3 only: the late push is crafted as a 1.0 StreamResponse body, which a 0.3 agent never sends.
async def test_terminal_state_absorbs_a_late_non_terminal_push(
    peer: Peer, engine: Engine, hook: PushReceiver
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
    outcome = await engine.register_webhook(view.task, hook.url)
    assert outcome.registered
    done = await engine.drive(view.task, until="terminal", timeout=10)
    assert done.state == "completed"
    completed_at = datetime.fromisoformat(state_of(engine, view.task)["remote_timestamp"])

    late = status_update_body(
        view.remote_task_id or "", view.context_id, "working", completed_at + timedelta(seconds=1)
    )
    delivery = await engine.deliver(late, headers_for(outcome))

    assert (delivery.status, delivery.outcome) == (200, "ignored")
    ignored = data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)[-1]
    assert (ignored["reason"], ignored["state"], ignored["source"]) == (
        "after_terminal",
        "working",
        "push",
    )
    assert (await engine.task(view.task)).state == "completed"
    assert transitions(engine.store, view.task) == SLOW


# -- R11: errors are told apart (incident 002) -----------------------------------------------------


async def test_endpoint_gone_is_unreachable_not_task_not_found_and_changes_nothing(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 1")
    assert (await engine.poll(view.task)).state == "working"
    agent.set_endpoint_gone(True)  # plain 404, no A2A error body

    with pytest.raises(EndpointUnreachableError) as caught:
        await engine.poll(view.task)
    assert "404" in str(caught.value)
    reads_before = agent.card_requests
    with pytest.raises(EndpointUnreachableError):
        await engine.drive(view.task, until="terminal", timeout=0.3)

    assert agent.card_requests > reads_before  # a bare 404 prompts an R9 check
    assert (await engine.task(view.task)).state == "working"  # nothing was changed
    unreachable = data_of(engine.store, view.task, ev.ENDPOINT_UNREACHABLE)
    assert unreachable
    assert {u["during"] for u in unreachable} == {"poll"}
    assert transitions(engine.store, view.task) == [("submitted", "working")]

    # A real TaskNotFound is something else: an A2A error body, told apart by its code.
    used = endpoint_in_use(agent)
    interface = Interface(used["url"], used["binding"], used["protocol_version"])
    transport = A2ATransport(engine.client, interface)
    agent.set_endpoint_gone(False)
    with pytest.raises(RemoteRefusedError) as not_found:
        await transport.get_task("no-such-task")
    assert not_found.value.code == TASK_NOT_FOUND

    done = await engine.drive(view.task, until="terminal", timeout=10)  # the task lived on
    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW


async def test_polls_failing_alike_during_an_outage_add_one_event_and_a_count(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 1")
    assert (await engine.poll(view.task)).state == "working"
    agent.set_endpoint_gone(True)
    asked = len(agent.calls)

    for _ in range(6):
        with pytest.raises(EndpointUnreachableError):
            await engine.poll(view.task)
    failed = len(agent.calls) - asked
    agent.set_endpoint_gone(False)
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert failed == 6  # every poll reached the agent, and was answered a bare 404
    assert len(data_of(engine.store, view.task, ev.ENDPOINT_UNREACHABLE)) == 1
    logged = engine.store.read_stream(task_stream_id(view.task))
    after = next(i for i, e in enumerate(logged) if e.type == ev.ENDPOINT_UNREACHABLE) + 1
    assert logged[after].data[ev.FAILURES_REPEATED] == 5  # carried by the task's next event
    assert done.state == "completed"
    assert done.failures_repeated == 5


async def test_a_followed_tasks_last_failed_poll_is_kept_without_its_frames(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 1")
    agent.set_endpoint_gone(True)
    pace = Pace.start(engine.config, now=0.0)

    await engine.follow_step(view.task, await engine.records.state(view.task), pace)

    kept: BaseException | None = pace.unreachable
    assert isinstance(kept, EndpointUnreachableError)  # what `drive` raises at its deadline
    chain = []
    while kept is not None:
        chain.append(kept)
        kept = kept.__cause__ or kept.__context__
    # Kept as long as the task is followed: no traceback, so none of the failed request's
    # frames and locals (some 40 KB a task) stay with it.
    assert [e.__traceback__ for e in chain] == [None] * len(chain)


async def test_a_followed_tasks_last_failure_to_connect_keeps_no_request(engine: Engine) -> None:
    """An agent that is down (its port closed): the failure kept until the next poll is the
    engine's own error, not the HTTP client's behind it (raised ``from None``: never shown),
    which holds the request, its headers and the socket's -- some kilobytes a task, for every
    task of the agent, for as long as it is down."""
    with Peer() as doomed:
        view = await engine.start_task(doomed.base_url, skill="slow", text="slow 5")
    pace = Pace.start(engine.config, now=0.0)

    await engine.follow_step(view.task, await engine.records.state(view.task), pace)

    kept = pace.unreachable
    assert isinstance(kept, EndpointUnreachableError)
    assert "network error" in str(kept)  # the connection was refused, not answered
    assert (kept.__cause__, kept.__context__, kept.__traceback__) == (None, None, None)


@pytest.fixture
def old_endpoint(peer: Peer) -> Iterator[MovableEndpoint]:
    """The agent's JSON-RPC endpoint as the card first advertises it: a relay that can retire."""
    with MovableEndpoint(peer.jsonrpc_url) as relay:
        peer.mutate_card(point_jsonrpc_at(relay.url))
        yield relay


# 1.3 only: the relay's log is asserted in 1.0 JSON-RPC method names.
async def test_bare_404_at_a_moved_endpoint_prompts_the_r9_check_and_the_task_follows(
    peer: Peer, engine: Engine, old_endpoint: MovableEndpoint
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.6")
    assert (await engine.poll(view.task)).state == "working"
    assert old_endpoint.relayed == ["SendMessage", "GetTask"]
    # Seed 002 #2: the vendor moves the endpoint; the old URL answers a bare 404.
    peer.mutate_card(point_jsonrpc_at(peer.jsonrpc_url))
    old_endpoint.gone = True

    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW
    assert old_endpoint.refused == ["GetTask"]  # one 404, then the R9 check moved the task
    [unreachable] = data_of(engine.store, view.task, ev.ENDPOINT_UNREACHABLE)
    assert "404" in unreachable["detail"]
    [moved] = data_of(engine.store, view.task, ev.ENDPOINT_MOVED)
    assert (moved["old"]["url"], moved["new"]["url"]) == (old_endpoint.url, peer.jsonrpc_url)
    recorded = types(engine.store, view.task)
    assert recorded.index(ev.ENDPOINT_UNREACHABLE) < recorded.index(ev.ENDPOINT_MOVED)
    assert calls(peer, "CancelTask") == 0


# 1.3 only: it shares old_endpoint, the relay in front of the 1.3 agent, with the test above.
async def test_cancel_at_a_moved_endpoint_is_unreachable_not_task_not_found(
    peer: Peer, engine: Engine, old_endpoint: MovableEndpoint
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 2")
    assert (await engine.poll(view.task)).state == "working"
    peer.mutate_card(point_jsonrpc_at(peer.jsonrpc_url))
    old_endpoint.gone = True

    with pytest.raises(EndpointUnreachableError) as caught:
        await engine.cancel(view.task)  # incident 002: this 404 was read as "task not found"

    assert not isinstance(caught.value, RemoteRefusedError)
    assert (await engine.task(view.task)).state == "working"
    [unreachable] = data_of(engine.store, view.task, ev.ENDPOINT_UNREACHABLE)
    assert unreachable["during"] == "cancel"
    assert calls(peer, "CancelTask") == 0  # it never reached the agent

    await engine.resume(view.task)  # the R9 check the error prompts
    canceled = await engine.cancel(view.task)

    assert canceled.state == "canceled"
    assert calls(peer, "CancelTask") == 1
    assert ev.ENDPOINT_MOVED in types(engine.store, view.task)


async def test_failed_without_diagnostic_is_terminal_and_never_retried(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="fail", text="fail")
    done = await engine.drive(view.task, until="terminal", timeout=5)
    assert done.state == "failed"
    assert done.last_message is None
    sent = list(agent.calls)

    again = await engine.drive(view.task, until="terminal", timeout=5)
    resumed = await engine.resume(view.task)

    assert again.state == resumed.state == "failed"
    assert agent.calls == sent  # no further SendMessage or GetTask for it
    assert calls(agent, "SendMessage") == 1
    assert [to for _, to in transitions(engine.store, view.task)].count("failed") == 1
    assert ev.FLAGGED_FOR_REVIEW not in types(engine.store, view.task)  # the card did not move


async def test_failed_without_diagnostic_after_a_card_change_is_flagged_for_revision_skew(
    agent: Agent, engine: Engine
) -> None:
    view = await engine.start_task(agent.base_url, skill="fail", text="fail")
    agent.mutate_card(drop_skill("fail"))  # the vendor rolled a new card (incident 002)
    fresh = await engine.discovery.read(agent.base_url, fresh=True)

    done = await engine.drive(view.task, until="terminal", timeout=5)
    sent = len(agent.calls)
    await engine.drive(view.task, until="terminal", timeout=5)

    assert done.state == "failed"
    flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
    [skew] = [f for f in flagged if f["reason"] == "revision_skew"]
    assert skew["revision"] == fresh.revision
    assert "revision_skew" in done.flags
    assert len(agent.calls) == sent  # still terminal, still not retried


async def test_failed_with_a_diagnostic_after_a_card_change_is_not_flagged(
    agent: Agent, engine: Engine
) -> None:
    def add_fail_diag(card: dict[str, Any]) -> None:
        card["skills"].append({**card["skills"][-1], "id": "fail-diag", "name": "Fail loudly"})

    agent.mutate_card(add_fail_diag)
    view = await engine.start_task(agent.base_url, skill="fail-diag", text="fail-diag boom")
    agent.mutate_card(lambda card: card.update(version="9.9.9"))
    await engine.discovery.read(agent.base_url, fresh=True)

    done = await engine.drive(view.task, until="terminal", timeout=5)

    assert done.state == "failed"
    assert done.last_message is not None
    assert "boom" in done.last_message
    assert "revision_skew" not in done.flags


# -- R12: observations are applied in order, exactly once -----------------------------------------


async def test_redelivered_webhook_changes_nothing(agent: Agent, db_url: str) -> None:
    with PushReceiver() as hook:
        async with audited_engine(db_url) as engine:
            view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.3")
            assert (await engine.register_webhook(view.task, hook.url)).registered
            await wait_until(lambda: "TASK_STATE_COMPLETED" in hook.states_delivered())

            first = [await engine.deliver(body, headers) for body, headers in hook.deliveries]
            await engine.settle()  # the closing read the completing push started
            applied = state_of(engine, view.task)
            changed = transitions(engine.store, view.task)
            again = [await engine.deliver(body, headers) for body, headers in hook.deliveries]

            assert applied["state"] == "completed"
            assert {d.status for d in first + again} == {200}
            assert "applied" in {d.outcome for d in first}
            assert {d.outcome for d in again} <= {"duplicate", "ignored"}
            completed = next(
                n
                for n, (body, _) in enumerate(hook.deliveries)
                if delivered_state(body) == "TASK_STATE_COMPLETED"
            )
            assert again[completed].outcome == "duplicate"
            assert transitions(engine.store, view.task) == changed
            assert [to for _, to in changed].count("completed") == 1
            after = state_of(engine, view.task)
            for field in ("state", "remote_timestamp", "artifacts", "transitions", "webhook"):
                assert after[field] == applied[field]
            assert types(engine.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
            # One closing read after a 1.0 agent's status push; none after a 0.3 agent's, which
            # pushes the whole task. Redeliveries read nothing.
            closing = 0 if wire_version(agent).startswith("0.") else 1
            assert calls(agent, "GetTask") == closing


# 1.3 only: the pushes are crafted as 1.0 StreamResponse bodies, which a 0.3 agent never sends.
@pytest.mark.parametrize(
    ("state", "offset", "reason", "outcome"),
    [
        ("working", -1.0, "stale", "stale"),  # the agent's earlier push, arriving late
        ("input-required", 0.0, "duplicate", "duplicate"),  # the same report again
        ("submitted", 1.0, "illegal", "ignored"),  # nothing goes back to submitted
        ("unspecified", 1.0, "unknown_state", "ignored"),  # `unknown` changes nothing
    ],
)
async def test_push_that_is_not_newer_or_not_legal_is_ignored_with_its_reason(
    peer: Peer, engine: Engine, hook: PushReceiver, state: str, offset: float, reason: str,
    outcome: str,
) -> None:  # fmt: skip
    view = await engine.start_task(peer.base_url, skill="ask", text="ask")
    registered = await engine.register_webhook(view.task, hook.url)
    assert registered.registered
    waiting = await engine.drive(view.task, until="interrupted", timeout=5)
    assert waiting.state == "input-required"
    watermark = state_of(engine, view.task)["remote_timestamp"]
    applied_at = datetime.fromisoformat(watermark)
    before = transitions(engine.store, view.task)

    body = status_update_body(
        view.remote_task_id or "", view.context_id, state, applied_at + timedelta(seconds=offset)
    )
    delivery = await engine.deliver(body, headers_for(registered))

    assert (delivery.status, delivery.outcome) == (200, outcome)
    ignored = data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)[-1]
    assert (ignored["reason"], ignored["source"]) == (reason, "push")
    assert (await engine.task(view.task)).state == "input-required"
    assert state_of(engine, view.task)["remote_timestamp"] == watermark  # not moved
    assert transitions(engine.store, view.task) == before


async def test_push_and_poll_racing_record_each_transition_once(agent: Agent, db_url: str) -> None:
    with PushReceiver() as hook:
        async with audited_engine(db_url) as engine:
            hook.forward_to(engine)
            view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.5")
            assert (await engine.register_webhook(view.task, hook.url)).registered

            done = await engine.drive(view.task, until="terminal", timeout=10)
            await wait_until(lambda: "TASK_STATE_COMPLETED" in hook.states_delivered())
            await wait_until(lambda: len(hook.answers) == len(hook.deliveries))

            assert done.state == "completed"
            changed = transitions(engine.store, view.task)
            targets = [to for _, to in changed]
            assert len(targets) == len(set(targets))  # each transition recorded once
            assert targets[-1] == "completed"
            assert changed in (SLOW, [("submitted", "completed")])
            assert {a.status for a in hook.answers} == {200}
            sources = {d["source"] for d in data_of(engine.store, view.task, ev.STATE_CHANGED)}
            assert sources <= {"poll", "push", "send"}


REFUSALS = [
    # (case, status): every one of them is refused before anything is written.
    ("wrong_token", 401),
    ("missing_token", 401),
    ("wrong_authorization", 401),
    ("missing_authorization", 401),
    ("unknown_task", 404),
    ("task_without_webhook", 404),
    ("five_megabytes", 413),
    ("text_plain", 415),
    ("malformed_json", 400),
    ("not_a_stream_response", 400),
]


# 1.3 only: the pushes are crafted as 1.0 StreamResponse bodies, which a 0.3 agent never sends.
@pytest.mark.parametrize(("case", "status"), REFUSALS)
async def test_refused_delivery_writes_nothing(
    peer: Peer, engine: Engine, hook: PushReceiver, case: str, status: int
) -> None:
    view = await engine.start_task(peer.base_url, skill="ask", text="ask")
    outcome = await engine.register_webhook(
        view.task, hook.url, auth_scheme="Bearer", auth_credentials="hook-secret"
    )
    assert outcome.registered
    plain = await engine.start_task(peer.base_url, skill="ask", text="ask")
    now = datetime.now(UTC)
    remote = view.remote_task_id or ""
    valid_body = status_update_body(remote, view.context_id, "input-required", now)
    valid_headers = push_headers(outcome.token, authorization="Bearer hook-secret")
    body, headers = valid_body, dict(valid_headers)
    if case == "wrong_token":
        headers["x-a2a-notification-token"] = "not-the-token"
    elif case == "missing_token":
        del headers["x-a2a-notification-token"]
    elif case == "wrong_authorization":
        headers["authorization"] = "Bearer guessed"
    elif case == "missing_authorization":
        del headers["authorization"]
    elif case == "unknown_task":
        body = status_update_body("no-such-remote-task", view.context_id, "working", now)
    elif case == "task_without_webhook":
        body = status_update_body(plain.remote_task_id or "", plain.context_id, "working", now)
    elif case == "five_megabytes":
        body = b'{"statusUpdate": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    elif case == "text_plain":
        headers["content-type"] = "text/plain"
    elif case == "malformed_json":
        body = b'{"statusUpdate": {"taskId": '
    elif case == "not_a_stream_response":
        body = json.dumps({"hello": "world"}).encode()
    marks = write_marks(engine.store)
    snapshot = state_of(engine, view.task)

    delivery = await engine.deliver(body, headers)

    assert (delivery.status, delivery.outcome) == (status, "refused")
    assert write_marks(engine.store) == marks
    assert state_of(engine, view.task) == snapshot
    assert snapshot["webhook"]["status"] == "provisional"  # a refused delivery confirms nothing
    # The same delivery without the defect is applied: the refusal was for that defect alone.
    accepted = await engine.deliver(valid_body, valid_headers)
    assert (accepted.status, accepted.outcome) == (200, "applied")
    assert state_of(engine, view.task)["webhook"]["status"] == "confirmed"


# -- R6 and R11 apply to pushed observations too (R12: whatever the source) ----------------------


# 1.3 only: the push is crafted as a 1.0 StreamResponse body, which a 0.3 agent never sends.
async def test_failed_without_diagnostic_by_push_after_a_card_change_is_flagged_for_revision_skew(
    peer: Peer, engine: Engine, hook: PushReceiver
) -> None:
    view = await engine.start_task(peer.base_url, skill="ask", text="ask")
    outcome = await engine.register_webhook(view.task, hook.url)
    assert outcome.registered
    await engine.drive(view.task, until="interrupted", timeout=5)
    peer.mutate_card(drop_skill("fail"))  # the vendor rolled a new card (incident 002)
    fresh = await engine.discovery.read(peer.base_url, fresh=True)
    applied_at = datetime.fromisoformat(state_of(engine, view.task)["remote_timestamp"])

    failed = status_update_body(
        view.remote_task_id or "", view.context_id, "failed", applied_at + timedelta(seconds=1)
    )
    delivery = await engine.deliver(failed, headers_for(outcome))

    assert (delivery.status, delivery.outcome) == (200, "applied")
    assert (await engine.task(view.task)).state == "failed"
    flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
    assert [(f["reason"], f["revision"]) for f in flagged] == [("revision_skew", fresh.revision)]


# 1.3 only: the push is crafted as a 1.0 StreamResponse body, which a 0.3 agent never sends.
async def test_boundary_crossed_by_a_push_rechecks_the_card_and_downgrades(
    peer: Peer, db: str, hook: PushReceiver
) -> None:
    config = dataclasses.replace(FAST, max_card_age=60.0)  # only the boundary re-check may tell
    async with audited_engine(db, config) as engine:
        view = await engine.start_task(peer.base_url, skill="ask", text="ask")
        outcome = await engine.register_webhook(view.task, hook.url)
        assert outcome.registered
        assert state_of(engine, view.task)["state"] == "submitted"
        peer.mutate_card(withdraw_push)

        working = status_update_body(
            view.remote_task_id or "", view.context_id, "working", datetime.now(UTC)
        )
        delivery = await engine.deliver(working, headers_for(outcome))
        await engine.settle()

        assert (delivery.status, delivery.outcome) == (200, "applied")
        assert transitions(engine.store, view.task) == [("submitted", "working")]
        recorded = types(engine.store, view.task)
        assert ev.DELIVERY_DOWNGRADED in recorded
        assert recorded.index(ev.DELIVERY_DOWNGRADED) > recorded.index(ev.STATE_CHANGED)
        assert state_of(engine, view.task)["delivery_mode"] == "polling"


async def test_boundary_recheck_decides_on_the_task_as_it_is_when_its_outcome_is_appended(
    peer: Peer, db: str, hook: PushReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(FAST, max_card_age=60.0)
    async with audited_engine(db, config) as engine:
        view = await engine.start_task(peer.base_url, skill="ask", text="ask")
        outcome = await engine.register_webhook(view.task, hook.url)
        assert outcome.registered
        peer.mutate_card(withdraw_push)
        read_card = engine.connections.read

        async def read_while_another_report_downgrades(*args: Any, **kwargs: Any) -> Any:
            read = await read_card(*args, **kwargs)
            # While the re-check's card read was in flight, the task went to polling already.
            meanwhile = guards.downgrade("push_withdrawn", "seen first by another report")
            await engine.records.record(view.task, [meanwhile])
            return read

        monkeypatch.setattr(engine.connections, "read", read_while_another_report_downgrades)
        working = status_update_body(
            view.remote_task_id or "", view.context_id, "working", datetime.now(UTC)
        )
        delivery = await engine.deliver(working, headers_for(outcome))
        await engine.settle()

        assert (delivery.status, delivery.outcome) == (200, "applied")
        assert state_of(engine, view.task)["delivery_mode"] == "polling"
        assert types(engine.store, view.task).count(ev.DELIVERY_DOWNGRADED) == 1


# -- crash safety: recorded before sending; resume finds what was sent ----------------------------


# 1.3 only: resume asks ListTasks first, which 0.3 does not have (test_wire03 covers 0.3).
async def test_task_is_recorded_before_sending_and_resume_sends_it_when_it_never_arrived(
    peer: Peer, engine: Engine
) -> None:
    peer.set_endpoint_gone(True)  # the card reads fine; the A2A endpoint answers a plain 404

    with pytest.raises(EndpointUnreachableError):
        await engine.start_task(peer.base_url, skill="echo", text="echo kept")

    [pending] = await engine.tasks()
    assert (pending.state, pending.remote_task_id) == ("submitted", None)
    assert types(engine.store, pending.task) == [ev.TASK_SUBMITTED, ev.ENDPOINT_UNREACHABLE]
    submitted = data_of(engine.store, pending.task, ev.TASK_SUBMITTED)[0]

    peer.set_endpoint_gone(False)
    resumed = await engine.resume(pending.task)
    done = await engine.drive(resumed.task, until="terminal", timeout=5)

    assert done.state == "completed"
    assert done.remote_task_id is not None
    methods = [m for _, m in peer.calls]
    assert methods[methods.index("ListTasks") + 1] == "SendMessage"  # asked first, then sent
    assert calls(peer, "SendMessage") == 2  # the one that hit the 404, then the resent one
    assert [a["parts"][0]["text"] for a in done.artifacts] == ["kept"]
    assert submitted["message_id"].startswith("m-")


# 1.3 only: the task is found through ListTasks, which 0.3 does not have.
async def test_resume_binds_the_remote_task_found_through_list_tasks(
    peer: Peer, engine: Engine
) -> None:
    peer.set_endpoint_gone(True)
    with pytest.raises(EndpointUnreachableError):
        await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
    [pending] = await engine.tasks()
    [recorded] = data_of(engine.store, pending.task, ev.TASK_SUBMITTED)
    peer.set_endpoint_gone(False)
    # The crash fell between send and record: the message reached the agent, its answer did not.
    transport = A2ATransport(engine.client, Interface(peer.jsonrpc_url, JSONRPC, "1.0"))
    remote = await transport.send_message(
        message=submitted_message(engine.log.first_event(pending.task)),
        message_id=recorded["message_id"],
        context_id=recorded["context_id"],
        metadata={"skillId": "slow"},
    )
    sent = calls(peer, "SendMessage")

    resumed = await engine.resume(pending.task)
    done = await engine.drive(resumed.task, until="terminal", timeout=10)

    assert resumed.remote_task_id == remote.id  # type: ignore[union-attr]
    assert ("JSONRPC", "ListTasks") in peer.calls
    assert calls(peer, "SendMessage") == sent  # found, not sent twice
    assert done.state == "completed"
    assert (await engine.task(remote.id)).task == pending.task  # type: ignore[union-attr]


async def test_resume_after_a_restart_with_an_unchanged_card_drives_to_completion(
    agent: Agent, engine: Engine, db: str
) -> None:
    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.4")
    await asyncio.sleep(0)  # nothing else: the process "dies" here

    async with audited_engine(db) as restarted:
        resumed = await restarted.resume(view.task[:8])  # an unambiguous prefix
        done = await restarted.drive(resumed.task, until="terminal", timeout=10)

        assert done.state == "completed"
        assert transitions(restarted.store, view.task) == SLOW
        recorded = types(restarted.store, view.task)
        assert ev.TASK_ORPHANED not in recorded
        assert ev.ENDPOINT_MOVED not in recorded
