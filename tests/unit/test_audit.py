"""Replay and audit over a store (R13, R14): no network, SQLite in memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from cardfence.engine import events as ev
from cardfence.engine.audit import audit, replay
from cardfence.engine.tasklog import TaskLog, task_stream_id
from cardfence.store import CardSnapshot, EventStore, NewEvent, Projection, RecordedEvent
from cardfence.store.chain import content_hash
from cardfence.store.schema import card_snapshots, streams

BODY = '{"name":"agent"}'
REVISION = content_hash(BODY)


@pytest.fixture
def store() -> Iterator[EventStore]:
    with EventStore.open("sqlite://") as opened:
        yield opened


def _task(store: EventStore) -> None:
    store.put_snapshot(CardSnapshot(REVISION, BODY, "http://a/card", None, 200, datetime.now(UTC)))
    log = TaskLog(store)
    log.create("t1", [(ev.TASK_SUBMITTED, {"skill": "echo", "card_revision": REVISION})])
    change = {"from": "submitted", "to": "working", "source": "poll", "remote_timestamp": None}
    log.record("t1", lambda s: [(ev.STATE_CHANGED, change)])


def test_a_store_written_by_the_engine_audits_clean(store: EventStore) -> None:
    _task(store)
    report = audit(store)
    assert report.ok, report.violations
    assert (report.streams_checked, report.events_checked) == (1, 2)


def test_replay_reproduces_the_projection_and_is_deterministic(store: EventStore) -> None:
    _task(store)
    events = store.read_stream(task_stream_id("t1"))
    head = store.stream(task_stream_id("t1"))
    assert head is not None
    assert replay(task_stream_id("t1"), events) == head.state
    assert replay(task_stream_id("t1"), events) == replay(task_stream_id("t1"), events)


def test_a_tampered_projection_is_a_mismatch(store: EventStore) -> None:
    _task(store)
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state='{"state": "completed"}'))
    kinds = [v.kind for v in audit(store).violations]
    assert kinds == ["projection_mismatch"]


def test_a_missing_or_altered_snapshot_is_reported(store: EventStore) -> None:
    _task(store)
    with store.engine.begin() as conn:
        conn.execute(card_snapshots.update().values(body='{"name":"forged"}'))
    assert [v.kind for v in audit(store).violations] == ["snapshot_mismatch"]
    with store.engine.begin() as conn:
        conn.execute(card_snapshots.delete())
    assert [v.kind for v in audit(store).violations] == ["snapshot_missing"]


def test_an_unknown_event_type_is_reported_not_crashed_on(store: EventStore) -> None:
    _task(store)
    head = store.stream(task_stream_id("t1"))
    assert head is not None
    store.append(
        task_stream_id("t1"),
        head.version,
        [NewEvent("FromTheFuture", {"x": 1}, schema_version=3)],
        projection=Projection(head.state, category="task", status=head.status),
    )
    violations = audit(store).violations
    assert [v.kind for v in violations] == ["unknown_event_type"]
    assert "FromTheFuture" in violations[0].detail


def test_events_appended_while_the_audit_reads_are_checked_next_time_not_reported(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _task(store)
    read_stream = store.read_stream

    def after_a_writer(stream_id: str, from_version: int = 1) -> list[RecordedEvent]:
        # Another process appends between the audit's read of the head and of the events.
        change = {"from": "working", "to": "completed", "source": "push", "remote_timestamp": None}
        TaskLog(store).record("t1", lambda s: [(ev.STATE_CHANGED, change)])
        return read_stream(stream_id, from_version)

    monkeypatch.setattr(store, "read_stream", after_a_writer)
    report = audit(store)
    assert report.ok, report.violations
    assert report.events_checked == 2  # as of the head read: the third is the next audit's


def test_an_event_written_without_moving_its_head_is_reported(store: EventStore) -> None:
    _task(store)
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(version=1))  # the head left behind its second event
    report = audit(store)
    assert [v.kind for v in report.violations][:1] == ["head_mismatch"]
