"""Applying remote reports (R10, R12): the continuation path, pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cardfence.engine import events as ev
from cardfence.engine.answers import Artifact, Part
from cardfence.engine.observations import (
    MAX_RECORDED_MESSAGE_BYTES,
    ArtifactRecord,
    Observation,
    apply_observation,
    artifact_record,
)
from cardfence.engine.replay import apply_task_event, initial_task_state

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
    task = _after(task, Observation("poll", "working", _at(3)))
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
