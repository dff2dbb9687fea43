"""cardfence against the official a2a-sdk 0.3.26 agent (`support.Peer03`, a subprocess in a venv of
its own): the engine drives each of its scripts over both 0.3 bindings, as it drives a 1.0 agent,
and every store ends with a clean audit (R13). What the transport sends and reads there is
``engine/wire/_v03.py``'s (docs/wire.md, "A2A 0.3 on the wire").

Also against the real agents: 0.3 push bodies (the whole task, a token and no Authorization),
streams (``tasks/resubscribe``), the bare mode ``text`` of a 0.3 card and ``--media-type``, the
missing ListTasks at resume, a card declaring a version nobody speaks, and protocol mismatches
both ways (a 0.3 agent whose card says 1.0; the a2a-sdk 1.3 agent whose card says 0.3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import Peer, Peer03
from support.engine_fixtures import (
    FAST,
    PushReceiver,
    audited_engine,
    data_of,
    state_of,
    transitions,
    types,
    wait_until,
)

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.core.messages import submitted_message
from cardfence.engine.core.parts import media_type_of
from cardfence.engine.errors import (
    CreationRefusedError,
    EndpointUnreachableError,
    OperationUnsupportedError,
    ProtocolMismatchError,
    ProtocolUnsupportedError,
    SkillUnavailableError,
)
from cardfence.store.event_store import EventStore

BINDINGS = ("JSONRPC", "HTTP+JSON")
# What the agent logs for a JSON-RPC method 0.3 lacks, or an HTTP+JSON path it does not have.
UNKNOWN = ("unknown:", "GET /", "POST /")


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


def over(binding: str, **changes: Any) -> EngineConfig:
    """FAST, on ``binding`` (the agent prefers JSON-RPC: its card's top-level url)."""
    return dataclasses.replace(FAST, prefer_bindings=(binding,), **changes)


@pytest.fixture(params=BINDINGS)
async def engine(request: pytest.FixtureRequest, db: str) -> AsyncIterator[Engine]:
    """An engine speaking to the 0.3 agent over the parametrised binding; audited at the end."""
    async with audited_engine(db, over(request.param)) as running:
        yield running


def wire_of(peer: Peer03) -> list[str]:
    """The 0.3 methods (JSON-RPC) and paths (HTTP+JSON, ``VERB /v1/...``) the agent received."""
    return [wire for _, wire in peer.wire_calls]


def binding_of(engine: Engine) -> str:
    return engine.config.prefer_bindings[0]


# -- each script, both bindings --------------------------------------------------------------------


async def test_echo_completes_with_its_artifact(peer03: Peer03, engine: Engine) -> None:
    view = await engine.start_task(peer03.base_url, skill="echo", text="echo hi")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert [a["parts"][0]["text"] for a in done.artifacts] == ["hi"]
    [submitted] = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    binding = binding_of(engine)
    url = peer03.jsonrpc_url if binding == "JSONRPC" else peer03.rest_url
    assert submitted["endpoint"] == {"url": url, "binding": binding, "protocol_version": "0.3.0"}
    wire = wire_of(peer03)
    assert wire[0] == ("message/send" if binding == "JSONRPC" else "POST /v1/message:send")
    assert [method for _, method in peer03.calls if method.startswith(UNKNOWN)] == []


async def test_ask_then_reply_completes(peer03: Peer03, engine: Engine) -> None:
    view = await engine.start_task(peer03.base_url, skill="ask", text="ask colour?")
    asked = await engine.drive(view.task, until="interrupted", timeout=10)
    assert asked.state == "input-required"

    await engine.reply(view.task, "blue")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert [a["parts"][0]["text"] for a in done.artifacts] == ["answer: blue"]
    reached = [to for _, to in transitions(engine.store, view.task)]
    assert reached[reached.index("input-required") :][-1] == "completed"
    assert ev.REPLY_SENT in types(engine.store, view.task)


async def test_slow_then_cancel_ends_canceled_by_the_agent(peer03: Peer03, engine: Engine) -> None:
    peer03.hold()  # working until released: the cancel always finds it live
    view = await engine.start_task(peer03.base_url, skill="slow", text="slow 1")

    await engine.cancel(view.task)
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "canceled"
    assert transitions(engine.store, view.task)[-1][1] == "canceled"
    assert ev.CANCEL_REQUESTED in types(engine.store, view.task)


async def test_fail_ends_failed(peer03: Peer03, engine: Engine) -> None:
    view = await engine.start_task(peer03.base_url, skill="fail", text="fail")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "failed"
    assert transitions(engine.store, view.task)[-1][1] == "failed"


# -- streams and pushes ---------------------------------------------------------------------------


def subscribed(wire: str) -> bool:
    return wire == "tasks/resubscribe" or (wire.startswith("GET /v1/") and ":subscribe" in wire)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_stream_is_followed_with_tasks_resubscribe(
    peer03: Peer03, db: str, binding: str
) -> None:
    peer03.hold()  # working until the stream is open
    async with audited_engine(
        db, over(binding, max_poll_interval=1.0, follow_streams=True)
    ) as engine:
        view = await engine.start_task(peer03.base_url, skill="slow", text="slow 0.1")
        driving = asyncio.create_task(engine.drive(view.task, until="terminal", timeout=20))
        await wait_until(lambda: any(map(subscribed, wire_of(peer03))), 10, "a subscription")
        peer03.release()
        done = await driving

    assert done.state == "completed"
    assert done.artifacts[0]["parts"][0]["text"] == "slept 0.1s"
    assert [method for _, method in peer03.calls if method.startswith(UNKNOWN)] == []


@pytest.mark.parametrize("binding", BINDINGS)
async def test_pushes_of_the_whole_task_are_applied(peer03: Peer03, db: str, binding: str) -> None:
    with PushReceiver() as hook:
        async with audited_engine(db, over(binding, max_poll_interval=5.0)) as engine:
            hook.forward_to(engine)
            view = await engine.start_task(peer03.base_url, skill="slow", text="slow 1")
            outcome = await engine.register_webhook(view.task, hook.url)
            done = await engine.drive(view.task, until="terminal", timeout=15)
            await wait_until(lambda: len(hook.answers) == len(hook.deliveries) > 0)

    assert outcome.registered
    assert outcome.authorization is None  # a2a-sdk 0.3 never sends one: none is asked for
    assert state_of(engine, view.task)["webhook"]["auth_sha256"] is None
    assert done.state == "completed"
    bodies = [json.loads(body) for body, _ in hook.deliveries]
    assert all(b["kind"] == "task" for b in bodies)  # the whole task, as 0.3 pushes it
    assert all(a.status == 200 for a in hook.answers)
    assert any(a.outcome == "applied" for a in hook.answers)
    pushed = [
        d for d in data_of(engine.store, view.task, ev.STATE_CHANGED) if d["source"] == "push"
    ]
    assert pushed, "no transition came by push"


# -- media types -----------------------------------------------------------------------------------


async def test_the_bare_word_text_accepts_text_types_only(peer03: Peer03, engine: Engine) -> None:
    """Skill ``ask`` of the 0.3 agent declares the bare input mode ``text``."""
    view = await engine.start_task(
        peer03.base_url, skill="ask", text="ask *colour*?", media_type="text/markdown"
    )
    asked = await engine.drive(view.task, until="interrupted", timeout=10)
    assert asked.state == "input-required"
    submitted = engine.log.first_event(view.task)  # its content read back (R17)
    assert [part.media_type for part in submitted_message(submitted).parts] == ["text/markdown"]

    sent_before = len(peer03.wire_calls)
    with pytest.raises(SkillUnavailableError, match="does not accept application/json"):
        await engine.start_task(
            peer03.base_url, skill="ask", text='{"a": 1}', media_type="application/json"
        )
    assert len(peer03.wire_calls) == sent_before  # nothing was sent


def cardfence_run(
    peer: Peer03, db: str, skill: str, *options: str
) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "cardfence", "run", peer.base_url, "--skill", skill, *options]
    run += ["--max-poll-interval", "0.2", "--json", "--db", db]
    return subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)


def test_cli_run_sends_the_media_type_it_is_given(peer03: Peer03, db: str) -> None:
    """``ask`` takes the bare mode ``text``; ``echo`` ``text/plain`` only."""
    asked = cardfence_run(
        peer03, db, "ask", "--text", "ask *why*?", "--media-type", "text/markdown"
    )
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["state"] == "input-required"
    assert stored_media_types(db) == ["text/markdown"]

    refused = cardfence_run(
        peer03, db, "echo", "--text", "echo # x", "--media-type", "text/markdown"
    )
    assert refused.returncode == 3
    assert "does not accept text/markdown (accepts: text/plain)" in refused.stderr
    assert stored_media_types(db) == ["text/markdown"]  # nothing recorded, nothing sent


def stored_media_types(db: str) -> list[str]:
    """The media type every task of the store was created with (its message's one part)."""
    with EventStore.open(db) as store:
        log = TaskLog(store)
        first = [log.first_event(head.key) for head in log.all()]  # content read back (R17)
    return [media_type_of(submitted_message(doc).parts[0]) for doc in first]


# -- what 0.3 lacks, and versions ------------------------------------------------------------------


async def test_resume_cannot_tell_without_list_tasks_and_sends_nothing(
    peer03: Peer03, engine: Engine
) -> None:
    peer03.set_endpoint_gone(True)  # the card reads fine; the A2A endpoint answers a plain 404
    with pytest.raises(EndpointUnreachableError):
        await engine.start_task(peer03.base_url, skill="echo", text="echo lost?")
    [pending] = await engine.tasks()
    peer03.set_endpoint_gone(False)
    peer03.reset()

    with pytest.raises(OperationUnsupportedError, match=r"ListTasks is not part of A2A 0\.3"):
        await engine.resume(pending.task)

    assert peer03.wire_calls == []  # neither asked (0.3 cannot) nor sent again
    assert (await engine.task(pending.task)).state == "submitted"
    assert types(engine.store, pending.task) == [ev.TASK_SUBMITTED, ev.ENDPOINT_UNREACHABLE]


async def test_a_card_in_a_version_nobody_speaks_is_refused_before_sending(
    peer03: Peer03, db: str
) -> None:
    peer03.mutate_card(lambda card: card.update(protocolVersion="2.0"))
    async with audited_engine(db) as engine:
        with pytest.raises(ProtocolUnsupportedError, match=r"declares '2\.0'"):
            await engine.start_task(peer03.base_url, skill="echo", text="echo hi")
        assert await engine.tasks() == []
    assert peer03.wire_calls == []


async def test_a_03_agent_whose_card_says_10_is_a_named_mismatch(peer03: Peer03, db: str) -> None:
    peer03.mutate_card(lambda card: card.update(protocolVersion="1.0"))
    async with audited_engine(db) as engine:
        with pytest.raises(CreationRefusedError) as raised:
            await engine.start_task(peer03.base_url, skill="echo", text="echo hi")
    assert isinstance(raised.value.__cause__, ProtocolMismatchError)
    detail = str(raised.value)
    assert "the card says A2A 1.0, the endpoint speaks another version (0.3 perhaps)" in detail
    assert "SendMessage, which 0.3 calls message/send" in detail
    assert peer03.calls == [("JSONRPC", "unknown:SendMessage")]


async def test_a_10_agent_whose_card_says_03_is_a_named_mismatch(db: str) -> None:
    def declare_03(card: dict[str, Any]) -> None:
        for interface in card["supportedInterfaces"]:
            interface["protocolVersion"] = "0.3"

    with Peer() as peer:
        peer.mutate_card(declare_03)
        async with audited_engine(db) as engine:
            with pytest.raises(CreationRefusedError) as raised:
                await engine.start_task(peer.base_url, skill="echo", text="echo hi")
    assert isinstance(raised.value.__cause__, ProtocolMismatchError)
    detail = str(raised.value)
    assert "the card says A2A 0.3, the endpoint speaks another version (1.0 perhaps)" in detail
    assert "message/send, which 1.0 calls SendMessage" in detail


async def test_over_http_json_a_mismatch_is_a_bare_404_never_task_not_found(
    peer03: Peer03, db: str
) -> None:
    """Neither version's HTTP+JSON server knows the other's paths: R11 reads the bare 404."""
    peer03.mutate_card(lambda card: card.update(protocolVersion="1.0"))
    async with audited_engine(db, over("HTTP+JSON")) as engine:
        with pytest.raises(EndpointUnreachableError) as raised:
            await engine.start_task(peer03.base_url, skill="echo", text="echo hi")
        [pending] = await engine.tasks()
    assert raised.value.status == 404
    assert pending.state == "submitted"  # an unknown outcome, not a refusal
    assert peer03.wire_calls == [("REST", "POST /message:send")]  # 1.0's path, unknown to 0.3
