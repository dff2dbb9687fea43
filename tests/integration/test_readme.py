"""The README's "Use it" section runs as printed against ``cardfence demo --agent-only``.

The section's first console block starts the agent; every ``$ cardfence …`` line of the blocks
after it is run in order, in a fresh folder, exactly as printed (only the port changes when 9999
is taken on this machine). Then the commands its prose names by task prefix (``reply``, ``show``)
are run on the task the walkthrough created.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "cardfence")
PRINTED_PORT = 9999


def use_it_blocks() -> list[list[str]]:
    """The ``$ `` command lines of each console block under "## Use it"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Use it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n(.*?)```", section, flags=re.S)
    return [
        [line[2:].split("  #")[0].strip() for line in block.splitlines() if line.startswith("$ ")]
        for block in blocks
    ]


def free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def agent_port(tmp_path: Path) -> Iterator[int]:
    """The agent of the section's first block, on 9999 when free (else any free port)."""
    (start,) = use_it_blocks()[0]
    argv = shlex.split(start)
    assert argv[:3] == ["cardfence", "demo", "--agent-only"], start
    port = PRINTED_PORT if free(PRINTED_PORT) else 0
    argv[argv.index("--port") + 1] = str(port)
    child = subprocess.Popen(
        [*CLI, *argv[1:], "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        started = json.loads(child.stdout.readline() or "{}")
        assert started, child.stderr.read() if child.stderr else "the agent printed nothing"
        yield int(started["agent"].rsplit(":", 1)[1])
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=30)


def test_every_command_of_the_use_it_section_runs_as_printed(
    agent_port: int, tmp_path: Path
) -> None:
    walkthrough = [line for block in use_it_blocks()[1:] for line in block]
    assert len(walkthrough) >= 5, walkthrough
    folder = tmp_path / "fresh"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARDFENCE_")}

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*CLI, *argv[1:]], cwd=folder, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        return done

    ask_task = None
    for line in walkthrough:
        argv = shlex.split(line.replace(f":{PRINTED_PORT}", f":{agent_port}"))
        assert argv[0] == "cardfence", line
        done = run(argv)
        if "--json" in argv:
            document = json.loads(done.stdout)  # exactly one JSON document
            if argv[1] == "run" and document.get("state") == "input-required":
                ask_task = document["task"]

    # The prose goes on with the ask task by prefix: reply to it, then show its timeline.
    assert ask_task is not None, "the walkthrough should leave an input-required task"
    replied = run(["cardfence", "reply", ask_task[:8], "--text", "42", "--until", "terminal"])
    assert "state completed" in replied.stdout
    assert "answer: 42" in run(["cardfence", "show", ask_task[:8]]).stdout
