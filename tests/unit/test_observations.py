"""Applying remote reports (R10, R12): the continuation path, pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import Artifact, Part
from cardfence.engine.core.observations import (
    MAX_RECORDED_MESSAGE_BYTES,
    ArtifactRecord,
    Observation,
    apply_observation,
    artifact_record,
)
from cardfence.engine.core.replay import apply_task_event, initial_task_state

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _task(state: str = "submitted", **extra: Any) -> dict[str, Any]:
    return {**initial_task_state("k"), "state": state, **extra}


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _after(task: dict[str, Any], observation: Observation) -> dict[str, Any]:
    for type_, data in apply_observation(task, observation):
        task = apply_task_event(task, type_, data)
    return task


def test_a_legal_new_state_is_a_state_change_with_its_source_and_time() -> None:
    [(kind, data)] = apply_observation(_task(), Observation("poll", "working", _at(1)))
    assert kind == ev.STATE_CHANGED
    assert (data["from"], data["to"], data["source"]) == ("submitted", "working", "poll")
    assert data["remote_timestamp"] == "2026-11-29T12:00:01.000000+00:00"


@pytest.mark.parametrize("terminal", ["completed", "failed", "canceled", "rejected"])
@pytest.mark.parametrize("later", ["working", "input-required", "submitted", "completed", "failed"])
def test_terminal_states_absorb_every_later_report(terminal: str, later: str) -> None:
    task = _task(terminal, remote_timestamp=_at(5).isoformat(timespec="microseconds"))
    [(kind, data)] = apply_observation(task, Observation("push", later, _at(9)))
    assert kind == ev.OBSERVATION_IGNORED
    assert data["reason"] == ("duplicate" if later == terminal else "after_terminal")


def test_an_older_report_is_stale_and_changes_nothing() -> None:
    task = _after(_task(), Observation("poll", "input-required", _at(5)))
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(3)))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "stale")


def test_a_redelivered_report_is_a_duplicate() -> None:
    report = Observation("push", "working", _at(2))
    task = _after(_task(), report)
    [(kind, data)] = apply_observation(task, report)
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "duplicate")
    assert _after(task, report)["state"] == "working"


def test_a_newer_same_state_report_moves_the_watermark_so_a_late_older_one_is_stale() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    task = _after(task, Observation("poll", "working", _at(3), message="half way"))
    assert task["remote_timestamp"] == _at(3).isoformat(timespec="microseconds")
    [(kind, data)] = apply_observation(task, Observation("push", "input-required", _at(2)))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "stale")


def test_generation_orders_reports_before_timestamps() -> None:
    task = _after(_task(), Observation("poll", "working", _at(9), generation=4))
    [(kind, _)] = apply_observation(task, Observation("push", "input-required", _at(1), 5))
    assert kind == ev.STATE_CHANGED
    [(kind, data)] = apply_observation(task, Observation("push", "input-required", _at(20), 3))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "stale")


def test_reports_without_time_are_ordered_by_arrival() -> None:
    task = _after(_task(), Observation("poll", "working", _at(5)))
    [(kind, _)] = apply_observation(task, Observation("push", "input-required", None))
    assert kind == ev.STATE_CHANGED


def test_unknown_changes_nothing_and_nothing_goes_back_to_submitted() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    [(_, unknown)] = apply_observation(task, Observation("poll", "unknown", _at(2)))
    [(_, back)] = apply_observation(task, Observation("poll", "submitted", _at(3)))
    assert (unknown["reason"], back["reason"]) == ("unknown_state", "illegal")


def test_the_first_report_naming_the_remote_task_binds_it() -> None:
    task = _after(_task(), Observation("send", "submitted", _at(0), remote_task_id="r-1",
                                       remote_context_id="c-1"))  # fmt: skip
    assert (task["remote_task_id"], task["remote_context_id"]) == ("r-1", "c-1")
    assert task["state"] == "submitted"
    [(_, data)] = apply_observation(
        task, Observation("poll", "working", _at(1), remote_task_id="r-1")
    )
    assert "remote_task_id" not in data  # bound once


def test_new_artifacts_are_recorded_once() -> None:
    artifact = ArtifactRecord("a1", "answer", ({"kind": "text", "text": "42"},))
    report = Observation("poll", "completed", _at(1), artifacts=(artifact,))
    task = _after(_task("working"), report)
    assert [a["artifact_id"] for a in task["artifacts"]] == ["a1"]
    again = Observation("push", "completed", _at(1), artifacts=(artifact,))
    types = [t for t, _ in apply_observation(task, again)]
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

    assert recorded[1]["message_parts"] == list(FORM_PARTS)
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
    assert apply_observation(task, same)[0][1].get("repeat") is True
    assert apply_observation(task, again)[0][1].get("repeat") is None


def test_a_form_too_large_to_keep_is_kept_as_its_size_and_digest() -> None:
    huge = ({"kind": "data", "data": {"x": "y" * MAX_RECORDED_MESSAGE_BYTES}},)
    asked = Observation("poll", "input-required", _at(1), message="", message_parts=huge)
    recorded = dict(apply_observation(_task("working"), asked))[ev.STATE_CHANGED]

    assert "message_parts" not in recorded
    assert recorded["message"] is None
    assert recorded["payload_truncated"] is True
    assert recorded["message_bytes"] > MAX_RECORDED_MESSAGE_BYTES


def test_a_redelivered_push_is_recorded_but_a_poll_reading_back_the_same_is_not() -> None:
    task = _after(_task(), Observation("poll", "working", _at(2)))
    assert apply_observation(task, Observation("poll", "working", _at(2))) == []
    [(kind, data)] = apply_observation(task, Observation("push", "working", _at(2)))
    assert (kind, data["reason"]) == (ev.OBSERVATION_IGNORED, "duplicate")


def test_status_message_rides_on_the_state_change() -> None:
    [(_, data)] = apply_observation(
        _task("working"), Observation("poll", "input-required", _at(1), message="Which one?")
    )
    assert data["message"] == "Which one?"


# -- R12: what a remote reports must not wedge the task, bloat its log or vanish -----------------


def test_a_generation_far_ahead_is_flagged_once_and_orders_nothing() -> None:
    ahead = Observation("poll", "working", None, generation=10**30)
    [(kind, data), (flag, flagged)] = apply_observation(_task(), ahead)
    task = _after(_task(), ahead)

    assert kind == ev.STATE_CHANGED
    assert (data["reported_generation"], data["generation_skew"]) == (10**30, True)
    assert "generation" not in data
    assert (flag, flagged["reason"]) == (ev.FLAGGED_FOR_REVIEW, "generation_skew")
    assert task["generation"] is None  # the watermark did not move
    [(kind, _)] = apply_observation(task, Observation("poll", "input-required", None, 7, "Q?"))
    assert kind == ev.STATE_CHANGED  # not stale: ordered by arrival
    again = apply_observation(
        task, Observation("poll", "input-required", None, generation=2**53 + 1)
    )
    assert [k for k, _ in again] == [ev.STATE_CHANGED]  # flagged once per task


@pytest.mark.parametrize(("step", "skewed"), [(10**6, False), (10**6 + 1, True)])
def test_a_generation_more_than_a_million_above_the_last_applied_is_skewed(
    step: int, skewed: bool
) -> None:
    task = _after(_task(), Observation("poll", "working", _at(1), generation=5))
    events = apply_observation(
        task, Observation("poll", "input-required", _at(2), generation=5 + step)
    )
    assert [d.get("reason") for _, d in events][1:] == (["generation_skew"] if skewed else [])
    assert ("generation" in events[0][1]) is not skewed


def test_a_generation_past_2_53_applied_before_it_was_bounded_orders_nothing() -> None:
    wedged = _task("working", generation=10**30, remote_timestamp=_at(1).isoformat())
    [(kind, data)] = apply_observation(wedged, Observation("poll", "input-required", _at(2), 7))
    assert (kind, data["generation"]) == (ev.STATE_CHANGED, 7)


def test_a_restamped_status_is_a_repeat_whatever_its_timestamp() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1), 1, "busy"))
    for source in ("poll", "push"):
        assert apply_observation(task, Observation(source, "working", _at(2), 2, "busy")) == []

    news = Observation("poll", "working", _at(3), message="half way")
    [(_, said)] = apply_observation(task, news)
    artifact = ArtifactRecord("a1", None, ({"kind": "text", "text": "x"},))
    with_artifact = Observation("poll", "working", _at(3), message="busy", artifacts=(artifact,))
    later = _after(task, news)
    replied = apply_task_event(task, ev.REPLY_SENT, {"message_id": "m"})

    assert said["reason"] == "same_state"
    assert [k for k, _ in apply_observation(task, with_artifact)] == [
        ev.OBSERVATION_IGNORED,
        ev.ARTIFACT_RECEIVED,
    ]
    assert (
        apply_observation(later, Observation("poll", "working", _at(4), message="half way")) == []
    )
    assert len(apply_observation(replied, Observation("poll", "working", _at(4), 4, "busy"))) == 1
    binding = Observation("poll", "working", _at(2), 2, "busy", remote_task_id="r-1")
    assert [d["remote_task_id"] for _, d in apply_observation(task, binding)] == ["r-1"]


def test_a_state_left_and_reported_again_is_applied_however_like_it_was() -> None:
    task = _after(_task(), Observation("poll", "working", _at(1)))
    task = _after(task, Observation("poll", "auth-required", _at(2)))
    [(kind, _)] = apply_observation(task, Observation("poll", "working", _at(3)))
    assert kind == ev.STATE_CHANGED


def _text(artifact_id: str, text: str) -> ArtifactRecord:
    return ArtifactRecord(artifact_id, None, ({"kind": "text", "text": text},))


def test_a_report_naming_one_artifact_twice_records_the_last_and_what_it_dropped() -> None:
    first, last = _text("a1", "draft"), _text("a1", "final")
    report = Observation("poll", "working", _at(1), artifacts=(first, last, last))
    [_, (kind, received), (_, flagged)] = apply_observation(_task(), report)
    dropped = {"bytes": first.to_json()["bytes"], "sha256": first.to_json()["sha256"]}

    assert (kind, received["parts"]) == (ev.ARTIFACT_RECEIVED, [{"kind": "text", "text": "final"}])
    assert received["dropped"] == [dropped]
    assert flagged["reason"] == "artifact_dropped"
    assert flagged["detail"] == (
        "one report named artifactId 'a1' more than once with different contents; the last was "
        f"kept, and the one of {dropped['bytes']} bytes with SHA-256 {dropped['sha256']} dropped"
    )
    held = _after(_task(), Observation("poll", "working", _at(1), artifacts=(last,)))
    again = Observation("poll", "working", _at(1), artifacts=(first, last))
    assert [d["reason"] for _, d in apply_observation(held, again)] == ["artifact_dropped"]
    assert apply_observation(_after(_task(), report), again) == []  # flagged once per task
    same = apply_observation(_task(), Observation("poll", "working", artifacts=(last, last)))
    assert [sorted(d) for _, d in same][1] == sorted({**last.to_json(), "source": "poll"})
