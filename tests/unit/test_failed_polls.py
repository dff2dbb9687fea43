"""A poll or card read that fails as one of the task's last events, all such failures, did is
counted, not appended (engine/client/tasklog.py): an agent down for a day grows the log by an event
or
two a task, not one a poll, and the count rides on the task's next event, where the fold adds it
up (the projection stays its replay, R13)."""

from __future__ import annotations

from typing import Any

from cardfence.engine.client.audit import audit
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import Event
from cardfence.engine.core.replay import fold_task
from cardfence.store.event_store import EventStore

KEY = "t-failing"
URL = "http://agent.example/a2a/jsonrpc"
REFUSED = "ConnectError: [Errno 111] Connection refused"


def _failed(detail: str = REFUSED, *, during: str = "poll", url: str = URL) -> Event:
    return ev.ENDPOINT_UNREACHABLE, {"url": url, "detail": detail, "during": during}


def _log(store: EventStore) -> TaskLog:
    log = TaskLog(store)
    log.create(KEY, [(ev.TASK_SUBMITTED, {"task": KEY, "agent": "http://agent.example"})])
    return log


def _types_and_data(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, dict(e.data)) for e in store.read_stream(task_stream_id(KEY))]


def test_the_same_failure_poll_after_poll_is_appended_once_then_counted_on_the_next_event(
    store: EventStore,
) -> None:
    log = _log(store)
    for _ in range(5):
        log.record(KEY, lambda _state: [_failed()])
    log.record(KEY, lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])

    recorded = _types_and_data(store)
    assert [t for t, _ in recorded] == [
        ev.TASK_SUBMITTED, ev.ENDPOINT_UNREACHABLE, ev.DEADLINE_EXCEEDED,
    ]  # fmt: skip
    assert ev.FAILURES_REPEATED not in recorded[1][1]
    assert recorded[2][1][ev.FAILURES_REPEATED] == 4
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == 4
    assert fold_task(KEY, [(t, d) for t, d in recorded])[ev.FAILURES_REPEATED] == 4
    assert audit(store).ok


def test_counts_add_up_across_outages_and_each_outage_starts_with_its_event(
    store: EventStore,
) -> None:
    log = _log(store)
    for outage in (3, 2):
        for _ in range(outage):
            log.record(KEY, lambda _state: [_failed()])
        log.record(KEY, lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])

    types = [t for t, _ in _types_and_data(store)]
    assert types.count(ev.ENDPOINT_UNREACHABLE) == 2
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == (3 - 1) + (2 - 1)
    assert audit(store).ok


def test_an_agent_down_fails_polls_and_card_reads_alike_and_each_kind_is_appended_once(
    store: EventStore,
) -> None:
    log = _log(store)
    card_down = (ev.DISCOVERY_UNAVAILABLE, {
        "kind": "network", "detail": REFUSED, "url": "http://agent.example/.well-known/agent-card.json",
        "during": "revalidation",
    })  # fmt: skip
    for _ in range(3):  # an hour of it: polls, and a re-validation now and then
        for _ in range(4):
            log.record(KEY, lambda _state: [_failed()])
        log.record(KEY, lambda _state: [card_down])
    log.record(KEY, lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])

    types = [t for t, _ in _types_and_data(store)]
    assert types == [
        ev.TASK_SUBMITTED, ev.ENDPOINT_UNREACHABLE, ev.DISCOVERY_UNAVAILABLE, ev.DEADLINE_EXCEEDED,
    ]  # fmt: skip
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == 15 - 2
    assert audit(store).ok


def test_a_failure_unlike_the_last_one_is_appended(store: EventStore) -> None:
    log = _log(store)
    unlike = [
        _failed(),
        _failed("ReadTimeout: timed out"),  # another error
        _failed("ReadTimeout: timed out", url=URL + "/v2"),  # another endpoint
        _failed("ReadTimeout: timed out", url=URL + "/v2", during="reply"),  # not a poll
        _failed("ReadTimeout: timed out", url=URL + "/v2", during="reply"),  # never counted
    ]
    for event in unlike:
        log.record(KEY, lambda _state, event=event: [event])

    assert [t for t, _ in _types_and_data(store)].count(ev.ENDPOINT_UNREACHABLE) == 5
    assert ev.FAILURES_REPEATED not in log.head(KEY).state


def test_a_failure_after_another_writers_event_is_appended(store: EventStore) -> None:
    log = _log(store)
    log.record(KEY, lambda _state: [_failed()])
    other = TaskLog(store)  # another process: a `reply` while `serve` polls, say
    other.record(KEY, lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])

    log.record(KEY, lambda _state: [_failed()])

    types = [t for t, _ in _types_and_data(store)]
    assert types[1:] == [ev.ENDPOINT_UNREACHABLE, ev.DEADLINE_EXCEEDED, ev.ENDPOINT_UNREACHABLE]
    assert audit(store).ok


def _refused(status: int, at: str) -> Event:
    return ev.AUTHORIZATION_FAILED, {
        "url": URL, "status": status, "schemes": ["bearer"], "detail": f"HTTP {status}",
        "during": "poll", "at": at,
    }  # fmt: skip


def test_polls_refused_alike_are_counted_whatever_their_moment_and_another_status_is_not(
    store: EventStore,
) -> None:
    log = _log(store)
    for second in range(4):  # revoked credentials: refused poll after poll
        log.record(KEY, lambda _state, s=second: [_refused(401, f"2026-12-03T10:00:0{s}Z")])
    log.record(KEY, lambda _state: [_refused(403, "2026-12-03T10:00:05Z")])
    log.record(KEY, lambda _state: [_refused(401, "2026-12-03T10:00:06Z")])  # as before
    log.record(KEY, lambda _state: [(ev.DEADLINE_EXCEEDED, {"until": "terminal"})])

    recorded = _types_and_data(store)
    assert [d["status"] for t, d in recorded if t == ev.AUTHORIZATION_FAILED] == [401, 403]
    assert recorded[1][1]["at"] == "2026-12-03T10:00:00Z"  # the first refusal's moment
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == 3 + 1
    assert audit(store).ok
