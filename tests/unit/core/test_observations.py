"""Observations, field by field: what is recorded, the ordering watermark, and the wire mapping.

The P1 differential proof cannot see a fault that every world shares (a dropped status message, a
push read as nothing): these tests pin each field from the wire value to the recorded event."""

from __future__ import annotations

import base64
import gc
import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from support.events import stored, submitted

from cardfence.engine.client.tasklog import AsOf, TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.core import observations
from cardfence.engine.core.answers import (
    Artifact,
    Part,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    StreamUpdate,
)
from cardfence.engine.core.content import outlined
from cardfence.engine.core.observations import (
    FLAG_PAYLOAD_TRUNCATED,
    MAX_RECORDED_ARTIFACT_BYTES,
    MAX_RECORDED_MEDIA_TYPE_CHARS,
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_NAME_CHARS,
    MAX_RECORDED_PARTS,
    MAX_REPORT_PARTS,
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
from cardfence.engine.core.replay import (
    apply_task_event,
    apply_task_events,
    fold_task,
    initial_task_state,
)
from cardfence.engine.wire.exchange import DEFAULT_MAX_BYTES
from cardfence.engine.wire.v10 import MAX_ID_CHARS
from cardfence.store._base import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PROJECTION_BYTES
from cardfence.store.event_store import EventStore

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
    [event] = apply_observation(task, Observation("push", "working", _at(1)))
    assert event.type == ev.OBSERVATION_IGNORED
    data = event.payload()
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
    assert stored(apply_observation(_task("working"), report)) == [
        (ev.ARTIFACT_RECEIVED, {**_digest(recorded), "source": "stream"})
    ]


def test_an_artifact_repeated_in_one_report_is_recorded_once() -> None:
    artifact = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "42"},))
    report = Observation("poll", None, artifacts=(artifact, artifact))
    assert [event.type for event in apply_observation(_task("working"), report)] == [
        ev.ARTIFACT_RECEIVED
    ]


def test_a_projection_without_artifacts_takes_new_ones() -> None:
    artifact = ArtifactRecord("a1", None)
    report = Observation("poll", None, artifacts=(artifact,))
    events = apply_observation({"state": "working"}, report)
    recorded = {"artifact_id": "a1", "name": None, "parts": []}
    assert stored(events) == [(ev.ARTIFACT_RECEIVED, {**_digest(recorded), "source": "poll"})]


# -- ordering by generation (R12) ----------------------------------------------------------------


def test_a_redelivered_report_with_a_generation_is_a_duplicate() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [event] = apply_observation(task, Observation("push", "working", _at(1), 4))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "duplicate"


def test_the_next_generation_of_the_same_state_is_newer_not_a_duplicate() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [event] = apply_observation(task, Observation("push", "working", _at(1), 5))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "same_state"


def test_the_previous_generation_is_stale() -> None:
    task = _task("working", generation=4, remote_timestamp=_iso(1))
    [event] = apply_observation(task, Observation("push", "input-required", _at(9), 3))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "stale"


@pytest.mark.usefixtures("local_zone_is_not_utc")
def test_remote_timestamps_are_recorded_in_utc_whatever_the_local_zone() -> None:
    assert datetime(2026, 1, 1, tzinfo=UTC).astimezone().utcoffset() == timedelta(hours=9)
    paris = timezone(timedelta(hours=1))
    [event] = apply_observation(_task(), Observation("poll", "working", T0.astimezone(paris)))
    assert event.payload()["remote_timestamp"] == T0_ISO


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


# -- what the store is given (R16) ----------------------------------------------------------------


def test_stored_json_is_compact_ascii_with_sorted_keys_and_refuses_nan() -> None:
    assert stored_json({"b": [1, 2.5], "a": "\u00e9"}) == '{"a":"\\u00e9","b":[1,2.5]}'
    with pytest.raises(ValueError, match="not JSON compliant"):
        stored_json({"n": float("nan")})


def _sized_artifact(size: int, name: str | None = None) -> ArtifactRecord:
    """An artifact whose stored JSON of id, name and parts is exactly ``size`` characters."""
    empty = stored_json(
        {"artifact_id": "a1", "name": name, "parts": [{"kind": "text", "text": ""}]}
    )
    return ArtifactRecord("a1", name, ({"kind": "text", "text": "x" * (size - len(empty))},))


def test_an_artifact_at_the_size_limit_is_kept_whole_and_one_byte_more_as_its_digest() -> None:
    at_limit = _sized_artifact(MAX_RECORDED_ARTIFACT_BYTES).to_json()
    assert at_limit["bytes"] == MAX_RECORDED_ARTIFACT_BYTES
    assert "truncated" not in at_limit
    assert at_limit["parts"][0]["text"].startswith("xxx")

    over = _sized_artifact(MAX_RECORDED_ARTIFACT_BYTES + 1)
    text = stored_json({"artifact_id": "a1", "name": None, "parts": list(over.parts)})
    assert over.to_json() == {
        "artifact_id": "a1",
        "name": None,
        "truncated": True,
        "bytes": MAX_RECORDED_ARTIFACT_BYTES + 1,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def test_an_oversize_artifact_keeps_the_first_characters_of_its_name() -> None:
    name = "n" * (MAX_RECORDED_NAME_CHARS + 44)
    kept = _sized_artifact(MAX_RECORDED_ARTIFACT_BYTES + 1, name).to_json()
    assert kept["name"] == "n" * MAX_RECORDED_NAME_CHARS


# -- repeats (R12): a report recorded once is recorded once more as a repeat, then never -----------


def _recorded(task: dict[str, Any], observation: Observation) -> tuple[dict[str, Any], str]:
    """The task after ``observation`` was recorded as a transition, and its report."""
    [event] = apply_observation(task, observation)
    assert isinstance(event, ev.StateChanged)
    assert event.report is not None
    after = {
        **task,
        "state": event.to,
        "remote_timestamp": event.remote_timestamp,
        "last_report": event.report,
        "reports_seen": [event.report],
    }
    return after, event.report


def test_a_report_pushed_again_is_recorded_once_as_a_repeat_with_its_fingerprint() -> None:
    task, report = _recorded(_task(), Observation("push", "working", _at(1), message="hi"))
    again = Observation("push", "working", _at(1), message="hi")
    assert apply_observation(task, again) == [
        ev.ObservationIgnored(
            reason="duplicate",
            state="working",
            source="push",
            remote_timestamp=None,
            report=report,
            repeat=True,
        )
    ]
    assert apply_observation({**task, "reports_repeated": ["other"]}, again)[0].payload()["repeat"]
    assert apply_observation({**task, "reports_repeated": [report]}, again) == []


def test_a_report_polled_again_records_nothing() -> None:
    task, _ = _recorded(_task(), Observation("poll", "working", _at(1)))
    assert apply_observation(task, Observation("poll", "working", _at(1))) == []


def test_a_report_is_a_repeat_if_it_was_the_last_or_any_since_the_last_reply() -> None:
    task, report = _recorded(_task(), Observation("push", "working", _at(1)))
    again = Observation("push", "working", _at(1))
    only_last = {**task, "reports_seen": None}
    only_seen = {**task, "last_report": "other", "reports_seen": ["x", report]}
    neither = {**task, "last_report": "other", "reports_seen": ["x"]}
    for seen in (only_last, only_seen):
        repeated = apply_observation(seen, again)[0]
        assert isinstance(repeated, ev.ObservationIgnored)
        assert repeated.repeat is True
    [event] = apply_observation(neither, again)
    assert isinstance(event, ev.ObservationIgnored)
    assert (event.reason, "repeat" in event.payload()) == ("duplicate", False)


def test_a_poll_of_the_moment_already_applied_records_nothing_a_push_records_a_duplicate() -> None:
    task = _task("working", remote_timestamp=_iso(1))  # applied; no fingerprint kept
    # Same state, same moment, another status message: not a repeat of a recorded report.
    assert apply_observation(task, Observation("poll", "working", _at(1), message="m")) == []
    [event] = apply_observation(task, Observation("push", "working", _at(1), message="m"))
    assert isinstance(event, ev.ObservationIgnored)
    assert (event.reason, event.source) == ("duplicate", "push")


def test_the_same_state_at_the_same_time_is_a_duplicate_earlier_stale_later_same_state() -> None:
    task = _task("working", remote_timestamp=_iso(5))
    first = [
        apply_observation(task, Observation("push", "working", _at(t), message="m"))[0]
        for t in (5, 4, 6)
    ]
    assert [event.payload()["reason"] for event in first] == ["duplicate", "stale", "same_state"]


def test_a_transition_without_a_timestamp_records_no_skew() -> None:
    [event] = apply_observation(_task(), Observation("push", "working"))
    assert event.type == ev.STATE_CHANGED
    data = event.payload()
    data.pop("report")
    data.pop("said")
    assert data == {
        "from": "submitted",
        "to": "working",
        "source": "push",
        "remote_timestamp": None,
    }


# -- artifacts seen before, replaced, superseded ---------------------------------------------------

V1 = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "one"},))
V2 = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "two"},))


def _holding(record: ArtifactRecord, **extra: Any) -> dict[str, Any]:
    return _task("working", artifacts=[record.to_json()], **extra)


def test_an_artifact_already_held_is_not_recorded_again() -> None:
    assert apply_observation(_holding(V1), Observation("poll", None, artifacts=(V1,))) == []


def test_a_new_version_of_an_artifact_is_recorded_as_replacing_the_one_held() -> None:
    assert stored(apply_observation(_holding(V1), Observation("push", None, artifacts=(V2,)))) == [
        (ev.ARTIFACT_RECEIVED, {**V2.to_json(), "source": "push", "replaces": True})
    ]


def test_a_version_that_was_replaced_is_never_recorded_again() -> None:
    task = _holding(V2, **{ev.SUPERSEDED_ARTIFACTS: {"a1": [V1.to_json()["sha256"]]}})
    assert apply_observation(task, Observation("poll", None, artifacts=(V1,))) == []
    other = {ev.SUPERSEDED_ARTIFACTS: {"a2": [V1.to_json()["sha256"]]}}
    assert (
        len(apply_observation(_holding(V2, **other), Observation("poll", None, artifacts=(V1,))))
        == 1
    )


# -- flags: payload truncated, clock skew (recorded once per task) ---------------------------------

TRUNCATED_DETAIL = "an oversize part of a remote report was kept as its size and SHA-256"


def test_an_oversize_artifact_flags_the_task_once() -> None:
    big = _sized_artifact(MAX_RECORDED_ARTIFACT_BYTES + 1)
    small = ArtifactRecord("a0", None)
    report = Observation("push", None, artifacts=(big, small))
    flagged = ev.FlaggedForReview(reason="payload_truncated", detail=TRUNCATED_DETAIL)
    events = apply_observation(_task("working"), report)
    assert stored(events[:2]) == [
        (ev.ARTIFACT_RECEIVED, {**big.to_json(), "source": "push"}),
        (ev.ARTIFACT_RECEIVED, {**small.to_json(), "source": "push"}),
    ]
    assert events[2:] == [flagged]
    assert apply_observation(_task("working", flags=["clock_skew"]), report)[-1] == flagged
    already = apply_observation(_task("working", flags=["payload_truncated"]), report)
    assert [event.type for event in already] == [ev.ARTIFACT_RECEIVED, ev.ARTIFACT_RECEIVED]
    assert apply_observation(_task("working", flags=None), report)[-1] == flagged


def test_a_status_message_at_the_limit_is_kept_and_one_byte_more_is_kept_as_its_digest() -> None:
    at_limit = "m" * (MAX_RECORDED_MESSAGE_BYTES - 2)  # stored with its two quotes
    [kept] = apply_observation(_task(), Observation("push", "working", message=at_limit))
    assert kept.payload()["message"] == at_limit

    over = at_limit + "m"
    events = apply_observation(_task(), Observation("push", "working", message=over))
    [event, flag] = events
    data = event.payload()
    data.pop("report")
    data.pop("said")
    assert (event.type, data) == (
        ev.STATE_CHANGED,
        {
            "from": "submitted",
            "to": "working",
            "source": "push",
            "remote_timestamp": None,
            "message": None,
            "message_bytes": MAX_RECORDED_MESSAGE_BYTES + 1,
            "message_sha256": hashlib.sha256(f'"{over}"'.encode()).hexdigest(),
            "payload_truncated": True,
        },
    )
    assert flag == ev.FlaggedForReview(reason="payload_truncated", detail=TRUNCATED_DETAIL)
    flagged = _task(flags=["payload_truncated"])
    assert len(apply_observation(flagged, Observation("push", "working", message=over))) == 1


def test_a_timestamp_too_far_ahead_is_kept_as_reported_not_used_and_flags_the_task_once() -> None:
    ahead = Observation("push", "working", _at(400), received_at=T0)
    [event, flag] = apply_observation(_task(), ahead)
    data = event.payload()
    data.pop("report")
    data.pop("said")
    assert (event.type, data) == (
        ev.STATE_CHANGED,
        {
            "from": "submitted",
            "to": "working",
            "source": "push",
            "remote_timestamp": None,
            "reported_timestamp": _iso(400),
            "clock_skew": True,
        },
    )
    detail = (
        f"status timestamp {_iso(400)} is more than 300 s ahead of its receipt at {_iso(0)}; "
        "not used for ordering"
    )
    assert flag == ev.FlaggedForReview(reason="clock_skew", detail=detail)
    assert len(apply_observation(_task(flags=["clock_skew"]), ahead)) == 1
    assert len(apply_observation(_task(flags=["payload_truncated"]), ahead)) == 2


def test_the_clock_skew_allowed_is_the_one_given_and_its_bound_is_not_skew() -> None:
    def recorded(seconds: float, **kwargs: float) -> list[dict[str, Any]]:
        observation = Observation("push", "working", _at(seconds), received_at=T0)
        return [event.payload() for event in apply_observation(_task(), observation, **kwargs)]

    [data] = recorded(300)  # exactly the default bound: still usable
    assert data["remote_timestamp"] == _iso(300)
    [data] = recorded(400, max_clock_skew=500)
    assert (data["remote_timestamp"], "clock_skew" in data) == (_iso(400), False)
    [data, flag] = recorded(20, max_clock_skew=10)
    assert (data["remote_timestamp"], data["clock_skew"]) == (None, True)
    assert "more than 10 s ahead" in flag["detail"]
    [data] = recorded(-3600)  # behind its receipt: never skew
    assert data["remote_timestamp"] == _iso(-3600)


# --------------------------------------------------------------------------------------------------
# Applying remote reports (R10, R12): the continuation path, pure.


def _after(task: dict[str, Any], observation: Observation) -> dict[str, Any]:
    for event in apply_observation(task, observation):
        task = apply_task_event(task, event.type, event.payload())
    return task


def test_a_legal_new_state_is_a_state_change_with_its_source_and_time() -> None:
    [event] = apply_observation(_task(), Observation("poll", "working", _at(1)))
    assert isinstance(event, ev.StateChanged)
    assert (event.from_, event.to, event.source) == ("submitted", "working", "poll")
    assert event.remote_timestamp == "2026-11-29T12:00:01.000000+00:00"


@pytest.mark.parametrize("terminal", ["completed", "failed", "canceled", "rejected"])
@pytest.mark.parametrize("later", ["working", "input-required", "submitted", "completed", "failed"])
def test_terminal_states_absorb_every_later_report(terminal: str, later: str) -> None:
    task = _task(terminal, remote_timestamp=_at(5).isoformat(timespec="microseconds"))
    [event] = apply_observation(task, Observation("push", later, _at(9)))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == ("duplicate" if later == terminal else "after_terminal")


def test_an_older_report_is_stale_and_changes_nothing() -> None:
    task = _after(_task(), Observation("poll", "input-required", _at(5)))
    [event] = apply_observation(task, Observation("push", "working", _at(3)))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "stale"


def test_a_redelivered_report_is_a_duplicate() -> None:
    report = Observation("push", "working", _at(2))
    task = _after(_task(), report)
    [event] = apply_observation(task, report)
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "duplicate"
    assert _after(task, report)["state"] == "working"


def test_a_newer_same_state_report_moves_the_watermark_so_a_late_older_one_is_stale() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    task = _after(task, Observation("poll", "working", _at(3), message="half way"))
    assert task["remote_timestamp"] == _at(3).isoformat(timespec="microseconds")
    [event] = apply_observation(task, Observation("push", "input-required", _at(2)))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "stale"


def test_generation_orders_reports_before_timestamps() -> None:
    task = _after(_task(), Observation("poll", "working", _at(9), generation=4))
    [event] = apply_observation(task, Observation("push", "input-required", _at(1), 5))
    assert event.type == ev.STATE_CHANGED
    [event] = apply_observation(task, Observation("push", "input-required", _at(20), 3))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "stale"


def test_reports_without_time_are_ordered_by_arrival() -> None:
    task = _after(_task(), Observation("poll", "working", _at(5)))
    [event] = apply_observation(task, Observation("push", "input-required", None))
    assert event.type == ev.STATE_CHANGED


def test_unknown_changes_nothing_and_nothing_goes_back_to_submitted() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    [unknown] = apply_observation(task, Observation("poll", "unknown", _at(2)))
    [back] = apply_observation(task, Observation("poll", "submitted", _at(3)))
    assert (unknown.payload()["reason"], back.payload()["reason"]) == ("unknown_state", "illegal")


def test_the_first_report_naming_the_remote_task_binds_it() -> None:
    task = _after(_task(), Observation("send", "submitted", _at(0), remote_task_id="r-1",
                                       remote_context_id="c-1"))  # fmt: skip
    assert (task["remote_task_id"], task["remote_context_id"]) == ("r-1", "c-1")
    assert task["state"] == "submitted"
    [event] = apply_observation(task, Observation("poll", "working", _at(1), remote_task_id="r-1"))
    assert "remote_task_id" not in event.payload()  # bound once


def test_new_artifacts_are_recorded_once() -> None:
    artifact = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "42"},))
    report = Observation("poll", "completed", _at(1), artifacts=(artifact,))
    task = _after(_task("working"), report)
    assert [a["artifact_id"] for a in task["artifacts"]] == ["a1"]
    again = Observation("push", "completed", _at(1), artifacts=(artifact,))
    types = [event.type for event in apply_observation(task, again)]
    assert types == [ev.OBSERVATION_IGNORED]  # same artifact again: nothing new


def test_a_file_part_is_recorded_with_its_filename_and_media_type() -> None:
    part = Part("url", url="https://x.test/r.pdf", media_type="application/pdf", filename="r.pdf")
    record = artifact_record(Artifact("a1", "report", (part,)))

    recorded = record.to_json()["parts"]
    assert recorded == [
        {"kind": "url", "url": "https://x.test/r.pdf", "media_type": "application/pdf",
         "filename": "r.pdf"},
    ]  # fmt: skip
    assert "filename" not in artifact_record(Artifact("a2", None, (Part("text", "t"),))).parts[0]


FORM_PARTS = (
    {"kind": "text", "text": "Your answer?"},
    {"kind": "data", "data": {"type": "object"}},
)


def test_a_message_with_a_form_records_its_parts_and_the_next_text_only_one_drops_them() -> None:
    asked = Observation("poll", "input-required", _at(1), message="Your answer?",
                        message_parts=FORM_PARTS)  # fmt: skip
    (recorded,) = apply_observation(_task("working"), asked)
    task = _after(_task("working"), asked)
    later = _after(task, Observation("poll", "working", _at(2), message="Thanks"))

    assert recorded.payload()["message_parts"] == list(FORM_PARTS)
    assert task["last_message_parts"] == list(FORM_PARTS)
    assert later["last_message"] == "Thanks"
    assert "last_message_parts" not in later


def test_the_same_text_with_another_form_is_another_report() -> None:
    other = (FORM_PARTS[0], {"kind": "data", "data": {"type": "string"}})
    first = Observation("push", "input-required", None, message="Your answer?",
                        message_parts=FORM_PARTS)  # fmt: skip
    task = _after(_task("working"), first)

    again = Observation("push", "input-required", None, message="Your answer?",
                        message_parts=other)  # fmt: skip
    same = Observation("push", "input-required", None, message="Your answer?",
                       message_parts=FORM_PARTS)  # fmt: skip
    repeated, other_form = apply_observation(task, same)[0], apply_observation(task, again)[0]
    assert isinstance(repeated, ev.ObservationIgnored)
    assert isinstance(other_form, ev.ObservationIgnored)
    assert repeated.repeat is True
    assert other_form.repeat is None


def test_a_form_too_large_to_keep_is_kept_as_its_size_and_digest() -> None:
    huge = ({"kind": "data", "data": {"x": "y" * MAX_RECORDED_MESSAGE_BYTES}},)
    asked = Observation("poll", "input-required", _at(1), message="", message_parts=huge)
    recorded = dict(stored(apply_observation(_task("working"), asked)))[ev.STATE_CHANGED]

    assert "message_parts" not in recorded
    assert recorded["message"] is None
    assert recorded["payload_truncated"] is True
    assert recorded["message_bytes"] > MAX_RECORDED_MESSAGE_BYTES


def test_a_redelivered_push_is_recorded_but_a_poll_reading_back_the_same_is_not() -> None:
    task = _after(_task(), Observation("poll", "working", _at(2)))
    assert apply_observation(task, Observation("poll", "working", _at(2))) == []
    [event] = apply_observation(task, Observation("push", "working", _at(2)))
    assert isinstance(event, ev.ObservationIgnored)
    assert event.reason == "duplicate"


def test_status_message_rides_on_the_state_change() -> None:
    [event] = apply_observation(
        _task("working"), Observation("poll", "input-required", _at(1), message="Which one?")
    )
    assert event.payload()["message"] == "Which one?"


# -- R12: what a remote reports must not wedge the task, bloat its log or vanish -----------------


def test_a_generation_far_ahead_is_flagged_once_and_orders_nothing() -> None:
    ahead = Observation("poll", "working", None, generation=10**30)
    [event, flagged] = apply_observation(_task(), ahead)
    task = _after(_task(), ahead)

    assert isinstance(event, ev.StateChanged)
    assert (event.reported_generation, event.generation_skew) == (10**30, True)
    assert "generation" not in event.payload()
    assert isinstance(flagged, ev.FlaggedForReview)
    assert flagged.reason == "generation_skew"
    assert task["generation"] is None  # the watermark did not move
    [event] = apply_observation(task, Observation("poll", "input-required", None, 7, "Q?"))
    assert event.type == ev.STATE_CHANGED  # not stale: ordered by arrival
    again = apply_observation(
        task, Observation("poll", "input-required", None, generation=2**53 + 1)
    )
    assert [event.type for event in again] == [ev.STATE_CHANGED]  # flagged once per task


@pytest.mark.parametrize(("step", "skewed"), [(10**6, False), (10**6 + 1, True)])
def test_a_generation_more_than_a_million_above_the_last_applied_is_skewed(
    step: int, skewed: bool
) -> None:
    task = _after(_task(), Observation("poll", "working", _at(1), generation=5))
    events = apply_observation(
        task, Observation("poll", "input-required", _at(2), generation=5 + step)
    )
    reasons = [event.payload().get("reason") for event in events]
    assert reasons[1:] == (["generation_skew"] if skewed else [])
    assert ("generation" in events[0].payload()) is not skewed


def test_a_generation_past_2_53_applied_before_it_was_bounded_orders_nothing() -> None:
    wedged = _task("working", generation=10**30, remote_timestamp=_at(1).isoformat())
    [event] = apply_observation(wedged, Observation("poll", "input-required", _at(2), 7))
    assert isinstance(event, ev.StateChanged)
    assert event.generation == 7


def test_a_restamped_status_is_a_repeat_whatever_its_timestamp() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1), 1, "busy"))
    for source in ("poll", "push"):
        assert apply_observation(task, Observation(source, "working", _at(2), 2, "busy")) == []

    news = Observation("poll", "working", _at(3), message="half way")
    [said] = apply_observation(task, news)
    artifact = ArtifactRecord("a1", None, ({"kind": "text", "text": "x"},))
    with_artifact = Observation("poll", "working", _at(3), message="busy", artifacts=(artifact,))
    later = _after(task, news)
    replied = apply_task_event(task, ev.REPLY_SENT, {"message_id": "m"})

    assert said.payload()["reason"] == "same_state"
    assert [event.type for event in apply_observation(task, with_artifact)] == [
        ev.OBSERVATION_IGNORED,
        ev.ARTIFACT_RECEIVED,
    ]
    assert (
        apply_observation(later, Observation("poll", "working", _at(4), message="half way")) == []
    )
    assert len(apply_observation(replied, Observation("poll", "working", _at(4), 4, "busy"))) == 1
    binding = Observation("poll", "working", _at(2), 2, "busy", remote_task_id="r-1")
    recorded = apply_observation(task, binding)
    assert [event.payload()["remote_task_id"] for event in recorded] == ["r-1"]


def test_a_state_left_and_reported_again_is_applied_however_like_it_was() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    task = _after(task, Observation("poll", "auth-required", _at(2)))
    [event] = apply_observation(task, Observation("poll", "working", _at(3)))
    assert event.type == ev.STATE_CHANGED


def _text(artifact_id: str, text: str) -> ArtifactRecord:
    return ArtifactRecord(artifact_id, None, ({"kind": "text", "text": text},))


def test_a_report_naming_one_artifact_twice_records_the_last_and_what_it_dropped() -> None:
    first, last = _text("a1", "draft"), _text("a1", "final")
    report = Observation("poll", "working", _at(1), artifacts=(first, last, last))
    [_, received, flagged] = apply_observation(_task(), report)
    dropped = {"bytes": first.to_json()["bytes"], "sha256": first.to_json()["sha256"]}

    assert isinstance(received, ev.ArtifactReceived)
    assert received.parts == [{"kind": "text", "text": "final"}]
    assert received.dropped == [dropped]
    assert isinstance(flagged, ev.FlaggedForReview)
    assert flagged.reason == "artifact_dropped"
    assert flagged.detail == (
        "one report named artifactId 'a1' more than once with different contents; the last was "
        f"kept, and the one of {dropped['bytes']} bytes with SHA-256 {dropped['sha256']} dropped"
    )
    held = _after(_task(), Observation("poll", "working", _at(1), artifacts=(last,)))
    again = Observation("poll", "working", _at(1), artifacts=(first, last))
    assert [e.payload()["reason"] for e in apply_observation(held, again)] == ["artifact_dropped"]
    assert apply_observation(_after(_task(), report), again) == []  # flagged once per task
    same = apply_observation(_task(), Observation("poll", "working", artifacts=(last, last)))
    assert [sorted(e.payload()) for e in same][1] == sorted({**last.to_json(), "source": "poll"})


# --------------------------------------------------------------------------------------------------
# R16: applying and replaying artifacts is linear, and the limits on what is kept agree.


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
        log.create("k", [submitted("k")])
        artifacts = [
            ev.ArtifactReceived(artifact_id=f"a{n}", name=None, parts=[], source="poll")
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


def _widest(count: int, artifact_id: str = "a" * MAX_ID_CHARS) -> ArtifactRecord:
    """An artifact of ``count`` file parts whose outlines are as long as outlines get: the
    longest media type kept, content large enough for the size's digits."""
    media_type = "m" * MAX_RECORDED_MEDIA_TYPE_CHARS
    content = base64.b64encode(b"\0" * (MAX_RECORDED_ARTIFACT_BYTES // (2 * count))).decode()
    part = {"kind": "raw", "data": content, "media_type": media_type, "filename": "f"}
    return ArtifactRecord(artifact_id, "n" * 10**4, (part,) * count)


def test_the_largest_record_kept_whole_fits_in_one_event_with_room_to_spare() -> None:
    # R16 with R17: an event holds its parts' outlines, so what bounds it is their number and
    # media types. The widest artifact kept whole, outlined as the store is given it:
    whole = _widest(MAX_RECORDED_PARTS)
    [event] = apply_observation(_task("working"), Observation("push", None, artifacts=(whole,)))
    assert isinstance(event, ev.ArtifactReceived)
    assert event.truncated is None
    stored, kept = outlined(event.type, event.payload(), "00" * 16)
    assert len(kept) == 1  # the parts are alike: one record
    assert 300 * 1024 < len(stored_json(stored)) < DEFAULT_MAX_PAYLOAD_BYTES // 2
    # One part more, or a media type one character longer, and it is kept as a digest.
    more = _widest(MAX_RECORDED_PARTS + 1).to_json()
    longer = replace(whole, parts=({**whole.parts[0], "media_type": "m" * 256},)).to_json()
    assert more["truncated"] is True
    assert longer["truncated"] is True
    # A state event carries at most one message of as many parts, plus ids and timestamps.
    message = Observation(
        "push", "input-required", message="", message_parts=whole.parts, remote_task_id="r" * 64
    )
    [changed] = apply_observation(_task("working"), message)
    assert isinstance(changed, ev.StateChanged)
    assert changed.payload_truncated is None
    stored, _ = outlined(changed.type, changed.payload(), "00" * 16)
    assert len(stored_json(stored)) + 4 * MAX_ID_CHARS < DEFAULT_MAX_PAYLOAD_BYTES // 2
    # A record kept as a digest is small whatever the artifact's size.
    truncated = ArtifactRecord("a" * MAX_ID_CHARS, "n" * 10**6, ({"text": "x" * 2**24},))
    kept_digest = truncated.to_json()
    assert kept_digest["truncated"] is True
    assert len(kept_digest["name"]) == MAX_RECORDED_NAME_CHARS
    assert len(stored_json(kept_digest)) < 1024


def test_one_whole_answer_fits_in_a_projection() -> None:
    # The transport accepts an answer of DEFAULT_MAX_BYTES (the bound content is kept whole up
    # to). What one report adds to a projection is its artifacts' records: at most
    # MAX_REPORT_PARTS outlines kept whole (the widest as above), and records without parts, each
    # under five times its wire form (an artifact with no parts, or kept as a digest).
    assert DEFAULT_MAX_BYTES == MAX_RECORDED_ARTIFACT_BYTES == MAX_RECORDED_MESSAGE_BYTES
    widest = _widest(MAX_RECORDED_PARTS).to_json()
    stored, _ = outlined(ev.ARTIFACT_RECEIVED, widest, "00" * 16)
    outlines = len(stored_json(stored)) * (MAX_REPORT_PARTS // MAX_RECORDED_PARTS)
    assert outlines + 5 * DEFAULT_MAX_BYTES < DEFAULT_MAX_PROJECTION_BYTES
    empty = {"artifactId": "a", "parts": []}
    record = ArtifactRecord("a", None).to_json()
    assert len(stored_json(record)) < 5 * len(stored_json(empty))


def test_a_report_keeps_its_parts_whole_up_to_its_bound_then_its_artifacts_as_digests() -> None:
    # An answer of many artifacts of tiny parts: each outline is about eight times its wire form.
    part = {"kind": "text", "text": ""}
    whole = MAX_REPORT_PARTS // MAX_RECORDED_PARTS
    many = tuple(
        ArtifactRecord(f"a{i}", f"n{i}", (part,) * MAX_RECORDED_PARTS) for i in range(whole + 2)
    )
    out = apply_observation(_task("working"), Observation("poll", None, artifacts=many))
    received = [e for e in out if isinstance(e, ev.ArtifactReceived)]
    assert [e.truncated for e in received] == [None] * whole + [True] * 2
    assert all(e.parts is None and e.sha256 for e in received[whole:])
    assert FLAG_PAYLOAD_TRUNCATED in [e.reason for e in out if isinstance(e, ev.FlaggedForReview)]
    # Read again, it is the same report: nothing new is recorded.
    task = fold_task("k", [(e.type, e.payload()) for e in out])
    again = apply_observation(
        {**task, "state": "working"}, Observation("poll", None, artifacts=many)
    )
    assert not [e for e in again if isinstance(e, ev.ArtifactReceived)]


def test_chunks_past_the_parts_bound_keep_the_artifact_as_its_digest() -> None:
    # Held parts that are not joined (as outlines never are): data parts.
    first = ArtifactRecord("c", "c", ({"kind": "data", "data": {}},) * (MAX_RECORDED_PARTS - 1))
    task, logged = _play(
        Observation("stream", None, artifacts=(first,)),
        _chunk("y", artifact_id="c"),
        _chunk("z", artifact_id="c"),
    )
    assert [e.get("truncated") for e in _received(logged)] == [None, None, True]
    [held] = task["artifacts"]
    assert held["truncated"] is True
    assert "parts" not in held


# --------------------------------------------------------------------------------------------------
# An artifact sent in chunks (A2A ``append``), as agents stream a model's answer token by token:
# each chunk extends the artifact held, the log keeps each chunk's own parts (never the whole
# again), the projection joins text that follows text into one part (so it grows with the text, not
# with the number of chunks), and the whole artifact read when the task ends is recorded once, as
# the agent holds it. Pure: apply_observation and the fold.


KEY = "k"


def _text_artifact_chunks(text: str) -> dict[str, Any]:
    return {"kind": "text", "text": text}


def _chunk(text: str, *, append: bool = True, artifact_id: str = "answer") -> Observation:
    record = ArtifactRecord(artifact_id, "answer", (_text_artifact_chunks(text),), append=append)
    return Observation("stream", None, artifacts=(record,))


def _whole(*texts: str, state: str = "completed") -> Observation:
    record = ArtifactRecord("answer", "answer", tuple(_text_artifact_chunks(t) for t in texts))
    return Observation("poll", state, artifacts=(record,))


def _play(*observations: Observation) -> tuple[dict[str, Any], list[ev.TaskEvent]]:
    task: dict[str, Any] = {**initial_task_state(KEY), "state": "working"}
    logged: list[ev.TaskEvent] = []
    for observation in observations:
        for event in apply_observation(task, observation):
            logged.append(event)
            task = apply_task_event(task, event.type, event.payload())
    return task, logged


def _received(logged: list[ev.TaskEvent]) -> list[dict[str, Any]]:
    """The payloads of the ``ArtifactReceived`` events, as recorded."""
    return [event.payload() for event in logged if event.type == ev.ARTIFACT_RECEIVED]


def test_chunks_make_up_one_artifact_and_each_event_keeps_only_its_own_parts() -> None:
    task, logged = _play(_chunk("one ", append=False), _chunk("two "), _chunk("three"))

    (artifact,) = task["artifacts"]
    assert [p["text"] for p in artifact["parts"]] == ["one two three"]  # text after text: joined
    assert artifact["chunks"] == 2
    received = _received(logged)
    assert [[p["text"] for p in r["parts"]] for r in received] == [["one "], ["two "], ["three"]]
    assert [r.get("append", False) for r in received] == [False, True, True]
    assert not any(r.get("replaces") for r in received)  # a chunk replaces no version


def test_only_text_parts_alike_are_joined() -> None:
    figure = ArtifactRecord("answer", "answer", ({"kind": "url", "url": "https://x.test/f.png"},),
                            append=True)  # fmt: skip
    other = ArtifactRecord("answer", "answer", ({"kind": "text", "text": "# t", "media_type":
                                                 "text/markdown"},), append=True)  # fmt: skip
    task, _ = _play(
        _chunk("one ", append=False), Observation("stream", None, artifacts=(figure,)),
        _chunk("two "), _chunk("three"), Observation("stream", None, artifacts=(other,)),
    )  # fmt: skip

    kinds = [(p["kind"], p.get("text"), p.get("media_type")) for p in task["artifacts"][0]["parts"]]
    assert kinds == [
        ("text", "one ", None), ("url", None, None), ("text", "two three", None),
        ("text", "# t", "text/markdown"),
    ]  # fmt: skip


def test_the_whole_artifact_read_after_its_chunks_is_recorded_once_as_the_agent_holds_it() -> None:
    task, _ = _play(_chunk("one ", append=False), _chunk("two "), _chunk("three"))
    whole = ArtifactRecord(
        "answer", "answer", tuple(_text_artifact_chunks(t) for t in ("one ", "two ", "three"))
    )
    read = Observation("poll", None, artifacts=(whole,))

    first = apply_observation(task, read)
    task = _play(_chunk("one ", append=False), _chunk("two "), _chunk("three"), read)[0]

    assert [event.payload().get("replaces") for event in first] == [True]
    assert [p["text"] for p in task["artifacts"][0]["parts"]] == ["one ", "two ", "three"]
    assert "chunks" not in task["artifacts"][0]
    assert apply_observation(task, read) == []  # read again: nothing


def test_a_chunk_costs_what_it_holds_not_the_artifact_again() -> None:
    chunks = [_chunk("word ", append=n > 0) for n in range(2_000)]
    task, logged = _play(*chunks)

    assert len(task["artifacts"][0]["parts"]) == 1
    assert task["artifacts"][0]["bytes"] > 2_000 * len("word ")
    assert max(len(str(data)) for _, data in stored(logged)) < 300  # each event: one chunk


def test_a_chunk_met_twice_is_put_right_by_the_whole_artifact_read_at_the_end() -> None:
    # A chunk delivered by the stream and again by push: the projection holds it twice until
    # the closing read brings the agent's whole artifact, which replaces it.
    task, logged = _play(
        _chunk("one ", append=False), _chunk("two "), _chunk("two "), _whole("one ", "two ")
    )

    assert [p["text"] for p in task["artifacts"][0]["parts"]] == ["one ", "two "]
    assert _received(logged)[-1].get("replaces") is True
    assert "chunks" not in task["artifacts"][0]  # whole again, as the agent holds it


def test_a_chunk_of_an_artifact_never_seen_is_kept_as_it_comes_marked_partial() -> None:
    # Its first chunks came before the stream was followed (a 0.3 agent sends no snapshot).
    task, logged = _play(_chunk("two "), _chunk("three"))

    (artifact,) = task["artifacts"]
    assert [p["text"] for p in artifact["parts"]] == ["two three"]
    assert artifact["partial"] is True  # still missing its start: read whole at the end
    assert "append" not in _received(logged)[0]
    whole = _play(_chunk("two "), _whole("one ", "two ", "three"))[0]["artifacts"][0]
    assert "partial" not in whole


def test_a_partial_start_is_unmarked_by_the_whole_read_even_when_it_was_all_there() -> None:
    # The stream was followed from the artifact's only chunk: the whole read finds the same
    # text, and is recorded all the same, for it says the artifact is complete.
    task, logged = _play(_chunk("all"), _whole("all"))

    (artifact,) = task["artifacts"]
    assert [p["text"] for p in artifact["parts"]] == ["all"]
    assert "partial" not in artifact
    assert _received(logged)[-1].get("replaces") is True


def test_an_empty_chunk_records_nothing() -> None:
    empty = Observation(
        "stream", None, artifacts=(ArtifactRecord("answer", "answer", (), append=True),)
    )
    _, logged = _play(_chunk("one ", append=False), empty)

    assert len(_received(logged)) == 1


def test_chunks_growing_past_the_limit_leave_a_digest_and_go_on_counting_bytes() -> None:
    piece = "x" * (MAX_RECORDED_ARTIFACT_BYTES // 3)
    task, events = _play(*(_chunk(piece, append=n > 0) for n in range(5)))
    logged = stored(events)

    artifact = task["artifacts"][0]
    assert artifact.get("truncated") is True
    assert "parts" not in artifact
    assert artifact["bytes"] > 5 * len(piece)
    assert artifact["chunks"] == 4
    assert (ev.FLAGGED_FOR_REVIEW, {"reason": "payload_truncated"}) in [
        (t, {"reason": d.get("reason")}) for t, d in logged if t == ev.FLAGGED_FOR_REVIEW
    ]
    assert all(len(str(d)) < 2 * len(piece) for _, d in logged)  # no event holds the whole
    assert len({d["sha256"] for t, d in logged if t == ev.ARTIFACT_RECEIVED}) == 5


def test_the_projection_of_chunks_is_the_fold_of_their_events() -> None:
    task, logged = _play(
        _chunk("one ", append=False), _chunk("two "), _chunk("a", artifact_id="other"),
        _chunk("three"), _whole("one ", "two ", "three"),
    )  # fmt: skip

    folded = fold_task(KEY, [(ev.TASK_SUBMITTED, {"task": KEY}), *logged])
    assert folded["artifacts"] == task["artifacts"]
    assert [a["artifact_id"] for a in task["artifacts"]] == ["answer", "other"]


# -- the property: any mix of chunks and whole reports puts together what the agent sent --------

Step = tuple[str, str, tuple[str, ...]]  # (artifact id, "first" | "chunk" | "whole" | "big", texts)

BIG = "z" * (MAX_RECORDED_ARTIFACT_BYTES // 2)
steps = st.lists(
    st.tuples(
        st.sampled_from(["a1", "a2"]),
        st.sampled_from(["first", "chunk", "chunk", "chunk", "whole", "big"]),
        st.lists(st.text(alphabet="ab \n", max_size=3), min_size=1, max_size=3).map(tuple),
    ),
    max_size=30,
)


def _observation(step: Step) -> Observation:
    artifact_id, kind, texts = step
    if kind == "big":
        texts = (BIG,)
    parts = tuple(_text_artifact_chunks(t) for t in (texts if kind == "whole" else texts[:1]))
    record = ArtifactRecord(artifact_id, artifact_id, parts, append=kind in ("chunk", "big"))
    return Observation("poll" if kind == "whole" else "stream", None, artifacts=(record,))


def chunk_violation(scenario: list[Step]) -> str | None:
    """What goes wrong putting ``scenario`` together, against a model of the agent's artifacts:
    a whole report sets one (unless it is a version already replaced: R12 never records one
    again), a chunk adds to it, or starts it when none is held (a start that is no version)."""
    text: dict[str, str] = {}
    version: dict[str, tuple[str, ...] | None] = {}  # the parts of a whole one; None: of chunks
    replaced: dict[str, set[tuple[str, ...]]] = {}
    task: dict[str, Any] = {**initial_task_state(KEY), "state": "working"}
    # The fold is fed the store's pair for the start, then the events as made.
    logged: list[ev.TaskEvent | tuple[str, dict[str, Any]]] = [(ev.TASK_SUBMITTED, {"task": KEY})]
    for step in scenario:
        observation = _observation(step)
        (record,) = observation.artifacts
        said = tuple(str(p["text"]) for p in record.parts)
        aid, held = record.artifact_id, record.artifact_id in text
        if record.append:  # a chunk (of one not held: a partial start) is never a version
            text[aid], version[aid] = text.get(aid, "") + "".join(said), None
        elif not held or (version[aid] != said and said not in replaced.get(aid, set())):
            if held and version[aid] is not None:
                replaced.setdefault(aid, set()).add(version[aid])  # type: ignore[arg-type]
            text[aid], version[aid] = "".join(said), said
        events = apply_observation(task, observation)
        if len(events) > 2:
            return f"{step}: {len(events)} events for one report"
        for event in events:
            task = apply_task_event(task, event.type, event.payload())
        logged += events
        if fold_task(KEY, logged)["artifacts"] != task["artifacts"]:
            return f"{step}: the projection is not the fold of its events"
        for artifact in task["artifacts"]:
            expected = text[artifact["artifact_id"]]
            if artifact.get("truncated"):
                if len(expected) < MAX_RECORDED_ARTIFACT_BYTES // 2:
                    return f"{step}: {artifact['artifact_id']} kept as a digest, yet small"
                continue
            kept = "".join(str(p.get("text", "")) for p in artifact["parts"])
            if kept != expected:
                return (
                    f"{step}: {artifact['artifact_id']} holds {kept!r}, the agent sent {expected!r}"
                )
    return None


@given(steps)
def test_any_mix_of_chunks_and_whole_reports_holds_what_the_agent_sent(
    scenario: list[Step],
) -> None:
    assert chunk_violation(scenario) is None


def test_property_catches_a_chunk_read_as_the_whole_artifact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: the engine as it was, every chunk taken for the whole artifact (its last chunk
    replacing the rest)."""
    monkeypatch.setattr(observations, "_recorded", lambda artifact, held: artifact.to_json())
    found = find(
        steps,
        lambda scenario: chunk_violation(scenario) is not None,
        settings=settings(max_examples=500, database=None, deadline=None, derandomize=True),
    )
    assert "the agent sent" in (chunk_violation(found) or ""), found


# -- coalescing: a burst of chunks recorded at once ------------------------------------------------


def _state(state: str) -> Observation:
    return Observation("stream", state)


def test_a_run_of_chunks_is_one_chunk_holding_them_all_joined_and_counted() -> None:
    burst = [_chunk("one ", append=False), _chunk("two "), _chunk("three "), _chunk("four")]

    merged = observations.coalesced(burst)
    task, logged = _play(*merged)

    assert len(merged) == 2  # the first chunk starts the artifact; the rest are one
    first, rest = (event.payload() for event in logged)
    assert [p["text"] for p in rest["parts"]] == ["two three four"]
    assert (rest["append"], rest["chunks"]) == (True, 3)
    assert "chunks" not in first
    (artifact,) = task["artifacts"]
    assert [p["text"] for p in artifact["parts"]] == ["one two three four"]
    assert artifact["chunks"] == 3  # the agent's chunks, not the events
    one_by_one = _play(*burst)[0]["artifacts"][0]
    assert artifact == {**one_by_one, "bytes": artifact["bytes"], "sha256": artifact["sha256"]}


def test_a_state_a_whole_artifact_or_another_artifact_ends_a_run_in_its_place() -> None:
    reports = [
        _chunk("a "), _chunk("b "), _state("input-required"), _chunk("c "),
        _chunk("x", artifact_id="other"), _chunk("d "), _whole("a b c d"), _chunk("e"),
    ]  # fmt: skip

    merged = observations.coalesced(reports)

    said = [
        (o.state, [(a.artifact_id, [p["text"] for p in a.parts], a.chunks) for a in o.artifacts])
        for o in merged
    ]
    assert said == [
        (None, [("answer", ["a b "], 2)]), ("input-required", []), (None, [("answer", ["c "], 1)]),
        (None, [("other", ["x"], 1)]), (None, [("answer", ["d "], 1)]),
        ("completed", [("answer", ["a b c d"], 1)]), (None, [("answer", ["e"], 1)]),
    ]  # fmt: skip


def test_chunks_of_other_tasks_or_sources_are_never_joined() -> None:
    mine = _chunk("a ")
    theirs = Observation("stream", None, artifacts=mine.artifacts, remote_task_id="t-2")
    pushed = Observation("push", None, artifacts=mine.artifacts)

    assert len(observations.coalesced([mine, theirs, pushed, mine])) == 4


Report = tuple[str, str, tuple[str, ...]]  # a step, or ("", state, ()) for a status update

reports = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["a1", "a2"]),
            st.sampled_from(["first", "chunk", "chunk", "chunk", "chunk", "whole"]),
            st.lists(st.text(alphabet="ab \n", max_size=3), min_size=0, max_size=3).map(tuple),
        ),
        st.tuples(st.just(""), st.sampled_from(["working", "input-required"]), st.just(())),
    ),
    max_size=40,
)


def _report(report: Report) -> Observation:
    artifact_id, kind, texts = report
    if not artifact_id:
        return _state(kind)
    if kind != "whole":
        texts = texts[:1]
    parts = tuple(_text_artifact_chunks(t) for t in texts)
    record = ArtifactRecord(artifact_id, artifact_id, parts, append=kind == "chunk")
    return Observation("poll" if kind == "whole" else "stream", None, artifacts=(record,))


def _held(task: dict[str, Any]) -> list[tuple[str, str, bool, int]]:
    return [
        (a["artifact_id"], "".join(str(p.get("text", "")) for p in a["parts"]),
         bool(a.get("partial")), int(a.get("chunks") or 0))
        for a in task["artifacts"]
    ]  # fmt: skip


def coalescing_violation(scenario: list[Report]) -> str | None:
    """What coalescing ``scenario`` changes: recorded together, the reports must leave the task
    in the same state, holding the same artifacts (text, partial mark, chunks counted), in no
    more events, and the projection must still be the fold of the events."""
    each = [_report(r) for r in scenario]
    one_by_one, logged = _play(*each)
    together, merged_log = _play(*observations.coalesced(each))
    if together["state"] != one_by_one["state"]:
        return f"state {together['state']}, one by one {one_by_one['state']}"
    if _held(together) != _held(one_by_one):
        return f"holds {_held(together)}, one by one {_held(one_by_one)}"
    if len(merged_log) > len(logged):
        return f"{len(merged_log)} events, one by one {len(logged)}"
    working = {"from": "submitted", "to": "working"}
    start = [(ev.TASK_SUBMITTED, {"task": KEY}), (ev.STATE_CHANGED, working)]
    if fold_task(KEY, [*start, *merged_log])["artifacts"] != together["artifacts"]:
        return "the projection is not the fold of its events"
    return None


@given(reports)
def test_any_reports_recorded_together_hold_what_they_hold_one_by_one(
    scenario: list[Report],
) -> None:
    assert coalescing_violation(scenario) is None


def test_property_catches_chunks_of_two_artifacts_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a run of chunks ends at a state or a whole report, but not at another
    artifact's chunk (the ids not compared)."""

    def joinable(last: Observation, observation: Observation) -> bool:
        return (
            len(last.artifacts) == len(observation.artifacts) == 1
            and last.artifacts[0].append
            and observation.artifacts[0].append
            and last.state is None
            and observation.state is None
        )

    monkeypatch.setattr(observations, "_joinable", joinable)
    found = find(
        reports,
        lambda scenario: coalescing_violation(scenario) is not None,
        settings=settings(max_examples=1000, database=None, deadline=None, derandomize=True),
    )
    assert "holds" in (coalescing_violation(found) or ""), found
