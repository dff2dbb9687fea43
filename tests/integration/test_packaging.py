"""The wheel installs one import package, ``cardfence``, with its wings, migrations and licence."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of the sources, so a stale ``build/`` folder cannot leak in."""
    source = out / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".venv", "build", "dist", "*.egg-info", ".git", "mutants", "__pycache__", ".*_cache"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("cardfence-*.whl")
    return wheel


def test_wheel_installs_only_cardfence_at_the_top_with_its_wings_and_migrations(
    tmp_path: Path,
) -> None:
    wheel = zipfile.ZipFile(build_wheel(tmp_path))
    names = set(wheel.namelist())
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"cardfence"}
    for required in (
        "cardfence/__init__.py",
        "cardfence/__main__.py",
        "cardfence/py.typed",
        "cardfence/engine/engine.py",
        "cardfence/engine/cards/discovery.py",
        "cardfence/engine/cli/main.py",
        "cardfence/store/eventlog.py",
        "cardfence/migrations/env.py",
        "cardfence/migrations/script.py.mako",
        "cardfence/migrations/versions/0001_event_log.py",
    ):
        assert required in names, required
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cardfence = cardfence.engine.cli:main" in wheel.read(entry_points).decode()
    licence = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert b"Apache License" in wheel.read(licence)
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
