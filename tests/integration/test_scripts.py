"""scripts/venv.sh (sourced by scripts/test and scripts/demo) checks the interpreter before it
creates anything, and never builds on a .venv whose install did not finish.

The interpreters here are stand-ins that answer the version check as told and whose ``pip
install`` fails, so the checks run in a second and need no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in interpreter: version {version}, `-m venv` copies itself, `pip install -e` fails.
echo "$0 $*" >> "{log}"
case "$1 $2" in
  "-c "*version_info*) exit {version_ok} ;;
  "-c "*python_version*) echo "{version}"; exit 0 ;;
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0 ;;
  "-m pip") case "$*" in *--upgrade*) exit 0 ;; *) echo "pip: no network" >&2; exit 1 ;; esac ;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder shaped like a clone, with just what venv.sh reads."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "venv.sh", root / "scripts" / "venv.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def fake_python(folder: Path, version: str) -> Path:
    path = folder / f"python{version}"
    ok = 0 if tuple(int(p) for p in version.split(".")[:2]) >= (3, 11) else 1
    log = folder / "calls.log"
    path.write_text(FAKE_PYTHON.format(version=version, version_ok=ok, log=log))
    path.chmod(0o755)
    return path


def source_venv(root: Path, python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", 'source scripts/venv.sh && cardfence_venv && echo "venv ready"'],
        cwd=root,
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_interpreter_older_than_3_11_is_named_and_nothing_is_created(
    checkout: Path, tmp_path: Path
) -> None:
    done = source_venv(checkout, fake_python(tmp_path, "3.10.13"))

    assert done.returncode != 0
    assert "Python >= 3.11" in done.stderr
    assert "3.10.13" in done.stderr
    assert not (checkout / ".venv").exists()


def test_a_missing_interpreter_is_named(checkout: Path, tmp_path: Path) -> None:
    done = source_venv(checkout, tmp_path / "no-such-python")

    assert done.returncode != 0
    assert "Python >= 3.11" in done.stderr
    assert not (checkout / ".venv").exists()


def test_a_failed_install_removes_the_venv_it_was_filling(checkout: Path, tmp_path: Path) -> None:
    done = source_venv(checkout, fake_python(tmp_path, "3.12.1"))

    assert done.returncode != 0
    assert "failed" in done.stderr
    assert "venv ready" not in done.stdout
    assert not (checkout / ".venv").exists()  # the next run starts clean


def test_a_venv_whose_install_never_finished_is_made_anew(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path, "3.12.1")
    leftover = checkout / ".venv" / "bin"
    leftover.mkdir(parents=True)
    shutil.copy(python, leftover / "python")
    (checkout / ".venv" / "left-by-a-broken-run").write_text("")  # and no install stamp

    done = source_venv(checkout, python)

    assert "incomplete" in done.stderr
    assert not (checkout / ".venv" / "left-by-a-broken-run").exists()
    calls = (tmp_path / "calls.log").read_text()
    assert "-m venv" in calls  # made anew, not reused


def test_a_finished_venv_is_reused_without_reinstalling(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path, "3.12.1")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(python, checkout / ".venv" / "bin" / "python")
    digest = subprocess.run(
        ["sha256sum", str(checkout / "pyproject.toml")], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    (checkout / ".venv" / ".cardfence-installed").write_text(digest + "\n")

    done = source_venv(checkout, python)

    assert done.returncode == 0, done.stderr
    assert "venv ready" in done.stdout
    calls = (tmp_path / "calls.log").read_text()
    assert "-m venv" not in calls
    assert "-m pip install" not in calls
