"""One import name: cardfence never collides with a user's own ``engine``, ``store`` or
``migrations`` packages (the usual layout of an application with an alembic folder)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from support import Peer

ROOT = Path(__file__).resolve().parents[2]

# A user's application, first on sys.path (it is the working folder of `python -c`).
USER_PACKAGES = {
    "engine/__init__.py": "WHOSE = 'user'\n",
    "store/__init__.py": "WHOSE = 'user'\n",
    "migrations/__init__.py": "WHOSE = 'user'\n",
    "migrations/env.py": "raise RuntimeError('the user alembic env must never run')\n",
    "migrations/versions/__init__.py": "",
}

APPLICATION = textwrap.dedent(
    """
    import asyncio, json, sys

    import engine, migrations, store  # the user's own packages
    from cardfence import Engine, EngineConfig

    async def main(agent, db):
        async with Engine.connect(db, config=EngineConfig(max_poll_interval=0.2)) as e:
            task = await e.start_task(agent, skill="echo", text="echo collision-free")
            task = await e.drive(task.task, until="terminal", timeout=20)
            revision = e.store.schema_revision()
        return {
            "state": task.state,
            "artifacts": [p.get("text") for a in task.artifacts for p in a.get("parts", ())],
            "revision": revision,
            "user": [engine.WHOSE, store.WHOSE, migrations.WHOSE],
        }

    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
    """
)


def test_user_packages_named_engine_store_and_migrations_do_not_break_cardfence(
    tmp_path: Path, peer: Peer
) -> None:
    app = tmp_path / "app"
    for name, text in USER_PACKAGES.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"

    done = subprocess.run(
        [sys.executable, "-c", APPLICATION, peer.base_url, db],
        cwd=app,
        env={"PYTHONPATH": str(app), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["user"] == ["user", "user", "user"]  # theirs stayed theirs
    assert result["state"] == "completed"
    assert result["artifacts"] == ["collision-free"]
    assert result["revision"]  # migrated by cardfence's own migrations, not the user's env.py


def test_the_repository_code_imports_only_the_cardfence_namespace() -> None:
    """No module imports the top-level folders by their bare names (they are not installed)."""
    offenders = []
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from"):
                top = words[1].split(".")[0]
                if top in ("engine", "store", "migrations"):
                    offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []
