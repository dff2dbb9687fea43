"""The task log (engine/client/tasklog.py) on a SQLite store: points of the past and their replay,
how a
reference names a task, what an append carries, and what the log keeps in memory.

Each test states one behaviour an operator or the engine relies on: ``tasks show --as-of`` reading
the past, ``tasks show REF`` finding the task meant (or naming every candidate), an append that
loses a race deciding again on what the winner wrote, and one line logged per decision.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from support.events import submitted

from cardfence.engine.client import tasklog
from cardfence.engine.client.tasklog import (
    AsOf,
    TaskLog,
    driving,
    key_of,
    projection_of,
    status_of,
    task_stream_id,
)
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import State, StoredEvent, initial_task_state
from cardfence.engine.errors import UsageError
from cardfence.store.errors import ConcurrencyError, CorruptRecordError, LeaseLostError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, Projection
from cardfence.store.schema import events, streams
from cardfence.store.schema import events as events_table

AGENT = "http://agent.example"


def _bound(remote: str, to: str = "working") -> ev.StateChanged:
    return ev.StateChanged(
        from_="submitted", to=to, source="send", remote_timestamp=None, remote_task_id=remote
    )


def _moved(to: str, frm: str = "working") -> ev.StateChanged:
    return ev.StateChanged(from_=frm, to=to, source="poll", remote_timestamp=None)


def _flagged(reason: str) -> ev.FlaggedForReview:
    return ev.FlaggedForReview(reason=reason, detail=f"flagged: {reason}")


def _task(log: TaskLog, key: str, remote: str | None = None, agent: str = AGENT) -> None:
    log.create(key, [submitted(key, agent=agent)])
    if remote is not None:
        log.record(key, lambda _state: [_bound(remote)])


def _types(store: EventStore, key: str) -> list[str]:
    return [e.type for e in store.read_stream(task_stream_id(key))]


# -- AsOf: the points of the past -------------------------------------------------------------


def test_a_position_point_is_parsed_from_at_n_with_spaces_allowed() -> None:
    assert AsOf.parse("@42") == AsOf(position=42)
    assert AsOf.parse("  @ 7 ") == AsOf(position=7)
    assert AsOf.parse("@0") == AsOf(position=0)


def test_a_naive_time_is_read_as_utc_and_an_offset_time_is_converted_to_utc() -> None:
    assert AsOf.parse("2025-01-31T12:00:00") == AsOf(time=datetime(2025, 1, 31, 12, tzinfo=UTC))
    point = AsOf.parse("2025-01-31T14:00:00+02:00")
    assert point == AsOf(time=datetime(2025, 1, 31, 12, tzinfo=UTC))
    assert point.time is not None
    assert point.time.utcoffset() == timedelta(0)
    assert str(point) == "2025-01-31T12:00:00+00:00"


def test_an_offset_time_is_converted_to_utc_whatever_the_machines_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        point = AsOf.parse("2025-01-31T14:00:00+02:00")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert point.time is not None
    assert point.time.utcoffset() == timedelta(0)
    assert str(point) == "2025-01-31T12:00:00+00:00"


@pytest.mark.parametrize("text", ["@", "@-1", "@x", "yesterday", "", "2025-13-01"])
def test_text_that_is_neither_form_is_a_usage_error_naming_both_forms(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        AsOf.parse(text)
    assert str(caught.value) == f"--as-of {text!r} is not {AsOf.FORMS}"


def test_a_point_names_exactly_one_of_position_and_time_and_its_time_has_a_zone() -> None:
    one = "an AsOf names a position or a time, exactly one"
    with pytest.raises(ValueError, match=f"^{one}$"):
        AsOf()
    with pytest.raises(ValueError, match=f"^{one}$"):
        AsOf(position=1, time=datetime(2025, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match=r"^an AsOf time must be timezone-aware$"):
        AsOf(time=datetime(2025, 1, 1))
    assert AsOf(position=0).position == 0  # zero is a position, not "none given"
    assert AsOf(time=datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=1)))).time is not None


def test_a_point_includes_the_events_at_or_before_it_by_position_or_by_time(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    first, second = store.read_stream(task_stream_id("t1"))
    assert AsOf(position=first.position).includes(first)
    assert not AsOf(position=first.position).includes(second)
    assert AsOf(position=second.position).includes(second)
    assert AsOf(time=first.recorded_at).includes(first)
    assert not AsOf(time=first.recorded_at - timedelta(microseconds=1)).includes(first)
    assert str(AsOf(position=first.position)) == f"@{first.position}"


# -- the past replayed ------------------------------------------------------------------------


def test_a_task_as_of_a_position_is_its_prefix_replayed_with_the_time_of_its_last_event(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [_moved("completed")])
    logged = store.read_stream(task_stream_id("t1"))

    head, replayed = log.as_of("t1", AsOf(position=logged[1].position))

    assert replayed == logged[:2]
    assert (head.key, head.version, head.state["state"]) == ("t1", 2, "working")
    assert head.updated_at == logged[1].recorded_at
    now, _ = log.as_of("t1", AsOf(position=logged[-1].position))
    assert (now.version, now.state) == (3, log.head("t1").state)


def test_a_task_before_its_first_event_did_not_exist_yet_and_the_message_says_when_it_began(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t0")
    _task(log, "t1")
    first = store.read_stream(task_stream_id("t1"))[0]

    with pytest.raises(UsageError) as caught:
        log.as_of("t1", AsOf(position=first.position - 1))

    assert str(caught.value) == (
        f"task t1 did not exist yet at @{first.position - 1}: its first event was recorded at "
        f"{first.recorded_at.isoformat()} (position {first.position})"
    )
    with pytest.raises(UsageError, match=r"^unknown task 'nope'$"):
        log.as_of("nope", AsOf(position=first.position))


def test_every_task_as_of_a_point_leaves_out_later_tasks_and_later_events_by_position(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "b", "rb")
    _task(log, "a", "ra")
    point = AsOf(position=store.last_position())
    log.record("a", lambda _state: [_moved("completed")])
    _task(log, "c", "rc")  # begun after the point

    heads = log.all_as_of(point)

    assert [(h.key, h.version, h.state["state"]) for h in heads] == [
        ("a", 2, "working"), ("b", 2, "working"),
    ]  # fmt: skip
    a_events = store.read_stream(task_stream_id("a"))
    assert heads[0].updated_at == a_events[1].recorded_at
    assert [h.key for h in log.all_as_of(point, status="working")] == ["a", "b"]
    assert log.all_as_of(point, status="completed") == []
    later = AsOf(position=store.last_position())
    assert [h.key for h in log.all_as_of(later, status="completed")] == ["a"]
    assert [h.key for h in log.all_as_of(later, status="working")] == ["b", "c"]


def test_every_task_as_of_a_time_keeps_each_stream_a_prefix_and_skips_other_streams(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    store.append("card:x", 0, [NewEvent(ev.CARD_FETCHED, {"url": AGENT})])  # not a task stream
    _task(log, "t2", "r2")
    log.record("t1", lambda _state: [_moved("completed")])
    logged = {key: store.read_stream(task_stream_id(key)) for key in ("t1", "t2")}
    # Times as the store recorded them, made to interleave: t1's last event is later than the
    # point, t2's events are not, whatever the clock's resolution.
    cut = logged["t2"][-1].recorded_at
    with store.engine.begin() as conn:
        conn.execute(
            events_table.update()
            .where(events_table.c.position == logged["t1"][-1].position)
            .values(recorded_at=cut + timedelta(seconds=5))
        )

    heads = log.all_as_of(AsOf(time=cut))

    assert [(h.key, h.version, h.state["state"]) for h in heads] == [
        ("t1", 2, "working"), ("t2", 2, "working"),
    ]  # fmt: skip


def test_an_event_recorded_after_the_point_closes_its_stream_there_even_if_a_later_one_is_not(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [_moved("input-required")])
    positions = [e.position for e in store.read_stream(task_stream_id("t1"))]
    base = store.read_stream(task_stream_id("t1"))[0].recorded_at
    # The second event recorded late, the third early (clocks stepped back): the stream as it
    # stood at the point is its first event only -- a prefix, never a selection.
    with store.engine.begin() as conn:
        for position, shift in zip(positions, (0, 60, 1), strict=True):
            conn.execute(
                events_table.update()
                .where(events_table.c.position == position)
                .values(recorded_at=base + timedelta(seconds=shift))
            )
    point = AsOf(time=base + timedelta(seconds=30))

    [head] = log.all_as_of(point)
    single, replayed = log.as_of("t1", point)

    assert (head.version, head.state["state"]) == (1, "submitted")
    assert (single.version, len(replayed)) == (1, 1)


def test_a_stream_past_the_point_stops_only_itself_and_later_streams_still_count(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    late = store.read_stream(task_stream_id("t1"))[1]
    base = store.read_stream(task_stream_id("t1"))[0].recorded_at
    with store.engine.begin() as conn:
        conn.execute(
            events_table.update()
            .where(events_table.c.position == late.position)
            .values(recorded_at=base + timedelta(hours=1))
        )
    _task(log, "t2", "r2")  # recorded after t1's late event, and before the point

    heads = log.all_as_of(AsOf(time=base + timedelta(minutes=30)))

    assert [(h.key, h.version) for h in heads] == [("t1", 1), ("t2", 2)]


def test_an_unreadable_events_message_keeps_120_characters_of_the_error(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")

    def fold(key: str, pairs: Any) -> State:
        list(pairs)
        raise ValueError("v" * 200)

    monkeypatch.setattr(tasklog, "fold_task", fold)
    with pytest.raises(CorruptRecordError) as caught:
        log.as_of("t1", AsOf(position=store.last_position()))
    last = store.read_stream(task_stream_id("t1"))[-1]
    assert caught.value.record == f"event 2 (position {last.position}, {ev.STATE_CHANGED})"
    assert caught.value.detail == (
        f"its payload lacks what its type holds (ValueError: {'v' * 120})"
    )


# -- references to a task ---------------------------------------------------------------------


def test_a_local_key_wins_over_a_remote_id_equal_to_it(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "r9", "x1")
    _task(log, "t2", "r9")  # another task whose remote id is the first task's key
    assert log.find("r9") == "r9"
    assert log.find("  r9\n") == "r9"
    assert log.find("x1") == "r9"


def test_a_remote_id_or_a_unique_prefix_of_a_key_or_remote_id_finds_the_task(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "alpha-1", "remote-abc")
    _task(log, "beta-2", "remote-xyz")
    assert log.find("remote-xyz") == "beta-2"
    assert log.find("alp") == "alpha-1"
    assert log.find("remote-a") == "alpha-1"


def test_an_empty_or_unknown_reference_is_a_usage_error_saying_so(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    with pytest.raises(UsageError, match=r"^no task named$"):
        log.find("   ")
    with pytest.raises(UsageError, match=r"^unknown task 'zz'$"):
        log.find("zz")


def test_a_remote_id_two_agents_share_is_ambiguous_and_names_each_key_agent_and_remote(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t2", "shared", agent="http://two.example")
    _task(log, "t1", "shared", agent="http://one.example")

    with pytest.raises(UsageError) as caught:
        log.find("shared")

    assert str(caught.value) == (
        "task 'shared' is ambiguous: 2 tasks match: "
        "t1 (agent http://one.example, remote shared); t2 (agent http://two.example, remote "
        "shared); name one by its local key"
    )
    assert sorted(h.key for h in log.by_remote_id("shared")) == ["t1", "t2"]
    assert log.by_remote_id("none") == []


def test_an_ambiguous_prefix_names_ten_candidates_and_counts_the_rest(store: EventStore) -> None:
    log = TaskLog(store)
    for n in range(12):
        _task(log, f"job-{n:02d}")  # no remote id yet: shown as "-"

    with pytest.raises(UsageError) as caught:
        log.find("job-")

    message = str(caught.value)
    assert message.startswith("task 'job-' is ambiguous: 12 tasks match: job-00 (agent ")
    assert "job-00 (agent http://agent.example, remote -)" in message
    assert "job-09 (agent" in message
    assert "job-10 (agent" not in message
    assert message.endswith("; and 2 more; name one by its local key")
    two = _ambiguity(store, ["job-00", "job-01"])
    assert "more" not in two
    assert "2 tasks match" in two


def _ambiguity(store: EventStore, keys: list[str]) -> str:
    records = [record for key in keys if (record := store.stream(task_stream_id(key)))]
    return str(tasklog._ambiguous("ref", records))


def test_a_candidate_without_an_agent_is_named_with_a_question_mark(store: EventStore) -> None:
    store.append(task_stream_id("bare"), 0, [NewEvent(ev.TASK_SUBMITTED, {})])
    assert "bare (agent ?, remote -)" in _ambiguity(store, ["bare", "bare"])


def _other_category(store: EventStore, alias: str) -> None:
    """A stream of another category (an agent's) with the same alias and status as tasks have."""
    store.append(
        f"{ev.AGENT_STREAM_PREFIX}x",
        0,
        [NewEvent(ev.CARD_FETCHED, {"url": AGENT})],
        projection=Projection({"url": AGENT}, category=ev.AGENT_CATEGORY, alias=alias,
                              status="working"),
    )  # fmt: skip


def test_streams_of_other_categories_are_never_taken_for_tasks(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t1", "shared")
    _other_category(store, "shared")

    assert log.find("shared") == "t1"
    assert log.find("sha") == "t1"
    assert [h.key for h in log.by_remote_id("shared")] == ["t1"]
    assert [h.key for h in log.all()] == ["t1"]
    assert log.all_readable("working") == ([log.head("t1")], [])


def test_a_remote_id_shared_exactly_is_ambiguous_among_those_only_not_its_prefix_matches(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "shared", agent="http://one.example")
    _task(log, "t2", "shared", agent="http://two.example")
    _task(log, "t3", "shared-too")
    with pytest.raises(UsageError) as caught:
        log.find("shared")
    assert "2 tasks match" in str(caught.value)
    assert "t3" not in str(caught.value)


def test_a_head_read_from_the_store_carries_the_time_it_was_last_written(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    written = store.stream(task_stream_id("t1"))
    assert written is not None
    assert log.head("t1").updated_at == written.updated_at
    assert [h.updated_at for h in log.all()] == [written.updated_at]


# -- lists ------------------------------------------------------------------------------------


def test_every_task_is_listed_by_key_and_filtered_by_status(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t2", "r2")
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [_moved("completed")])
    assert [h.key for h in log.all()] == ["t1", "t2"]
    assert [(h.key, h.version) for h in log.all("completed")] == [("t1", 3)]
    assert [h.key for h in log.all(status="working")] == ["t2"]


def test_a_list_raises_the_first_altered_record_and_the_lenient_list_sets_it_apart(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    for key in ("t1", "t2", "t3"):
        _task(log, key, f"r{key}")
    from cardfence.store.schema import streams

    with store.engine.begin() as conn:
        for key in ("t3", "t2"):
            conn.execute(
                streams.update()
                .where(streams.c.stream_id == task_stream_id(key))
                .values(state="[1]")
            )

    heads, unreadable = log.all_readable()
    assert [h.key for h in heads] == ["t1"]
    assert [e.stream_id for e in unreadable] == [task_stream_id("t2"), task_stream_id("t3")]
    with pytest.raises(CorruptRecordError) as caught:
        log.all()
    assert caught.value.stream_id == task_stream_id("t2")


# -- projections ------------------------------------------------------------------------------


def _state(**fields: Any) -> State:
    return {**initial_task_state("k"), **fields}


def test_a_projection_marks_live_only_when_it_changes_and_indexes_the_remote_id() -> None:
    idle, bound = _state(), _state(remote_task_id="r1", state="working")
    done = _state(remote_task_id="r1", state="completed")
    assert projection_of(idle).live is None  # a new stream not live yet: no row to add
    assert projection_of(bound).live is True
    assert projection_of(bound, idle).live is True
    assert projection_of(bound, bound).live is None  # unchanged: the row is left alone
    assert projection_of(done, bound).live is False
    assert projection_of(done, done).live is None
    assert projection_of(idle, idle).live is None
    projection = projection_of(bound)
    assert (projection.alias, projection.status, projection.category) == (
        "r1", "working", ev.TASK_CATEGORY,
    )  # fmt: skip
    assert projection.state is bound


def test_a_task_whose_creation_was_refused_has_the_status_never_created() -> None:
    assert status_of(_state(closed="never_created")) == "never_created"
    assert status_of(_state(closed=None, state="working")) == "working"
    assert status_of(_state(closed="", state="failed")) == "failed"
    assert status_of({}) is None


def test_a_stream_id_and_its_key_are_each_others_inverse() -> None:
    assert task_stream_id("abc") == f"{ev.TASK_STREAM_PREFIX}abc"
    assert key_of(task_stream_id("task:abc")) == "task:abc"  # only the one prefix is removed
    assert key_of("abc") == "abc"


# -- appends ----------------------------------------------------------------------------------


def test_a_decision_of_no_events_appends_nothing_and_returns_the_state_twice(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    before, after = log.record("t1", lambda _state: [])
    assert before is after
    assert before["state"] == "working"
    assert _types(store, "t1") == [ev.TASK_SUBMITTED, ev.STATE_CHANGED]


def test_an_append_that_lost_the_race_decides_again_on_what_the_other_writer_wrote(
    store: EventStore,
) -> None:
    mine, theirs = TaskLog(store), TaskLog(store)
    _task(mine, "t1", "r1")
    theirs.record("t1", lambda _state: [_moved("input-required")])
    seen: list[str] = []

    def decide(state: State) -> list[ev.TaskEvent]:
        seen.append(state["state"])
        return [_moved("completed", frm=state["state"])]

    before, after = mine.record("t1", decide)

    assert seen == ["working", "input-required"]  # decided on the stale head, then again
    assert (before["state"], after["state"]) == ("input-required", "completed")
    assert mine.kept("t1") == after
    assert store.stream(task_stream_id("t1")).version == 4  # type: ignore[union-attr]


def test_an_append_that_keeps_losing_gives_up_with_a_concurrency_error(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    other = TaskLog(store)
    calls = 0

    def decide(state: State) -> list[ev.TaskEvent]:
        nonlocal calls
        calls += 1
        other.record("t1", lambda s: [_flagged(f"r{s['transitions']}")])
        return [_moved("completed")]

    monkeypatch.setattr(tasklog, "_RETRIES", 3)
    with pytest.raises(ConcurrencyError) as caught:
        log.record("t1", decide)
    assert calls == 3
    # The last race lost, as the store saw it: the version expected, the one found.
    found = store.stream(task_stream_id("t1"))
    assert found is not None
    assert (caught.value.stream_id, caught.value.actual_version) == (found.stream_id, found.version)
    assert caught.value.expected_version == found.version - 1
    assert str(caught.value) == (
        f"stream 'task:t1' is at version {found.version}, not {found.version - 1}: another "
        "writer appended first (nothing was written)"
    )
    assert ev.STATE_CHANGED not in _types(store, "t1")[2:]


def test_an_unknown_task_cannot_be_recorded_to(store: EventStore) -> None:
    with pytest.raises(UsageError, match=r"^unknown task 'ghost'$"):
        TaskLog(store).record("ghost", lambda _state: [_moved("completed")])


def test_repeats_counted_ride_on_the_next_event_once(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    log.count_repeat("t1")
    log.count_repeat("t1")
    log.record("t1", lambda _state: [_flagged("a")])
    log.record("t1", lambda _state: [_flagged("b")])
    data = [e.data for e in store.read_stream(task_stream_id("t1"))]
    assert data[2][ev.REPEATS_IGNORED] == 2
    assert ev.REPEATS_IGNORED not in data[3]
    assert ev.FAILURES_REPEATED not in data[2]
    assert log.head("t1").state[ev.REPEATS_IGNORED] == 2


def test_an_append_under_a_lease_carries_the_lease_only_on_its_own_task(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    _task(log, "t2", "r2")
    [lease] = [lease for lease in store.due.claim("me", 60, 10) if lease.stream_id.endswith("t1")]

    with driving(lease):
        log.record("t1", lambda _state: [_flagged("a")])
        log.record("t2", lambda _state: [_flagged("b")])
    log.record("t1", lambda _state: [_flagged("c")])

    t1 = [e.data for e in store.read_stream(task_stream_id("t1"))]
    assert t1[2][ev.LEASE] == {"owner": "me", "epoch": lease.epoch}
    assert ev.LEASE not in t1[3]
    assert ev.LEASE not in store.read_stream(task_stream_id("t2"))[2].data


def test_a_failure_repeated_after_another_writer_appended_is_appended_again(
    store: EventStore,
) -> None:
    failed = ev.EndpointUnreachable(url=AGENT, detail="down", during="poll")
    log, other = TaskLog(store), TaskLog(store)
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [failed])
    log.record("t1", lambda _state: [failed])
    assert log.failures_held("t1") == 1
    other.record("t1", lambda _state: [_flagged("x")])
    log.record("t1", lambda _state: [failed])  # the log moved: this one is appended
    log.record("t1", lambda _state: [failed])  # and this one counted again

    logged = store.read_stream(task_stream_id("t1"))
    assert [e.type for e in logged].count(ev.ENDPOINT_UNREACHABLE) == 2
    assert logged[-1].data[ev.FAILURES_REPEATED] == 1  # the count held before, carried
    assert log.failures_held("t1") == 1
    assert log.failures_held("other") == 0


def test_a_new_kind_of_failure_is_appended_and_an_old_kind_after_it_is_still_counted(
    store: EventStore,
) -> None:
    poll = ev.EndpointUnreachable(url=AGENT, detail="down", during="poll")
    card = ev.DiscoveryUnavailable(
        kind="http_status", detail="503", url=AGENT, during="revalidation"
    )
    log = TaskLog(store)
    _task(log, "t1", "r1")
    for decided in (poll, card, poll, card, poll):
        log.record("t1", lambda _state, d=decided: [d])  # type: ignore[misc]
    assert _types(store, "t1")[2:] == [ev.ENDPOINT_UNREACHABLE, ev.DISCOVERY_UNAVAILABLE]
    assert log.failures_held("t1") == 3


def test_failures_not_in_the_repeatable_kinds_are_appended_every_time(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    sent = ev.EndpointUnreachable(url=AGENT, detail="down", during="send")
    twice = [sent, sent]
    for _ in range(2):
        log.record("t1", lambda _state: [sent])
        log.record("t1", lambda _state: list(twice))  # two events are never one failure
    assert _types(store, "t1")[2:].count(ev.ENDPOINT_UNREACHABLE) == 6


def test_a_failure_differing_only_in_its_moment_is_the_same_failure() -> None:
    def failed(**extra: Any) -> list[StoredEvent]:
        return [(ev.AUTHORIZATION_FAILED, {"during": "subscribe", "status": 401, **extra})]

    assert tasklog._repeatable_failure(failed(at="1")) == tasklog._repeatable_failure(
        failed(at="2")
    )
    assert tasklog._repeatable_failure(failed(status=403)) != tasklog._repeatable_failure(failed())
    moment = datetime(2025, 1, 1, tzinfo=UTC)
    fingerprint = tasklog._repeatable_failure(
        [(ev.AUTHORIZATION_FAILED, {"when": moment, "during": "poll"})]
    )
    # Fields sorted, values JSON or their text: the same failure always prints the same.
    when = '"when": "2025-01-01 00:00:00+00:00"'
    assert fingerprint == f'["{ev.AUTHORIZATION_FAILED}", {{"during": "poll", {when}}}]'


def test_the_head_kept_after_an_append_is_the_next_appends_start_no_store_read(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = TaskLog(store)
    reads: list[str] = []
    read = log.head
    monkeypatch.setattr(log, "head", lambda key: reads.append(key) or read(key))
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [_moved("input-required")])
    log.record("t1", lambda _state: [_flagged("a")])
    assert reads == []
    assert store.stream(task_stream_id("t1")).version == 4  # type: ignore[union-attr]


def test_an_append_under_a_lease_another_process_took_writes_nothing(store: EventStore) -> None:
    log = TaskLog(store)
    _task(log, "t1", "r1")
    [mine] = store.due.claim("me", -1.0, 10)  # run out at once
    [theirs] = store.due.claim("them", 60.0, 10)

    with driving(mine), pytest.raises(LeaseLostError) as caught:
        log.record("t1", lambda _state: [_moved("completed")])

    assert (caught.value.owner, caught.value.held_by) == ("me", "them")
    assert theirs.epoch > mine.epoch
    assert _types(store, "t1") == [ev.TASK_SUBMITTED, ev.STATE_CHANGED]


def test_a_task_that_ends_leaves_the_due_work_and_one_that_starts_joins_it(
    store: EventStore,
) -> None:
    log = TaskLog(store)
    _task(log, "t1")
    assert store.due.rows() == []  # no remote id yet: nothing to drive
    log.record("t1", lambda _state: [_bound("r1")])
    assert [row.stream_id for row in store.due.rows()] == [task_stream_id("t1")]
    log.record("t1", lambda _state: [_flagged("a")])
    assert [row.stream_id for row in store.due.rows()] == [task_stream_id("t1")]
    log.record("t1", lambda _state: [_moved("completed")])
    assert store.due.rows() == []


def test_failures_seen_before_another_writer_appended_are_forgotten_after_it(
    store: EventStore,
) -> None:
    poll = ev.EndpointUnreachable(url=AGENT, detail="down", during="poll")
    card = ev.DiscoveryUnavailable(
        kind="http_status", detail="503", url=AGENT, during="revalidation"
    )
    log, other = TaskLog(store), TaskLog(store)
    _task(log, "t1", "r1")
    log.record("t1", lambda _state: [poll])
    other.record("t1", lambda _state: [_flagged("x")])
    log.record("t1", lambda _state: [card])  # the failures since: this one only
    log.record("t1", lambda _state: [poll])  # not among them: appended
    assert _types(store, "t1")[2:] == [
        ev.ENDPOINT_UNREACHABLE, ev.FLAGGED_FOR_REVIEW, ev.DISCOVERY_UNAVAILABLE,
        ev.ENDPOINT_UNREACHABLE,
    ]  # fmt: skip


# -- the log of decisions ---------------------------------------------------------------------


def test_one_line_is_logged_per_decision_with_task_event_and_reason(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    log = TaskLog(store)
    with caplog.at_level(logging.INFO, logger="cardfence.tasks"):
        log.create("t1", [submitted("t1")])
        log.record("t1", lambda _state: [_bound("r1"), _flagged("x")])
    lines = [(r.getMessage(), r.task, r.event, r.reason) for r in caplog.records]  # type: ignore[attr-defined]
    assert lines == [
        (f"t1 {ev.TASK_SUBMITTED}", "t1", ev.TASK_SUBMITTED, None),
        (f"t1 {ev.STATE_CHANGED}", "t1", ev.STATE_CHANGED, "working"),
        (f"t1 {ev.FLAGGED_FOR_REVIEW}", "t1", ev.FLAGGED_FOR_REVIEW, "x"),
    ]


def test_nothing_is_logged_below_info(store: EventStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cardfence.tasks"):
        TaskLog(store).create("t1", [submitted("t1")])
    assert caplog.records == []


# --------------------------------------------------------------------------------------------------
# A task record altered in the store is a typed error naming it, never a crash or a wrong task.
#
# Everything cardfence writes is a JSON object, and a task's projection holds every field of the
# first one ever written: anything else was altered in the store (by hand, or by a tool that is not
# cardfence). Reading it raises :class:`CorruptRecordError` -- the stream, the record, what is wrong
# with it -- and listing tasks sets it apart, so one such task holds up no other.


WORKING = ev.StateChanged(from_="submitted", to="working", source="poll", remote_timestamp=None)


@pytest.fixture
def log() -> Iterator[TaskLog]:
    with EventStore.open("sqlite://") as store:
        log = TaskLog(store)
        for key in ("t1", "t2", "t3"):
            log.create(key, [submitted(key)])
            log.record(key, lambda _state: [WORKING])
        yield log


def _set_projection(log: TaskLog, key: str, state: str) -> None:
    with log.store.engine.begin() as conn:
        conn.execute(
            streams.update().where(streams.c.stream_id == task_stream_id(key)).values(state=state)
        )


def test_a_projection_lacking_task_fields_is_named_with_how_many_and_the_first_five(
    log: TaskLog,
) -> None:
    kept = dict(log.head("t2").state)
    for name in ("agent_url", "endpoint", "flags", "state", "task", "webhook"):
        del kept[name]
    _set_projection(log, "t2", json.dumps(kept))

    with pytest.raises(CorruptRecordError) as caught:
        log.head("t2")

    assert str(caught.value).startswith(
        "stream 'task:t2', its projection: the stored task lacks 6 of its fields "
        "(agent_url, endpoint, flags, state, task, …): altered in the store?"
    )


def test_an_empty_projection_is_not_taken_for_a_new_task(log: TaskLog) -> None:
    _set_projection(log, "t2", "{}")

    with pytest.raises(CorruptRecordError, match=f"lacks {len(initial_task_state('t2'))} of"):
        log.head("t2")


def test_listing_sets_apart_the_tasks_whose_record_was_altered_and_reads_the_others(
    log: TaskLog,
) -> None:
    _set_projection(log, "t1", "[1]")
    _set_projection(log, "t3", "{}")

    heads, unreadable = log.all_readable()

    assert [h.key for h in heads] == ["t2"]
    assert [(e.stream_id, e.record) for e in unreadable] == [
        ("task:t1", "its projection"), ("task:t3", "its projection"),
    ]  # fmt: skip
    assert "is an array, not a JSON object" in str(unreadable[0])
    with pytest.raises(CorruptRecordError, match=r"^stream 'task:t1'"):
        log.all()  # the strict listing (the library's Engine.tasks) raises the first


def test_a_task_replayed_as_of_a_point_names_the_event_its_fold_cannot_read(
    log: TaskLog,
) -> None:
    changed = [e for e in log.store.read_stream(task_stream_id("t2")) if e.type == ev.STATE_CHANGED]
    with log.store.engine.begin() as conn:
        conn.execute(
            events.update().where(events.c.position == changed[0].position).values(payload="{}")
        )
    point = AsOf(position=log.store.last_position())

    with pytest.raises(CorruptRecordError) as caught:
        log.as_of("t2", point)
    with pytest.raises(CorruptRecordError) as listed:
        log.all_as_of(point)

    for error in (caught.value, listed.value):
        assert (error.stream_id, error.record) == (
            "task:t2", f"event 2 (position {changed[0].position}, StateChanged)",
        )  # fmt: skip
        assert error.detail == "its payload lacks what its type holds (KeyError: 'to')"
    assert log.as_of("t1", point)[0].state["state"] == "working"  # the others replay
