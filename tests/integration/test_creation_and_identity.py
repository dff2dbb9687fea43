"""R3's last paragraph, R16's remote ids and R12's answers about another task, end to end.

- A creation the agent refused with an A2A error is final (a real a2a-sdk agent refusing a media
  type with -32005; a small agent answering -32601 for the command line's exit 3).
- A re-send by ``resume`` is a creation: gated by a fresh card under the task's frozen contract,
  also when the endpoint moved to another origin (a small agent whose send times out, then
  rotates its contract).
- Remote task ids are unique per agent only: two small agents answering the same task id.
- A GetTask answer about another task, or in another context.
- A send answered with a member given twice (I-JSON, R16): bound to neither task id.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.engine_fixtures import (
    FAST,
    audited_engine,
    calls,
    data_of,
    headers_for,
    push_headers,
    state_of,
    status_update_body,
    types,
)
from support.hostile import SKILL, HostileAgent, Reply

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.cli._app import exit_code_for
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.errors import (
    ContractChangedError,
    CreationRefusedError,
    DeadlineExceeded,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.http import deadline
from cardfence.engine.wire.transport import A2ATransport
from cardfence.engine.wire.v10 import HISTORY_IDS_KEPT

CARDFENCE = shutil.which("cardfence", path=str(Path(sys.executable).parent)) or "cardfence"
CONTENT_TYPE_NOT_SUPPORTED = -32005
METHOD_NOT_FOUND = -32601
MTLS_ONLY = {
    "securitySchemes": {"mtls": {"mtlsSecurityScheme": {"description": "mTLS only"}}},
    "securityRequirements": [{"schemes": {"mtls": {"list": []}}}],
}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


@pytest.fixture
async def engine(db: str) -> AsyncIterator[Engine]:
    async with audited_engine(db) as running:
        yield running


@pytest.fixture
def agent() -> Iterator[HostileAgent]:
    with HostileAgent() as running:
        yield running


@pytest.fixture
def other_agent() -> Iterator[HostileAgent]:
    with HostileAgent() as running:
        yield running


def rpc_result(result: object) -> Callable[[object], Reply]:
    return lambda rid: Reply(
        body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()
    )


def rpc_error(code: int, message: str) -> Callable[[object], Reply]:
    error = {"code": code, "message": message}
    return lambda rid: Reply(
        body=json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode()
    )


def wire_task(task_id: str, context_id: str, state: str, at: datetime) -> dict[str, Any]:
    wire_state = "TASK_STATE_" + state.upper().replace("-", "_")
    return {
        "id": task_id,
        "contextId": context_id,
        "status": {"state": wire_state, "timestamp": at.isoformat()},
    }


def sent_messages(agent: HostileAgent) -> list[dict[str, Any]]:
    return [json.loads(r.body)["params"]["message"] for r in agent.posts("SendMessage")]


def serve_card(agent: HostileAgent, **changes: Any) -> None:
    agent.card = Reply(body=json.dumps({**agent.card_document(), **changes}).encode())


# -- R3: a creation the agent refused is final ----------------------------------------------------


async def test_creation_refused_by_the_agent_is_final_and_resume_never_sends_it_again(
    peer: Peer, engine: Engine
) -> None:
    # The served card offers JSON input for `echo`; the a2a-sdk handler, built with the card
    # that does not, refuses it: ContentTypeNotSupported, a real A2A error to a creation.
    def offer_json(card: dict[str, Any]) -> None:
        for skill in card["skills"]:
            if skill["id"] == "echo":
                skill["inputModes"] = ["text/plain", "application/json"]

    peer.mutate_card(offer_json)
    peer.validate_input_modes()

    with pytest.raises(CreationRefusedError) as caught:
        await engine.start_task(
            peer.base_url, skill="echo", text="{}", media_type="application/json"
        )

    key = caught.value.task
    assert caught.value.code == CONTENT_TYPE_NOT_SUPPORTED
    assert exit_code_for(caught.value) == 3  # docs/cli.md: "the agent refused the creation"
    [refused] = data_of(engine.store, key, ev.TASK_CREATION_REFUSED)
    assert refused["code"] == CONTENT_TYPE_NOT_SUPPORTED
    assert refused["message"]
    view = await engine.task(key)
    assert view.state == "submitted"  # no terminal state the remote did not report (R10)
    assert "never_created" in view.flags
    assert state_of(engine, key)["closed"] == "never_created"
    assert [v.task for v in await engine.tasks(state="never_created")] == [key]

    resumed = await engine.resume(key)
    driven = await engine.drive(key, until="terminal", timeout=1)

    assert (resumed.state, driven.state) == ("submitted", "submitted")
    assert calls(peer, "SendMessage") == 1  # never sent again
    assert calls(peer, "ListTasks") == 0


def test_cli_run_refused_by_the_agent_exits_3_and_resume_all_sends_nothing(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = rpc_error(METHOD_NOT_FOUND, "Method not found")
    agent.rpc["ListTasks"] = rpc_result({"tasks": []})

    def cardfence(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CARDFENCE, *args, "--db", db], capture_output=True, text=True, timeout=60
        )

    run = cardfence("run", agent.url, "--skill", SKILL, "--text", "hi", "--json")
    resumed = cardfence("resume", "--all", "--timeout", "5", "--json")
    listed = cardfence("tasks", "--json")

    assert run.returncode == 3, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("CreationRefusedError: ")
    assert resumed.returncode == 0, resumed.stderr
    assert len(agent.posts("SendMessage")) == 1
    assert agent.posts("ListTasks") == []
    [row] = json.loads(listed.stdout)["tasks"]
    assert "never_created" in row["flags"]


# -- R3: a re-send by resume is a creation -------------------------------------------------------


async def test_resend_of_an_unknown_outcome_is_gated_by_the_frozen_contract_at_a_moved_origin(
    agent: HostileAgent, other_agent: HostileAgent, db: str
) -> None:
    config = dataclasses.replace(FAST, request_timeout=0.5)
    agent.rpc["SendMessage"] = lambda rid: Reply(body=b'{"jsonrpc"', drip=0.05)  # times out
    other_agent.rpc["ListTasks"] = rpc_result({"tasks": []})
    async with audited_engine(db, config) as engine:
        with pytest.raises(EndpointUnreachableError):
            await engine.start_task(agent.url, skill=SKILL, text="hi")
        [key] = [v.task for v in await engine.tasks()]
        # Meanwhile the agent moved its endpoint to another origin and rotated its contract.
        agent.interfaces = [other_agent.rpc_url]
        serve_card(agent, **MTLS_ONLY)

        with pytest.raises(ContractChangedError):
            await engine.resume(key)

        assert other_agent.posts("SendMessage") == []  # nothing sent where it moved
        assert len(agent.posts("SendMessage")) == 1
        assert state_of(engine, key)["remote_task_id"] is None
        refusals = [e.data for e in engine.store.read_stream(ev.agent_stream_id(agent.url))]
        assert any(r.get("task") == key and r.get("reason") == "contract_changed" for r in refusals)

        # Under the task's frozen contract again: the re-send goes, to where the agent now is,
        # with the same messageId.
        agent.card = None
        resumed = await engine.resume(key)

        assert resumed.remote_task_id == "t-1"
        [first] = sent_messages(agent)
        [again] = sent_messages(other_agent)
        assert again["messageId"] == first["messageId"]
        assert again["contextId"] == first["contextId"]


async def test_resume_binds_the_task_of_its_context_whose_history_holds_the_creations_message_id(
    peer: Peer, engine: Engine
) -> None:
    peer.set_endpoint_gone(True)
    with pytest.raises(EndpointUnreachableError):
        await engine.start_task(peer.base_url, skill="echo", text="echo ours")
    [pending] = await engine.tasks()
    [recorded] = data_of(engine.store, pending.task, ev.TASK_SUBMITTED)
    peer.set_endpoint_gone(False)
    transport = A2ATransport(engine.client, Interface(peer.jsonrpc_url, JSONRPC, "1.0"))
    context = recorded["context_id"]
    # The crash fell between send and record: the creation reached the agent, its answer did
    # not. Then the conversation went on in its context: a later task, which a2a-sdk lists first.
    ours, later = [
        await transport.send_message(
            text=text, message_id=message_id, context_id=context,
            metadata={"skillId": "echo"}, return_immediately=False,
        )
        for text, message_id in (("echo ours", recorded["message_id"]), ("echo on", "m-later"))
    ]  # fmt: skip
    sent = calls(peer, "SendMessage")

    resumed = await engine.resume(pending.task)

    assert resumed.remote_task_id == ours.id != later.id
    assert calls(peer, "SendMessage") == sent  # found, not sent again
    listed = await transport.list_tasks(context_id=context, history_length=HISTORY_IDS_KEPT)
    assert [(t.id, t.history_ids[0]) for t in listed] == [
        (later.id, "m-later"),
        (ours.id, recorded["message_id"]),
    ]


# -- R16: an answer is I-JSON ----------------------------------------------------------------------


async def test_a_send_answered_with_two_task_members_binds_neither_and_is_an_invalid_answer(
    agent: HostileAgent, engine: Engine
) -> None:
    at = datetime.now(UTC)
    first, second = (json.dumps(wire_task(t, "c", "working", at)) for t in ("t-1", "t-2"))
    agent.rpc["SendMessage"] = lambda rid: Reply(
        body=f'{{"jsonrpc": "2.0", "id": {json.dumps(rid)}, '
        f'"result": {{"task": {first}, "task": {second}}}}}'.encode()
    )

    with pytest.raises(InvalidAgentResponseError, match=r"result\.task: duplicate member name"):
        await engine.start_task(agent.url, skill=SKILL, text="hi")

    [key] = [v.task for v in await engine.tasks()]
    assert state_of(engine, key)["remote_task_id"] is None  # bound to neither id
    assert (await engine.task(key)).state == "submitted"  # the outcome unknown: resume looks for it
    [unknown] = data_of(engine.store, key, ev.ENDPOINT_UNREACHABLE)
    assert "result.task: duplicate member name" in unknown["detail"]


# -- R3, R5: a send the agent asked to wait -------------------------------------------------------


def in_turn(*answers: Callable[[object], Reply]) -> Callable[[object], Reply]:
    """Each request answered by the next of ``answers``, the last for ever after."""
    left = list(answers)
    return lambda rid: (left.pop(0) if len(left) > 1 else left[0])(rid)


def busy(status: int, retry_after: str) -> Callable[[object], Reply]:
    headers = {"Content-Type": "text/plain", "Retry-After": retry_after}
    return lambda rid: Reply(status=status, body=b"busy", headers=headers)


def created(rid: object) -> Reply:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return rpc_result({"task": wire_task("t-1", "c-1", "working", at)})(rid)


async def test_a_send_answered_429_goes_again_after_the_wait_and_creates_one_task(
    agent: HostileAgent, engine: Engine
) -> None:
    agent.rpc["SendMessage"] = in_turn(busy(429, "1"), created)

    view = await engine.start_task(agent.url, skill=SKILL, text="hi")

    assert (view.remote_task_id, view.state) == ("t-1", "working")
    first, again = sent_messages(agent)
    assert again["messageId"] == first["messageId"]  # nothing was created: the same send
    assert agent.posts("ListTasks") == []
    # Through the gate again: a fresh card read before the second send.
    gets = [r.method if r.method == "GET" else r.rpc_method for r in agent.requests]
    assert gets[-3:] == ["SendMessage", "GET", "SendMessage"]
    assert [v.task for v in await engine.tasks()] == [view.task]
    [throttled] = data_of(engine.store, view.task, ev.THROTTLED)
    assert (throttled["status"], throttled["asked"], throttled["during"]) == (429, 1.0, "send")
    assert ev.ENDPOINT_UNREACHABLE not in types(engine.store, view.task)


def test_cli_run_whose_send_is_answered_429_then_taken_exits_0_with_one_task(
    agent: HostileAgent, db: str
) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    done = rpc_result({"task": wire_task("t-1", "c-1", "completed", at)})
    agent.rpc["SendMessage"] = in_turn(busy(429, "1"), done)

    run = subprocess.run(
        [CARDFENCE, "run", agent.url, "--skill", SKILL, "--text", "hi", "--json", "--db", db],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["remote_task_id"] == "t-1"
    first, again = sent_messages(agent)
    assert again["messageId"] == first["messageId"]


@pytest.mark.parametrize("found", [True, False], ids=["created", "not-created"])
async def test_a_send_answered_503_asks_list_tasks_before_sending_again(
    agent: HostileAgent, engine: Engine, found: bool
) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    agent.rpc["SendMessage"] = in_turn(busy(503, "1"), created)
    task = wire_task("t-1", "c-1", "working", at)
    agent.rpc["ListTasks"] = lambda rid: rpc_result(
        {"tasks": [{**task, "history": sent_messages(agent)[:1]}] if found else []}
    )(rid)
    agent.rpc["GetTask"] = rpc_result(wire_task("t-1", "c-1", "working", at))

    view = await engine.start_task(agent.url, skill=SKILL, text="hi")

    assert view.remote_task_id == "t-1"
    methods = [r.rpc_method for r in agent.requests if r.method == "POST"]
    if found:  # a proxy answered 503 after the agent created the task: bound, not sent again
        assert methods == ["SendMessage", "ListTasks", "GetTask"]
    else:
        assert methods == ["SendMessage", "ListTasks", "SendMessage"]
        first, again = sent_messages(agent)
        assert again["messageId"] == first["messageId"]
    [listed] = agent.posts("ListTasks")
    params = json.loads(listed.body)["params"]
    assert params["contextId"] == sent_messages(agent)[0]["contextId"]
    assert params["historyLength"] == HISTORY_IDS_KEPT  # the history tells our task (R3)


async def test_a_send_asked_to_wait_past_the_deadline_is_not_sent_again_and_exits_6(
    agent: HostileAgent, engine: Engine
) -> None:
    agent.rpc["SendMessage"] = busy(429, "100")

    with deadline.within(3), pytest.raises(DeadlineExceeded) as caught:
        await engine.start_task(agent.url, skill=SKILL, text="hi")

    assert exit_code_for(caught.value) == 6
    assert "HTTP 429" in str(caught.value)
    assert "nothing was created" in str(caught.value)
    assert len(agent.posts("SendMessage")) == 1
    key = caught.value.task
    [throttled] = data_of(engine.store, key, ev.THROTTLED)
    assert (throttled["asked"], throttled["wait"]) == (100.0, None)
    assert (await engine.task(key)).state == "submitted"


# -- R16: a remote task id is unique per agent, not globally -------------------------------------


async def test_two_agents_answering_the_same_task_id_keep_their_own_pushes_and_show_names_both(
    agent: HostileAgent, other_agent: HostileAgent, engine: Engine
) -> None:
    for each in (agent, other_agent):
        each.rpc["CreateTaskPushNotificationConfig"] = rpc_result(
            {"id": "cf", "url": "http://127.0.0.1:9/hook"}
        )
    first = await engine.start_task(agent.url, skill=SKILL, text="one")
    hook = await engine.register_webhook(first.task, "http://127.0.0.1:9/hook")
    second = await engine.start_task(other_agent.url, skill=SKILL, text="two")
    other_hook = await engine.register_webhook(second.task, "http://127.0.0.1:9/hook")
    assert first.remote_task_id == second.remote_task_id == "t-1"
    assert hook.token
    assert other_hook.token

    done = datetime.now(UTC)
    body = status_update_body("t-1", first.context_id, "completed", done)
    delivered = await engine.deliver(body, headers_for(hook))
    other_body = status_update_body("t-1", second.context_id, "input-required", done)
    other_delivered = await engine.deliver(other_body, headers_for(other_hook))

    assert (delivered.status, delivered.task) == (200, first.task)
    assert (other_delivered.status, other_delivered.task) == (200, second.task)
    assert (await engine.task(first.task)).state == "completed"
    assert (await engine.task(second.task)).state == "input-required"
    refused = await engine.deliver(body, push_headers("not-a-token"))
    assert refused.status == 401
    with pytest.raises(UsageError) as ambiguous:
        await engine.task("t-1")
    message = str(ambiguous.value)
    for key, origin in ((first.task, agent.url), (second.task, other_agent.url)):
        assert key in message
        assert origin in message


# -- R12: an answer about another task, or in another context ------------------------------------


async def test_get_task_answering_another_task_id_is_recorded_once_and_applies_nothing(
    agent: HostileAgent, engine: Engine
) -> None:
    view = await engine.start_task(agent.url, skill=SKILL, text="hi")
    later = datetime.now(UTC) + timedelta(seconds=1)
    agent.rpc["GetTask"] = rpc_result(
        wire_task("t-other", str(view.context_id), "completed", later)
    )
    before = types(engine.store, view.task)

    for _ in range(3):
        with pytest.raises(WrongTaskAnswerError):
            await engine.poll(view.task)

    added = types(engine.store, view.task)[len(before) :]
    assert added == [ev.OBSERVATION_IGNORED, ev.FLAGGED_FOR_REVIEW]  # once, not per poll
    [ignored] = data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)
    assert (ignored["reason"], ignored["asked"], ignored["answered"]) == (
        "wrong_task",
        "t-1",
        "t-other",
    )
    assert (await engine.task(view.task)).state == "working"
    assert "wrong_task" in (await engine.task(view.task)).flags


async def test_get_task_in_another_context_is_applied_and_flagged_context_mismatch_once(
    agent: HostileAgent, engine: Engine
) -> None:
    view = await engine.start_task(agent.url, skill=SKILL, text="hi")
    now = datetime.now(UTC)
    answers = iter(
        [
            wire_task("t-1", "c-elsewhere", "input-required", now + timedelta(seconds=1)),
            wire_task("t-1", "c-elsewhere", "completed", now + timedelta(seconds=2)),
        ]
    )
    counter = itertools.count()
    agent.rpc["GetTask"] = lambda rid: (next(counter), rpc_result(next(answers))(rid))[1]

    assert (await engine.poll(view.task)).state == "input-required"
    assert (await engine.poll(view.task)).state == "completed"

    flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
    assert [f["reason"] for f in flagged] == ["context_mismatch"]
    assert "context_mismatch" in (await engine.task(view.task)).flags
