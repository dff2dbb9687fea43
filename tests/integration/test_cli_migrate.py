"""`cardfence migrate` through the real console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cardfence.migrations as migrations

CARDFENCE = shutil.which("cardfence", path=str(Path(sys.executable).parent)) or "cardfence"


def _run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CARDFENCE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_migrate_creates_the_default_store_and_prints_the_revision(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CARDFENCE_DB"}
    done = subprocess.run(
        [CARDFENCE, "migrate"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == migrations.head_revision()
    assert (tmp_path / "cardfence.db").exists()


def test_migrate_json_takes_global_options_before_or_after_the_command(
    tmp_path: Path, db_url: str
) -> None:
    for args in (["--db", db_url, "--json", "migrate"], ["migrate", "--db", db_url, "--json"]):
        done = _run(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        assert document["revision"] == migrations.head_revision()


def test_migrate_reads_the_store_url_from_the_environment(tmp_path: Path) -> None:
    target = tmp_path / "from-env.db"
    done = _run("migrate", cwd=tmp_path, env={"CARDFENCE_DB": f"sqlite:///{target}"})
    assert done.returncode == 0, done.stderr
    assert target.exists()


def test_unreachable_store_exits_10_with_a_typed_one_line_error(tmp_path: Path) -> None:
    done = _run(
        "migrate", "--db", "postgresql://nobody@127.0.0.1:1/x?connect_timeout=2", cwd=tmp_path
    )
    assert done.returncode == 10
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("StoreUnavailableError: ")
    assert "Traceback" not in done.stderr


def test_too_new_store_is_refused_with_its_revision(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    assert _run("migrate", "--db", f"sqlite:///{db}", cwd=tmp_path).returncode == 0
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {migrations.VERSION_TABLE} SET version_num = 'zz_future'")
    done = _run("migrate", "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert done.returncode == 10
    assert done.stderr.strip().splitlines()[-1].startswith("SchemaTooNewError: ")
    assert "zz_future" in done.stderr


def test_bad_flags_exit_2_with_a_usage_error_line(tmp_path: Path) -> None:
    done = _run("migrate", "--no-such-flag", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("UsageError: ")


def test_python_dash_m_cardfence_is_the_same_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardfence",
            "migrate",
            "--db",
            f"sqlite:///{tmp_path / 'm.db'}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["revision"] == migrations.head_revision()


def test_postgresql_url_without_psycopg_names_the_extra_to_install(tmp_path: Path) -> None:
    blocked = (
        "import sys; sys.modules['psycopg'] = None; "  # as if psycopg were not installed
        "from cardfence.engine.cli import main; "
        "sys.argv = ['cardfence', 'migrate', '--db', 'postgresql://u@127.0.0.1:1/x']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 10
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("StoreUnavailableError: ")
    assert "pip install 'cardfence[postgres]'" in last
    assert "nothing was written" in last
