"""R16: applying and replaying artifacts is linear, and the limits on what is kept agree."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cardfence.engine.client.tasklog import AsOf, TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.core.observations import (
    MAX_RECORDED_ARTIFACT_BYTES,
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_NAME_CHARS,
    ArtifactRecord,
    Observation,
    apply_observation,
    stored_json,
)
from cardfence.engine.core.replay import apply_task_events, fold_task, initial_task_state
from cardfence.engine.wire.exchange import DEFAULT_MAX_BYTES
from cardfence.engine.wire.v10 import MAX_ID_CHARS
from cardfence.store._base import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PROJECTION_BYTES
from cardfence.store.event_store import EventStore


def _growth(seconds: Callable[[int], float], small: int, large: int) -> float:
    """How many times longer ``seconds(large)`` takes than ``seconds(small)``: the best of three
    runs of each, with the cyclic garbage collector off while they run (its passes grow with the
    heap, not with the work measured) and CPU time rather than wall time (a loaded machine
    stretches the second, not the first). Linear work grows about ``large / small`` times,
    quadratic work its square: a factor of 4 between sizes tells them apart by 4 against 16."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        seconds(small)  # warm up
        return min(seconds(large) for _ in range(3)) / min(seconds(small) for _ in range(3))
    finally:
        if collecting:
            gc.enable()


def _apply_and_replay(count: int) -> float:
    report = Observation(
        "send",
        "completed",
        artifacts=tuple(
            ArtifactRecord(f"a{n}", None, ({"kind": "text", "text": f"part {n}"},))
            for n in range(count)
        ),
    )
    started = time.process_time()
    task = initial_task_state("k")
    events = apply_observation(task, report)
    projection = apply_task_events(task, events)
    assert fold_task("k", events) == projection
    assert len(projection["artifacts"]) == count
    return time.process_time() - started


def test_applying_and_replaying_artifacts_is_linear_in_their_number() -> None:
    assert _growth(_apply_and_replay, 5_000, 20_000) < 8.0  # linear about 4, quadratic 16


def _listed_as_of(folder: Path, count: int) -> float:
    """CPU seconds ``TaskLog.all_as_of`` takes over one task of ``count`` artifact events."""
    name = f"as-of-{count}-{time.perf_counter_ns()}.db"  # a new store each time
    with EventStore.open(f"sqlite:///{folder / name}") as store:
        log = TaskLog(store)
        log.create("k", [(ev.TASK_SUBMITTED, {"task": "k"})])
        artifacts = [
            (ev.ARTIFACT_RECEIVED, {"artifact_id": f"a{n}", "name": None, "parts": []})
            for n in range(count)
        ]
        log.record("k", lambda _state: artifacts)
        started = time.process_time()
        [head] = log.all_as_of(AsOf(position=count + 1))
        elapsed = time.process_time() - started
        assert len(head.state["artifacts"]) == count
        assert head.state == log.head("k").state
        return elapsed


def test_listing_as_of_a_point_is_linear_in_a_tasks_artifacts(tmp_path: Path) -> None:
    growth = _growth(lambda count: _listed_as_of(tmp_path, count), 2_500, 10_000)
    assert growth < 8.0  # linear about 4, quadratic 16


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
