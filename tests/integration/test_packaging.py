"""The wheel installs one import package, ``cardfence``, with its wings, migrations and licence."""

from __future__ import annotations

import zipfile
from pathlib import Path

from support.wheel import build_wheel


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
        "cardfence/engine/client/engine.py",
        "cardfence/engine/client/_records.py",
        "cardfence/engine/client/_observing.py",
        "cardfence/engine/discovery/reads.py",
        "cardfence/engine/cli/main.py",
        "cardfence/store/event_store.py",
        "cardfence/store/_appending.py",
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
