"""The ``cardfence`` console script as the command-line tests run it: its path, the options that
keep a run fast, one run against a store, and what docs/cli.md fixes of its output (one JSON
document on stdout, the exit code, the last stderr line naming the error's type)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

CARDFENCE = shutil.which("cardfence", path=str(Path(sys.executable).parent)) or "cardfence"
POLL = ("--max-poll-interval", "0.2")
RUN_FAST = (*POLL, "--max-card-age", "0.3", "--card-timeout", "1")
ROW_KEYS = {
    "task",
    "remote_task_id",
    "agent",
    "skill",
    "state",
    "delivery_mode",
    "flags",
    "updated_at",
}


def cardfence(db: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CARDFENCE, *args, "--db", db], capture_output=True, text=True, timeout=timeout
    )


def document(result: subprocess.CompletedProcess[str]) -> Any:
    """The one JSON document on stdout: nothing before it, nothing after it."""
    decoded, end = json.JSONDecoder().raw_decode(result.stdout.lstrip())
    assert result.stdout.lstrip()[end:].strip() == "", f"more than one document: {result.stdout}"
    return decoded


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def failed_with(
    result: subprocess.CompletedProcess[str], code: int, type_name: str
) -> dict[str, Any]:
    """Assert the exit code and the closing stderr line; return the JSON document."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert last_line(result).startswith(f"{type_name}: "), result.stderr
    return dict(document(result))
