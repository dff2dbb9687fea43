"""The driver of ``cardfence serve`` against a real a2a-sdk agent: it keeps every live task of the
store moving -- tasks other engines (other processes) started included -- with safety polls never
further apart than ``max_poll_interval`` (R5), R9's second trigger wired in, and nothing ever
decided by a card (R1). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from support import Peer
from support.engine_fixtures import (
    FAST,
    MovableEndpoint,
    assert_audit_ok,
    calls,
    data_of,
    driving,
    drop_skill,
    point_jsonrpc_at,
    state_of,
    transitions,
    types,
    wait_until,
)

from cardfence.engine.client.audit import rebuild_projections
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import is_live
from cardfence.engine.errors import CardInvalidError
from cardfence.engine.serve.driver import Driver
from cardfence.store.event_store import EventStore
from cardfence.store.records import StreamRecord

SLOW = [("submitted", "working"), ("working", "completed")]
# Each transition once, in order; a task that worked and ended between two polls (on a loaded
# machine, before the driver's first) goes from submitted to completed in one.
DRIVEN = (SLOW, [("submitted", "completed")])


async def test_driver_takes_over_tasks_another_engine_started_and_drives_them_to_the_end(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter, driving(db_url) as driver:
        started = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.3") for _ in range(5)
        ]  # recorded and sent by another engine, which never polls them

        await wait_until(
            lambda: all(state_of(starter, v.task)["state"] == "completed" for v in started),
            timeout=10,
            what="the driver to complete every task",
        )

        for view in started:
            assert transitions(starter.store, view.task) in DRIVEN
        await wait_until(lambda: driver.followed == 0, what="ended tasks to be let go")
        assert calls(peer, "CancelTask") == 0


async def test_driver_follows_tasks_live_when_it_starts_and_skips_ended_and_refused_ones(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter:
        live = await starter.start_task(peer.base_url, skill="slow", text="slow 0.3")
        done = await starter.start_task(peer.base_url, skill="echo", text="echo hi")
        await starter.drive(done.task, until="terminal", timeout=5)
        assert is_live(state_of(starter, live.task))
        assert not is_live(state_of(starter, done.task))

    async with driving(db_url) as driver:
        assert driver.followed == 1
        await wait_until(lambda: driver.followed == 0, timeout=10, what="the live task to end")

    async with Engine.connect(db_url, config=FAST) as reader:
        assert state_of(reader, live.task)["state"] == "completed"
        assert transitions(reader.store, done.task) == [("submitted", "completed")]


async def test_live_tasks_without_a_due_row_get_one_when_a_driver_loads_the_store(
    peer: Peer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written before the due-work table existed: its live tasks have no row (here
    removed, as the migration that made the table left them). The driver's load gives them
    one, reading only the heads of tasks not ended, and drives them to their end."""
    async with Engine.connect(db_url, config=FAST) as starter:
        live = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.3") for _ in range(3)
        ]
        done = await starter.start_task(peer.base_url, skill="echo", text="echo hi")
        await starter.drive(done.task, until="terminal", timeout=5)
        with starter.store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM due_work"))
    heads_read: list[str | None] = []
    streams = EventStore.streams

    def counted(store: EventStore, **filters: Any) -> list[StreamRecord]:
        found = streams(store, **filters)
        heads_read.extend(record.status for record in found)
        return found

    monkeypatch.setattr(EventStore, "streams", counted)

    async with driving(db_url) as driver:
        assert driver.followed == 3
        assert "completed" not in heads_read  # the ended task's head was never read
        await wait_until(lambda: driver.followed == 0, timeout=10, what="the live tasks to end")

    async with Engine.connect(db_url, config=FAST) as reader:
        for view in live:
            assert transitions(reader.store, view.task) in DRIVEN
        assert reader.store.due.rows() == []


async def test_safety_polls_complete_a_task_whose_pushes_are_dropped_within_max_poll_interval(
    peer: Peer, db_url: str
) -> None:
    """Seed 001: the agent accepts the webhook and never delivers. The task's completion is
    recorded no later than max_poll_interval after the agent completed it (the bound asserted on
    the agent's own status timestamp against the time it was recorded)."""
    config = dataclasses.replace(
        FAST, max_poll_interval=0.5, first_poll_interval=0.5, follow_streams=False
    )  # polls only: the bound is theirs
    peer.set_push_dropped(True)
    async with Engine.connect(db_url, config=config) as starter, driving(db_url, config):
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 1.2")
        registered = await starter.register_webhook(view.task, "http://127.0.0.1:9/webhook")
        assert registered.registered
        await wait_until(lambda: state_of(starter, view.task)["state"] == "completed", timeout=10)
        completed = [
            e for e in starter.store.read_stream(f"{ev.TASK_STREAM_PREFIX}{view.task}")
            if e.type == ev.STATE_CHANGED and e.data["to"] == "completed"
        ]  # fmt: skip
    assert peer.pushes_dropped > 0
    assert len(completed) == 1
    from datetime import datetime

    said = datetime.fromisoformat(completed[0].data["remote_timestamp"])
    lag = (completed[0].recorded_at - said).total_seconds()
    assert lag <= config.max_poll_interval + 0.25, f"completion recorded {lag:.2f}s late"
    assert completed[0].data["source"] == "poll"


async def test_a_task_whose_endpoint_moved_while_nobody_drove_it_follows_the_move(
    peer: Peer, db_url: str
) -> None:
    """R9's second trigger: the agent's latest recorded card differs from the one the task saw;
    the driver reconciles before polling and the task follows its skill's new endpoint."""
    with MovableEndpoint(peer.jsonrpc_url) as old:
        peer.mutate_card(point_jsonrpc_at(old.url))
        async with Engine.connect(db_url, config=FAST) as starter:
            view = await starter.start_task(peer.base_url, skill="slow", text="slow 0.5")
            assert state_of(starter, view.task)["endpoint"]["url"] == old.url
            peer.mutate_card(point_jsonrpc_at(peer.jsonrpc_url))  # the agent moved the endpoint
            old.gone = True
            await starter.discovery.read(peer.base_url, fresh=True)  # someone read the card

        async with driving(db_url) as driver:
            await wait_until(lambda: driver.followed == 0, timeout=10, what="the task to end")
            store = driver.store
            state = store.stream(f"{ev.TASK_STREAM_PREFIX}{view.task}")
            assert state is not None
            assert state.state["state"] == "completed"
            assert state.state["endpoint"]["url"] == peer.jsonrpc_url
            recorded = types(store, view.task)
            assert recorded.index(ev.ENDPOINT_MOVED) < recorded.index(ev.STATE_CHANGED)


async def test_a_card_moving_a_task_to_port_99999_is_a_failed_read_and_serve_completes_it_in_place(
    peer: Peer, db_url: str
) -> None:
    """The card is invalid (R16), so it is no move (R9): the task is polled where it was."""
    async with Engine.connect(db_url, config=FAST) as starter:
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 0.5")
        peer.mutate_card(point_jsonrpc_at("http://127.0.0.1:99999/"))
        with contextlib.suppress(CardInvalidError):
            await starter.discovery.read(peer.base_url, fresh=True)  # someone read the card

    async with driving(db_url) as driver:
        await wait_until(lambda: driver.followed == 0, timeout=10, what="the task to end")
        assert state_of(driver.engine, view.task)["state"] == "completed"
        assert state_of(driver.engine, view.task)["endpoint"]["url"] == peer.jsonrpc_url
        assert ev.ENDPOINT_MOVED not in types(driver.store, view.task)


async def test_an_orphaned_task_is_polled_on_at_its_recorded_endpoint_and_never_cancelled(
    peer: Peer, db_url: str
) -> None:
    """R9 says orphaned, R1 says the card never ends the task: it completes as the agent says."""
    async with Engine.connect(db_url, config=FAST) as starter:
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 0.6")
        peer.mutate_card(drop_skill("slow"))
        await starter.discovery.read(peer.base_url, fresh=True)

    async with driving(db_url) as driver:
        await wait_until(lambda: driver.followed == 0, timeout=10, what="the task to end")
        recorded = types(driver.store, view.task)
    assert recorded.count(ev.TASK_ORPHANED) == 1
    assert transitions(driver.store, view.task) in DRIVEN
    assert calls(peer, "CancelTask") == 0
    assert data_of(driver.store, view.task, ev.TASK_ORPHANED)[0]["reason"] == "skill_absent"


async def test_a_reply_sent_by_another_process_is_followed_at_once(peer: Peer, db_url: str) -> None:
    config = dataclasses.replace(FAST, max_poll_interval=5.0)
    async with Engine.connect(db_url, config=config) as starter, driving(db_url, config) as driver:
        view = await starter.start_task(peer.base_url, skill="ask", text="ask")
        await wait_until(
            lambda: state_of(starter, view.task)["state"] == "input-required", timeout=10
        )
        polls = driver.polls
        await starter.reply(view.task, "42")
        await wait_until(lambda: driver.followed == 0, timeout=4, what="the reply to be followed")
        assert state_of(starter, view.task)["state"] == "completed"
        assert driver.polls > polls


async def test_stopping_the_driver_finishes_the_steps_in_flight_and_leaves_tasks_resumable(
    peer: Peer, db_url: str
) -> None:
    peer.hold()
    async with Engine.connect(db_url, config=FAST) as starter:
        views = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0") for _ in range(10)
        ]
    async with driving(db_url) as driver:
        await wait_until(lambda: driver.polls >= 10, timeout=10, what="every task polled")
    peer.release()  # the driver is stopped and audited; a later engine picks the tasks up
    async with Engine.connect(db_url, config=FAST) as later:
        for view in views:
            await later.resume(view.task)
            assert (await later.drive(view.task, until="terminal", timeout=10)).state == (
                "completed"
            )
        await later.settle()
        assert_audit_ok(later.store)


async def test_a_task_whose_record_was_altered_is_not_driven_and_holds_up_no_other(
    peer: Peer, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two live tasks whose projections were altered in the store: one with its due row (met
    by a step), one without (met by the load's backfill). Neither stops the driver, and both
    are left exactly as they were; the other tasks are driven to their end."""
    async with Engine.connect(db_url, config=FAST) as starter:
        good = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.3") for _ in "ab"
        ]
        stepped, backfilled = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.3") for _ in "cd"
        ]
    altered = {f"task:{stepped.task}", f"task:{backfilled.task}"}
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = '[1]' WHERE stream_id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": sorted(altered)},
        )
        conn.execute(
            sa.text("DELETE FROM due_work WHERE stream_id = :id"), {"id": f"task:{backfilled.task}"}
        )
        before = dict(conn.execute(sa.text("SELECT stream_id, version FROM streams")).all())

    async with Engine.connect(db_url, config=FAST) as engine:
        driver = Driver(engine, scan_interval=0.05)
        with caplog.at_level(logging.ERROR, logger="cardfence.driver"):
            job = asyncio.create_task(driver.run())
            await driver.ready()
            await wait_until(
                lambda: all(state_of(engine, v.task)["state"] == "completed" for v in good),
                timeout=10,
                what="the readable tasks to complete",
            )
            await wait_until(
                lambda: {getattr(r, "task", None) for r in caplog.records} >= {
                    stepped.task, backfilled.task,
                },
                what="both altered tasks to be logged",
            )  # fmt: skip
            driver.stop()
            await job
        for view in good:
            assert transitions(engine.store, view.task) in DRIVEN
        with engine.store.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT stream_id, state, version FROM streams WHERE stream_id IN :ids")
                .bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": sorted(altered)},
            ).all()  # fmt: skip
    assert {(sid, state, version) for sid, state, version in rows} == {
        (sid, "[1]", before[sid]) for sid in altered
    }
    unreadable = [r for r in caplog.records if getattr(r, "event", None) == "RecordUnreadable"]
    assert {r.task for r in unreadable} == {stepped.task, backfilled.task}  # type: ignore[attr-defined]
    assert all(r.exc_info is None for r in unreadable)  # the cause in one line, no traceback
    assert all("its projection: the stored text is an array" in r.reason for r in unreadable)  # type: ignore[attr-defined]


async def test_an_altered_record_is_logged_once_and_its_task_driven_again_once_repaired(
    peer: Peer, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A live task whose projection was altered is met by a step every ``max_poll_interval``:
    one error line says so, the later steps log at debug level only; once the audit rebuilds
    the projection, the next step drives it to its end and one line says it is driven again."""
    async with Engine.connect(db_url, config=FAST) as starter:
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 0.3")
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :id"),
            {"id": f"task:{view.task}"},
        )

    def unreadable(level: int = logging.DEBUG) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if getattr(r, "event", None) == "RecordUnreadable" and r.levelno >= level
        ]

    async with Engine.connect(db_url, config=FAST) as engine:
        driver = Driver(engine, scan_interval=0.05)
        with caplog.at_level(logging.DEBUG, logger="cardfence.driver"):
            job = asyncio.create_task(driver.run())
            await driver.ready()
            await wait_until(lambda: len(unreadable()) >= 3, what="three steps to meet the record")
            assert len(unreadable(logging.ERROR)) == 1
            with EventStore.open(db_url) as store:
                report = await asyncio.to_thread(rebuild_projections, store)
            assert report.rebuilt == (f"task:{view.task}",)
            assert report.ok
            await wait_until(
                lambda: state_of(engine, view.task)["state"] == "completed",
                timeout=10,
                what="the repaired task to complete",
            )
            driver.stop()
            await job
        assert transitions(engine.store, view.task) in DRIVEN
    assert len(unreadable(logging.ERROR)) == 1
    again = [r for r in caplog.records if getattr(r, "event", None) == "RecordReadable"]
    assert [(r.task, r.levelno) for r in again] == [(view.task, logging.INFO)]  # type: ignore[attr-defined]


async def test_an_agent_record_altered_in_the_store_never_stops_its_tasks_being_polled(
    peer: Peer, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's stream is card state: unreadable, it is like a card that cannot be read
    (R8), and the tasks go on being polled to their end (the card never gates continuation)."""
    async with Engine.connect(db_url, config=FAST) as starter:
        live = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.3") for _ in "ab"
        ]
        agent = state_of(starter, live[0].task)["agent"]
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :id"),
            {"id": ev.agent_stream_id(agent)},
        )

    async with Engine.connect(db_url, config=FAST) as engine:
        driver = Driver(engine, scan_interval=0.05)
        with caplog.at_level(logging.WARNING):
            job = asyncio.create_task(driver.run())
            await driver.ready()
            try:
                await wait_until(
                    lambda: all(state_of(engine, v.task)["state"] == "completed" for v in live),
                    timeout=10,
                    what="the tasks to complete",
                )
            finally:
                driver.stop()
                await job
        for view in live:
            assert transitions(engine.store, view.task) in DRIVEN
