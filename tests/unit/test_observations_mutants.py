"""Observations, field by field: what is recorded, the ordering watermark, and the wire mapping.

Written to kill the mutants of ``engine/observations.py`` that ``scripts/mutation`` found alive.
The P1 differential proof cannot see a fault that every world shares (a dropped status message,
a push read as nothing): these tests pin each field from the wire value to the recorded event.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from cardfence.engine import events as ev
from cardfence.engine.observations import (
    ArtifactRecord,
    Observation,
    apply_observation,
    artifact_record,
    from_message,
    from_task,
    from_update,
    stored_json,
    watermark_after,
)
from cardfence.engine.remote import (
    Artifact,
    Part,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    StreamUpdate,
)
from cardfence.engine.replay import initial_task_state

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
T0_ISO = "2026-11-29T12:00:00.000000+00:00"


def _task(state: str = "submitted", **extra: Any) -> dict[str, Any]:
    return {**initial_task_state("k"), "state": state, **extra}


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _iso(seconds: float) -> str:
    return _at(seconds).isoformat(timespec="microseconds")


# -- the events apply_observation returns ---------------------------------------------------------


def test_an_ignored_observation_records_the_state_it_reported() -> None:
    task = _task("completed")
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(1)))
    assert kind == ev.OBSERVATION_IGNORED
    report = data.pop("report")
    assert len(report) == 32
    assert int(report, 16) >= 0
    assert data == {
        "reason": "after_terminal",
        "state": "working",
        "source": "push",
        "remote_timestamp": _iso(1),
    }


def _digest(record: dict[str, Any]) -> dict[str, Any]:
    text = stored_json(record)
    return {**record, "bytes": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def test_a_new_artifact_is_recorded_with_its_parts_and_source() -> None:
    artifact = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "42"},))
    report = Observation("stream", None, artifacts=(artifact,))
    recorded = {"artifact_id": "a1", "name": "answer", "parts": [{"kind": "text", "text": "42"}]}
    assert apply_observation(_task("working"), report) == [
        (ev.ARTIFACT_RECEIVED, {**_digest(recorded), "source": "stream"})
    ]


def test_an_artifact_repeated_in_one_report_is_recorded_once() -> None:
    artifact = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "42"},))
    report = Observation("poll", None, artifacts=(artifact, artifact))
    assert [kind for kind, _ in apply_observation(_task("working"), report)] == [
        ev.ARTIFACT_RECEIVED
    ]


def test_a_projection_without_artifacts_takes_new_ones() -> None:
    artifact = ArtifactRecord("a1", None)
    report = Observation("poll", None, artifacts=(artifact,))
    events = apply_observation({"state": "working"}, report)
    recorded = {"artifact_id": "a1", "name": None, "parts": []}
    assert events == [(ev.ARTIFACT_RECEIVED, {**_digest(recorded), "source": "poll"})]


# -- ordering by generation (R12) ----------------------------------------------------------------


def test_a_redelivered_report_with_a_generation_is_a_duplicate() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(1), 4))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "duplicate")


def test_the_next_generation_of_the_same_state_is_newer_not_a_duplicate() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(1), 5))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "same_state")


def test_the_previous_generation_is_stale() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [(kind, data)] = apply_observation(task, Observation("push", "input-required", _at(9), 3))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "stale")


@pytest.fixture
def local_zone_is_not_utc() -> Iterator[None]:
    """The machine's local time zone set to UTC+9 (a POSIX TZ string: no tz database needed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "JST-9")
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


@pytest.mark.usefixtures("local_zone_is_not_utc")
def test_remote_timestamps_are_recorded_in_utc_whatever_the_local_zone() -> None:
    assert datetime(2026, 1, 1, tzinfo=UTC).astimezone().utcoffset() == timedelta(hours=9)
    paris = timezone(timedelta(hours=1))
    [(_, data)] = apply_observation(_task(), Observation("poll", "working", T0.astimezone(paris)))
    assert data["remote_timestamp"] == T0_ISO


# -- the watermark the projection keeps (R12) ----------------------------------------------------

APPLIED = {"remote_timestamp": _iso(5), "generation": 7}


@pytest.mark.parametrize("reason", ["stale", "duplicate", "illegal", "after_terminal", "unknown"])
def test_ignored_reports_other_than_same_state_leave_the_watermark(reason: str) -> None:
    data = {"reason": reason, "remote_timestamp": _iso(9), "generation": 9}
    assert watermark_after(APPLIED, ev.OBSERVATION_IGNORED, data) == (_iso(5), 7)


def test_other_events_leave_the_watermark() -> None:
    data = {"remote_timestamp": _iso(9), "generation": 9}
    assert watermark_after(APPLIED, ev.ARTIFACT_RECEIVED, data) == (_iso(5), 7)


def test_a_newer_same_state_report_moves_the_watermark() -> None:
    data = {"reason": "same_state", "remote_timestamp": _iso(9), "generation": 9}
    assert watermark_after(APPLIED, ev.OBSERVATION_IGNORED, data) == (_iso(9), 9)


def test_a_transition_without_time_or_generation_keeps_the_last_ones() -> None:
    data = {"from": "working", "to": "completed", "remote_timestamp": None}
    assert watermark_after(APPLIED, ev.STATE_CHANGED, data) == (_iso(5), 7)


# -- from the wire --------------------------------------------------------------------------------

PARTS = (
    Part("text", text="42", media_type="text/plain"),
    Part("data", data={"n": 42}),
    Part("url", url="http://files.test/a.png", media_type="image/png"),
)
RECORDED_PARTS = (
    {"kind": "text", "text": "42", "media_type": "text/plain"},
    {"kind": "data", "data": {"n": 42}},
    {"kind": "url", "url": "http://files.test/a.png", "media_type": "image/png"},
)
ARTIFACT = Artifact("a1", "answer", PARTS, description="not recorded")
QUESTION = StatusMessage("m1", "agent", (Part("text", text="Which one?"),), "Which one?")
REMOTE = RemoteTask(
    id="r-1",
    context_id="c-1",
    state="input-required",
    timestamp=_at(3),
    generation=2,
    message=QUESTION,
    artifacts=(ARTIFACT,),
)


def test_an_artifact_is_recorded_with_its_id_name_and_non_empty_part_fields() -> None:
    assert artifact_record(ARTIFACT) == ArtifactRecord("a1", "answer", RECORDED_PARTS)
    assert artifact_record(Artifact("a2", None, ())) == ArtifactRecord("a2", None, ())


def test_a_task_snapshot_is_observed_field_by_field() -> None:
    assert from_task(REMOTE, "poll") == Observation(
        source="poll",
        state="input-required",
        remote_timestamp=_at(3),
        generation=2,
        message="Which one?",
        artifacts=(ArtifactRecord("a1", "answer", RECORDED_PARTS),),
        remote_task_id="r-1",
        remote_context_id="c-1",
    )


def test_a_task_snapshot_without_a_status_message_has_none() -> None:
    bare = RemoteTask("r-1", None, "working", None, None, None, ())
    assert from_task(bare, "send") == Observation("send", "working", remote_task_id="r-1")


def test_a_bare_message_answer_completes_the_task_with_its_text() -> None:
    answer = RemoteMessage("m2", "c-1", None, "agent", (Part("text", text="done"),), "done")
    assert from_message(answer, "send") == Observation("send", "completed", message="done")


def test_a_task_update_is_observed_as_its_task() -> None:
    update = StreamUpdate("task", "r-1", "c-1", task=REMOTE)
    assert from_update(update, "push") == from_task(REMOTE, "push")


def test_a_status_update_is_observed_field_by_field() -> None:
    update = StreamUpdate(
        "status", "r-1", "c-1", state="working", timestamp=_at(4), generation=3, message=QUESTION
    )
    assert from_update(update, "stream") == Observation(
        source="stream",
        state="working",
        remote_timestamp=_at(4),
        generation=3,
        message="Which one?",
        remote_task_id="r-1",
        remote_context_id="c-1",
    )


def test_a_status_update_without_a_message_has_none() -> None:
    update = StreamUpdate("status", "r-1", None, state="working")
    assert from_update(update, "push") == Observation("push", "working", remote_task_id="r-1")


def test_an_artifact_update_is_observed_without_a_state() -> None:
    update = StreamUpdate("artifact", "r-1", "c-1", artifact=ARTIFACT)
    assert from_update(update, "push") == Observation(
        source="push",
        state=None,
        artifacts=(ArtifactRecord("a1", "answer", RECORDED_PARTS),),
        remote_task_id="r-1",
        remote_context_id="c-1",
    )


@pytest.mark.parametrize(
    "update",
    [
        StreamUpdate("message", "r-1", "c-1", message=QUESTION),
        StreamUpdate("task", "r-1", "c-1"),
        StreamUpdate("artifact", "r-1", "c-1"),
    ],
    ids=["bare message", "task update without a task", "artifact update without an artifact"],
)
def test_an_update_that_says_nothing_of_the_task_is_no_observation(update: StreamUpdate) -> None:
    assert from_update(update, "push") is None
