"""An artifact sent in chunks (A2A ``append``), as agents stream a model's answer token by
token: each chunk extends the artifact held, the log keeps each chunk's own parts (never the
whole again), the projection joins text that follows text into one part (so it grows with the
text, not with the number of chunks), and the whole artifact read when the task ends is recorded
once, as the agent holds it. Pure: apply_observation and the fold.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from cardfence.engine.core import events as ev
from cardfence.engine.core import observations
from cardfence.engine.core.observations import (
    MAX_RECORDED_ARTIFACT_BYTES,
    ArtifactRecord,
    Observation,
    apply_observation,
)
from cardfence.engine.core.replay import apply_task_event, fold_task, initial_task_state

KEY = "k"


def _text(text: str) -> dict[str, Any]:
    return {"kind": "text", "text": text}


def _chunk(text: str, *, append: bool = True, artifact_id: str = "answer") -> Observation:
    record = ArtifactRecord(artifact_id, "answer", (_text(text),), append=append)
    return Observation("stream", None, artifacts=(record,))


def _whole(*texts: str, state: str = "completed") -> Observation:
    record = ArtifactRecord("answer", "answer", tuple(_text(t) for t in texts))
    return Observation("poll", state, artifacts=(record,))


def _play(*observations: Observation) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    task: dict[str, Any] = {**initial_task_state(KEY), "state": "working"}
    logged: list[tuple[str, dict[str, Any]]] = []
    for observation in observations:
        for type_, data in apply_observation(task, observation):
            logged.append((type_, data))
            task = apply_task_event(task, type_, data)
    return task, logged


def _received(logged: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for type_, data in logged if type_ == ev.ARTIFACT_RECEIVED]


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
    whole = ArtifactRecord("answer", "answer", tuple(_text(t) for t in ("one ", "two ", "three")))
    read = Observation("poll", None, artifacts=(whole,))

    first = apply_observation(task, read)
    task = _play(_chunk("one ", append=False), _chunk("two "), _chunk("three"), read)[0]

    assert [d.get("replaces") for _, d in first] == [True]
    assert [p["text"] for p in task["artifacts"][0]["parts"]] == ["one ", "two ", "three"]
    assert "chunks" not in task["artifacts"][0]
    assert apply_observation(task, read) == []  # read again: nothing


def test_a_chunk_costs_what_it_holds_not_the_artifact_again() -> None:
    chunks = [_chunk("word ", append=n > 0) for n in range(2_000)]
    task, logged = _play(*chunks)

    assert len(task["artifacts"][0]["parts"]) == 1
    assert task["artifacts"][0]["bytes"] > 2_000 * len("word ")
    assert max(len(str(data)) for _, data in logged) < 300  # each event: one chunk


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
    task, logged = _play(*(_chunk(piece, append=n > 0) for n in range(5)))

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
    parts = tuple(_text(t) for t in (texts if kind == "whole" else texts[:1]))
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
    logged: list[tuple[str, dict[str, Any]]] = [(ev.TASK_SUBMITTED, {"task": KEY})]
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
        for type_, data in events:
            task = apply_task_event(task, type_, data)
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
    ((_, first), (_, rest)) = logged
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
    parts = tuple(_text(t) for t in texts)
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
