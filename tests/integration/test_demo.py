"""``cardfence demo`` run as a user runs it (a subprocess of the console module): the five seed
incidents against the packaged agent, each outcome read back from the store it leaves and from its
JSON; the audit; the temporary store; ``--agent-only``; and the command without its extra."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from support.engine_fixtures import data_of, transitions, types

from cardfence.engine.client.audit import audit
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.messages import submitted_message
from cardfence.engine.core.parts import Text
from cardfence.engine.discovery.fetch import card_urls
from cardfence.store.event_store import EventStore

CLI = (sys.executable, "-m", "cardfence")
EXTRA_HINT = "pip install 'cardfence[demo]'"
SLOW = [("submitted", "working"), ("working", "completed")]


def cardfence(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class DemoRun:
    exit_code: int
    document: dict[str, Any]
    stderr: str
    db_path: Path

    def scenario(self, n: int) -> dict[str, Any]:
        found: list[dict[str, Any]] = [s for s in self.document["scenarios"] if s["n"] == n]
        assert len(found) == 1
        return found[0]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """All five scenarios once, on a store this module keeps (``--db``)."""
    folder = tmp_path_factory.mktemp("demo")
    db_path = folder / "demo.db"
    done = cardfence("demo", "--db", f"sqlite:///{db_path}", "--json", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return DemoRun(done.returncode, json.loads(done.stdout), done.stderr, db_path)


@pytest.fixture
def store(demo_run: DemoRun) -> Iterator[EventStore]:
    with EventStore.open(f"sqlite:///{demo_run.db_path}") as opened:
        yield opened


def webhook_of(store: EventStore, key: str) -> dict[str, Any]:
    head = store.stream(task_stream_id(key))
    assert head is not None
    return dict(head.state.get("webhook") or {})


# -- the five incidents ---------------------------------------------------------------------------


def test_push_withdrawn_after_registration_completes_by_a_safety_poll_with_the_webhook_provisional(
    demo_run: DemoRun, store: EventStore
) -> None:
    played = demo_run.scenario(1)
    key = played["task"]

    assert played["held"] is True
    assert played["state"] == "completed"
    assert transitions(store, key) == SLOW
    [*_, completed] = data_of(store, key, ev.STATE_CHANGED)
    assert completed["source"] == "poll"  # no delivery arrived: the safety poll saw the end
    assert ev.WEBHOOK_REGISTERED in types(store, key)
    assert ev.WEBHOOK_CONFIRMED not in types(store, key)
    assert webhook_of(store, key)["status"] == "provisional"
    assert played["facts"]["pushes_dropped"] >= 1
    assert played["facts"]["deliveries_received"] == 0


def test_card_503_mid_task_is_only_an_annotation_no_cancel_and_the_task_completes(
    demo_run: DemoRun, store: EventStore
) -> None:
    played = demo_run.scenario(2)
    key = played["task"]

    assert played["held"] is True
    assert played["state"] == "completed"
    assert transitions(store, key) == SLOW
    unavailable = data_of(store, key, ev.DISCOVERY_UNAVAILABLE)
    assert unavailable
    assert {(u["kind"], u["during"]) for u in unavailable} == {("http_status", "revalidation")}
    assert played["facts"]["cancel_requests"] == 0
    assert ev.CANCEL_REQUESTED not in types(store, key)


def test_skill_reorganised_away_mid_task_is_flagged_for_review_never_cancelled_and_completes(
    demo_run: DemoRun, store: EventStore
) -> None:
    played = demo_run.scenario(3)
    key = played["task"]

    assert played["held"] is True
    assert played["state"] == "completed"
    assert transitions(store, key) == SLOW
    assert [f["reason"] for f in data_of(store, key, ev.FLAGGED_FOR_REVIEW)] == ["skill_withdrawn"]
    assert "skill_withdrawn" in played["flags"]
    [changed] = data_of(store, key, ev.CARD_REVISION_CHANGED)
    assert changed["changes"]["skills"] == {"removed": ["slow"]}
    assert played["facts"]["cancel_requests"] == 0
    assert ev.CANCEL_REQUESTED not in types(store, key)


def test_restart_after_the_endpoint_moved_orphans_a_retired_skill_and_follows_a_kept_one(
    demo_run: DemoRun, store: EventStore
) -> None:
    played = demo_run.scenario(4)
    [orphan] = played["other_tasks"]
    facts = played["facts"]

    # Skill retired as well: TaskOrphanedError, the task left as last observed, nothing sent.
    assert facts["orphaned"]["raised"] == "TaskOrphanedError"
    assert orphan["state"] == facts["orphaned"]["state_before"] == "working"
    assert transitions(store, orphan["task"]) == [("submitted", "working")]
    [orphaned] = data_of(store, orphan["task"], ev.TASK_ORPHANED)
    assert (orphaned["reason"], orphaned["skill"]) == ("skill_absent", "slow")
    assert "orphaned" in orphan["flags"]
    assert facts["orphaned"]["endpoint_requests"] == 0
    assert ev.ENDPOINT_MOVED not in types(store, orphan["task"])

    # Skill kept: resumed at the new endpoint and driven to completion there.
    key = played["task"]
    [moved] = data_of(store, key, ev.ENDPOINT_MOVED)
    assert (moved["old"]["binding"], moved["new"]["binding"]) == ("JSONRPC", "HTTP+JSON")
    head = store.stream(task_stream_id(key))
    assert head is not None
    assert head.state["endpoint"] == moved["new"]
    assert played["state"] == "completed"
    assert transitions(store, key) == SLOW
    assert played["held"] is True


def test_contract_rotated_between_read_and_send_sends_nothing_until_accepted_then_completes(
    demo_run: DemoRun, store: EventStore
) -> None:
    played = demo_run.scenario(5)
    facts = played["facts"]

    assert facts["refused"] == "ContractChangedError"
    assert facts["send_message_after"] == facts["send_message_before"]  # nothing was sent
    sent_texts = [
        part.text
        for head in TaskLog(store).all()
        for part in submitted_message(TaskLog(store).first_event(head.key)).parts
        if isinstance(part, Text)
    ]
    assert "echo rotated" not in sent_texts  # not even recorded as a task
    agent = card_urls(demo_run.document["agent"])[0]
    recorded = [(e.type, e.data) for e in store.read_stream(ev.agent_stream_id(agent))]
    refusals = [d for t, d in recorded if t == ev.TASK_CREATION_REFUSED]
    assert [r["reason"] for r in refusals] == ["ContractChangedError"]
    [accepted] = [d for t, d in recorded if t == ev.CONTRACT_ACCEPTED]
    assert accepted["contract_hash"] == played["contract_hash"] == facts["accepted_contract"]
    assert accepted["previous"] == facts["pinned_contract"]
    assert played["state"] == "completed"
    assert played["held"] is True


# -- the run as a whole ---------------------------------------------------------------------------


def test_demo_plays_five_scenarios_audits_clean_and_keeps_the_db_it_was_given(
    demo_run: DemoRun,
) -> None:
    document = demo_run.document

    assert [s["n"] for s in document["scenarios"]] == [1, 2, 3, 4, 5]
    assert all(s["held"] for s in document["scenarios"])
    assert all("\n" not in s["outcome"] for s in document["scenarios"])  # one line each
    assert document["audit"]["violations"] == []
    assert document["store"] == {"url": f"sqlite:///{demo_run.db_path}", "kept": True}
    assert demo_run.db_path.is_file()
    with EventStore.open(f"sqlite:///{demo_run.db_path}") as kept:
        report = audit(kept)
    assert report.ok
    assert report.events_checked == document["audit"]["events_checked"]
    for n in range(1, 6):  # progress on stderr as each scenario starts
        assert f"[{n}/5] " in demo_run.stderr


def test_demo_without_db_plays_in_a_temporary_folder_and_removes_it(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.pop("CARDFENCE_DB", None)

    done = cardfence("demo", "--scenario", "2", cwd=tmp_path, env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    narration = [line for line in done.stdout.splitlines() if line.startswith("2. ")]
    assert len(narration) == 1
    assert "CancelTask sent: 0" in narration[0]
    assert "completed" in done.stdout
    assert "intact" in done.stdout  # the audit verdict
    assert "[2/5] " in done.stderr
    assert list(scratch.iterdir()) == []  # the temporary store's folder is gone
    assert list(tmp_path.glob("*.db")) == []  # and no store was left where it ran


@pytest.mark.parametrize(
    "args",
    [
        ("--scenario", "9"),
        ("--scenario", "0"),
        ("--port", "9999"),  # without --agent-only
        ("--agent-only", "--scenario", "1"),
    ],
)
def test_bad_demo_options_are_usage_errors(tmp_path: Path, args: Sequence[str]) -> None:
    done = cardfence("demo", *args, cwd=tmp_path, timeout=60)

    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("UsageError: ")
    assert done.stdout == ""


# -- the agent alone ------------------------------------------------------------------------------


def _line_from(stream: IO[str], timeout: float) -> str:
    """The next line of a child's output, or fail after ``timeout`` seconds."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no line from the agent within {timeout}s")


@pytest.fixture
def agent_only(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``cardfence demo --agent-only --port 0 --json`` running, with the document it printed."""
    child = subprocess.Popen(
        [*CLI, "demo", "--agent-only", "--port", "0", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = _line_from(child.stdout, timeout=60)
        assert line, child.stderr.read() if child.stderr else "no output"
        yield child, json.loads(line)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def test_agent_only_serves_its_card_on_the_port_and_stops_cleanly_on_sigint(
    agent_only: tuple[subprocess.Popen[str], dict[str, Any]],
) -> None:
    child, document = agent_only
    base = document["agent"]
    port = int(base.rsplit(":", 1)[1])

    card = httpx.get(f"http://127.0.0.1:{port}/.well-known/agent-card.json", timeout=10).json()
    assert document["card_url"] == f"{base}/.well-known/agent-card.json"
    assert [s["id"] for s in card["skills"]] == [s["id"] for s in document["skills"]]
    assert {"echo", "ask", "slow"} <= {s["id"] for s in card["skills"]}
    assert card["supportedInterfaces"][0]["url"] == document["interfaces"]["JSONRPC"]

    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=30)

    assert child.returncode == 0, stderr
    assert stdout == ""  # the one document was printed at the start
    assert document["card_url"] in stderr
    assert "skill ask" in stderr


def test_agent_only_answers_the_readme_walkthrough_and_stops_cleanly_on_sigterm(
    agent_only: tuple[subprocess.Popen[str], dict[str, Any]], tmp_path: Path
) -> None:
    child, document = agent_only
    base = document["agent"]
    env = {**os.environ, "CARDFENCE_DB": f"sqlite:///{tmp_path / 'walk.db'}"}

    def ok(*args: str) -> str:
        done = cardfence(*args, cwd=tmp_path, env=env, timeout=60)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        return done.stdout

    started = json.loads(ok("run", base, "--skill", "ask", "--text", "ask", "--json"))
    assert started["state"] == "input-required"
    replied = json.loads(
        ok("reply", started["task"], "--text", "42", "--until", "terminal", "--json")
    )
    assert replied["state"] == "completed"
    assert "answer: 42" in ok("show", started["task"])
    listed = json.loads(ok("tasks", "--state", "completed", "--json"))
    assert [t["task"] for t in listed["tasks"]] == [started["task"]]
    assert json.loads(ok("cards", base, "--json"))["revisions"]
    resumed = json.loads(ok("resume", "--all", "--json"))
    assert (resumed["tasks"], resumed["orphaned"]) == ([], [])
    assert json.loads(ok("audit", "--json"))["violations"] == []

    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=30)
    assert child.returncode == 0


# -- without the extra ----------------------------------------------------------------------------

# Runs the command line with a2a-sdk, uvicorn and Starlette made unimportable, as in an install
# without the `demo` extra.
WITHOUT_EXTRA = (
    "import sys\n"
    "for name in ('a2a', 'uvicorn', 'starlette', 'sse_starlette'):\n"
    "    sys.modules[name] = None\n"
    "from cardfence.engine.cli.main import run\n"
    "raise SystemExit(run(sys.argv[1:]))\n"
)


def test_demo_without_the_extra_is_a_one_line_usage_error_and_other_commands_still_work(
    tmp_path: Path,
) -> None:
    def without_extra(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WITHOUT_EXTRA, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    for args in (("demo",), ("demo", "--agent-only")):
        refused = without_extra(*args)
        assert refused.returncode == 2
        [line] = refused.stderr.splitlines()
        assert line.startswith("UsageError: ")
        assert line.endswith(EXTRA_HINT)
        assert refused.stdout == ""

    migrated = without_extra("migrate", "--db", f"sqlite:///{tmp_path / 'plain.db'}")
    assert migrated.returncode == 0, migrated.stderr
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, cardfence, cardfence.engine.cli\n"
            "loaded = {m.split('.')[0] for m in sys.modules}\n"
            "print(sorted(loaded & {'a2a', 'uvicorn', 'starlette'}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert imported.stdout.strip() == "[]", imported.stderr
