"""The benchmark entry point runs and reports well-formed figures (no timing is asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench.py"
PG_URL_VAR = "CARDFENCE_TEST_PG_URL"
KEYS = {"name", "value", "unit", "baseline", "ratio", "target"}


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _assert_quick_rate(figure: dict[str, Any], unit: str) -> None:
    """A ``--quick`` figure that is a rate in ``unit`` against a same-run baseline."""
    assert set(figure) == KEYS, figure
    assert figure["unit"] == unit, figure
    assert figure["name"].endswith("(--quick)"), figure
    assert _positive(figure["value"]), figure
    assert _positive(figure["baseline"]), figure
    assert _positive(figure["ratio"]), figure


def _run_section(
    section: str, *, timeout: int, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run ``bench.py SECTION --quick --json``; it must succeed with exactly one JSON document
    on stdout naming the section. Returns the run and its figures."""
    done = subprocess.run(
        [sys.executable, str(BENCH), section, "--quick", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # exactly one JSON document on stdout
    assert set(document) == {"section", "figures"}
    assert document["section"] == section
    figures: list[dict[str, Any]] = document["figures"]
    return done, figures


@pytest.mark.timeout(120)
def test_store_section_quick_json() -> None:
    # PostgreSQL figures come from the same server the other tests use, only when it is set.
    env = {k: v for k, v in os.environ.items() if k != PG_URL_VAR}
    pg_url = os.environ.get(PG_URL_VAR)
    if pg_url:
        env[PG_URL_VAR] = pg_url

    done, figures = _run_section("store", timeout=110, env=env)
    assert figures
    for figure in figures:
        assert set(figure) == KEYS, figure
        assert isinstance(figure["name"], str)
        assert isinstance(figure["unit"], str)
        assert figure["name"]
        assert figure["unit"]
        assert _positive(figure["value"]), figure
        # Every store figure has a same-process baseline, so a ratio.
        assert _positive(figure["baseline"]), figure
        assert _positive(figure["ratio"]), figure
        assert figure["target"] is None or _positive(figure["target"]), figure

    names = [f["name"] for f in figures]
    assert len(names) == len(set(names))
    databases = {name.split()[0] for name in names}
    assert databases == ({"sqlite", "postgresql"} if pg_url else {"sqlite"})
    targets = {f["name"]: f["target"] for f in figures}
    assert targets["sqlite append 1 event/txn (chain+projection)"] == 0.6
    if not pg_url:
        assert "PostgreSQL figures omitted" in done.stderr


@pytest.mark.timeout(60)
def test_cards_section_quick_json() -> None:
    # Starts two local a2a-sdk agents and a SQLite store of its own; no PostgreSQL involved.
    _, figures = _run_section("cards", timeout=50)
    for figure in figures:
        assert set(figure) == KEYS, figure
        assert isinstance(figure["name"], str)
        assert figure["name"]
        # Every cards figure is a rate against a same-run baseline, with no stated target.
        assert _positive(figure["value"]), figure
        assert _positive(figure["baseline"]), figure
        assert _positive(figure["ratio"]), figure
        assert figure["target"] is None, figure

    names = [f["name"] for f in figures]
    assert len(names) == len(set(names))
    units = {f["name"]: f["unit"] for f in figures}
    parses = [n for n in names if n.startswith("parse_card ")]
    reads = [n for n in names if n.startswith("Discovery.read ")]
    assert len(parses) == 2
    assert any("2 KB" in n for n in parses)
    assert any("50 KB" in n for n in parses)
    assert len(reads) == 2
    assert any("304" in n for n in reads)
    assert any("changed" in n for n in reads)
    assert sorted(names) == sorted(parses + reads)
    assert {units[n] for n in parses} == {"cards/s"}
    assert {units[n] for n in reads} == {"reads/s"}
    # Both revalidation figures are against the same plain-GET baseline, measured once.
    assert len({f["baseline"] for f in figures if f["name"] in reads}) == 1


@pytest.mark.timeout(90)
def test_engine_section_quick_json() -> None:
    # One local a2a-sdk agent and SQLite files in a temporary folder, and a helper process
    # appending to one of them; no PostgreSQL involved.
    _, figures = _run_section("engine", timeout=80)
    names = [f["name"] for f in figures]
    assert len(names) == len(set(names))
    for figure in figures:
        assert set(figure) == KEYS, figure
        assert isinstance(figure["name"], str)
        assert figure["name"]
        assert isinstance(figure["unit"], str)
        assert figure["unit"]

    # Card requests are counts against a budget: no baseline, no ratio (see bench_engine.py).
    counts = [f for f in figures if f["unit"] == "requests/task"]
    assert [f["target"] for f in counts] == [1, 1, 0]  # creation, webhook, poll path
    for figure in counts:
        value = figure["value"]
        assert isinstance(value, int | float)
        assert not isinstance(value, bool)
        assert math.isfinite(value)
        assert value >= 0
        assert figure["baseline"] is None, figure
        assert figure["ratio"] is None, figure

    # The updates' delay from append (in another process) to delivery: p50 and p99, reported
    # with no baseline and no target.
    delays = [f for f in figures if f["unit"] == "ms"]
    assert [f["name"].rsplit(", ", 1)[1] for f in delays] == ["p50", "p99"]
    for figure in delays:
        assert _positive(figure["value"]), figure
        assert (figure["baseline"], figure["ratio"], figure["target"]) == (None, None, None)
    assert delays[0]["value"] <= delays[1]["value"]

    # Every other figure is a rate against a same-run baseline.
    rates = [f for f in figures if f["unit"] not in ("requests/task", "ms")]
    for figure in rates:
        assert _positive(figure["value"]), figure
        assert _positive(figure["baseline"]), figure
        assert _positive(figure["ratio"]), figure
        assert figure["target"] is None or _positive(figure["target"]), figure
    units = {f["unit"] for f in rates}
    assert units == {"observations/s", "calls/s", "tasks/s", "events/s"}
    targets = {f["name"].split(",")[0]: f["target"] for f in rates if f["target"] is not None}
    assert targets == {
        "Observing.apply: transition+guards+event+projection": 0.5,
        "end to end ask->reply->completed": 0.85,
        "task with a 256 KiB file part": 0.8,  # 1 MiB at full size
        "replay: read_stream + audit.replay": 1.5,
    }
    assert [f["target"] for f in rates if f["unit"] == "calls/s"] == [None, None]


@pytest.mark.timeout(120)
def test_push_section_quick_json() -> None:
    # A responder and a sender in processes of their own; PostgreSQL only when it is set.
    env = {k: v for k, v in os.environ.items() if k != PG_URL_VAR}
    pg_url = os.environ.get(PG_URL_VAR)
    if pg_url:
        env[PG_URL_VAR] = pg_url

    _, figures = _run_section("push", timeout=110, env=env)
    for figure in figures:
        _assert_quick_rate(figure, "deliveries/s")

    databases = ["sqlite", "postgresql"] if pg_url else ["sqlite"]
    targets = {f["name"].split()[0]: f["target"] for f in figures if f["target"] is not None}
    assert targets == dict.fromkeys(databases, 0.5)
    # Beside each database's target, two untargeted figures that place it: the floor (decode
    # and one append a delivery) against the 200-only app, and ours against the floor.
    floors = [f for f in figures if "floor" in f["name"]]
    assert sorted(f["name"].split()[0] for f in floors) == sorted(databases * 2)
    offload = [f for f in figures if "worker threads" in f["name"]]
    assert [f["target"] for f in offload] == ([None] if pg_url else [])
    assert len(figures) == len(targets) + len(floors) + len(offload)


@pytest.mark.timeout(90)
def test_serve_e2e_section_quick_json() -> None:
    # The demo agent in a process of its own (`cardfence demo --agent-only`); SQLite only.
    _, figures = _run_section("serve-e2e", timeout=80)
    [figure] = figures  # the engine as it comes, against the bare a2a-sdk client
    _assert_quick_rate(figure, "tasks/s")
    assert figure["target"] == 0.8


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_scale_section_quick_json_reports_serves_against_the_agent_alone(
    pg_admin_url: str,
) -> None:
    env = {**os.environ, PG_URL_VAR: pg_admin_url}
    done, figures = _run_section("scale", timeout=170, env=env)
    rates = [f for f in figures if f["unit"] == "tasks/s"]
    assert [f["name"].split(" serve")[0] for f in rates] == [
        "tasks driven by 1",
        "tasks completed by 1",
        "tasks driven by 2",
        "tasks completed by 2",
    ]
    for figure in rates:
        assert set(figure) == KEYS
        assert _positive(figure["value"])
        assert _positive(figure["baseline"])
        assert math.isclose(figure["ratio"], figure["value"] / figure["baseline"])
    assert all(_positive(f["value"]) for f in figures if f["unit"] == "transactions")
    assert "scale: 1 serve(s)" in done.stderr


@pytest.mark.timeout(120)
def test_group_section_quick_json_compares_writers_and_max_wait_on_each_database() -> None:
    pg_url = os.environ.get(PG_URL_VAR)  # PostgreSQL figures too when the tests have a server
    _done, figures = _run_section("group", timeout=110)
    databases = ["sqlite", "postgresql"] if pg_url else ["sqlite"]
    for database in databases:
        mine = [f for f in figures if f["name"].startswith(database)]
        rates = [f for f in mine if f["unit"] == "observations/s"]
        assert len(rates) == 5, mine
        waiting = [f["name"] for f in rates if "max_wait 1 ms (vs max_wait 0)" in f["name"]]
        assert len(waiting) == 2, waiting  # 64 writers and one, a leader waiting for company
        for figure in rates:
            assert set(figure) == KEYS
            assert _positive(figure["value"])
            assert _positive(figure["baseline"])
            assert math.isclose(figure["ratio"], figure["value"] / figure["baseline"])
        (commits,) = [f for f in mine if f["unit"] == "commits"]
        assert 0 < commits["value"] < 1  # batches formed: fewer commits than appends
