"""R16: applying and replaying artifacts is linear, and the limits on what is kept agree."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cardfence.engine import events as ev
from cardfence.engine.observations import (
    MAX_RECORDED_ARTIFACT_BYTES,
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_NAME_CHARS,
    ArtifactRecord,
    Observation,
    apply_observation,
    stored_json,
)
from cardfence.engine.remote import MAX_ID_CHARS
from cardfence.engine.replay import apply_task_events, fold_task, initial_task_state
from cardfence.engine.tasklog import AsOf, TaskLog
from cardfence.engine.transport import DEFAULT_MAX_BYTES
from cardfence.store import EventStore
from cardfence.store.eventlog import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PROJECTION_BYTES


def _apply_and_replay(count: int) -> float:
    report = Observation(
        "send",
        "completed",
        artifacts=tuple(
            ArtifactRecord(f"a{n}", None, ({"kind": "text", "text": f"part {n}"},))
            for n in range(count)
        ),
    )
    started = time.perf_counter()
    task = initial_task_state("k")
    events = apply_observation(task, report)
    projection = apply_task_events(task, events)
    assert fold_task("k", events) == projection
    assert len(projection["artifacts"]) == count
    return time.perf_counter() - started


def test_applying_and_replaying_artifacts_is_linear_in_their_number() -> None:
    _apply_and_replay(2_000)  # warm up
    ratios = []
    for _ in range(3):  # the best of three: a loaded machine may slow one run down
        ratios.append(_apply_and_replay(40_000) / _apply_and_replay(20_000))
    assert min(ratios) < 3.0  # quadratic would be about 4


def _listed_as_of(folder: Path, count: int) -> float:
    """Seconds ``TaskLog.all_as_of`` takes over one task of ``count`` artifact events."""
    name = f"as-of-{count}-{time.perf_counter_ns()}.db"  # a new store each time
    with EventStore.open(f"sqlite:///{folder / name}") as store:
        log = TaskLog(store)
        log.create("k", [(ev.TASK_SUBMITTED, {"task": "k"})])
        artifacts = [
            (ev.ARTIFACT_RECEIVED, {"artifact_id": f"a{n}", "name": None, "parts": []})
            for n in range(count)
        ]
        log.record("k", lambda _state: artifacts)
        started = time.perf_counter()
        [head] = log.all_as_of(AsOf(position=count + 1))
        elapsed = time.perf_counter() - started
        assert len(head.state["artifacts"]) == count
        assert head.state == log.head("k").state
        return elapsed


def test_listing_as_of_a_point_is_linear_in_a_tasks_artifacts(tmp_path: Path) -> None:
    _listed_as_of(tmp_path, 1_000)  # warm up
    small, large = _listed_as_of(tmp_path, 10_000), _listed_as_of(tmp_path, 20_000)
    ratios = [large / small]
    for _ in range(2):  # the best of three: a loaded machine may slow one run down
        ratios.append(_listed_as_of(tmp_path, 20_000) / _listed_as_of(tmp_path, 10_000))
    assert min(ratios) < 3.0  # quadratic would be about 4


def test_100000_artifacts_are_applied_and_replayed() -> None:
    _apply_and_replay(100_000)  # before: did not finish in 120 s; no wall-clock bound here


def test_an_artifact_replayed_one_event_at_a_time_is_replaced_in_place() -> None:
    events: list[tuple[str, dict[str, Any]]] = [
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a1", "name": None, "parts": []}),
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a2", "name": None, "parts": []}),
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a1", "name": "new", "parts": [], "replaces": True}),
    ]
    state = initial_task_state("k")
    for event in events:
        state = apply_task_events(state, [event])
    assert state == fold_task("k", events)
    assert [(a["artifact_id"], a["name"]) for a in state["artifacts"]] == [
        ("a1", "new"),
        ("a2", None),
    ]


def test_the_largest_record_kept_whole_fits_in_one_event_with_room_to_spare() -> None:
    # Kept whole: at most MAX_RECORDED_ARTIFACT_BYTES plus its digest fields and source.
    whole: dict[str, Any] = {"artifact_id": "a" * MAX_ID_CHARS, "name": None, "parts": []}
    envelope = len(stored_json({**whole, "bytes": 10**9, "sha256": "0" * 64, "source": "push"}))
    assert MAX_RECORDED_ARTIFACT_BYTES + envelope < DEFAULT_MAX_PAYLOAD_BYTES
    # A state event carries at most one message kept whole, plus ids and timestamps.
    assert MAX_RECORDED_MESSAGE_BYTES + 4 * MAX_ID_CHARS + 1024 < DEFAULT_MAX_PAYLOAD_BYTES
    # A record kept as a digest is small whatever the artifact's size.
    truncated = ArtifactRecord("a" * MAX_ID_CHARS, "n" * 10**6, ({"text": "x" * 2**20},))
    kept = truncated.to_json()
    assert kept["truncated"] is True
    assert len(kept["name"]) == MAX_RECORDED_NAME_CHARS
    assert len(stored_json(kept)) < 1024


def test_one_whole_answer_fits_in_a_projection() -> None:
    # The transport accepts an answer of DEFAULT_MAX_BYTES; what it adds to a projection is at
    # most its artifacts' records, never longer than about twice their wire form (a digest record
    # is under 1 KiB): the projection limit leaves room for several such answers.
    assert DEFAULT_MAX_PROJECTION_BYTES >= 4 * 2 * DEFAULT_MAX_BYTES
