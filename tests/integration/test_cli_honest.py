"""An honest command line, through the real ``cardfence`` console script: option values checked
before anything is opened, written or sent (exit 2); no store made up for a read-only command or an
in-memory ``--db``; a store that never answers ends the command by its ``--timeout``; Ctrl-C exits
130 with the task left for ``resume``, at any moment of the process; an endpoint that speaks
another A2A version is named as such (docs/cli.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.cli import CARDFENCE, POLL, cardfence, document, failed_with, last_line
from support.hostile import SKILL, HostileAgent, Reply, SilentListener

from cardfence.engine.cli import _signals as signals
from cardfence.engine.client.tasklog import TaskLog
from cardfence.store.event_store import EventStore


def _usage_refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert last_line(result).startswith("UsageError: "), result.stderr
    assert result.stdout == ""


def _nothing_reached(peer: Peer) -> None:
    assert peer.calls == []
    assert peer.card_log == []


# -- option values (exit 2, nothing written, nothing sent) -----------------------------------------

RUN_BAD = [
    (("--timeout", "-5"), "--timeout"),
    (("--timeout", "0"), "--timeout"),
    (("--timeout", "nan"), "--timeout"),
    (("--max-poll-interval", "0"), "--max-poll-interval"),
    (("--max-poll-interval", "0.001"), "--max-poll-interval"),
    (("--max-card-age", "0"), "--max-card-age"),
    (("--max-retry-after", "0"), "--max-retry-after"),
    (("--card-timeout", "-1"), "--card-timeout"),
    (("--max-card-bytes", "0"), "--max-card-bytes"),
    (("--until", "bogus"), "--until"),
]


@pytest.mark.parametrize(("bad", "option"), RUN_BAD, ids=lambda v: " ".join(v) if v else "")
def test_run_with_an_option_out_of_range_is_a_usage_error_before_anything(
    peer: Peer, tmp_path: Path, bad: tuple[str, ...], option: str
) -> None:
    path = tmp_path / "cardfence.db"
    result = cardfence(
        f"sqlite:///{path}", "run", peer.base_url, "--skill", "echo", "--text", "hi", *bad, "--json"
    )

    error = failed_with(result, 2, "UsageError")["error"]
    assert option in error["message"]
    assert not path.exists()
    _nothing_reached(peer)


@pytest.mark.parametrize(
    "argv",
    [
        ("resume", "--all", "--timeout", "-5"),
        ("resume", "--all", "--max-poll-interval", "0"),
        ("resume", "--all", "--until", "never"),
        ("reply", "t", "--text", "x", "--until", "never"),
        ("tasks", "--state", "bogus"),
        ("cards", "AGENT", "--card-timeout", "0"),
        ("cards", "AGENT", "--max-card-bytes", "-1"),
    ],
    ids=" ".join,
)
def test_other_commands_check_their_option_values_too(
    peer: Peer, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    path = tmp_path / "cardfence.db"
    argv = tuple(peer.base_url if a == "AGENT" else a for a in argv)

    result = cardfence(f"sqlite:///{path}", *argv)

    _usage_refused(result)
    assert not path.exists()
    _nothing_reached(peer)


# -- the store the command line names ----------------------------------------------------------


@pytest.mark.parametrize("argv", [("tasks",), ("show", "abc"), ("audit",), ("resume", "--all")])
def test_a_read_command_on_a_sqlite_file_that_does_not_exist_creates_nothing(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    path = tmp_path / "typo.db"

    result = cardfence(f"sqlite:///{path}", *argv, "--json")

    error = failed_with(result, 2, "UsageError")["error"]
    assert error["message"].startswith(f"no store at {path}")
    assert not path.exists()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:", "", "garbage"])
def test_an_in_memory_empty_or_unparsable_db_is_refused(
    peer: Peer, tmp_path: Path, url: str
) -> None:
    argv = [CARDFENCE, "run", peer.base_url, "--skill", "echo", "--text", "hi", "--db", url]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    _usage_refused(result)
    assert list(tmp_path.iterdir()) == []  # not even the default ./cardfence.db
    _nothing_reached(peer)


# A store that never answers: commands that take --timeout end by it (here 2 s), the others by
# their connect timeout (the URL's, 2 s here; 10 s by default), never by a fixed 10 s.
SILENT_STORE = [
    ("run", "AGENT", "--skill", "echo", "--text", "hi", "--timeout", "2"),
    ("resume", "--all", "--timeout", "2"),
    ("audit",),
    ("serve", "--port", "0"),
]


@pytest.mark.parametrize("argv", SILENT_STORE, ids=lambda argv: argv[0])
def test_a_store_that_never_answers_ends_the_command_by_its_timeout(
    peer: Peer, argv: tuple[str, ...]
) -> None:
    pytest.importorskip("psycopg")
    argv = tuple(peer.base_url if a == "AGENT" else a for a in argv)
    with SilentListener() as silent:
        url = f"postgresql+psycopg://cf:s3cret@127.0.0.1:{silent.port}/db"
        if "--timeout" not in argv:
            url += "?connect_timeout=2"
        started = time.monotonic()
        result = cardfence(url, *argv, "--json")
        took = time.monotonic() - started

    error = failed_with(result, 10, "StoreUnavailableError")["error"]
    assert took < 8, f"ended after {took:.1f} s: the fixed 10 s connect timeout, not the 2 s bound"
    assert error["message"].startswith(f"postgresql+psycopg://cf:***@127.0.0.1:{silent.port}/db")
    assert "nothing was written" in error["message"]
    assert "s3cret" not in result.stdout + result.stderr
    _nothing_reached(peer)


# -- Ctrl-C ---------------------------------------------------------------------------------------


def _wait_until_working(db: str, seconds: float = 20) -> str:
    path = Path(db.removeprefix("sqlite:///"))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists():
            with EventStore.open(db) as store:
                heads = TaskLog(store).all()
            for head in heads:
                if head.state.get("state") == "working":
                    return str(head.key)
        time.sleep(0.1)
    raise AssertionError("the task was never recorded working")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_during_run_exits_130_and_leaves_the_task_for_resume(
    peer: Peer, tmp_path: Path, as_json: bool, sig: signal.Signals
) -> None:
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"
    argv = [CARDFENCE, "run", peer.base_url, "--skill", "slow", "--text", "slow 3",
            *POLL, "--db", db]  # fmt: skip
    process = subprocess.Popen(
        [*argv, *(["--json"] if as_json else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        key = _wait_until_working(db)
        process.send_signal(sig)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    result = subprocess.CompletedProcess(argv, process.returncode, out, err)

    assert result.returncode == 130, (out, err)
    assert last_line(result) == (
        f"Interrupted: {sig.name} received: task {key} left as recorded (working); "
        f"`cardfence resume {key}` continues it"
    )
    if as_json:
        error = document(result)["error"]
        assert (error["type"], error["exit_code"]) == ("Interrupted", 130)
    else:
        assert out == ""
    audited = cardfence(db, "audit", "--json")
    assert audited.returncode == 0, audited.stderr
    assert document(audited)["violations"] == []

    resumed = cardfence(db, "resume", key, "--until", "terminal", *POLL, "--json")

    assert resumed.returncode == 0, resumed.stderr
    assert document(resumed)["state"] == "completed"
    assert cardfence(db, "audit").returncode == 0


# A signal at any moment once the program runs: the interpreter's own start, before the first
# line of cardfence, is out of any program's reach, so the signal goes once the command line's
# imports have begun (their first import of asyncio, made after the entry point set its
# handlers; PYTHONPROFILEIMPORTTIME shows it on stderr), and at later moments; wherever it lands
# (imports, option parsing, the store, discovery, serve starting or serving), it ends the same way.
EARLY = (0.0, 0.05, 0.2, 0.5)
_IMPORTED = re.compile(r"^import time:.*\|\s*asyncio(\.\w+)*$")


def _interrupted_early(argv: list[str], delay: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stderr is not None
    assert process.stdout is not None
    said: list[str] = []
    importing = threading.Event()

    def read(stream: Any) -> None:  # drained all along: a full pipe would stall the command
        for line in stream:
            if _IMPORTED.match(line.rstrip("\n")):
                importing.set()
            elif not line.startswith("import time:"):
                said.append(line)
        importing.set()

    reader = threading.Thread(target=read, args=(process.stderr,), daemon=True)
    reader.start()
    try:
        assert importing.wait(60), "the command line never began its imports"
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        out = process.stdout.read()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    return subprocess.CompletedProcess(argv, process.returncode, out, "".join(said))


@pytest.mark.parametrize("command", ["run", "serve"])
def test_ctrl_c_at_any_moment_of_the_start_ends_as_an_interruption(
    tmp_path: Path, command: str
) -> None:
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"
    with SilentListener() as silent:  # an agent whose card never comes: run waits in discovery
        for i, delay in enumerate(EARLY):
            as_json = i % 2 == 1
            argv = (
                [sys.executable, "-m", "cardfence", "run", f"http://127.0.0.1:{silent.port}",
                 "--skill", "echo", "--text", "hi"]
                if command == "run"
                else [CARDFENCE, "serve", "--port", "0"]
            )  # fmt: skip
            result = _interrupted_early([*argv, "--db", db, *(["--json"] * as_json)], delay)

            moment = f"{command} at {delay} s: {result.stderr}"
            assert "Traceback" not in result.stderr, moment
            assert "Exception ignored" not in result.stderr, moment
            if result.returncode == 0:  # serve was serving: it stops as docs/cli.md says
                assert command == "serve", moment
                assert '"event": "Stopping"' in result.stderr, moment
                continue
            assert result.returncode == 130, moment
            assert last_line(result).startswith("Interrupted: SIGINT received"), moment
            if as_json:
                error = document(result)["error"]
                assert (error["type"], error["exit_code"]) == ("Interrupted", 130), moment
            else:
                assert result.stdout == "", moment


def test_a_signal_inside_an_import_is_raised_once_the_import_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Raised inside the import, it could be swallowed by the import machinery's callbacks.
    (tmp_path / "signalled_mid_import.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGINT)\nDONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    imported: list[bool] = []

    def import_then_wait() -> None:
        import signalled_mid_import  # type: ignore[import-not-found]

        imported.append(signalled_mid_import.DONE)
        time.sleep(30)  # the signal, sent again, ends this wait

    with pytest.raises(KeyboardInterrupt), signals.handled():
        import_then_wait()

    assert imported == [True]
    assert signals.received() == "SIGINT"


# -- an endpoint that speaks another A2A version ------------------------------------------------


def _method_not_found(rid: object) -> Reply:
    error = {"code": -32601, "message": "Method not found"}
    return Reply(body=json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode())


def test_a_0_3_endpoint_behind_a_1_0_card_is_named_a_protocol_mismatch(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"
    with HostileAgent() as agent:
        agent.rpc["SendMessage"] = _method_not_found

        result = cardfence(db, "run", agent.url, "--skill", SKILL, "--text", "hi", "--json")

    error = document(result)["error"]
    assert result.returncode == 3, result.stderr
    assert error["type"] == "CreationRefusedError"
    for said in ("-32601", "A2A 1.0", "SendMessage", "0.3", "message/send"):
        assert said in error["message"], error["message"]
    assert last_line(result).startswith("CreationRefusedError: ")
