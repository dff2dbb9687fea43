"""Build cardfence's wheel the way a release would, from a copy of the sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a build must not see: a stale build/ folder would leak old files into the wheel.
NOT_SOURCES = (".venv", "build", "dist", "*.egg-info", ".git", "mutants", "__pycache__", ".*_cache")


def build_wheel(out: Path) -> Path:
    """Build the wheel into ``out`` from a clean copy of the working tree; return its path."""
    source = out / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("cardfence-*.whl")
    return wheel
