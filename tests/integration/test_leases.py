"""Leases: each live task is driven by exactly one process at a time. The due-work table moves in
step with the log (same transactions), claims never hand one task to two drivers, a lease that
runs out is taken over, and a driver that lost its lease cannot append for the task -- the race
forced here on both databases. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support import Peer
from support.engine_fixtures import (
    FAST,
    assert_audit_ok,
    driving,
    events,
    state_of,
    transitions,
    wait_until,
)

from cardfence.engine.client import tasklog
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import State
from cardfence.store.errors import ConcurrencyError, LeaseLostError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, Projection

SLOW = [("submitted", "working"), ("working", "completed")]
SKIPPED = [("submitted", "completed")]  # the task worked between two polls


def live_streams(store: EventStore, count: int, prefix: str = "task-") -> list[str]:
    """``count`` streams made live by their first append (as the engine's binding append does)."""
    ids = [f"{prefix}{n:04d}" for n in range(count)]
    for stream_id in ids:
        store.append(stream_id, 0, [NewEvent("Made", {})], projection=Projection({}, live=True))
    return ids


def test_the_append_that_makes_a_stream_live_or_ends_it_adds_or_removes_its_row(
    db_url: str,
) -> None:
    with EventStore.open(db_url) as store:
        (stream,) = live_streams(store, 1)
        assert [row.stream_id for row in store.due.rows()] == [stream]
        store.append(stream, 1, [NewEvent("Moved", {})], projection=Projection({}))
        assert [row.stream_id for row in store.due.rows()] == [stream]  # live=None: untouched
        with pytest.raises(ConcurrencyError):  # a refused append changes no row either
            store.append(stream, 1, [NewEvent("Ended", {})], projection=Projection({}, live=False))
        assert [row.stream_id for row in store.due.rows()] == [stream]
        store.append(stream, 2, [NewEvent("Ended", {})], projection=Projection({}, live=False))
        assert store.due.rows() == []


def test_racing_claims_hand_each_due_task_to_exactly_one_driver(db_url: str) -> None:
    with EventStore.open(db_url) as store:
        streams = live_streams(store, 120)
        won: dict[str, list[str]] = {f"driver-{n}": [] for n in range(4)}
        start = threading.Barrier(len(won))

        def claim_all(owner: str) -> None:
            start.wait()
            for _ in range(len(streams)):  # bounded: a claim that stole would never run dry
                leases = store.due.claim(owner, ttl=30, limit=7)
                if not leases:
                    return
                won[owner] += [lease.stream_id for lease in leases]

        threads = [threading.Thread(target=claim_all, args=(owner,)) for owner in won]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        claimed = [stream for mine in won.values() for stream in mine]
        assert sorted(claimed) == streams  # every task claimed, none twice
        assert {row.owner for row in store.due.rows()} == {o for o, mine in won.items() if mine}
        assert store.due.claim("late", ttl=30, limit=100) == []  # nothing left while held


def test_a_lease_that_runs_out_is_claimed_by_another_driver_with_a_higher_epoch(
    db_url: str,
) -> None:
    with EventStore.open(db_url) as store:
        (stream,) = live_streams(store, 1)
        (first,) = store.due.claim("a", ttl=0.3, limit=10)
        assert store.due.claim("b", ttl=10, limit=10) == []
        assert store.due.renew("a", ttl=0.3) == {stream}
        time.sleep(0.5)  # a crashed: no renewal
        (second,) = store.due.claim("b", ttl=10, limit=10)
        assert (second.owner, second.epoch) == ("b", first.epoch + 1)
        assert store.due.renew("a", ttl=10) == set()  # a learns it holds nothing


def test_a_driver_that_lost_its_lease_cannot_append_for_the_task(db_url: str) -> None:
    """The race forced: ``a``'s lease runs out while it is about to append, ``b`` claims the task
    and appends; ``a``'s append under its old lease is refused whole, even at the version it read
    -- and without leases, optimistic concurrency alone refuses the loser's stale version."""
    with EventStore.open(db_url) as store:
        (stream,) = live_streams(store, 1)
        (lease_a,) = store.due.claim("a", ttl=0.2, limit=1)
        version_a = store.stream(stream).version  # a reads the head, then stalls
        time.sleep(0.3)
        (lease_b,) = store.due.claim("b", ttl=10, limit=1)

        with pytest.raises(LeaseLostError, match="now held by 'b'") as lost:
            store.append(stream, version_a, [NewEvent("Polled", {"by": "a"})], lease=lease_a)
        assert "nothing was written" in str(lost.value)
        assert store.stream(stream).version == version_a

        store.append(stream, version_a, [NewEvent("Polled", {"by": "b"})], lease=lease_b)
        with pytest.raises(ConcurrencyError):  # the unleased twin of a's stale append
            store.append(stream, version_a, [NewEvent("Polled", {"by": "a"})])
        assert [e.data["by"] for e in store.read_stream(stream)[1:]] == ["b"]


def test_a_released_task_is_due_again_when_its_driver_would_have_polled_it(db_url: str) -> None:
    with EventStore.open(db_url) as store:
        soon, later = live_streams(store, 2)
        store.due.claim("a", ttl=30, limit=10)
        store.due.release("a", {soon: 0.0, later: 60.0})
        assert [lease.stream_id for lease in store.due.claim("b", ttl=30, limit=10)] == [soon]
        assert {row.stream_id: row.owner for row in store.due.rows()} == {soon: "b", later: None}


def lease_stamps(store: EventStore, key: str) -> list[tuple[str, int]]:
    return [
        (e.data[ev.LEASE]["owner"], e.data[ev.LEASE]["epoch"])
        for e in events(store, key)
        if ev.LEASE in e.data
    ]


async def test_two_drivers_share_the_tasks_and_each_is_driven_by_one_lease_at_a_time(
    peer: Peer, db_url: str
) -> None:
    async with (
        Engine.connect(db_url, config=FAST) as starter,
        driving(db_url, owner="one") as one,
        driving(db_url, owner="two") as two,
    ):
        started = [
            await starter.start_task(peer.base_url, skill="slow", text="slow 0.4")
            for _ in range(12)
        ]
        await wait_until(
            lambda: all(state_of(starter, v.task)["state"] == "completed" for v in started),
            timeout=20,
            what="the drivers to complete every task",
        )
        await wait_until(lambda: one.followed + two.followed == 0, what="ended tasks let go")

        owners = set()
        for view in started:
            assert transitions(starter.store, view.task) in (SLOW, SKIPPED)
            stamps = lease_stamps(starter.store, view.task)
            assert stamps, "every driven append records its lease"
            assert len({owner for owner, _ in stamps}) == 1  # nobody took it over meanwhile
            owners |= {owner for owner, _ in stamps}
        assert starter.store.due.rows() == []  # every row went with the append that ended it
        assert_audit_ok(starter.store)
    assert owners <= {"one", "two"}


async def test_a_stopped_driver_lets_go_and_the_other_finishes_its_tasks(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter:
        async with driving(db_url, owner="leaving") as leaving:
            view = await starter.start_task(peer.base_url, skill="slow", text="slow 1.5")
            await wait_until(lambda: leaving.followed == 1, what="the first driver to claim it")
        assert state_of(starter, view.task)["state"] != "completed"
        (row,) = starter.store.due.rows()
        assert row.owner is None  # let go on a clean stop, not left to run out
        async with driving(db_url, owner="staying") as staying:
            await wait_until(
                lambda: state_of(starter, view.task)["state"] == "completed",
                timeout=10,
                what="the second driver to finish it",
            )
            await wait_until(lambda: staying.followed == 0, what="the ended task let go")
        stamps = lease_stamps(starter.store, view.task)
        owners = [owner for owner, _ in stamps]
        assert owners == sorted(owners, key=["leaving", "staying"].index)  # handed over once
        assert [epoch for _, epoch in stamps] == sorted(epoch for _, epoch in stamps)
        assert_audit_ok(starter.store)


async def test_a_driver_whose_lease_is_taken_lets_the_task_go_without_appending(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter:
        async with driving(db_url, owner="slow-renewer", lease_ttl=30.0) as driver:
            view = await starter.start_task(peer.base_url, skill="slow", text="slow 30")
            await wait_until(lambda: driver.followed == 1, what="the driver to claim it")
            stream = task_stream_id(view.task)
            # Another process takes the task over (as if the lease had run out).
            store = starter.store
            (row,) = store.due.rows()
            store.due.release(row.owner or "", {stream: 0.0})
            (taken,) = store.due.claim("usurper", ttl=60, limit=1)
            before = len(events(store, view.task))
            driver._renewed_at = -float("inf")  # renew on the next claim round
            await wait_until(lambda: driver.followed == 0, what="the driver to let it go")
            assert [e for e in events(store, view.task)[before:] if ev.LEASE in e.data] == []
            assert store.due.rows()[0].owner == taken.owner == "usurper"
        await starter.cancel(view.task)  # the agent's task would work on for 30 s


def test_take_over_moves_leases_from_one_holder_with_new_epochs_and_fences_the_old_holder(
    db_url: str,
) -> None:
    with EventStore.open(db_url) as store:
        streams = live_streams(store, 6)
        held = {lease.stream_id: lease for lease in store.due.claim("a", ttl=30, limit=10)}
        assert store.due.holdings() == {"a": 6}

        taken = store.due.take_over("b", "a", ttl=30, limit=2)

        assert len(taken) == 2
        assert {lease.epoch for lease in taken} == {held[streams[0]].epoch + 1}
        assert store.due.holdings() == {"a": 4, "b": 2}
        assert store.due.renew("a", ttl=30) == set(streams) - {t.stream_id for t in taken}
        stolen = taken[0].stream_id
        with pytest.raises(LeaseLostError, match="now held by 'b'"):
            store.append(stolen, 1, [NewEvent("Polled", {"by": "a"})], lease=held[stolen])
        assert store.due.take_over("b", "b", ttl=30, limit=5) == []  # never from itself


async def test_a_driver_started_beside_a_busy_one_takes_over_its_fair_share(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter:
        async with driving(db_url, owner="busy", lease_ttl=1.5) as busy:
            views = [
                await starter.start_task(peer.base_url, skill="slow", text="slow 30")
                for _ in range(10)
            ]
            await wait_until(lambda: busy.followed == 10, what="the first driver to claim all")
            async with driving(db_url, owner="newcomer", lease_ttl=1.5) as newcomer:
                await wait_until(
                    lambda: (busy.followed, newcomer.followed) == (5, 5),
                    timeout=10,
                    what="the two drivers to hold half each",
                )
                owners = [row.owner for row in starter.store.due.rows()]
                assert sorted(owners) == ["busy"] * 5 + ["newcomer"] * 5
                # Each task is driven on by exactly the driver holding it: the taken ones' next
                # leased appends (if any) name the newcomer with a higher epoch.
                for view in views:
                    stamps = lease_stamps(starter.store, view.task)
                    assert [e for _, e in stamps] == sorted(e for _, e in stamps)
        for view in views:
            await starter.cancel(view.task)  # the agent's tasks would work on for 30 s


async def test_a_background_decision_under_a_lease_since_lost_writes_nothing_and_is_no_error(
    peer: Peer, db_url: str
) -> None:
    """A re-check or re-validation a driver started under its lease may end after the lease was
    lost (the task ended, or another process took it over): its append is refused, and that is
    the end of it -- not an error that :meth:`Engine.settle` reports."""
    async with Engine.connect(db_url, config=FAST) as starter:
        async with driving(db_url, owner="first", lease_ttl=30.0) as driver:
            view = await starter.start_task(peer.base_url, skill="slow", text="slow 30")
            await wait_until(lambda: driver.followed == 1, what="the driver to claim it")
            lease = driver._leases[view.task]
            store = starter.store
            store.due.release("first", {task_stream_id(view.task): 0.0})
            store.due.claim("usurper", ttl=60, limit=1)
            before = len(events(store, view.task))

            with tasklog.driving(lease):  # as a step of the driver spawns its checks
                flag = ev.FlaggedForReview(reason="skill_withdrawn", detail="late")
                driver.engine.background.spawn(driver.engine.records.record(view.task, [flag]))
            await driver.engine.settle()  # nothing to report

            assert len(events(store, view.task)) == before
        await starter.cancel(view.task)  # the agent's task would work on for 30 s


async def test_an_append_refused_under_an_older_lease_leaves_the_newer_one_driven(
    peer: Peer, db_url: str
) -> None:
    """A step still in flight under a lease the driver has since lost and claimed again (a slow
    poll across a take-over and back) has its append refused: the driver lets go of nothing,
    and drives the task on under the newer lease. Before, it dropped the newer lease while the
    store went on renewing it, so nobody ever polled the task again."""
    async with (
        Engine.connect(db_url, config=FAST) as starter,
        driving(db_url, owner="racer", lease_ttl=30.0) as driver,
    ):
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 1.5")
        await wait_until(lambda: driver.followed == 1, what="the driver to claim it")
        store, stream = starter.store, task_stream_id(view.task)
        stepping = driver._step_leased
        raced: list[LeaseLostError] = []

        async def step_across_a_new_claim(key: str) -> float | None:
            if raced:
                return await stepping(key)
            store.due.release("racer", {stream: 0.0})  # lost and claimed again meanwhile
            (again,) = store.due.claim("racer", ttl=30, limit=1)
            driver._take([again])
            flag = ev.FlaggedForReview(reason="skill_withdrawn", detail="late")
            try:  # this step's append, under the lease it started with
                await driver.engine.records.record(key, [flag])
            except LeaseLostError as refused:
                raced.append(refused)
                raise
            raise AssertionError("the append under the older lease was not refused")

        driver._step_leased = step_across_a_new_claim  # type: ignore[method-assign]
        await wait_until(lambda: bool(raced), what="the raced step")
        await wait_until(
            lambda: state_of(starter, view.task)["state"] == "completed",
            timeout=15,
            what="the task driven on under its newer lease",
        )
        stamps = lease_stamps(store, view.task)
        assert stamps[-1] == ("racer", raced[0].epoch + 1)  # the newer lease drove it on
        assert driver.lost == 0
        await wait_until(lambda: driver.followed == 0, what="the ended task let go")
        assert store.due.rows() == []


async def test_a_lease_held_in_the_store_but_not_driven_is_released_and_claimed_again(
    peer: Peer, db_url: str
) -> None:
    """Should the store say a driver holds a lease it is not driving (a claim whose answer was
    lost), its next renewal lets the lease go rather than renew it forever: the task is due at
    once and claimed again, and driven to its end."""
    async with (
        Engine.connect(db_url, config=FAST) as starter,
        driving(db_url, owner="forgetful", lease_ttl=30.0) as driver,
    ):
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 1.5")
        await wait_until(lambda: driver.followed == 1, what="the driver to claim it")
        forgotten = driver._leases.pop(view.task)  # held in the store, not in the driver
        driver._drop(view.task)
        (row,) = starter.store.due.rows()
        assert (row.owner, row.epoch) == ("forgetful", forgotten.epoch)
        driver._renewed_at = -float("inf")  # renew on the next claim round
        await wait_until(
            lambda: state_of(starter, view.task)["state"] == "completed",
            timeout=15,
            what="the task claimed again and driven to its end",
        )
        assert lease_stamps(starter.store, view.task)[-1][1] > forgotten.epoch
        await wait_until(lambda: driver.followed == 0, what="the ended task let go")
        assert starter.store.due.rows() == []


async def test_a_task_lost_while_its_state_is_read_is_followed_no_more(
    peer: Peer, db_url: str
) -> None:
    """A renewal may find a lease lost while a step of the task is reading its state: the step
    ends there, and the driver follows the task no more (before, the step put the task back
    among those it follows, where it stayed: counted, never polled)."""
    async with Engine.connect(db_url, config=FAST) as starter:
        async with driving(db_url, owner="loser", lease_ttl=30.0) as driver:
            view = await starter.start_task(peer.base_url, skill="slow", text="slow 30")
            await wait_until(lambda: driver.followed == 1, what="the driver to claim it")
            store, stream = starter.store, task_stream_id(view.task)
            reading = driver.engine.records.state
            lost: list[str] = []

            async def read_while_the_lease_is_lost(key: str) -> State:
                state = await reading(key)
                if key == view.task and not lost:
                    store.due.release("loser", {stream: 0.0})
                    store.due.claim("usurper", ttl=60, limit=1)
                    driver._lose(key, "lease not renewed: another process claimed the task")
                    lost.append(key)
                return state

            driver.engine.records.state = read_while_the_lease_is_lost  # type: ignore[method-assign]
            driver._follow(view.task, driver._clock(), prompt=True)  # a step now
            await wait_until(lambda: bool(lost), what="the lease lost during a step")
            await asyncio.sleep(0.3)  # the step ends
            assert (driver.followed, driver.lost) == (0, 1)
            assert view.task not in driver._streams
            assert store.due.rows()[0].owner == "usurper"
        await starter.cancel(view.task)  # the agent's task would work on for 30 s
