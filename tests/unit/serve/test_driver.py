"""What ``serve``'s driver keeps about the tasks it drives, and what it says when that changes: a
lease lost to another process (the task let go, its stream stopped, counted and logged once), a
task that needs no more driving (its due-work row removed under the lease, or left alone when the
append that ended it removed it), a record that cannot be read (logged as an error once, then at
debug level), an orphaned task (logged, and not checked again until its card changes), and the
global log's events noted for the tasks held.

The driver runs no loop here: its methods are called on tasks made by a real engine on an
in-memory store, against a mock agent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import socket
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.mocked import ScriptedAgent, engine_on, rpc_result, task_answer
from support.virtual_time import run_virtual, virtual_engine

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.errors import TaskOrphanedError, UsageError
from cardfence.engine.serve._metrics import render
from cardfence.engine.serve.driver import Driver
from cardfence.store.errors import CorruptRecordError, LeaseLostError
from cardfence.store.event_store import EventStore


@pytest.fixture
async def engine(store: EventStore) -> AsyncIterator[Engine]:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        yield engine


async def _driving(engine: Engine, tasks: int = 2) -> tuple[Driver, list[str]]:
    """A driver holding the leases of ``tasks`` live tasks (started, bound to a remote id)."""
    keys = [(await engine.start_task(ORIGIN, skill="echo", text="hi")).task for _ in range(tasks)]
    driver = Driver(engine, owner="driver-a")
    await driver.load()
    assert sorted(driver._leases) == sorted(keys)
    return driver, keys


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_a_lost_lease_lets_the_task_go_stops_its_stream_and_is_counted_and_logged(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cardfence")
    driver, (lost, kept) = await _driving(engine)
    stream = asyncio.create_task(asyncio.sleep(60))
    driver._streams[lost] = stream
    driver._row_gone.add(lost)
    driver._orphaned_at[lost] = "a-revision"
    assert driver._lose(lost, "taken over by driver-b") is True
    await asyncio.sleep(0)
    assert stream.cancelled()
    assert lost not in driver._streams
    assert (lost in driver._leases, kept in driver._leases) == (False, True)
    assert (lost in driver._paces, kept in driver._paces) == (False, True)
    assert (lost in driver._scheduled, kept in driver._scheduled) == (False, True)
    assert lost not in driver._orphaned_at
    assert lost not in driver._row_gone
    assert driver.lost == 1
    (record,) = _logged(caplog, "LeaseLost")
    assert record.getMessage() == "taken over by driver-b"
    assert (record.task, record.reason) == (lost, "taken over by driver-b")  # type: ignore[attr-defined]
    assert record.levelno == logging.INFO

    # A task no longer held is let go again without a count or a line; the next one counts.
    assert driver._lose(lost, "again") is True
    assert driver._lose(kept, "taken over too") is True
    assert driver.lost == 2
    assert [r.getMessage() for r in _logged(caplog, "LeaseLost")] == [
        "taken over by driver-b",
        "taken over too",
    ]


async def test_a_refusal_under_an_older_lease_lets_go_nothing_when_a_newer_one_is_held(
    engine: Engine,
) -> None:
    driver, (key, _) = await _driving(engine)
    held = driver._leases[key]
    assert driver._lose(key, "refused under an older lease", held.epoch - 1) is False
    assert driver._leases[key] is held
    assert key in driver._paces
    assert driver.lost == 0
    assert driver._lose(key, "refused under the lease held", held.epoch) is True
    assert key not in driver._leases


async def test_a_finished_task_has_its_due_row_removed_under_its_lease(
    engine: Engine, store: EventStore
) -> None:
    driver, (finished, other) = await _driving(engine)
    removing: list[set[str]] = []
    done = store.due.done

    def watched(lease: Any) -> None:
        removing.append(set(driver._finishing))  # still held while the row is removed
        done(lease)

    store.due.done = watched  # type: ignore[method-assign]
    await driver._finish(finished)
    rows = {row.stream_id for row in store.due.rows()}
    assert rows == {task_stream_id(other)}
    assert removing == [{finished}]
    assert driver._finishing == set()
    assert (finished in driver._leases, finished in driver._paces) == (False, False)
    assert other in driver._leases


async def test_a_task_whose_ending_append_removed_its_row_is_let_go_without_a_store_call(
    engine: Engine, store: EventStore
) -> None:
    driver, (ended, other) = await _driving(engine)
    driver._row_gone.add(ended)
    calls: list[Any] = []
    store.due.done = calls.append  # type: ignore[method-assign]
    await driver._finish(ended)
    assert calls == []
    assert ended not in driver._row_gone
    assert ended not in driver._leases
    await driver._finish("never-held")  # no lease: nothing to remove
    assert calls == []
    assert other in driver._leases


async def test_an_unreadable_record_is_an_error_once_then_debug_until_its_reason_changes(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cardfence")
    driver = Driver(engine, owner="driver-a")
    first = CorruptRecordError("task:k-1", "projection", "it does not match its events")
    other = CorruptRecordError("task:k-1", "event 3", "its hash breaks the chain")
    for corrupt in (first, first, other):
        driver._not_driven("k-1", corrupt)
    lines = [
        (r.levelno, r.getMessage(), r.task, r.reason)  # type: ignore[attr-defined]
        for r in _logged(caplog, "RecordUnreadable")
    ]
    assert lines == [
        (logging.ERROR, "task not driven: its record cannot be read", "k-1", str(first)),
        (logging.DEBUG, "task still not driven: its record cannot be read", "k-1", str(first)),
        (logging.ERROR, "task not driven: its record cannot be read", "k-1", str(other)),
    ]
    driver._readable("k-1")
    driver._readable("k-1")  # said once
    (again,) = _logged(caplog, "RecordReadable")
    assert (again.getMessage(), again.task) == ("task driven again: its record can be read", "k-1")  # type: ignore[attr-defined]


async def test_an_orphaned_task_is_logged_and_not_checked_again_at_the_same_revision(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cardfence")
    driver, (key, _) = await _driving(engine)
    orphaned = TaskOrphanedError(key, "echo", "rev-2", "skill echo is no longer offered")

    async def reconcile(_key: str) -> None:
        raise orphaned

    engine.following.reconcile_endpoint = reconcile  # type: ignore[method-assign]
    state = await driver._reconcile(key, "rev-2")
    assert state == await engine.records.state(key)  # read again, as it is now
    assert driver._orphaned_at == {key: "rev-2"}
    await driver._reconcile(key, None)  # no revision read: nothing to remember
    assert driver._orphaned_at == {key: "rev-2"}
    records = _logged(caplog, ev.TASK_ORPHANED)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "task orphaned by a card revision; polling on at its recorded endpoint")
    ] * 2
    assert (records[0].task, records[0].reason) == (key, str(orphaned))  # type: ignore[attr-defined]


async def test_the_events_of_tasks_held_are_noted_past_other_streams_and_tasks_in_flight_touched(
    engine: Engine,
) -> None:
    driver, (idle, stepping) = await _driving(engine)
    driver._in_flight.add(stepping)
    driver._paces[idle].delay = 8.0
    driver._claim_soon.clear()
    driver._note(
        [
            (f"agent:{ORIGIN}", ev.CARD_FETCHED),  # not a task: skipped, the rest still read
            (task_stream_id("not-held"), ev.TASK_SUBMITTED),  # nobody here holds it: claim soon
            (task_stream_id(idle), ev.REPLY_SENT),
            (task_stream_id(stepping), ev.STATE_CHANGED),
        ]
    )
    assert driver._paces[idle].delay == engine.config.first_poll_interval  # prompted
    assert driver._touched == {stepping}
    assert driver._claim_soon.is_set()


async def test_an_event_of_a_task_held_but_not_followed_has_it_followed_now(
    engine: Engine,
) -> None:
    driver, (followed, dropped) = await _driving(engine)
    driver._drop(dropped)  # held, but no longer followed (its pace let go)
    due = dict(driver._scheduled)
    driver._paces[followed].delay = 8.0
    driver._note([(task_stream_id(k), ev.STATE_CHANGED) for k in (followed, dropped)])
    assert dropped in driver._paces
    assert driver._scheduled[dropped] <= driver._clock()  # due now
    assert driver._scheduled[followed] == due[followed]  # not prompted: left as it was
    assert driver._paces[followed].delay == 8.0


async def test_a_scan_reads_the_global_log_in_batches_of_1000_past_the_last_position(
    engine: Engine,
) -> None:
    driver = Driver(engine, owner="driver-a")
    sizes = iter([1000, 500, 0])
    asked: list[tuple[int, int]] = []

    def read_all(after: int, limit: int) -> list[Any]:
        asked.append((after, limit))
        n = next(sizes)
        return [
            SimpleNamespace(position=after + i + 1, stream_id="other", type="X") for i in range(n)
        ]

    driver.store.read_all = read_all  # type: ignore[method-assign]
    driver._position = 7
    assert await driver.scan() == 1500
    assert asked == [(7, 1000), (1007, 1000), (1507, 1000)]
    assert driver._position == 1507


async def test_what_the_driver_counts_is_exposed_as_metrics(engine: Engine) -> None:
    driver, (lost, kept, _) = await _driving(engine, tasks=3)
    driver._streams[kept] = asyncio.create_task(asyncio.sleep(60))
    driver.polls, driver.taken_over = 7, 2
    driver._lose(lost, "taken over by driver-b")
    text = render(driver.families())
    driver._streams.pop(kept).cancel()
    assert text == (
        "# HELP cardfence_tasks_followed Live tasks this driver follows.\n"
        "# TYPE cardfence_tasks_followed gauge\n"
        "cardfence_tasks_followed 2\n"
        "# HELP cardfence_leases_held Task leases this driver holds.\n"
        "# TYPE cardfence_leases_held gauge\n"
        "cardfence_leases_held 2\n"
        "# HELP cardfence_streams_followed Task event streams followed beside the polls.\n"
        "# TYPE cardfence_streams_followed gauge\n"
        "cardfence_streams_followed 1\n"
        "# HELP cardfence_polls_total Safety polls made (GetTask).\n"
        "# TYPE cardfence_polls_total counter\n"
        "cardfence_polls_total 7\n"
        "# HELP cardfence_leases_total Task leases gained (claimed: nobody held them; "
        "taken_over: from a driver above its fair share) and lost (another driver claimed or "
        "took the task over).\n"
        "# TYPE cardfence_leases_total counter\n"
        'cardfence_leases_total{event="claimed"} 3\n'
        'cardfence_leases_total{event="taken_over"} 2\n'
        'cardfence_leases_total{event="lost"} 1\n'
    )


async def test_a_task_stream_that_ends_or_brings_an_event_has_the_task_polled_now(
    engine: Engine,
) -> None:
    driver, (streamed, other) = await _driving(engine)
    for key in (streamed, other):
        driver._paces[key].delay = 8.0
        driver._scheduled[key] = driver._clock() + 8.0

    seen: list[tuple[str, float]] = []

    async def keep_streaming(key: str, *, after_each: Any = None) -> None:
        after_each()  # an event came
        seen.append((key, driver._paces[streamed].delay))
        driver._paces[streamed].delay = 8.0

    engine.keep_streaming = keep_streaming  # type: ignore[method-assign]
    driver._streams[streamed] = asyncio.create_task(driver._stream(streamed))
    await driver._streams[streamed]
    assert seen == [(streamed, engine.config.first_poll_interval)]  # polled at the event
    assert streamed not in driver._streams
    # It ended: it may have missed the end, so the task is polled now.
    assert driver._paces[streamed].delay == engine.config.first_poll_interval
    assert driver._scheduled[streamed] <= driver._clock()
    assert driver._paces[other].delay == 8.0


async def test_a_stream_whose_lease_was_lost_lets_the_task_go_unless_held_again_since(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cardfence")
    driver, (key, again) = await _driving(engine)
    lost = {
        k: LeaseLostError(task_stream_id(k), "driver-a", driver._leases[k].epoch - d, "driver-b")
        for k, d in ((key, 0), (again, 1))  # ``again``: refused under a lease older than held
    }

    async def keep_streaming(k: str, *, after_each: Any = None) -> None:
        raise lost[k]

    engine.keep_streaming = keep_streaming  # type: ignore[method-assign]
    await driver._stream(key)
    assert key not in driver._leases
    assert key not in driver._paces  # and no poll is asked for it
    assert driver.lost == 1
    (record,) = _logged(caplog, "LeaseLost")
    assert (record.getMessage(), record.task) == (str(lost[key]), key)  # type: ignore[attr-defined]
    await driver._stream(again)
    assert again in driver._leases
    assert driver.lost == 1


async def test_a_stream_follower_that_fails_is_logged_and_the_polls_go_on(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cardfence")
    driver, (key, _) = await _driving(engine)
    driver._paces[key].delay = 8.0

    async def keep_streaming(_key: str, *, after_each: Any = None) -> None:
        raise RuntimeError("a bug")

    engine.keep_streaming = keep_streaming  # type: ignore[method-assign]
    driver._streams[key] = asyncio.current_task()  # type: ignore[assignment]
    await driver._stream(key)
    (record,) = _logged(caplog, "StepFailed")
    assert (record.getMessage(), record.task) == ("stream follower failed", key)  # type: ignore[attr-defined]
    assert record.exc_info is not None
    assert key not in driver._streams
    assert driver._paces[key].delay == engine.config.first_poll_interval  # polled now


async def test_no_poll_is_asked_for_a_stream_that_ends_while_stopping_or_after_the_task(
    engine: Engine,
) -> None:
    driver, (stopping, let_go) = await _driving(engine)
    for key in (stopping, let_go):
        driver._paces[key].delay = 8.0
    driver._drop(let_go)
    driver._poll_soon(let_go)
    assert let_go not in driver._paces
    driver.stop()
    driver._poll_soon(stopping)
    assert driver._paces[stopping].delay == 8.0


async def test_a_driver_is_made_with_the_documented_defaults(engine: Engine) -> None:
    driver = Driver(engine)
    settings = (driver.workers, driver.max_streams, driver.scan_interval, driver.lease_ttl)
    assert settings == (32, 64, 0.5, 15.0)
    assert driver.claim_batch == 256
    host, pid, tag = driver.owner.split(":")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert re.fullmatch("[0-9a-f]{8}", tag)
    assert Driver(engine).owner != driver.owner
    with pytest.raises(UsageError, match="the lease time must be positive, not 0"):
        Driver(engine, lease_ttl=0)
    assert Driver(engine, lease_ttl=0.5).lease_ttl == 0.5


async def test_a_driver_not_yet_loaded_scans_the_global_log_from_its_start(
    engine: Engine, store: EventStore
) -> None:
    await engine.start_task(ORIGIN, skill="echo", text="hi")
    everything = len(store.read_all(0, 10_000))
    assert everything > 1
    assert await Driver(engine).scan() == everything


# --------------------------------------------------------------------------------------------------
# The driver's schedule (``serve``: every live task kept moving), read exactly on a virtual clock
# (``support.virtual_time``): R5's bound -- no live task goes longer than ``max_poll_interval``
# without a safety poll, confirmed push or not -- for every task of many over five virtual minutes;
# a task picked up after the driver started (another process's ``run``) followed at its next scan;
# and pushes arriving every second, each webhook confirmed, spacing no poll.
#
# Incident 001 is a client that waited six hours on a push the agent had stopped sending. Here the
# bound is not sampled by a test that sleeps: each task's polls are the times the engine asked for.


CONFIG = EngineConfig(first_poll_interval=0.5, max_poll_interval=4.0, follow_streams=False)


def _working_agent(retry_after: str | None = None) -> ScriptedAgent:
    """A mock agent whose every task stays `working`: a new remote id per send; each GetTask
    answered for the task asked about (``retry_after``: answered 429 with it)."""
    ids = (f"r-{n}" for n in itertools.count())
    card = card_document()
    card["capabilities"]["pushNotifications"] = True

    def send(call: dict[str, Any]) -> httpx.Response:
        return rpc_result(call, {"task": {**task_answer("submitted"), "id": next(ids)}})

    def get(call: dict[str, Any]) -> httpx.Response:
        if retry_after is not None:
            return httpx.Response(429, headers={"Retry-After": retry_after})
        return rpc_result(call, {**task_answer("working"), "id": call["params"]["id"]})

    return ScriptedAgent(get, card=card, send=send)


def _polls(agent: ScriptedAgent) -> defaultdict[str, list[float]]:
    """When each task was polled, by the loop's clock, by remote id."""
    polls: defaultdict[str, list[float]] = defaultdict(list)
    calls = iter(agent.calls)  # one for each request but the card reads, in the same order
    for method, when in agent.at:
        if method == "card":
            continue
        call = next(calls)
        if method == "GetTask":
            polls[call["params"]["id"]].append(when)
    return polls


def _driving_driver_pace(
    agent: ScriptedAgent, seconds: float, meanwhile: Callable[[Engine], Awaitable[None]]
) -> None:
    """Drive every live task for ``seconds`` of virtual time, with ``meanwhile(engine)`` run
    beside the driver from its start."""

    async def job() -> None:
        async with virtual_engine(agent.transport(), CONFIG) as engine:
            driver = Driver(engine, workers=8, scan_interval=0.5)
            running = asyncio.ensure_future(driver.run())
            await driver.ready()
            await meanwhile(engine)
            await asyncio.sleep(seconds - engine.clock())
            driver.stop()
            await running

    run_virtual(job())


def _gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


async def _started(engine: Engine, count: int) -> None:
    for _ in range(count):
        await engine.start_task(ORIGIN, skill="echo", text="hi")


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_no_live_task_goes_longer_than_max_poll_interval_without_a_poll() -> None:
    agent = _working_agent()
    _driving_driver_pace(agent, 300.0, lambda engine: _started(engine, 30))
    assert len(_polls(agent)) == 30
    for times in _polls(agent).values():
        # The first at once, then backing off to the bound, and the bound kept to the end.
        assert times[0] <= CONFIG.first_poll_interval
        assert max(_gaps(times)) <= CONFIG.max_poll_interval
        assert times[-1] >= 300.0 - CONFIG.max_poll_interval
        assert _gaps(times)[-1] == CONFIG.max_poll_interval


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_task_started_while_the_driver_runs_is_polled_at_once_then_backs_off() -> None:
    agent = _working_agent()

    async def later(engine: Engine) -> None:
        await _started(engine, 1)  # before the driver's first poll: r-0
        await asyncio.sleep(100.0)
        await _started(engine, 1)  # another process's `run`, a hundred seconds in: r-1

    _driving_driver_pace(agent, 200.0, later)
    late = _polls(agent)["r-1"]
    assert 100.0 <= late[0] <= 100.0 + 0.5  # picked up by the next scan of the log
    assert _gaps(late)[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(_gaps(_polls(agent)["r-0"])) <= CONFIG.max_poll_interval


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_task_whose_pushes_arrive_every_second_is_still_polled_at_the_bound() -> None:
    # R5: push confirmed or not, the safety polls go on; a confirmed webhook never spaces them.
    agent = _working_agent()
    confirmed: list[str] = []
    pushers: list[asyncio.Future[None]] = []

    async def pushing(engine: Engine) -> None:
        webhooks = []
        for _ in range(5):
            key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
            outcome = await engine.register_webhook(key, "https://hooks.example/w")
            assert outcome.token is not None
            assert outcome.authorization is not None
            headers = {
                "content-type": "application/json",
                "x-a2a-notification-token": outcome.token,
                "authorization": outcome.authorization,
            }
            webhooks.append(
                (key, str((await engine.records.state(key))["remote_task_id"]), headers)
            )

        async def deliveries() -> None:
            for second in range(1, 120):
                await asyncio.sleep(second - asyncio.get_running_loop().time())
                for _, remote, headers in webhooks:
                    status = {
                        "state": "TASK_STATE_WORKING",
                        "timestamp": f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z",
                    }
                    update = {"taskId": remote, "contextId": "c-1", "status": status}
                    body = json.dumps({"statusUpdate": update}).encode()
                    delivered = await engine.deliver(body, headers)
                    assert delivered.status == 200, delivered
            for key, _, _ in webhooks:
                if (await engine.records.state(key))["webhook"]["status"] == "confirmed":
                    confirmed.append(key)

        pushers.append(asyncio.ensure_future(deliveries()))

    _driving_driver_pace(agent, 121.0, pushing)
    assert pushers[0].done()
    assert pushers[0].exception() is None  # every delivery answered 200
    assert len(confirmed) == 5
    for times in _polls(agent).values():
        assert max(_gaps(times)) <= CONFIG.max_poll_interval
        assert times[-1] >= 121.0 - CONFIG.max_poll_interval


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_an_agent_asking_for_time_is_polled_no_sooner_even_when_news_prompts_a_poll() -> None:
    # R5: its Retry-After (10 s) outweighs the bound (4 s), and the news of a registration.
    agent = _working_agent(retry_after="10")
    keys: list[str] = []

    async def later(engine: Engine) -> None:
        keys.append((await engine.start_task(ORIGIN, skill="echo", text="hi")).task)
        await asyncio.sleep(15.0)  # between two polls, 10 s apart
        await engine.register_webhook(keys[0], "https://hooks.example/w")
        await asyncio.sleep(44.0)
        stream = engine.store.read_stream(f"task:{keys[0]}")
        assert [e.type for e in stream].count(ev.THROTTLED) == 1

    _driving_driver_pace(agent, 60.0, later)
    polls = _polls(agent)["r-0"]
    assert len(polls) == 6
    assert set(_gaps(polls)) == {10.0}


@pytest.mark.usefixtures("_deadlines_on_the_virtual_clock")
def test_a_webhook_registered_elsewhere_prompts_a_poll_and_the_backoff_starts_over() -> None:
    # Another process's registration (or reply) is news about the task: the driver polls it at
    # its next scan of the log, and looks again soon after, as for a task just started.
    agent = _working_agent()

    async def later(engine: Engine) -> None:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        await asyncio.sleep(101.0)  # between two polls at the bound (100 and 104)
        await engine.register_webhook(key, "https://hooks.example/w")

    _driving_driver_pace(agent, 130.0, later)
    polls = _polls(agent)["r-0"]
    before = [when for when in polls if when <= 101.0]
    after = [when for when in polls if when > 101.0]
    assert before[-2:] == [96.0, 100.0]  # at the bound until then
    assert after[0] <= 101.0 + 0.5  # the next scan, not the next poll at the bound (104)
    assert _gaps(after)[:4] == [0.5, 1.0, 2.0, 4.0]
