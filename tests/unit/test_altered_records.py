"""A task record altered in the store is a typed error naming it, never a crash or a wrong task.

Everything cardfence writes is a JSON object, and a task's projection holds every field of the
first one ever written: anything else was altered in the store (by hand, or by a tool that is not
cardfence). Reading it raises :class:`CorruptRecordError` -- the stream, the record, what is wrong
with it -- and listing tasks sets it apart, so one such task holds up no other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cardfence.engine.client.tasklog import AsOf, TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import initial_task_state
from cardfence.store.errors import CorruptRecordError
from cardfence.store.event_store import EventStore
from cardfence.store.schema import events, streams

SUBMITTED = {"skill": "echo", "card_revision": "r" * 64}
WORKING = {"from": "submitted", "to": "working", "source": "poll", "remote_timestamp": None}


@pytest.fixture
def log() -> Iterator[TaskLog]:
    with EventStore.open("sqlite://") as store:
        log = TaskLog(store)
        for key in ("t1", "t2", "t3"):
            log.create(key, [(ev.TASK_SUBMITTED, SUBMITTED)])
            log.record(key, lambda _state: [(ev.STATE_CHANGED, WORKING)])
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
