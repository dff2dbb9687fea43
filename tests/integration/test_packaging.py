"""The wheel carries all three import packages, migrations included, and a console script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_engine_store_and_the_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("cardfence-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "engine/__init__.py",
        "engine/cli.py",
        "engine/py.typed",
        "store/eventlog.py",
        "migrations/env.py",
        "migrations/script.py.mako",
        "migrations/versions/0001_event_log.py",
    ):
        assert required in names, required
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cardfence = engine.cli:main" in text
