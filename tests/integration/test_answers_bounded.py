"""R12 and R16 against a real hostile agent: answers that must never wedge, bloat or lose a task.

A small A2A agent on 127.0.0.1 (``tests/support/hostile.py``) answers SendMessage and GetTask with
what a careless or hostile remote sends: an artifact of 7 MB, one of 18 MB as stored JSON, 20,000
artifacts in one answer, a status message of 9 MB as stored JSON, a first answer stamped
9999-12-31 or of generation 10^30, the same answer on every poll (restamped or not), one
artifactId twice in one answer, the same push 200 times.
Every test ends with the audit (R13: every projection equals its replay).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.engine_fixtures import audited_engine, data_of, headers_for, types
from support.hostile import SKILL, HostileAgent, Reply

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import RemoteTask
from cardfence.engine.core.observations import (
    MAX_RECORDED_ARTIFACT_BYTES,
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_PARTS,
    stored_json,
)
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import DeadlineExceeded, WrongTaskAnswerError
from cardfence.engine.http import deadline
from cardfence.engine.wire.transport import A2ATransport

CONFIG = EngineConfig(
    max_poll_interval=0.05,
    first_poll_interval=0.01,
    max_card_age=60.0,
    card_limits=CardLimits(timeout=5.0, connect_timeout=2.0),
    request_timeout=30.0,
)
REMOTE_ID = "t-1"


@pytest.fixture
def agent() -> Iterator[HostileAgent]:
    running = HostileAgent()
    with running:
        yield running


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


def wire_state(state: str) -> str:
    return "TASK_STATE_" + state.upper().replace("-", "_")


def task_json(
    state: str,
    timestamp: str | None = "2026-01-01T00:00:00Z",
    *,
    artifacts: list[dict[str, Any]] | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"state": wire_state(state)}
    if timestamp is not None:
        status["timestamp"] = timestamp
    if message is not None:
        status["message"] = {
            "messageId": "m-status",
            "role": "ROLE_AGENT",
            "parts": [{"text": message}],
        }
    task: dict[str, Any] = {"id": REMOTE_ID, "contextId": "c-1", "status": status}
    if artifacts is not None:
        task["artifacts"] = artifacts
    return task


def text_artifact(artifact_id: str, text: str) -> dict[str, Any]:
    return {"artifactId": artifact_id, "parts": [{"text": text}]}


def answering(task: dict[str, Any], *, send: bool) -> Callable[[object], Reply]:
    """A JSON-RPC reply factory giving ``task`` (SendMessage wraps it in ``{"task": …}``), its
    text as UTF-8 (an ``é`` is two bytes on the wire, six as the store's ASCII JSON)."""
    body_of: Callable[[object], bytes] = lambda rid: json.dumps(  # noqa: E731
        {"jsonrpc": "2.0", "id": rid, "result": {"task": task} if send else task},
        ensure_ascii=False,
    ).encode()
    return lambda rid: Reply(body=body_of(rid))


def texts(engine: Engine, key: str, parts: list[dict[str, Any]]) -> list[str]:
    """The text of each of an event's outlined parts, read from its content record (R17)."""
    assert all(set(part) - {"media_type"} == {"kind", "size", "sha256"} for part in parts)
    kept = engine.store.contents(task_stream_id(key), [part["sha256"] for part in parts])
    return [kept[part["sha256"]].data["text"] for part in parts]


def now_stamp(seconds: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


# -- R16: an answer too large to store never makes a task unrecordable --------------------------


async def test_a_7mb_artifact_in_a_poll_is_kept_whole_out_of_line_and_the_terminal_state_recorded(
    agent: HostileAgent, db: str
) -> None:
    big = text_artifact("a-big", "x" * (7 * 1000 * 1000))
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(
        task_json("completed", "2026-01-01T00:00:05Z", artifacts=[big]), send=False
    )
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        done = await engine.drive(view.task, until="terminal", timeout=20)

        assert done.state == "completed"
        [record] = done.artifacts
        assert record["parts"][0]["text"] == "x" * (7 * 1000 * 1000)
        assert "payload_truncated" not in done.flags
        [received] = data_of(engine.store, done.task, ev.ARTIFACT_RECEIVED)
        assert len(stored_json(received)) < 1024  # its content is out of line
        assert texts(engine, done.task, received["parts"]) == ["x" * (7 * 1000 * 1000)]


async def test_an_artifact_over_the_bound_as_stored_is_kept_as_its_digest_and_the_state_recorded(
    agent: HostileAgent, db: str
) -> None:
    text = "é" * (3 * 1000 * 1000)  # 6 MB on the wire, 18 MB as the store's ASCII JSON
    big = text_artifact("a-big", text)
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(
        task_json("completed", "2026-01-01T00:00:05Z", artifacts=[big]), send=False
    )
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        done = await engine.drive(view.task, until="terminal", timeout=20)

        assert done.state == "completed"
        assert done.remote_task_id == REMOTE_ID
        [record] = done.artifacts
        part = {"kind": "text", "text": text}
        expected = stored_json({"artifact_id": "a-big", "name": None, "parts": [part]})
        assert record["truncated"] is True
        assert record["bytes"] == len(expected) > MAX_RECORDED_ARTIFACT_BYTES
        assert record["sha256"] == hashlib.sha256(expected.encode()).hexdigest()
        assert "parts" not in record
        assert "payload_truncated" in done.flags
        assert len(agent.posts("SendMessage")) == 1


async def test_a_send_answer_with_20000_artifacts_is_recorded_with_its_state(
    agent: HostileAgent, db: str
) -> None:
    many = [text_artifact(f"a{n}", f"part {n}") for n in range(20_000)]
    agent.rpc["SendMessage"] = answering(task_json("completed", artifacts=many), send=True)
    async with audited_engine(db, CONFIG) as engine:
        done = await engine.start_task(agent.url, skill=SKILL, text="hi")

        assert done.state == "completed"
        assert done.remote_task_id == REMOTE_ID
        assert [a["artifact_id"] for a in done.artifacts] == [f"a{n}" for n in range(20_000)]
        assert [p["text"] for p in done.artifacts[-1]["parts"]] == ["part 19999"]
        assert types(engine.store, done.task).count(ev.ARTIFACT_RECEIVED) == 20_000
        assert "payload_truncated" not in done.flags  # every part was small enough to keep


async def test_a_9mb_status_message_is_kept_as_its_digest_and_the_state_change_recorded(
    agent: HostileAgent, db: str
) -> None:
    text = "é" * (1500 * 1000)  # 3 MB of UTF-8 on the wire, 9 MB as the store's ASCII JSON
    agent.rpc["SendMessage"] = answering(task_json("failed", message=text), send=True)
    async with audited_engine(db, CONFIG) as engine:
        done = await engine.start_task(agent.url, skill=SKILL, text="hi")

        assert done.state == "failed"
        [changed] = data_of(engine.store, done.task, ev.STATE_CHANGED)
        assert changed["message"] is None
        assert changed["payload_truncated"] is True
        assert changed["message_bytes"] == len(stored_json(text)) > MAX_RECORDED_MESSAGE_BYTES
        assert changed["message_sha256"] == hashlib.sha256(stored_json(text).encode()).hexdigest()
        assert "payload_truncated" in done.flags


async def test_a_2mb_status_message_is_kept_whole_out_of_line(agent: HostileAgent, db: str) -> None:
    text = "é" * (1 << 20)  # 2 MiB of UTF-8, 6 MiB as the store's ASCII JSON
    agent.rpc["SendMessage"] = answering(task_json("failed", message=text), send=True)
    async with audited_engine(db, CONFIG) as engine:
        done = await engine.start_task(agent.url, skill=SKILL, text="hi")

        assert (done.state, done.last_message) == ("failed", text)
        [changed] = data_of(engine.store, done.task, ev.STATE_CHANGED)
        assert "message" not in changed
        assert "payload_truncated" not in changed
        assert texts(engine, done.task, changed["message_parts"]) == [text]
        assert "payload_truncated" not in done.flags


async def test_an_oversized_push_is_answered_never_raised_and_a_truncated_one_says_so(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["CreateTaskPushNotificationConfig"] = lambda rid: Reply(
        body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": json.loads(
            agent.posts("CreateTaskPushNotificationConfig")[-1].body)["params"]}).encode()
    )  # fmt: skip
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        outcome = await engine.register_webhook(view.task, "http://127.0.0.1:9/hook")
        assert outcome.registered
        assert outcome.token is not None
        headers = headers_for(outcome)

        def artifact_push(text: str) -> bytes:
            update = {"taskId": REMOTE_ID, "contextId": "c-1",
                      "artifact": text_artifact("p1", text)}  # fmt: skip
            return json.dumps({"artifactUpdate": update}, ensure_ascii=False).encode()

        too_big = await engine.deliver(artifact_push("y" * 400 * 1024), headers)
        # 12 KB on the wire, one part more than an artifact is kept whole with: kept as digest
        parts = [{"text": ""}] * (MAX_RECORDED_PARTS + 1)
        update = {"taskId": REMOTE_ID, "contextId": "c-1",
                  "artifact": {"artifactId": "p1", "parts": parts}}  # fmt: skip
        cut = await engine.deliver(json.dumps({"artifactUpdate": update}).encode(), headers)

        assert (too_big.status, too_big.outcome) == (413, "refused")
        assert (cut.status, cut.outcome, cut.detail) == (200, "applied", "payload_truncated")
        [record] = (await engine.task(view.task)).artifacts
        assert record["truncated"] is True


# -- R12: a far-future timestamp never wedges a task -------------------------------------------


async def test_far_future_timestamp_never_blocks_the_terminal_report(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working", "9999-12-31T23:59:59Z"), send=True)
    polls: list[str] = ["working", "working", "input-required", "completed"]
    agent.rpc["GetTask"] = lambda rid: answering(
        task_json(polls.pop(0) if len(polls) > 1 else polls[0], now_stamp()), send=False
    )(rid)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        first = data_of(engine.store, view.task, ev.STATE_CHANGED)[0]
        assert first["remote_timestamp"] is None
        assert first["clock_skew"] is True
        assert first["reported_timestamp"].startswith("9999-12-31")

        interrupted = await engine.drive(view.task, until="interrupted", timeout=20)
        done = await engine.drive(view.task, until="terminal", timeout=20)

        assert interrupted.state == "input-required"  # later reports are not stale either
        assert done.state == "completed"
        assert "clock_skew" in done.flags
        flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
        assert [f["reason"] for f in flagged].count("clock_skew") == 1
        stale = [d for d in data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)
                 if d["reason"] == "stale"]  # fmt: skip
        assert stale == []


async def test_a_terminal_report_stamped_before_the_last_applied_one_is_still_recorded(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working", now_stamp()), send=True)
    agent.rpc["GetTask"] = answering(task_json("completed", now_stamp(-3600)), send=False)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        done = await engine.drive(view.task, until="terminal", timeout=20)

        assert done.state == "completed"
        assert "clock_skew" not in done.flags


# -- R12: repeats never grow the log -------------------------------------------------------------


async def test_a_poll_answer_repeating_its_artifact_on_every_poll_is_recorded_once(
    agent: HostileAgent, db: str
) -> None:
    report = task_json("working", artifacts=[text_artifact("a1", "partial")])
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(report, send=False)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        for _ in range(19):
            await engine.poll(view.task)
        logged = types(engine.store, view.task)

        assert logged.count(ev.ARTIFACT_RECEIVED) == 1
        assert len(logged) <= 4  # submitted, working, the artifact (and a same-state report)
        assert len(agent.posts("GetTask")) == 19


async def test_an_artifact_changed_under_the_same_id_is_recorded_as_a_replacement(
    agent: HostileAgent, db: str
) -> None:
    versions = iter(["draft", "draft", "final", "final", "final"])
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = lambda rid: answering(
        task_json("working", artifacts=[text_artifact("a1", next(versions))]), send=False
    )(rid)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        for _ in range(5):
            await engine.poll(view.task)

        received = data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)
        assert [(texts(engine, view.task, r["parts"]), r.get("replaces", False))
                for r in received] == [(["draft"], False), (["final"], True)]  # fmt: skip
        parts = (await engine.task(view.task)).artifacts[0]["parts"]
        assert [(p["kind"], p["text"]) for p in parts] == [("text", "final")]


async def test_200_identical_push_replays_append_at_most_one_event(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["CreateTaskPushNotificationConfig"] = lambda rid: Reply(
        body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": json.loads(
            agent.posts("CreateTaskPushNotificationConfig")[-1].body)["params"]}).encode()
    )  # fmt: skip
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        outcome = await engine.register_webhook(view.task, "http://127.0.0.1:9/hook")
        assert outcome.token is not None
        update = {"taskId": REMOTE_ID, "contextId": "c-1",
                  "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                             "timestamp": "2026-01-01T00:00:09Z"}}  # fmt: skip
        body = json.dumps({"statusUpdate": update}).encode()

        first = await engine.deliver(body, headers_for(outcome))
        before = len(types(engine.store, view.task))
        replays = [await engine.deliver(body, headers_for(outcome)) for _ in range(200)]

        assert first.outcome == "applied"
        assert {(d.status, d.outcome) for d in replays} == {(200, "duplicate")}
        assert len(types(engine.store, view.task)) <= before + 1
        assert (await engine.task(view.task)).state == "input-required"


async def test_repeats_beyond_the_first_are_counted_on_the_next_event_not_appended(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(task_json("working"), send=False)  # the same report
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        before = types(engine.store, view.task)
        for _ in range(5):
            await engine.poll(view.task)
        assert types(engine.store, view.task) == before  # counted, not appended

        agent.rpc["GetTask"] = answering(task_json("completed", "2026-01-01T00:00:05Z"), send=False)
        done = await engine.poll(view.task)

        assert done.state == "completed"
        assert data_of(engine.store, view.task, ev.STATE_CHANGED)[-1]["repeats_ignored"] == 5
        assert done.repeats_ignored == (await engine.task(view.task)).repeats_ignored == 5
        assert len(types(engine.store, view.task)) == len(before) + 1
        # the audit at the end of the block proves the fold reproduces the count (R13)


async def test_a_generation_far_ahead_never_wedges_the_task_and_its_reply_is_accepted(
    agent: HostileAgent, db_url: str
) -> None:
    agent.rpc["SendMessage"] = answering(
        {**task_json("working", None), "generation": 10**30}, send=True
    )
    later = iter(range(7, 1000))
    agent.rpc["GetTask"] = lambda rid: answering(
        {**task_json("input-required", None, message="Which one?"), "generation": next(later)},
        send=False,
    )(rid)
    async with audited_engine(db_url, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        asked = await engine.drive(view.task, until="interrupted", timeout=5)
        agent.rpc["SendMessage"] = answering(
            {**task_json("working", None), "generation": 1000}, send=True
        )
        replied = await engine.reply(view.task, "the blue one")

        assert asked.state == "input-required"
        assert replied.state == "working"
        first = data_of(engine.store, view.task, ev.STATE_CHANGED)[0]
        assert (first["reported_generation"], first["generation_skew"]) == (10**30, True)
        flagged = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
        assert [f["reason"] for f in flagged] == ["generation_skew"]


async def test_an_agent_restamping_its_status_on_every_poll_adds_no_event_per_poll(
    agent: HostileAgent, db_url: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working", now_stamp()), send=True)
    agent.rpc["GetTask"] = lambda rid: answering(
        task_json("working", now_stamp(), message="busy"), send=False
    )(rid)
    async with audited_engine(db_url, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        for _ in range(20):
            await engine.poll(view.task)
        logged = types(engine.store, view.task)
        agent.rpc["GetTask"] = answering(task_json("completed", now_stamp()), send=False)
        done = await engine.poll(view.task)

        assert logged.count(ev.OBSERVATION_IGNORED) == 1  # the first "busy", a new message
        assert done.repeats_ignored == 19
        assert data_of(engine.store, view.task, ev.STATE_CHANGED)[-1]["repeats_ignored"] == 19


async def test_an_answer_naming_one_artifact_twice_records_what_it_dropped(
    agent: HostileAgent, db_url: str
) -> None:
    twice = [text_artifact("a1", "draft"), text_artifact("a1", "final")]
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(task_json("working", artifacts=twice), send=False)
    async with audited_engine(db_url, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        for _ in range(3):
            await engine.poll(view.task)

        [received] = data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)
        draft = stored_json({"artifact_id": "a1", "name": None,
                             "parts": [{"kind": "text", "text": "draft"}]})  # fmt: skip
        dropped = {"bytes": len(draft), "sha256": hashlib.sha256(draft.encode()).hexdigest()}
        assert texts(engine, view.task, received["parts"]) == ["final"]
        assert received["dropped"] == [dropped]
        [flagged] = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
        assert flagged["reason"] == "artifact_dropped"
        assert (await engine.task(view.task)).flags == ("artifact_dropped",)


# -- R16: applying an answer never starts past the command's deadline ----------------------------


async def test_a_large_answer_arriving_after_the_deadline_is_not_applied_and_drive_ends_on_time(
    agent: HostileAgent, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = [text_artifact(f"a{n}", f"part {n}") for n in range(20_000)]
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    agent.rpc["GetTask"] = answering(
        task_json("completed", "2026-01-01T00:00:05Z", artifacts=many), send=False
    )
    get_task = A2ATransport.get_task

    async def late(self: A2ATransport, task_id: str, *, history_length: int = 0) -> RemoteTask:
        answer = await get_task(self, task_id, history_length=history_length)
        await asyncio.sleep(max(deadline.left(), 0.0) + 0.05)  # it lands just past the deadline
        return answer

    monkeypatch.setattr(A2ATransport, "get_task", late)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await engine.drive(view.task, until="terminal", timeout=1.0)
        elapsed = time.monotonic() - started

        assert elapsed < 1.0 + 3.0  # the deadline and a margin for a loaded machine
        logged = types(engine.store, view.task)
        assert ev.ARTIFACT_RECEIVED not in logged  # nothing of the late answer, not half of it
        assert logged[-1] == ev.DEADLINE_EXCEEDED
        assert (await engine.task(view.task)).state == "working"


# -- R12: an answer about another task, to a reply or a cancel -----------------------------------


async def test_a_reply_answered_about_another_task_is_recorded_once_and_raises(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("input-required"), send=True)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        other = {**task_json("completed", "2026-01-01T00:00:05Z"), "id": "t-other"}
        agent.rpc["SendMessage"] = answering(other, send=True)

        for _ in range(2):
            with pytest.raises(WrongTaskAnswerError):
                await engine.reply(view.task, "more")

        [ignored] = data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)
        assert (ignored["reason"], ignored["asked"], ignored["answered"]) == (
            "wrong_task",
            REMOTE_ID,
            "t-other",
        )
        [flagged] = data_of(engine.store, view.task, ev.FLAGGED_FOR_REVIEW)
        assert flagged["reason"] == "wrong_task"
        assert (await engine.task(view.task)).state == "input-required"
        assert "wrong_task" in (await engine.task(view.task)).flags


async def test_a_cancel_answered_about_another_task_is_recorded_once_and_raises(
    agent: HostileAgent, db: str
) -> None:
    agent.rpc["SendMessage"] = answering(task_json("working"), send=True)
    other = {**task_json("canceled", "2026-01-01T00:00:05Z"), "id": "t-other"}
    agent.rpc["CancelTask"] = answering(other, send=False)
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")

        for _ in range(2):
            with pytest.raises(WrongTaskAnswerError):
                await engine.cancel(view.task)

        [ignored] = data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)
        assert (ignored["reason"], ignored["answered"]) == ("wrong_task", "t-other")
        assert types(engine.store, view.task).count(ev.FLAGGED_FOR_REVIEW) == 1
        assert (await engine.task(view.task)).state == "working"
        assert "wrong_task" in (await engine.task(view.task)).flags
