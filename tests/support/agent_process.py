"""The demo agent (``cardfence demo --agent-only``) in a process of its own: for what must not share
a process, nor its GIL, with the agent (several ``serve`` processes, the benchmarks of ``serve``).
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

STARTUP_SECONDS = 60.0
STOP_SECONDS = 30.0


@contextlib.contextmanager
def demo_agent_process(log: Path | None = None) -> Iterator[str]:
    """The agent on a free port of 127.0.0.1; its base URL, once it listens. Its stderr goes to
    ``log`` (default: nowhere). Stopped by its pid: SIGTERM, then SIGKILL if it lingers."""
    args = [sys.executable, "-m", "cardfence", "demo", "--agent-only", "--port", "0", "--json"]
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(log.open("w")) if log is not None else subprocess.DEVNULL
        child = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True
        )
        try:
            yield _announced(child, log)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            if child.stdout is not None:
                child.stdout.close()


def _announced(child: subprocess.Popen[str], log: Path | None) -> str:
    """The URL of the one JSON document the agent prints once it listens."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], STARTUP_SECONDS)
    line = child.stdout.readline() if ready else ""
    if not line:
        why = log.read_text()[-2000:] if log is not None else "(stderr not kept)"
        raise RuntimeError(f"the demo agent did not start within {STARTUP_SECONDS:.0f} s: {why}")
    return str(json.loads(line)["agent"])
