"""The task commands through the real ``cardfence`` console script, against a real a2a-sdk agent.

What docs/cli.md fixes is checked here as an operator's script would see it: the JSON documents
(exactly one on stdout under ``--json``), the exit codes, and the last stderr line naming the
error's type. Tasks the commands only read are made in-process (an :class:`Engine` on the same
store), which is faster than another subprocess and exercises the same store.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.cli import (
    CARDFENCE,
    POLL,
    ROW_KEYS,
    RUN_FAST,
    cardfence,
    document,
    failed_with,
    last_line,
)
from support.engine_fixtures import (
    audited_engine,
    data_of,
    drop_skill,
    make_tasks,
    transitions,
    withdraw_push,
)
from support.events import without_outline

from cardfence.engine.cli.main import run as cli
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.demo.executor import FORM
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent

RUN_KEYS = {
    "task",
    "remote_task_id",
    "context_id",
    "state",
    "delivery_mode",
    "card_revision",
    "flags",
    "artifacts",
    "last_message",
    "last_message_parts",
}
HEX64 = re.compile(r"[0-9a-f]{64}")


def stored(db: str, ref: str) -> dict[str, Any]:
    """The task's projection, read straight from the store."""
    with EventStore.open(db) as store:
        log = TaskLog(store)
        return dict(log.head(log.find(ref)).state)


def stored_events(db: str, ref: str, type_: str) -> list[dict[str, Any]]:
    with EventStore.open(db) as store:
        return data_of(store, TaskLog(store).find(ref), type_)


# -- run -------------------------------------------------------------------------------------------


def test_run_prints_the_task_as_json_and_exits_0_when_completed(peer: Peer, db: str) -> None:
    # Global options before the command name work too.
    argv = [
        CARDFENCE, "--db", db, "--json", "run", peer.base_url, "--skill", "echo",
        "--text", "echo hi", "--until", "terminal", *RUN_FAST,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    task = document(result)
    assert set(task) >= RUN_KEYS
    assert task["state"] == "completed"
    assert task["delivery_mode"] == "polling"
    assert HEX64.fullmatch(task["card_revision"])
    assert task["context_id"].startswith("c-")  # chosen before sending (crash safety)
    assert task["flags"] == []
    assert [p["text"] for a in task["artifacts"] for p in a["parts"]] == ["hi"]
    assert stored(db, task["task"])["remote_task_id"] == task["remote_task_id"]


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("http://127.0.0.1:99999", "its port is not a number from 1 to 65535"),
        ("http://[::1", "not a valid URL"),
        ("http://svc:PASS@127.0.0.1:9", "it carries credentials (user:password@): "),
    ],
)
@pytest.mark.parametrize("webhook", [False, True])
def test_run_with_a_url_that_cannot_be_used_exits_2_before_anything_is_opened_or_sent(
    url: str, fault: str, webhook: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    what, urls = ("webhook URL", ["http://127.0.0.1:9", "--webhook-url", url]) if webhook else (
        "agent URL", [url])  # fmt: skip
    db = tmp_path / "never.db"

    code = cli(["run", *urls, "--skill", "echo", "--text", "hi", "--db", f"sqlite:///{db}"])

    out, err = capsys.readouterr()
    shown = url.replace("svc:PASS@", "")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"UsageError: {what} {shown!r}: {fault}")
    assert "PASS" not in out + err
    if "PASS" in url:  # where credentials go instead
        assert ("--webhook-token" if webhook else "--credentials FILE") in err
    assert not db.exists()


def test_run_stops_at_input_required_and_reply_by_prefix_completes_it(peer: Peer, db: str) -> None:
    asked = cardfence(db, "run", peer.base_url, "--skill", "ask", "--text", "ask", "--json")
    assert asked.returncode == 0, asked.stderr
    waiting = document(asked)
    assert waiting["state"] == "input-required"
    assert waiting["last_message"] == "What is your answer?"  # the agent's question

    replied = cardfence(
        db, "reply", waiting["task"][:8], "--text", "42", "--until", "terminal", *POLL, "--json"
    )

    assert replied.returncode == 0, replied.stderr
    done = document(replied)
    assert set(done) >= RUN_KEYS
    assert (done["task"], done["state"]) == (waiting["task"], "completed")
    assert [p["text"] for a in done["artifacts"] for p in a["parts"]] == ["answer: 42"]
    assert stored_events(db, done["task"], ev.REPLY_SENT)


def test_a_question_carrying_a_form_prints_it_and_a_json_reply_fills_it(
    peer: Peer, db: str
) -> None:
    asked = cardfence(db, "run", peer.base_url, "--skill", "ask", "--text", "ask form", "--json")
    assert asked.returncode == 0, asked.stderr
    waiting = document(asked)
    assert waiting["last_message"] == "What is your answer?"
    assert [without_outline(part) for part in waiting["last_message_parts"]] == [
        {"kind": "text", "text": "What is your answer?"},
        {"kind": "data", "data": FORM, "media_type": "application/json"},
    ]
    shown = cardfence(db, "show", waiting["task"][:8])
    (said,) = [line for line in shown.stdout.splitlines() if line.startswith("  message data")]
    assert said.startswith("  message data (application/json): {")
    assert json.loads(said.partition(": ")[2]) == FORM

    answer = json.dumps({"answer": "42", "sure": True})
    replied = cardfence(
        db, "reply", waiting["task"][:8], "--text", answer, "--media-type", "application/json",
        "--until", "terminal", *POLL, "--json",
    )  # fmt: skip

    assert replied.returncode == 0, replied.stderr
    done = document(replied)
    assert done["state"] == "completed"
    # The agent completed it without a message: the last one is still its question, form and all.
    assert (done["last_message"], done["last_message_parts"]) == (
        waiting["last_message"], waiting["last_message_parts"],
    )  # fmt: skip
    assert stored_events(db, done["task"], ev.REPLY_SENT)


@pytest.mark.parametrize(
    ("breakage", "type_name"),
    [
        ("503", "DiscoveryError"),
        ("invalid_json", "CardInvalidError"),
        ("skill_absent", "SkillUnavailableError"),
    ],
)
def test_run_refused_before_sending_exits_3(
    peer: Peer, db: str, breakage: str, type_name: str
) -> None:
    skill = "translate" if breakage == "skill_absent" else "echo"
    if breakage != "skill_absent":
        peer.set_card_fault(breakage)

    result = cardfence(db, "run", peer.base_url, "--skill", skill, "--text", "hi", "--json")

    error = failed_with(result, 3, type_name)["error"]
    assert (error["type"], error["exit_code"]) == (type_name, 3)
    assert last_line(result).endswith("(nothing was sent)")
    if breakage == "503":
        assert last_line(result) == (
            f"DiscoveryError: GET {peer.card_url} -> 503 (nothing was sent)"
        )
    assert peer.calls == []
    with EventStore.open(db) as store:
        assert TaskLog(store).all() == []


def test_run_on_a_card_requiring_an_extension_exits_3_unless_extension_activates_it(
    peer: Peer, db: str
) -> None:
    uri = "https://extensions.example/trace/v1"
    peer.mutate_card(
        lambda card: card["capabilities"].__setitem__(
            "extensions", [{"uri": uri, "required": True}]
        )
    )

    refused = cardfence(db, "run", peer.base_url, "--skill", "echo", "--text", "hi", "--json")

    error = failed_with(refused, 3, "ExtensionRequiredError")["error"]
    assert error["exit_code"] == 3
    assert uri in error["message"]
    assert last_line(refused).endswith("(nothing was sent)")
    assert peer.calls == []

    result = cardfence(
        db, "run", peer.base_url, "--skill", "echo", "--text", "echo hi", "--extension", uri,
        "--until", "terminal", "--json", *RUN_FAST,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert document(result)["state"] == "completed"
    assert peer.extension_headers
    assert set(peer.extension_headers) == {uri}


def test_run_past_its_deadline_exits_6_and_the_task_is_not_failed(peer: Peer, db: str) -> None:
    result = cardfence(
        db, "run", peer.base_url, "--skill", "ask", "--text", "ask", "--until", "terminal",
        "--timeout", "3", *RUN_FAST, "--json",
    )  # fmt: skip  # the task waits for input for ever: the deadline passes however slow the run

    task = failed_with(result, 6, "DeadlineExceeded")
    assert task["state"] == "input-required"  # the run document, printed before the error
    assert "not marked failed" in last_line(result)
    state = stored(db, task["task"])
    assert state["state"] == "input-required"
    assert "deadline_exceeded" in state["flags"]
    assert stored_events(db, task["task"], ev.DEADLINE_EXCEEDED)
    assert ("JSONRPC", "CancelTask") not in peer.calls


def test_run_of_a_task_the_remote_failed_exits_8(peer: Peer, db: str) -> None:
    result = cardfence(
        db, "run", peer.base_url, "--skill", "fail", "--text", "fail", "--until", "terminal",
        *RUN_FAST, "--json",
    )  # fmt: skip

    # Exit 8 is reported as TaskEndedError (docs/cli.md, "Exit codes").
    task = failed_with(result, 8, "TaskEndedError")
    assert task["state"] == "failed"
    assert "no diagnostic" in last_line(result)
    assert [m for _, m in peer.calls].count("SendMessage") == 1  # never retried


def test_run_with_a_webhook_on_a_card_without_push_runs_on_polling_and_exits_0(
    peer: Peer, db: str
) -> None:
    peer.mutate_card(withdraw_push)

    result = cardfence(
        db, "run", peer.base_url, "--skill", "slow", "--text", "slow 0.2", "--until", "terminal",
        "--webhook-url", "http://127.0.0.1:9/webhook", *RUN_FAST, "--json",
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    task = document(result)
    assert (task["state"], task["delivery_mode"]) == ("completed", "polling")
    assert "delivery_downgraded" in task["flags"]
    [downgraded] = stored_events(db, task["task"], ev.DELIVERY_DOWNGRADED)
    assert downgraded["reason"] == "push_not_advertised"
    assert ("JSONRPC", "CreateTaskPushNotificationConfig") not in peer.calls


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_exits_0_when_accepted_and_7_when_the_remote_refuses(peer: Peer, db: str) -> None:
    started = cardfence(
        db, "run", peer.base_url, "--skill", "slow", "--text", "slow 30", "--until", "terminal",
        "--timeout", "2", *RUN_FAST, "--json",
    )  # fmt: skip  # working long past the deadline, which leaves the run time to send
    working = failed_with(started, 6, "DeadlineExceeded")
    assert working["state"] == "working"
    by_remote_id = working["remote_task_id"][:13]  # TASK may be a prefix of the remote id

    canceled = cardfence(db, "cancel", by_remote_id, "--json")
    again = cardfence(db, "cancel", by_remote_id, "--json")

    assert canceled.returncode == 0, canceled.stderr
    assert set(document(canceled)) >= RUN_KEYS
    assert document(canceled)["state"] == "canceled"  # as the remote answered
    error = failed_with(again, 7, "RemoteRefusedError")["error"]
    assert "-32002" in error["message"]
    [refused] = stored_events(db, working["task"], ev.CANCEL_REFUSED)
    assert refused["code"] == -32002
    assert stored(db, working["task"])["state"] == "canceled"


# -- resume ----------------------------------------------------------------------------------------


def test_endpoint_gone_exits_9_on_run_and_resume_and_resume_all_recovers(
    peer: Peer, db: str
) -> None:
    started = cardfence(
        db, "run", peer.base_url, "--skill", "slow", "--text", "slow 8", "--until", "terminal",
        "--timeout", "2", *RUN_FAST, "--json",
    )  # fmt: skip  # still working after the deadline and the resumes below
    live = failed_with(started, 6, "DeadlineExceeded")
    peer.set_endpoint_gone(True)  # plain 404 without an A2A body (incident 002)

    sent = cardfence(db, "run", peer.base_url, "--skill", "echo", "--text", "echo later", "--json")
    one = cardfence(db, "resume", live["task"][:8], "--timeout", "2", *POLL, "--json")
    every = cardfence(db, "resume", "--all", "--timeout", "2", *POLL, "--json")

    assert "404" in failed_with(sent, 9, "EndpointUnreachableError")["error"]["message"]
    failed_with(one, 9, "EndpointUnreachableError")
    listed = failed_with(every, 9, "EndpointUnreachableError")
    assert listed["orphaned"] == []
    assert sorted(t["state"] for t in listed["tasks"]) == ["submitted", "working"]
    assert stored(db, live["task"])["state"] == "working"  # nothing was changed
    assert transitions_in(db, live["task"]) == [("submitted", "working")]

    peer.set_endpoint_gone(False)
    recovered = cardfence(
        db, "resume", "--all", "--until", "terminal", "--timeout", "20", *POLL, "--json"
    )

    assert recovered.returncode == 0, recovered.stderr
    result = document(recovered)
    assert set(result) == {"tasks", "orphaned"}
    assert result["orphaned"] == []
    assert all(set(t) >= RUN_KEYS for t in result["tasks"])
    assert sorted(t["state"] for t in result["tasks"]) == ["completed", "completed"]
    assert all(t["remote_task_id"] for t in result["tasks"])  # the unsent one was found or sent


def test_resume_all_drives_every_task_at_once_so_one_waiting_holds_up_no_other(
    peer: Peer, db: str
) -> None:
    [waiting] = make_tasks(db, peer, ("ask", "ask", "interrupted"))  # never ends unanswered
    # A task that ends on its own, listed after the waiting one: driven one after another,
    # it would be looked at only once the waiting one's deadline had passed.
    ending = [started(db, peer, "slow", "slow 1")]
    while ending[-1] < waiting:
        ending.append(started(db, peer, "slow", "slow 1"))

    result = cardfence(
        db, "resume", "--all", "--until", "terminal", "--timeout", "6", *POLL, "--json"
    )

    listed = failed_with(result, 6, "DeadlineExceeded")
    states = {t["task"]: t["state"] for t in listed["tasks"]}
    assert states == {waiting: "input-required", **dict.fromkeys(ending, "completed")}
    assert [t["task"] for t in listed["tasks"]] == sorted(states)  # the store's order
    with EventStore.open(db) as store:
        deadline = [e.position for e in events_of(store, waiting, ev.DEADLINE_EXCEEDED)]
        ended = [e.position for e in events_of(store, ending[-1], ev.STATE_CHANGED)]
    assert len(deadline) == 1
    assert ended[-1] < deadline[0]  # seen completed while the waiting one was still waited on


def test_resume_all_drives_the_other_tasks_past_a_bug_in_one_and_names_it(
    peer: Peer, db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken, other = started(db, peer, "slow", "slow 0.3"), started(db, peer, "slow", "slow 0.3")
    resume = Engine.resume

    async def resume_but_one(engine: Engine, key: str, **options: Any) -> Any:
        if key == broken:
            raise ExceptionGroup("unhandled errors in a TaskGroup", [OverflowError("a bug")])
        return await resume(engine, key, **options)

    monkeypatch.setattr(Engine, "resume", resume_but_one)
    code = cli(["resume", "--all", "--until", "terminal", "--timeout", "20", *POLL, "--db", db])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert f"task {broken}: ExceptionGroup: unhandled errors in a TaskGroup" in err[0]
    assert err[-1].startswith("ExceptionGroup: ")
    assert stored(db, other)["state"] == "completed"  # the broken one is left as recorded


def started(db: str, peer: Peer, skill: str, text: str) -> str:
    """A task sent and left as the send's answer found it (nothing driven); its key."""

    async def main() -> str:
        async with audited_engine(db) as engine:
            return (await engine.start_task(peer.base_url, skill=skill, text=text)).task

    return asyncio.run(main())


def events_of(store: EventStore, key: str, type_: str) -> list[RecordedEvent]:
    return [e for e in store.read_stream(task_stream_id(key)) if e.type == type_]


def transitions_in(db: str, ref: str) -> list[tuple[str, str]]:
    with EventStore.open(db) as store:
        return transitions(store, TaskLog(store).find(ref))


def test_resume_of_a_task_whose_skill_vanished_exits_4_and_keeps_its_state(
    peer: Peer, db: str
) -> None:
    [key] = make_tasks(db, peer, ("ask", "ask", "interrupted"))
    peer.mutate_card(drop_skill("ask"))
    sent_before = len(peer.calls)

    one = cardfence(db, "resume", key, *POLL, "--json")
    every = cardfence(db, "resume", "--all", *POLL, "--json")

    failed_with(one, 4, "TaskOrphanedError")
    listed = failed_with(every, 4, "TaskOrphanedError")
    assert listed["orphaned"] == [key]
    [row] = listed["tasks"]
    assert (row["task"], row["state"]) == (key, "input-required")
    assert "orphaned" in row["flags"]
    assert peer.calls[sent_before:] == []  # nothing asked of the endpoint after the fresh read
    assert stored(db, key)["state"] == "input-required"


# -- tasks, show, audit ----------------------------------------------------------------------------


def test_tasks_lists_one_row_per_task_and_filters_by_state(peer: Peer, db: str) -> None:
    done, waiting = make_tasks(
        db, peer, ("echo", "echo a", "terminal"), ("ask", "ask", "interrupted")
    )

    everything = cardfence(db, "tasks", "--json")
    completed = cardfence(db, "tasks", "--state", "completed", "--json")
    human = cardfence(db, "tasks")

    assert everything.returncode == completed.returncode == human.returncode == 0
    rows = {r["task"]: r for r in document(everything)["tasks"]}
    assert set(rows) == {done, waiting}
    assert all(set(r) == ROW_KEYS for r in rows.values())
    assert (rows[done]["state"], rows[waiting]["state"]) == ("completed", "input-required")
    assert (rows[done]["skill"], rows[done]["agent"]) == ("echo", peer.base_url)
    assert [r["task"] for r in document(completed)["tasks"]] == [done]
    assert done[:12] in human.stdout
    assert "input-required" in human.stdout


def test_show_prints_the_task_stream_in_order_with_catalogue_types(peer: Peer, db: str) -> None:
    [key] = make_tasks(db, peer, ("slow", "slow 0.2", "terminal"))

    shown = cardfence(db, "show", key[:6], "--json")
    human = cardfence(db, "show", key[:6])

    assert shown.returncode == human.returncode == 0, shown.stderr
    timeline = document(shown)
    assert set(timeline) >= {"task", "remote_task_id", "state", "delivery_mode", "card_revision"}
    assert {"contract_hash", "flags", "events"} <= set(timeline)
    assert (timeline["task"], timeline["state"]) == (key, "completed")
    assert HEX64.fullmatch(timeline["card_revision"])
    assert HEX64.fullmatch(timeline["contract_hash"])
    recorded = timeline["events"]
    assert [e["version"] for e in recorded] == list(range(1, len(recorded) + 1))
    assert [e["position"] for e in recorded] == sorted(e["position"] for e in recorded)
    assert {e["type"] for e in recorded} <= ev.TASK_EVENTS
    assert recorded[0]["type"] == ev.TASK_SUBMITTED
    changed = [e["data"] for e in recorded if e["type"] == ev.STATE_CHANGED]
    assert [(c["from"], c["to"]) for c in changed] == [
        ("submitted", "working"),
        ("working", "completed"),
    ]
    assert all({"from", "to", "source", "remote_timestamp"} <= set(c) for c in changed)
    assert all(c["remote_timestamp"] for c in changed)
    assert all(e["recorded_at"].endswith("+00:00") for e in recorded)
    assert f"task {key}" in human.stdout
    assert "StateChanged" in human.stdout
    assert "working → completed" in human.stdout


def test_audit_exits_0_then_5_after_an_event_payload_is_edited(peer: Peer, tmp_path: Path) -> None:
    path = tmp_path / "tampered.db"  # not the audited `db` fixture: this one is broken on purpose
    db = f"sqlite:///{path}"
    [key] = make_tasks(db, peer, ("echo", "echo honest", "terminal"))

    clean = cardfence(db, "audit", "--json")

    assert clean.returncode == 0, clean.stderr
    report = document(clean)
    assert report["violations"] == []
    assert report["streams_checked"] == 2  # the agent's stream and the task's
    assert report["events_checked"] >= 4

    with sqlite3.connect(path) as raw:
        edited = raw.execute(
            """UPDATE events SET payload = replace(payload, '"skill":"echo"', '"skill":"ohce"') """
            "WHERE stream_id = ? AND type = ?",
            (f"task:{key}", ev.TASK_SUBMITTED),
        ).rowcount
    assert edited == 1

    tampered = cardfence(db, "audit", "--json")

    violations = failed_with(tampered, 5, "AuditViolation")["violations"]
    assert violations
    assert {v["stream"] for v in violations} == {f"task:{key}"}


def test_a_record_altered_in_the_store_exits_10_naming_it_and_holds_up_no_other_task(
    peer: Peer, tmp_path: Path
) -> None:
    path = tmp_path / "altered.db"  # not the audited `db` fixture: this one is broken on purpose
    db = f"sqlite:///{path}"
    [done] = make_tasks(db, peer, ("echo", "echo kept", "terminal"))
    live, altered = started(db, peer, "slow", "slow 1"), started(db, peer, "slow", "slow 1")
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE streams SET state = '[1]' WHERE stream_id = ?", (f"task:{altered}",))
        raw.execute(
            "UPDATE events SET payload = '{' WHERE stream_id = ? AND type = ?",
            (f"task:{done}", ev.STATE_CHANGED),
        )
        before = raw.execute("SELECT max(position) FROM events").fetchone()[0]
        version = raw.execute(
            "SELECT version FROM streams WHERE stream_id = ?", (f"task:{altered}",)
        ).fetchone()[0]

    shown = cardfence(db, "show", altered[:8], "--json")
    shown_done = cardfence(db, "show", done[:8], "--json")
    listed = cardfence(db, "tasks", "--json")
    resumed = cardfence(
        db, "resume", "--all", "--until", "terminal", "--timeout", "20", *POLL, "--json"
    )
    audited = cardfence(db, "audit", "--json")

    why = f"stream 'task:{altered}', its projection: the stored text is an array, not a JSON object"
    assert failed_with(shown, 10, "CorruptRecordError")["error"]["message"].startswith(why)
    assert last_line(shown).endswith(
        "(nothing was changed; 'cardfence audit' lists every such record)"
    )
    event = failed_with(shown_done, 10, "CorruptRecordError")["error"]["message"]
    assert event.startswith(f"stream 'task:{done}', event ")
    assert ", StateChanged): its payload is not JSON (" in event
    assert [t["task"] for t in failed_with(listed, 10, "CorruptRecordError")["tasks"]] == sorted(
        [done, live]
    )  # the others listed, the altered one left out
    assert last_line(listed).startswith(f"CorruptRecordError: {why}")
    driven = failed_with(resumed, 10, "CorruptRecordError")
    assert {t["task"]: t["state"] for t in driven["tasks"]} == {live: "completed"}
    with sqlite3.connect(path) as raw:
        kept = raw.execute(
            "SELECT state, version FROM streams WHERE stream_id = ?", (f"task:{altered}",)
        ).fetchone()
        appended = raw.execute(
            "SELECT DISTINCT stream_id FROM events WHERE position > ?", (before,)
        )
        streams = {row[0] for row in appended}
    assert kept == ("[1]", version)  # not driven, nothing written to it
    assert f"task:{live}" in streams
    assert f"task:{altered}" not in streams
    kinds = {
        (v["stream"], v["kind"]) for v in failed_with(audited, 5, "AuditViolation")["violations"]
    }
    assert (f"task:{altered}", "projection_invalid") in kinds
    assert (f"task:{done}", "payload_invalid") in kinds

    rebuilt = cardfence(db, "audit", "--rebuild-projections", "--json")
    shown_again = cardfence(db, "show", altered[:8], "--json")

    # The altered projection is rebuilt from its log; the altered event is not (the log itself).
    report = failed_with(rebuilt, 5, "AuditViolation")
    assert report["rebuilt"] == [f"task:{altered}"]
    assert {v["stream"] for v in report["violations"]} == {f"task:{done}"}
    assert shown_again.returncode == 0, shown_again.stderr
    assert document(shown_again)["task"] == altered


def test_unknown_or_ambiguous_task_exits_2_with_usage_error(peer: Peer, db: str) -> None:
    async def two_tasks_sharing_a_prefix() -> None:
        async with audited_engine(db) as engine:
            for key in ("abc1" + "0" * 28, "abc2" + "0" * 28):
                await engine.start_task(peer.base_url, skill="echo", text="echo x", key=key)

    asyncio.run(two_tasks_sharing_a_prefix())

    unknown = cardfence(db, "show", "no-such-task", "--json")
    ambiguous = cardfence(db, "cancel", "abc", "--json")

    error = failed_with(unknown, 2, "UsageError")["error"]
    assert error == {
        "type": "UsageError",
        "message": "unknown task 'no-such-task'",
        "exit_code": 2,
    }
    assert "ambiguous" in failed_with(ambiguous, 2, "UsageError")["error"]["message"]
    assert ("JSONRPC", "CancelTask") not in peer.calls


def test_resume_all_past_its_deadline_prints_one_json_document_and_exits_6(
    peer: Peer, db: str
) -> None:
    [key] = make_tasks(db, peer, ("ask", "ask", "interrupted"))

    result = cardfence(
        db, "resume", "--all", "--until", "terminal", "--timeout", "0.5", *POLL, "--json"
    )

    assert result.returncode == 6
    assert last_line(result).startswith("DeadlineExceeded: ")
    listed = document(result)  # exactly one document
    assert [t["task"] for t in listed["tasks"]] == [key]
    assert listed["tasks"][0]["state"] == "input-required"
