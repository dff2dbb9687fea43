"""The wheel, installed with its ``demo`` extra into a fresh virtual environment outside the
repository, works as a user gets it: the console script, the demo agent and the public API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.wheel import build_wheel


def run(*argv: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_the_wheel_installed_with_the_demo_extra_migrates_plays_a_scenario_and_imports(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    venv = tmp_path / "user-venv"
    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    assert run(sys.executable, "-m", "venv", venv, cwd=elsewhere).returncode == 0
    python, cardfence = venv / "bin" / "python", venv / "bin" / "cardfence"
    installed = run(python, "-m", "pip", "install", "-q", f"{wheel}[demo]", cwd=elsewhere)
    assert installed.returncode == 0, installed.stderr[-2000:]

    site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=elsewhere
        ).stdout.strip()
    )
    wings = ("core", "cards", "discovery", "wire", "http", "auth", "client", "serve", "cli", "demo")
    for wing in wings:  # every wing of the engine is in the wheel
        assert (site / "cardfence" / "engine" / wing / "__init__.py").is_file(), wing
    assert (site / "cardfence" / "engine" / "client" / "engine.py").is_file()
    assert (site / "cardfence" / "store" / "_appending.py").is_file()
    for bare in ("engine", "store", "migrations"):
        assert not (site / bare).exists(), f"{bare} installed at the top of site-packages"

    migrated = run(cardfence, "migrate", "--db", f"sqlite:///{elsewhere / 'c.db'}", cwd=elsewhere)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip()  # the revision

    demo = run(cardfence, "demo", "--scenario", "2", cwd=elsewhere, timeout=180)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "completed" in demo.stdout
    assert "intact" in demo.stdout  # the audit verdict

    imported = run(
        python, "-c", "from cardfence import Engine; print(Engine.__name__)", cwd=elsewhere
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "Engine"
