"""What a long-running engine keeps in memory is bounded, whatever happens to the tasks it has
seen: the task heads it last wrote or read, repeat counts and failures being counted, waiting
for a task's next event (R12), and the background failures kept for ``Engine.settle`` during an
outage."""

from __future__ import annotations

import httpx
import pytest

from cardfence.engine.client import _background
from cardfence.engine.client import tasklog as tasklog_module
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.store.event_store import EventStore


def _task(log: TaskLog, key: str) -> None:
    log.create(key, [(ev.TASK_SUBMITTED, {"task": key, "agent": "http://agent.example"})])


def _carried(store: EventStore, key: str) -> object:
    return store.read_stream(task_stream_id(key))[-1].data.get(ev.REPEATS_IGNORED)


def test_heads_are_kept_for_so_many_tasks_the_one_used_longest_ago_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasklog_module, "_HEADS_KEPT", 3)
    log = TaskLog(store)
    for key in ("first", "second", "third"):
        _task(log, key)
    log.record("first", lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])
    _task(log, "fourth")  # one over: "second" is the one used longest ago

    assert [key for key in ("first", "second", "third", "fourth") if log.kept(key)] == [
        "first",
        "third",
        "fourth",
    ]
    # A dropped head is read from the store once, and the task goes on from it.
    log.record("second", lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])
    assert log.head("second").version == 2
    assert log.kept("second") is not None
    assert log.kept("third") is None


def test_repeat_counts_are_held_for_so_many_tasks_the_longest_held_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasklog_module, "_COUNTS_KEPT", 3)
    log = TaskLog(store)
    for key in ("oldest", "kept"):
        _task(log, key)
    log.count_repeat("oldest")
    log.count_repeat("kept")
    log.count_repeat("kept")
    for n in range(2):  # two more tasks counted: four in all, one over
        log.count_repeat(f"ended-{n}")

    note = (ev.DEADLINE_EXCEEDED, {"until": "terminal"})
    log.record("oldest", lambda _state: [note])
    log.record("kept", lambda _state: [note])
    assert _carried(store, "oldest") is None  # dropped, as if its process had restarted
    assert _carried(store, "kept") == 2


def test_failures_being_counted_are_held_for_so_many_tasks_the_longest_held_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task failing as before is counted, not appended, while its failure is held; a process
    whose tasks move on to others (leases taken over) holds at most so many of them."""
    monkeypatch.setattr(tasklog_module, "_COUNTS_KEPT", 3)
    log = TaskLog(store)
    unreachable = (ev.ENDPOINT_UNREACHABLE, {"url": "http://agent.example", "during": "poll",
                                             "detail": "ConnectError: refused"})  # fmt: skip
    keys = ["oldest", "kept", "moved-0", "moved-1"]  # four held, one over
    for key in keys:
        _task(log, key)
        log.record(key, lambda _state: [unreachable])

    def failures(key: str) -> int:
        return [e.type for e in store.read_stream(task_stream_id(key))].count(
            ev.ENDPOINT_UNREACHABLE
        )

    log.record("kept", lambda _state: [unreachable])  # the same failure again: held, counted
    assert (failures("kept"), log.failures_held("kept")) == (1, 1)
    log.record("oldest", lambda _state: [unreachable])  # dropped: recorded anew, as on restart
    assert (failures("oldest"), log.failures_held("oldest")) == (2, 0)


async def test_background_failures_kept_for_settle_are_the_first_hundred_each_logged(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    async def failing(n: int) -> None:
        raise RuntimeError(f"store down ({n})")

    async with httpx.AsyncClient() as client, Engine(store, client) as engine:
        for n in range(_background._ERRORS_KEPT + 50):
            await engine.background.contained(failing(n))

        assert len(engine.background_errors) == _background._ERRORS_KEPT
        assert len([r for r in caplog.records if r.exc_info]) == _background._ERRORS_KEPT + 50
        with pytest.raises(RuntimeError, match=r"store down \(0\)"):
            await engine.settle()
