"""R10, R12, R16: whatever the remote answers, its terminal report is recorded and the log grows
at most linearly in the number of DISTINCT reports.

Any sequence of answers (sends, polls, pushes) drawn from a small pool of reports, so that repeats
are frequent: arbitrary states, timestamps far in the future, far in the past, close to receipt or
absent, generations small and far ahead, status messages small and oversize, artifacts new,
changed, repeated (in one report too) and oversize. Applied through the one path every remote
report takes (``apply_observation``) and folded by the replay fold (``apply_task_events``),
exactly as ``TaskLog.record`` does.

Proved for every sequence:

- the first terminal state the remote reports is the task's state at the end (R10, R12: no
  agent clock blocks it);
- events appended <= C * distinct + C0, with C = 2 + MAX_ARTIFACTS = 4 (a report's state event,
  its one recorded repeat, and its at most two artifacts) and C0 = 4 (the ``clock_skew``,
  ``generation_skew``, ``payload_truncated`` and ``artifact_dropped`` flags, each recorded once);
- the projection after each report equals the fold of all events so far (R13).

Teeth: a planted engine that orders by an unbounded timestamp, and one that records every repeat,
are each caught by ``hypothesis.find`` within a few seconds (no shrinking).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import find as hypothesis_find
from hypothesis import strategies as st

from cardfence.engine.core import observations
from cardfence.engine.core.lifecycle import TERMINAL, is_legal
from cardfence.engine.core.observations import (
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_PARTS,
    ArtifactRecord,
    Observation,
    apply_observation,
)
from cardfence.engine.core.replay import apply_task_events, fold_task, initial_task_state

MAX_ARTIFACTS = 2
C = 2 + MAX_ARTIFACTS
C0 = 4
RECEIVED = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
STATES = ("submitted", "working", "input-required", "auth-required", "unknown", *sorted(TERMINAL))
BIG_MESSAGE = "m" * (MAX_RECORDED_MESSAGE_BYTES + 1)

timestamps = st.one_of(
    st.none(),
    st.integers(-600, 600).map(lambda s: RECEIVED + timedelta(seconds=s)),  # close to receipt
    st.just(FAR_FUTURE),
    st.integers(1, 10_000).map(lambda d: RECEIVED + timedelta(days=d)),  # future
    st.just(datetime(1970, 1, 1, tzinfo=UTC)),  # far past
)
artifacts = st.builds(
    lambda aid, version: ArtifactRecord(
        aid,
        None,
        ({"kind": "text", "text": "x"},) * (MAX_RECORDED_PARTS + 1)
        if version == 2
        else ({"kind": "text", "text": f"v{version}"},),
    ),
    st.sampled_from(["a1", "a2", "a3"]),
    st.integers(0, 2),  # version 2 is over the per-artifact bound on parts: kept as its digest
)
reports = st.builds(
    lambda state, stamp, generation, message, found: (state, stamp, generation, message, found),
    st.sampled_from(STATES),
    timestamps,
    st.one_of(st.none(), st.integers(0, 3), st.sampled_from([10**30, 2**53 + 1, 10**6 + 4])),
    st.sampled_from([None, "hello", BIG_MESSAGE]),
    st.lists(artifacts, max_size=MAX_ARTIFACTS),
)
sources = st.sampled_from(["send", "poll", "push"])
# A pool of distinct reports and a long sequence of picks from it: repeats are the rule.
scenarios = st.lists(reports, min_size=1, max_size=6, unique_by=repr).flatmap(
    lambda pool: st.tuples(
        st.just(pool), st.lists(st.tuples(st.integers(0, len(pool) - 1), sources), max_size=40)
    )
)

Scenario = tuple[list[Any], list[tuple[int, str]]]
Apply = Callable[[dict[str, Any], Observation], list[tuple[str, dict[str, Any]]]]


def play(scenario: Scenario, apply: Apply = apply_observation) -> str | None:
    """The first way the run breaks the property, or None."""
    pool, picks = scenario
    task: dict[str, Any] = initial_task_state("k")
    logged: list[tuple[str, dict[str, Any]]] = []
    first_terminal: str | None = None
    used: set[int] = set()
    for index, source in picks:
        state, stamp, generation, message, found = pool[index]
        used.add(index)
        if first_terminal is None and state in TERMINAL:
            first_terminal = state
        report = Observation(
            source, state, stamp, generation, message, tuple(found), received_at=RECEIVED
        )
        events = apply(task, report)
        logged += events
        task = apply_task_events(task, events)
    if task != fold_task("k", logged):
        return "replay differs from the projection"
    if first_terminal is not None and task["state"] != first_terminal:
        return f"the remote reported {first_terminal} first, the task is {task['state']}"
    if len(logged) > C * len(used) + C0:
        return f"{len(logged)} events for {len(used)} distinct reports"
    return None


def _artifact(artifact_id: str, version: int) -> ArtifactRecord:
    text = "x" * 300_000 if version == 2 else f"v{version}"
    return ArtifactRecord(artifact_id, None, ({"kind": "text", "text": text},))


# Found by the ci profile: a report naming artifact a1 twice (v0, then v1) appended both on every
# read, flip-flopping between them; one record per artifactId, the last winning, fixed it.
FLIP_FLOP: Scenario = (
    [
        ("submitted", None, None, None, []),
        ("canceled", None, None, None, [_artifact("a1", 0), _artifact("a1", 1)]),
        ("canceled", None, None, None, [_artifact("a1", 0), _artifact("a1", 2)]),
    ],
    [(0, "send"), (0, "send"), (2, "send"), (1, "poll"), (1, "poll"), (1, "poll"), (1, "send")],
)

# Found by the ci profile too: after the terminal report, answers alternating two versions of
# artifacts a2 and a3 appended a replacement on every read; a version once replaced is never
# appended again.
ALTERNATING: Scenario = (
    [
        ("canceled", FAR_FUTURE, None, None, [_artifact("a2", 0), _artifact("a3", 0)]),
        ("canceled", None, None, None, [_artifact("a1", 0)]),
        ("submitted", None, None, None, [_artifact("a2", 1), _artifact("a3", 2)]),
    ],
    [(1, "send"), (0, "poll"), (1, "send"), (2, "send"), (0, "send"), (0, "send")]
    + [(2, "send"), (0, "send")] * 4,
)


@given(scenarios)
@example(FLIP_FLOP)
@example(ALTERNATING)
def test_every_terminal_report_is_recorded_and_the_log_grows_linearly_in_distinct_reports(
    scenario: Scenario,
) -> None:
    assert play(scenario) is None


# -- teeth ----------------------------------------------------------------------------------------


def catches(apply: Apply) -> str | None:
    """A problem the property finds in ``apply``: a generated search, no shrinking, bounded."""
    found = hypothesis_find(
        scenarios,
        lambda scenario: play(scenario, apply) is not None,
        settings=settings(
            max_examples=1000,
            phases=[Phase.generate],
            database=None,
            deadline=None,
            derandomize=True,  # a planted bug must be caught on every run, not on most
        ),
    )
    return play(found, apply)


@contextmanager
def planted(name: str, replacement: Any) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(observations, name, replacement)
        yield


def _ordered_like_any_report(task: Any, observation: Observation, usable: Any) -> str | None:
    """``_ignored_reason`` as it was: a terminal report is ordered like any other."""
    current, state = task["state"], observation.state
    if state == "unknown":
        return observations.IGNORED_UNKNOWN
    if current in TERMINAL:
        return "duplicate" if state == current else "after_terminal"
    order = observations._compare(task, observation, usable)
    if order < 0:
        return "stale"
    if state == current:
        return "duplicate" if order == 0 else "same_state"
    return None if is_legal(current, state or "") else "illegal"


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_property_catches_ordering_by_an_unbounded_timestamp() -> None:
    # The planted bug (the wedge): every timestamp orders reports, however far ahead of its
    # receipt, and a terminal report is ordered like any other.
    with (
        planted("_skewed", lambda observation, max_clock_skew: False),
        planted("_ignored_reason", _ordered_like_any_report),
    ):
        problem = catches(apply_observation)
    assert problem is not None
    assert "reported" in problem


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_property_catches_appending_every_repeat() -> None:
    # The planted bug: a report seen before is applied again (and recorded) every time.
    with planted("_is_repeat", lambda task, report: False):
        problem = catches(apply_observation)
    assert problem is not None
    assert "distinct reports" in problem
