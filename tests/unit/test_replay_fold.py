"""The projections the replay folds (engine/core/replay.py), field by field, where no end-to-end
test
looks: what a failed card read leaves on the agent stream, a fold continued from a state, and
the defaults of an artifact record and of a chunk appended to one. Pure."""

from __future__ import annotations

from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import fold_agent, fold_task, initial_agent_state

ORIGIN = "https://agent.example"


def test_a_failed_card_read_is_kept_as_the_last_failure_and_counted() -> None:
    failure = {"kind": "timeout", "detail": "no answer in 5 s", "at": "2026-12-06T00:00:00+00:00"}
    state = fold_agent(ORIGIN, [(ev.DISCOVERY_FAILED, {**failure, "extra": 1})] * 2)
    assert state["last_failure"] == failure
    assert state["failures"] == 2


def test_an_agent_fold_goes_on_from_the_state_it_is_given() -> None:
    before = {**initial_agent_state(ORIGIN), "failures": 3}
    after = fold_agent(ORIGIN, [(ev.DISCOVERY_FAILED, {"kind": "http"})], before)
    assert after["failures"] == 4
    assert before["failures"] == 3  # the state given is not modified


def artifacts(*events: dict[str, object]) -> list[dict[str, object]]:
    state = fold_task("t1", [(ev.ARTIFACT_RECEIVED, data) for data in events])
    return list(state["artifacts"])


def test_an_artifact_without_a_name_or_parts_is_recorded_with_none_and_no_parts() -> None:
    assert artifacts({"artifact_id": "a"}) == [{"artifact_id": "a", "name": None, "parts": []}]


def test_a_truncated_artifact_is_recorded_without_parts() -> None:
    truncated = {"artifact_id": "a", "truncated": True, "bytes": 9, "sha256": "f" * 64}
    assert artifacts(truncated) == [{**truncated, "name": None}]


def test_a_chunk_appended_keeps_the_name_the_artifact_was_first_given() -> None:
    first = {"artifact_id": "a", "name": "answer", "parts": [{"kind": "text", "text": "Hel"}]}
    chunk = {
        "artifact_id": "a",
        "name": "other",
        "parts": [{"kind": "text", "text": "lo"}],
        "append": True,
    }
    (record,) = artifacts(first, chunk)
    assert record["name"] == "answer"
    assert record["parts"] == [{"kind": "text", "text": "Hello"}]
    assert record["chunks"] == 1
