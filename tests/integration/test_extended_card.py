"""R15's authenticated extended card against a real a2a-sdk 1.3 agent (`ExtendedPeer`).

The public card says ``capabilities.extendedAgentCard`` and lacks ``slow``; the extended card
(``GetExtendedAgentCard``) lists it. A task of ``slow`` is created under the extended card, read
with the credentials of the card's own requirements, and its checks afterwards (R7, R9) read that
card again with the task's credentials: the public card lacking the skill never flags or orphans
it. An extended card that cannot be read leaves the public card alone to decide. Every engine
block ends with the audit (replay == projection, chains intact, snapshots present).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.engine_fixtures import (
    FAST,
    agent_events,
    audited_engine,
    calls,
    data_of,
    restored,
    state_of,
    transitions,
    types,
)
from support.extended_peer import EXTENDED_ONLY, ExtendedPeer

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.cli._app import exit_code_for
from cardfence.engine.cli.main import run as cli
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import card_urls
from cardfence.engine.errors import (
    DeadlineExceeded,
    EndpointUnreachableError,
    SkillUnavailableError,
)
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.event_store import EventStore

SLOW = [("submitted", "working"), ("working", "completed")]
TOKEN = "t-extended"
WIRE = {JSONRPC: "JSONRPC", HTTP_JSON: "REST"}  # binding -> how the agent's call log names it


@pytest.fixture(scope="module")
def shared_extended() -> Iterator[ExtendedPeer]:
    with ExtendedPeer() as running:
        yield running


@pytest.fixture
def peer(shared_extended: ExtendedPeer) -> Iterator[ExtendedPeer]:
    with restored(shared_extended) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def shared_unconfigured() -> Iterator[ExtendedPeer]:
    """Says ``extendedAgentCard: true`` but serves none: -32007 ExtendedAgentCardNotConfigured."""
    with ExtendedPeer(configured=False) as running:
        yield running


@pytest.fixture
def unconfigured(shared_unconfigured: ExtendedPeer) -> Iterator[ExtendedPeer]:
    with restored(shared_unconfigured) as fresh:
        yield fresh


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


def config(peer: ExtendedPeer, binding: str = JSONRPC) -> EngineConfig:
    """FAST, with the bearer token both cards require, preferring ``binding``."""
    token = CredentialsConfig.of({peer.base_url: {"bearer": Bearer(TOKEN)}})
    return dataclasses.replace(FAST, credentials=token, prefer_bindings=(binding,))


def fetched(store: EventStore, peer: ExtendedPeer, *, extended: bool) -> list[dict[str, object]]:
    return [
        data
        for type_, data in agent_events(store, peer)
        if type_ == ev.CARD_FETCHED and bool(data.get("extended")) == extended
    ]


def agent_state(store: EventStore, peer: ExtendedPeer) -> dict[str, object]:
    head = store.stream(ev.agent_stream_id(card_urls(peer.base_url)[0]))
    assert head is not None
    return head.state


def credentials_file(tmp_path: Path, peer: ExtendedPeer) -> str:
    path = tmp_path / "credentials.toml"
    path.write_text(f'[agents."{peer.base_url}"]\nbearer = {{ token = "{TOKEN}" }}\n')
    os.chmod(path, 0o600)
    return str(path)


# -- creation: the extended card's skills count (R2), and the task is frozen under it --------------


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_a_skill_only_on_the_extended_card_is_created_under_it_and_completes(
    peer: ExtendedPeer, db: str, binding: str
) -> None:
    async with audited_engine(db, config(peer, binding)) as engine:
        view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
        done = await engine.drive(view.task, until="terminal", timeout=10)
        await engine.settle()

        assert done.state == "completed"
        assert transitions(engine.store, view.task) == SLOW
        public = fetched(engine.store, peer, extended=False)[0]
        extended = fetched(engine.store, peer, extended=True)[0]
        assert EXTENDED_ONLY not in [skill for skill, _ in peer.skills()]  # the public card's
        # The extended card: read over the task's interface with the card's bearer token,
        # recorded, stored as a snapshot of its own, and the revision the task is frozen under.
        assert calls(peer, "GetExtendedAgentCard", WIRE[binding]) == 1
        assert peer.extended_authorizations == [f"Bearer {TOKEN}"]
        assert extended["binding"] == binding
        assert extended["url"] == (
            peer.jsonrpc_url if binding == JSONRPC else peer.rest_url + "/extendedAgentCard"
        )
        assert extended["public_revision"] == public["revision"]
        assert view.card_revision == extended["revision"] != public["revision"]
        snapshot = engine.store.get_snapshot(view.card_revision)
        assert snapshot is not None
        card = parse_card(snapshot.body.encode())
        assert EXTENDED_ONLY in [skill.id for skill in card.skills]
        [submitted] = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
        assert submitted["extended"] is True
        assert submitted["public_revision"] == public["revision"]
        assert submitted["skill_hash"] == card.compatibility_hash(EXTENDED_ONLY)
        assert submitted["contract_hash"] == card.contract_hash
        assert submitted["endpoint"]["binding"] == binding
        assert submitted["authorization"]["schemes"] == ["bearer"]
        # The agent's projection keeps the public card; the extended one beside it.
        state = agent_state(engine.store, peer)
        assert state["revision"] == public["revision"]
        assert state["pinned_contract"] == submitted["public_contract_hash"]
        assert state["extended_revision"] == extended["revision"]
        assert state["reads"] == 1
        assert calls(peer, "SendMessage", WIRE[binding]) == 1


async def test_a_public_skill_of_a_card_with_an_extended_card_is_frozen_under_the_extended_one(
    peer: ExtendedPeer, db: str
) -> None:
    async with audited_engine(db, config(peer)) as engine:
        view = await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        done = await engine.drive(view.task, until="terminal", timeout=10)

        assert done.state == "completed"
        assert view.card_revision == fetched(engine.store, peer, extended=True)[0]["revision"]
        assert state_of(engine, view.task)["extended"] is True


# -- R7 and R9: the extended card read again with the task's own credentials ----------------------


async def test_revalidation_mid_task_reads_the_extended_card_again_and_flags_nothing(
    peer: ExtendedPeer, db: str
) -> None:
    async with audited_engine(db, config(peer)) as engine:
        view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 1")
        peer.mutate_card(lambda card: card.update(version="1.0.1"))  # the public card moves on

        done = await engine.drive(view.task, until="terminal", timeout=10)
        await engine.settle()

        assert done.state == "completed"
        assert transitions(engine.store, view.task) == SLOW
        assert len(fetched(engine.store, peer, extended=True)) >= 2  # R7 read it again
        assert set(peer.extended_authorizations) == {f"Bearer {TOKEN}"}
        recorded = set(types(engine.store, view.task))
        for never in (
            ev.FLAGGED_FOR_REVIEW,
            ev.TASK_ORPHANED,
            ev.CARD_REVISION_CHANGED,
            ev.CONTRACT_DIVERGED,
            ev.DISCOVERY_UNAVAILABLE,
        ):
            assert never not in recorded
        assert done.flags == ()
        assert calls(peer, "CancelTask") == 0


async def test_resume_after_a_restart_reads_the_extended_card_and_does_not_orphan_the_task(
    peer: ExtendedPeer, db: str
) -> None:
    peer.hold()
    async with audited_engine(db, config(peer)) as engine:
        view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
        assert (await engine.poll(view.task)).state == "working"

    async with audited_engine(db, config(peer)) as restarted:  # a new process, same store
        before = len(peer.extended_authorizations)
        resumed = await restarted.resume(view.task)
        assert resumed.state == "working"
        assert peer.extended_authorizations[before:] == [f"Bearer {TOKEN}"]
        peer.release()
        done = await restarted.drive(view.task, until="terminal", timeout=10)

        assert done.state == "completed"
        assert transitions(restarted.store, view.task) == SLOW
        recorded = types(restarted.store, view.task)
        assert ev.TASK_ORPHANED not in recorded
        assert ev.ENDPOINT_MOVED not in recorded
        assert "orphaned" not in done.flags


async def test_resume_re_sends_a_creation_that_never_arrived_under_the_extended_card(
    peer: ExtendedPeer, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = A2ATransport.send_message

    async def lost(self: A2ATransport, **kwargs: object) -> object:
        raise EndpointUnreachableError(self.interface.url, "network error: connection reset")

    async with audited_engine(db, config(peer)) as engine:
        monkeypatch.setattr(A2ATransport, "send_message", lost)  # recorded, then never arrived
        with pytest.raises(EndpointUnreachableError):
            await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
        monkeypatch.setattr(A2ATransport, "send_message", sent)
        [pending] = await engine.tasks()

        resumed = await engine.resume(pending.task)  # ListTasks finds nothing: sent again
        done = await engine.drive(resumed.task, until="terminal", timeout=10)

        assert done.state == "completed"
        assert calls(peer, "SendMessage") == 1
        assert state_of(engine, pending.task)["extended"] is True


async def test_the_extended_card_unreadable_mid_task_lets_the_public_card_stand_in(
    peer: ExtendedPeer, db: str
) -> None:
    peer.hold()
    served = peer.handler.extended_agent_card
    try:
        async with audited_engine(db, config(peer)) as engine:
            view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
            assert (await engine.poll(view.task)).state == "working"
            peer.handler.extended_agent_card = None  # from now on: -32007

            resumed = await engine.resume(view.task)  # R9: never orphaned by the public card
            assert resumed.state == "working"
            with pytest.raises(DeadlineExceeded):  # held: R7 re-validates meanwhile
                await engine.drive(view.task, until="terminal", timeout=0.8)
            peer.release()
            done = await engine.drive(view.task, until="terminal", timeout=10)
            await engine.settle()

            assert done.state == "completed"
            assert transitions(engine.store, view.task) == SLOW
            recorded = set(types(engine.store, view.task))
            never = {ev.FLAGGED_FOR_REVIEW, ev.TASK_ORPHANED, ev.CARD_REVISION_CHANGED}
            assert not recorded & never
            unread = data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)
            assert {d["kind"] for d in unread} == {"extended_card"}
            assert {d["during"] for d in unread} >= {"resume", "revalidation"}
            assert all("-32007" in str(d["detail"]) for d in unread)
            assert state_of(engine, view.task)["latest_card_revision"] == view.card_revision
            assert done.flags == ("deadline_exceeded",)  # the first drive's, nothing else
    finally:
        peer.handler.extended_agent_card = served


# -- the extended card cannot be read: the public card alone decides -------------------------------


async def test_an_unconfigured_extended_card_leaves_the_public_skills_and_refuses_the_others(
    unconfigured: ExtendedPeer, db: str
) -> None:
    peer = unconfigured
    async with audited_engine(db, config(peer)) as engine:
        echo = await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        done = await engine.drive(echo.task, until="terminal", timeout=10)

        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")

        assert done.state == "completed"
        assert exit_code_for(refused.value) == 3
        message = str(refused.value)
        assert "is absent from the card" in message
        assert "the extended card could not be read" in message
        assert "-32007" in message
        assert "nothing was sent" in message
        assert calls(peer, "SendMessage") == 1  # echo's only
        # Nothing misleading: no extended read recorded, echo frozen under the public card.
        assert fetched(engine.store, peer, extended=True) == []
        assert "extended_revision" not in agent_state(engine.store, peer)
        public = fetched(engine.store, peer, extended=False)
        assert echo.card_revision == public[0]["revision"]
        [submitted] = data_of(engine.store, echo.task, ev.TASK_SUBMITTED)
        assert "extended" not in submitted
        assert "-32007" in submitted["extended_unread"]
        refusal = agent_events(engine.store, peer)[-1]
        assert refusal[0] == ev.TASK_CREATION_REFUSED
        assert refusal[1]["reason"] == "skill_absent"
        assert "-32007" in refusal[1]["detail"]


async def test_without_credentials_the_extended_card_is_not_asked_for(
    peer: ExtendedPeer, db: str
) -> None:
    async with audited_engine(db, dataclasses.replace(FAST)) as engine:
        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")

        assert "CredentialsMissingError" in str(refused.value)
        assert calls(peer, "GetExtendedAgentCard") == 0  # never asked without the token
        assert calls(peer, "SendMessage") == 0
        assert fetched(engine.store, peer, extended=True) == []


def test_run_of_a_skill_the_unreadable_extended_card_would_offer_exits_3(
    unconfigured: ExtendedPeer, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(["run", unconfigured.base_url, "--skill", EXTENDED_ONLY, "--text", "slow 0.1",
                "--credentials", credentials_file(tmp_path, unconfigured), "--db", db])  # fmt: skip

    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3, last
    assert last.startswith("SkillUnavailableError: ")
    assert "the extended card could not be read (RemoteRefusedError" in last


# -- cardfence cards shows both -----------------------------------------------------------------


def test_cards_shows_the_extended_card_beside_the_public_one(
    peer: ExtendedPeer, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = cli(["run", peer.base_url, "--skill", EXTENDED_ONLY, "--text", "slow 0.1",
               "--until", "terminal", "--credentials", credentials_file(tmp_path, peer),
               "--db", db])  # fmt: skip
    assert ran == 0, capsys.readouterr().err
    capsys.readouterr()

    assert cli(["cards", peer.base_url, "--db", db, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert cli(["cards", peer.base_url, "--db", db]) == 0
    shown = capsys.readouterr().out

    assert document["read"]["status"] == 304
    assert EXTENDED_ONLY not in document["skills"]
    extended = document["extended"]
    assert EXTENDED_ONLY in extended["skills"]
    assert extended["only_extended"] == [EXTENDED_ONLY]
    [revision] = extended["revisions"]
    assert revision["revision"] == extended["revision"]
    assert extended["revision"] != document["revisions"][-1]["revision"]
    assert len(document["revisions"]) == 1  # the extended reads are not public revisions
    assert "extended card (authenticated): revision " + extended["revision"][:12] in shown
    assert f"(only on the extended card: {EXTENDED_ONLY})" in shown


def test_cards_of_an_agent_never_read_extended_says_so(
    peer: ExtendedPeer, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["cards", peer.base_url, "--db", db, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["extended"] is None
    assert document["skills"] == [skill for skill, _ in peer.skills()]
