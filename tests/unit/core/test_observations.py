"""Observations, field by field: what is recorded, the ordering watermark, and the wire mapping.

Written to kill the mutants of ``engine/core/observations.py`` that ``scripts/mutation`` found
alive.
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

from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import (
    Artifact,
    Part,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    StreamUpdate,
)
from cardfence.engine.core.observations import (
    MAX_RECORDED_ARTIFACT_BYTES,
    MAX_RECORDED_MESSAGE_BYTES,
    MAX_RECORDED_NAME_CHARS,
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
from cardfence.engine.core.replay import initial_task_state

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
    [(kind, data)] = apply_observation(task, observation)
    assert kind == ev.STATE_CHANGED
    after = {
        **task,
        "state": data["to"],
        "remote_timestamp": data["remote_timestamp"],
        "last_report": data["report"],
        "reports_seen": [data["report"]],
    }
    return after, data["report"]


def test_a_report_pushed_again_is_recorded_once_as_a_repeat_with_its_fingerprint() -> None:
    task, report = _recorded(_task(), Observation("push", "working", _at(1), message="hi"))
    again = Observation("push", "working", _at(1), message="hi")
    assert apply_observation(task, again) == [
        (
            ev.OBSERVATION_IGNORED,
            {
                "reason": "duplicate",
                "state": "working",
                "source": "push",
                "remote_timestamp": None,
                "report": report,
                "repeat": True,
            },
        )
    ]
    assert apply_observation({**task, "reports_repeated": ["other"]}, again)[0][1]["repeat"]
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
    assert apply_observation(only_last, again)[0][1].get("repeat") is True
    assert apply_observation(only_seen, again)[0][1].get("repeat") is True
    [(kind, data)] = apply_observation(neither, again)
    assert (kind, data["reason"], "repeat" in data) == (ev.OBSERVATION_IGNORED, "duplicate", False)


def test_a_poll_of_the_moment_already_applied_records_nothing_a_push_records_a_duplicate() -> None:
    task = _task("working", remote_timestamp=_iso(1))  # applied; no fingerprint kept
    # Same state, same moment, another status message: not a repeat of a recorded report.
    assert apply_observation(task, Observation("poll", "working", _at(1), message="m")) == []
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(1), message="m"))
    assert (kind, data["reason"], data["source"]) == (ev.OBSERVATION_IGNORED, "duplicate", "push")


def test_the_same_state_at_the_same_time_is_a_duplicate_earlier_stale_later_same_state() -> None:
    task = _task("working", remote_timestamp=_iso(5))
    reasons = [
        apply_observation(task, Observation("push", "working", _at(t), message="m"))[0][1]["reason"]
        for t in (5, 4, 6)
    ]
    assert reasons == ["duplicate", "stale", "same_state"]


def test_a_transition_without_a_timestamp_records_no_skew() -> None:
    [(kind, data)] = apply_observation(_task(), Observation("push", "working"))
    assert kind == ev.STATE_CHANGED
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
    assert apply_observation(_holding(V1), Observation("push", None, artifacts=(V2,))) == [
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
    flagged = (ev.FLAGGED_FOR_REVIEW, {"reason": "payload_truncated", "detail": TRUNCATED_DETAIL})
    assert apply_observation(_task("working"), report) == [
        (ev.ARTIFACT_RECEIVED, {**big.to_json(), "source": "push"}),
        (ev.ARTIFACT_RECEIVED, {**small.to_json(), "source": "push"}),
        flagged,
    ]
    assert apply_observation(_task("working", flags=["clock_skew"]), report)[-1] == flagged
    already = apply_observation(_task("working", flags=["payload_truncated"]), report)
    assert [kind for kind, _ in already] == [ev.ARTIFACT_RECEIVED, ev.ARTIFACT_RECEIVED]
    assert apply_observation(_task("working", flags=None), report)[-1] == flagged


def test_a_status_message_at_the_limit_is_kept_and_one_byte_more_is_kept_as_its_digest() -> None:
    at_limit = "m" * (MAX_RECORDED_MESSAGE_BYTES - 2)  # stored with its two quotes
    [(_, kept)] = apply_observation(_task(), Observation("push", "working", message=at_limit))
    assert kept["message"] == at_limit

    over = at_limit + "m"
    events = apply_observation(_task(), Observation("push", "working", message=over))
    [(kind, data), flag] = events
    data.pop("report")
    data.pop("said")
    assert (kind, data) == (
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
    assert flag == (
        ev.FLAGGED_FOR_REVIEW,
        {"reason": "payload_truncated", "detail": TRUNCATED_DETAIL},
    )
    flagged = _task(flags=["payload_truncated"])
    assert len(apply_observation(flagged, Observation("push", "working", message=over))) == 1


def test_a_timestamp_too_far_ahead_is_kept_as_reported_not_used_and_flags_the_task_once() -> None:
    ahead = Observation("push", "working", _at(400), received_at=T0)
    [(kind, data), flag] = apply_observation(_task(), ahead)
    data.pop("report")
    data.pop("said")
    assert (kind, data) == (
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
    assert flag == (ev.FLAGGED_FOR_REVIEW, {"reason": "clock_skew", "detail": detail})
    assert len(apply_observation(_task(flags=["clock_skew"]), ahead)) == 1
    assert len(apply_observation(_task(flags=["payload_truncated"]), ahead)) == 2


def test_the_clock_skew_allowed_is_the_one_given_and_its_bound_is_not_skew() -> None:
    def recorded(seconds: float, **kwargs: float) -> list[tuple[str, dict[str, Any]]]:
        observation = Observation("push", "working", _at(seconds), received_at=T0)
        return apply_observation(_task(), observation, **kwargs)

    [(_, data)] = recorded(300)  # exactly the default bound: still usable
    assert data["remote_timestamp"] == _iso(300)
    [(_, data)] = recorded(400, max_clock_skew=500)
    assert (data["remote_timestamp"], "clock_skew" in data) == (_iso(400), False)
    [(_, data), (_, flag)] = recorded(20, max_clock_skew=10)
    assert (data["remote_timestamp"], data["clock_skew"]) == (None, True)
    assert "more than 10 s ahead" in flag["detail"]
    [(_, data)] = recorded(-3600)  # behind its receipt: never skew
    assert data["remote_timestamp"] == _iso(-3600)
