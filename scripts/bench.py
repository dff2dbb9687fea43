"""cardfence's benchmarks: ``python scripts/bench.py SECTION [--json] [--pg-url URL] [--quick]``.

Every figure is a rate measured in the same process as its baseline, interleaved with it run by run
(the machines these run on are shared and noisy: the ratio is the point, not the absolute rate).
Each rate is the median of ``RUNS`` timed runs.

Sections live in sibling modules named ``bench_<something>.py`` (``bench_store.py`` gives
``store``). Each one registers its sections on import::

    from bench import BenchContext, Figure, register

    @register("cards")
    def cards(ctx: BenchContext) -> list[Figure]: ...

and ``bench.py`` imports every ``bench_*.py`` next to it, so adding a section is adding a file.
The agents, servers and cards a section needs come from ``tests/support`` (``import support``),
the same the tests use.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# ``python scripts/bench.py`` runs this file as ``__main__``; section modules ``import bench``.
# Without this alias they would import a second copy with its own, empty, registry.
if __name__ == "__main__":
    sys.modules.setdefault("bench", sys.modules[__name__])

# The sections share the test suite's agents and fixtures (``tests/support``), imported as
# ``support`` as under pytest. Every section imports this module first, so this is in time for
# them, and for a section module run as a helper process of its own.
TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

RUNS = 5
PG_URL_VAR = "CARDFENCE_TEST_PG_URL"


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure. ``ratio`` is ``value / baseline``; ``target`` the ratio aimed for."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: float | None = None

    @classmethod
    def compared(
        cls, name: str, value: float, baseline: float, unit: str, target: float | None
    ) -> Figure:
        ratio = value / baseline if baseline > 0 else math.nan
        return cls(name, value, unit, baseline, ratio, target)


@dataclass(slots=True)
class BenchContext:
    """What a section gets: the options and a place for notes (printed to stderr in JSON mode)."""

    pg_url: str | None
    quick: bool
    runs: int = RUNS
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"bench: {text}", file=sys.stderr, flush=True)

    def progress(self, text: str) -> None:
        """A line on stderr while a long section runs (never part of the report)."""
        print(f"bench: … {text}", file=sys.stderr, flush=True)


Section = Callable[[BenchContext], list[Figure]]

SECTIONS: dict[str, Section] = {}
"""Every registered section by name: ``store`` and whatever later modules add."""


def register(name: str) -> Callable[[Section], Section]:
    """Register a section under ``name`` (a decorator)."""

    def decorate(section: Section) -> Section:
        if name in SECTIONS and SECTIONS[name] is not section:
            raise ValueError(f"bench section {name!r} registered twice")
        SECTIONS[name] = section
        return section

    return decorate


# -- measuring -----------------------------------------------------------------------------------

Workload = Callable[[], int]
"""One timed run: does the work and returns how many operations (events, saves…) it did."""


def _timed_rate(workload: Workload) -> float:
    gc.collect()
    start = time.perf_counter()
    count = workload()
    elapsed = time.perf_counter() - start
    return count / elapsed if elapsed > 0 else math.inf


def median_rates(workloads: dict[str, Workload], runs: int = RUNS) -> dict[str, float]:
    """The median rate (operations/s) of each workload over ``runs`` runs.

    The workloads are interleaved: run ``i`` runs every workload once, starting one further along
    the list each time, so slow drift of the machine (other tenants, caches, a growing table)
    falls on all of them alike.
    """
    names = list(workloads)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(_timed_rate(workloads[name]))
    return {name: statistics.median(values) for name, values in rates.items()}


# -- output --------------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _verdict(figure: Figure) -> str:
    if figure.ratio is None or figure.target is None:
        return ""
    return "ok" if figure.ratio >= figure.target else "BELOW"


def render_table(section: str, figures: Sequence[Figure], notes: Sequence[str] = ()) -> str:
    header = ("figure", "value", "unit", "baseline", "ratio", "target", "")
    rows = [
        (
            f.name,
            _number(f.value),
            f.unit,
            _number(f.baseline),
            "-" if f.ratio is None else f"{f.ratio:.3f}",
            "-" if f.target is None else f"{f.target:.2f}",
            _verdict(f),
        )
        for f in figures
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    left = {0, 2, 6}

    def line(row: Sequence[str]) -> str:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(cells).rstrip()

    out = [f"bench section: {section}", line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    if notes:
        out.append("")
        out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def render_json(section: str, figures: Sequence[Figure]) -> str:
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    document = {
        "section": section,
        "figures": [{k: clean(v) for k, v in asdict(f).items()} for f in figures],
    }
    return json.dumps(document, indent=2)


# -- sections ------------------------------------------------------------------------------------


def discover() -> dict[str, str]:
    """Import every ``bench_*.py`` beside this file; returns the ones that failed, with why."""
    here = Path(__file__).resolve().parent
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    failed: dict[str, str] = {}
    for path in sorted(here.glob("bench_*.py")):
        try:
            importlib.import_module(path.stem)
        except Exception:  # a broken module must not take the other sections down
            failed[path.stem] = traceback.format_exc()
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    failed = discover()
    parser = argparse.ArgumentParser(
        prog="bench.py",
        description="cardfence benchmarks: rates as ratios to raw baselines, same process.",
    )
    parser.add_argument("section", help=f"one of: {', '.join(sorted(SECTIONS)) or '(none)'}")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(PG_URL_VAR) or None,
        help=f"a PostgreSQL server to benchmark on (default: ${PG_URL_VAR}); a fresh database "
        "is created on it for the run and dropped afterwards",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    args = parser.parse_args(argv)

    section = SECTIONS.get(args.section)
    if section is None:
        for module, why in failed.items():
            print(f"bench: {module} failed to import:\n{why}", file=sys.stderr)
        parser.error(f"unknown section {args.section!r}; known: {', '.join(sorted(SECTIONS))}")
    if args.pg_url is None:
        print(
            f"bench: no PostgreSQL URL (--pg-url or ${PG_URL_VAR}): PostgreSQL figures omitted",
            file=sys.stderr,
        )
    ctx = BenchContext(pg_url=args.pg_url, quick=args.quick)
    figures = section(ctx)
    if args.json:
        print(render_json(args.section, figures))
    else:
        print(render_table(args.section, figures, ctx.notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
