"""What the API returns and the CLI prints about a task (engine/core/views.py): a projection read
into a :class:`TaskView`, and its two JSON shapes (docs/cli.md), each compared whole."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cardfence.engine.core.answers import TaskState
from cardfence.engine.core.views import TaskView

UPDATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ARTIFACT = {"artifact_id": "a-1", "parts": [{"text": "out"}]}
FORM = {"data": {"field": "name"}}


def projection(**changes: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "task": "k-1",
        "remote_task_id": "r-1",
        "context_id": "c-local",
        "remote_context_id": "c-remote",
        "state": "input-required",
        "delivery_mode": "push",
        "card_revision": "rev-1",
        "contract_hash": "contract-1",
        "flags": ["flagged_for_review"],
        "artifacts": [ARTIFACT],
        "agent": "http://agent.test",
        "skill": "work",
        "last_message": "which name?",
        "last_message_parts": [FORM],
        "repeats_ignored": 3,
        "failures_repeated": 2,
    }
    state.update(changes)
    return state


def test_a_view_reads_every_field_of_the_projection() -> None:
    view = TaskView.of(projection(), UPDATED)
    assert view == TaskView(
        task="k-1",
        remote_task_id="r-1",
        context_id="c-remote",  # the agent's context, once it named one
        state="input-required",
        delivery_mode="push",
        card_revision="rev-1",
        contract_hash="contract-1",
        flags=("flagged_for_review",),
        artifacts=(ARTIFACT,),
        agent="http://agent.test",
        skill="work",
        last_message="which name?",
        updated_at=UPDATED,
        last_message_parts=(FORM,),
        repeats_ignored=3,
        failures_repeated=2,
    )


def test_a_task_the_agent_has_not_answered_yet_reads_as_polled_with_nothing_counted() -> None:
    bare = {"task": "k-2", "state": "submitted", "context_id": "c-local"}
    assert TaskView.of(bare) == TaskView(
        task="k-2",
        remote_task_id=None,
        context_id="c-local",
        state="submitted",
        delivery_mode="polling",
        card_revision=None,
        contract_hash=None,
        flags=(),
        artifacts=(),
        agent=None,
        skill=None,
        last_message=None,
    )
    nulls = {**bare, "delivery_mode": None, "repeats_ignored": None, "failures_repeated": None}
    assert TaskView.of(nulls) == TaskView.of(bare)


def test_the_json_of_run_reply_cancel_and_resume_holds_its_fields() -> None:
    assert TaskView.of(projection(), UPDATED).to_json() == {
        "task": "k-1",
        "remote_task_id": "r-1",
        "context_id": "c-remote",
        "state": "input-required",
        "delivery_mode": "push",
        "card_revision": "rev-1",
        "flags": ["flagged_for_review"],
        "artifacts": [ARTIFACT],
        "last_message": "which name?",
        "last_message_parts": [FORM],
        "references": [],
    }


def test_a_row_of_tasks_holds_its_fields_and_its_time_in_iso_8601() -> None:
    view = TaskView.of(projection(), UPDATED)
    assert view.to_row() == {
        "task": "k-1",
        "remote_task_id": "r-1",
        "agent": "http://agent.test",
        "skill": "work",
        "state": "input-required",
        "delivery_mode": "push",
        "flags": ["flagged_for_review"],
        "updated_at": "2026-01-02T03:04:05+00:00",
    }
    assert TaskView.of(projection()).to_row()["updated_at"] is None


def test_the_json_shapes_are_copies_the_caller_may_change() -> None:
    view = TaskView.of(projection(), UPDATED)
    document = view.to_json()
    document["artifacts"][0]["parts"] = []
    document["flags"].append("x")
    document["last_message_parts"][0]["data"] = None
    view.to_row()["flags"].append("y")
    assert view.to_json()["artifacts"] == [{"artifact_id": "a-1", "parts": [{"text": "out"}]}]
    assert view.to_json()["last_message_parts"] == [{"data": {"field": "name"}}]
    assert view.flags == ("flagged_for_review",)


def test_a_views_state_is_a_task_state_equal_to_its_name_and_its_key_is_the_task() -> None:
    view = TaskView.of(projection(), UPDATED)
    assert view.state is TaskState.INPUT_REQUIRED
    assert view.state == "input-required"
    assert view.to_json()["state"] == "input-required"
    assert json.dumps(view.to_row()["state"]) == '"input-required"'
    assert view.key == view.task == "k-1"


def test_a_state_a_newer_cardfence_wrote_is_read_as_unknown() -> None:
    assert TaskView.of(projection(state="paused")).state is TaskState.UNKNOWN
