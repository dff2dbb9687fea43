"""The event store suite, written once, run on SQLite and PostgreSQL (fixture ``db_url``)."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from cardfence.store import (
    CardSnapshot,
    ConcurrencyError,
    EventStore,
    NewEvent,
    PayloadError,
    Projection,
    SnapshotMismatchError,
)
from cardfence.store.chain import content_hash
from cardfence.store.schema import events as events_table
from cardfence.store.schema import streams as streams_table


@pytest.fixture
def store(db_url: str) -> Iterator[EventStore]:
    with EventStore.open(db_url) as opened:
        yield opened


def _count(store: EventStore, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _snapshot(body: str) -> CardSnapshot:
    return CardSnapshot(
        revision=content_hash(body),
        body=body,
        source_url="http://agent.test/.well-known/agent-card.json",
        etag='W/"1"',
        http_status=200,
        fetched_at=datetime.now(UTC),
    )


# -- append and read ---------------------------------------------------------------------------


def test_appended_events_read_back_in_order_with_versions_and_positions(store: EventStore) -> None:
    first = store.append("s", 0, [NewEvent("A", {"n": 1}), NewEvent("B", {"n": 2})])
    second = store.append("s", 2, [NewEvent("C", {"nested": {"list": [1, "x", None]}})])

    read = store.read_stream("s")
    assert [e.type for e in read] == ["A", "B", "C"]
    assert [e.version for e in read] == [1, 2, 3]
    assert [e.position for e in read] == first + second
    assert first[0] < first[1] < second[0]
    assert read[2].data == {"nested": {"list": [1, "x", None]}}
    assert read[0].recorded_at.tzinfo is not None
    assert [e.type for e in store.read_stream("s", from_version=2)] == ["B", "C"]


def test_projection_is_written_in_the_same_append(store: EventStore) -> None:
    store.append(
        "task-1",
        0,
        [NewEvent("TaskSubmitted", {"skill": "echo"})],
        projection=Projection(
            {"state": "submitted"}, category="task", alias="r-1", status="submitted"
        ),
    )
    store.append(
        "task-1",
        1,
        [NewEvent("StateChanged", {"to": "working"})],
        projection=Projection({"state": "working"}, category="task", alias="r-1", status="working"),
    )
    head = store.stream("task-1")
    assert head is not None
    assert (head.version, head.state, head.alias, head.status) == (
        2,
        {"state": "working"},
        "r-1",
        "working",
    )
    assert [s.stream_id for s in store.streams(category="task", status="working")] == ["task-1"]
    assert store.streams(alias="r-1")[0].stream_id == "task-1"
    assert store.streams(status="submitted") == []


def test_read_all_pages_through_every_stream_in_position_order(store: EventStore) -> None:
    for i in range(5):
        store.append(f"s{i}", 0, [NewEvent("A", {"i": i}), NewEvent("B", {"i": i})])
    everything = store.read_all(after=0, limit=100)
    assert len(everything) == 10
    positions = [e.position for e in everything]
    assert positions == sorted(positions)
    page = store.read_all(after=positions[3], limit=4)
    assert [e.position for e in page] == positions[4:8]
    assert store.last_position() == positions[-1]


def test_append_at_a_stale_version_raises_and_writes_nothing(store: EventStore) -> None:
    store.append("s", 0, [NewEvent("A")], projection=Projection({"v": 1}))
    with pytest.raises(ConcurrencyError) as caught:
        store.append("s", 0, [NewEvent("B")], projection=Projection({"v": "stale"}))
    assert caught.value.actual_version == 1
    with pytest.raises(ConcurrencyError):
        store.append("s", 5, [NewEvent("B")])
    assert [e.type for e in store.read_stream("s")] == ["A"]
    head = store.stream("s")
    assert head is not None
    assert head.state == {"v": 1}
    assert "nothing was written" in str(caught.value)


def test_a_second_store_on_the_same_database_continues_the_chain(db_url: str) -> None:
    with EventStore.open(db_url) as one, EventStore.open(db_url) as two:
        one.append("s", 0, [NewEvent("A")])
        two.append("s", 1, [NewEvent("B")])
        one.append("s", 2, [NewEvent("C")])
        assert one.verify_stream("s") is None
        assert [e.type for e in two.read_stream("s")] == ["A", "B", "C"]


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [{"when": datetime.now(UTC)}, {"x": float("nan")}, {"x": {1, 2}}, {"x": b"bytes"}],
    ids=["datetime", "nan", "set", "bytes"],
)
def test_non_serialisable_payload_raises_payload_error_and_writes_nothing(
    store: EventStore, data: dict[str, object]
) -> None:
    with pytest.raises(PayloadError) as caught:
        store.append("s", 0, [NewEvent("A", {"ok": 1}), NewEvent("B", data)])
    assert "not JSON-serialisable" in str(caught.value)
    assert _count(store, events_table) == 0
    assert _count(store, streams_table) == 0


def test_oversized_payload_raises_payload_error_and_writes_nothing(db_url: str) -> None:
    with EventStore.open(db_url, max_payload_bytes=1024, max_projection_bytes=4096) as store:
        store.append("s", 0, [NewEvent("A", {"small": "x" * 10})])
        with pytest.raises(PayloadError, match="over the 1024-byte limit"):
            store.append("s", 1, [NewEvent("B", {"big": "x" * 2000})])
        with pytest.raises(PayloadError, match="projection"):
            store.append("s", 1, [NewEvent("B")], projection=Projection({"big": "y" * 5000}))
        assert [e.type for e in store.read_stream("s")] == ["A"]


def test_text_with_nul_and_non_ascii_round_trips(store: EventStore) -> None:
    data = {"text": "nul\x00 tab\t émoji 🎉 \ud800lone", "big": 2**70}
    store.append("s", 0, [NewEvent("A", data)])
    assert store.read_stream("s")[0].data == data
    assert store.verify_stream("s") is None


# -- card snapshots ------------------------------------------------------------------------------


def test_card_snapshot_is_stored_once_under_its_content_hash(store: EventStore) -> None:
    snap = _snapshot('{"name":"agent"}')
    assert store.put_snapshot(snap) is True
    assert store.put_snapshot(snap) is False
    store.append(
        "agent", 0, [NewEvent("CardFetched", {"revision": snap.revision})], snapshots=[snap]
    )
    assert store.snapshot_revisions() == [snap.revision]
    got = store.get_snapshot(snap.revision)
    assert got is not None
    assert got.body == snap.body
    assert got.etag == 'W/"1"'


def test_snapshot_whose_body_does_not_hash_to_its_key_is_refused(store: EventStore) -> None:
    forged = CardSnapshot(
        revision=content_hash("{}"),
        body='{"name":"other"}',
        source_url="http://x",
        etag=None,
        http_status=200,
        fetched_at=datetime.now(UTC),
    )
    with pytest.raises(SnapshotMismatchError):
        store.append("agent", 0, [NewEvent("CardFetched")], snapshots=[forged])
    assert _count(store, events_table) == 0
    assert store.get_snapshot(forged.revision) is None


def test_snapshot_and_events_roll_back_together_on_conflict(store: EventStore) -> None:
    store.append("agent", 0, [NewEvent("A")])
    snap = _snapshot('{"name":"v2"}')
    with pytest.raises(ConcurrencyError):
        store.append("agent", 0, [NewEvent("CardFetched")], snapshots=[snap])
    assert store.get_snapshot(snap.revision) is None


# -- the hash chain ------------------------------------------------------------------------------


def _chain_of_four(store: EventStore) -> list[int]:
    positions = store.append("s", 0, [NewEvent("A", {"i": 1}), NewEvent("B", {"i": 2})])
    positions += store.append("s", 2, [NewEvent("C", {"i": 3}), NewEvent("D", {"i": 4})])
    assert store.verify_stream("s") is None
    return positions


def test_chain_detects_an_edited_payload(store: EventStore) -> None:
    positions = _chain_of_four(store)
    with store.engine.begin() as conn:
        conn.execute(
            events_table.update()
            .where(events_table.c.position == positions[1])
            .values(payload='{"i":20}')
        )
    broken = store.verify_stream("s")
    assert broken is not None
    assert (broken.kind, broken.version) == ("hash_mismatch", 2)


def test_chain_detects_a_deleted_event(store: EventStore) -> None:
    positions = _chain_of_four(store)
    with store.engine.begin() as conn:
        conn.execute(events_table.delete().where(events_table.c.position == positions[2]))
    broken = store.verify_stream("s")
    assert broken is not None
    assert (broken.kind, broken.version) == ("gap", 4)


def test_chain_detects_a_deleted_last_event(store: EventStore) -> None:
    positions = _chain_of_four(store)
    with store.engine.begin() as conn:
        conn.execute(events_table.delete().where(events_table.c.position == positions[3]))
    broken = store.verify_stream("s")
    assert broken is not None
    assert broken.kind == "head_mismatch"


def test_chain_detects_two_events_swapped(store: EventStore) -> None:
    positions = _chain_of_four(store)
    # Swap the contents of events 2 and 3 (everything but their position and version).
    columns = ("type", "payload", "recorded_at", "prev_hash", "hash")
    with store.engine.begin() as conn:
        rows = {
            p: conn.execute(
                sa.select(*(events_table.c[c] for c in columns)).where(events_table.c.position == p)
            ).one()
            for p in positions[1:3]
        }
        for target, source in ((positions[1], positions[2]), (positions[2], positions[1])):
            conn.execute(
                events_table.update()
                .where(events_table.c.position == target)
                .values(dict(zip(columns, rows[source], strict=True)))
            )
    broken = store.verify_stream("s")
    assert broken is not None
    assert broken.version == 2
    assert broken.kind in {"broken_link", "hash_mismatch"}


# -- concurrency ---------------------------------------------------------------------------------


def _race(
    store: EventStore,
    stream: str,
    expected: int,
    writer: int,
    barrier: threading.Barrier,
    outcomes: list[tuple[int, str]],
) -> None:
    barrier.wait()
    try:
        store.append(stream, expected, [NewEvent("Won", {"writer": writer})])
        outcomes.append((writer, "won"))
    except ConcurrencyError:
        outcomes.append((writer, "conflict"))


@pytest.mark.parametrize("shared_store", [True, False], ids=["one-store", "store-per-thread"])
def test_conflicting_appends_from_threads_exactly_one_wins(db_url: str, shared_store: bool) -> None:
    writers, rounds = 4, 8
    stores = [EventStore.open(db_url)]
    stores += [EventStore.open(db_url, migrate=False) for _ in range(writers - 1)]
    try:
        for round_ in range(rounds):
            barrier = threading.Barrier(writers)
            outcomes: list[tuple[int, str]] = []
            threads = [
                threading.Thread(
                    target=_race,
                    args=(stores[0 if shared_store else w], "s", round_, w, barrier, outcomes),
                )
                for w in range(writers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(o for _, o in outcomes) == ["conflict"] * (writers - 1) + ["won"]
        logged = stores[0].read_stream("s")
        assert [e.version for e in logged] == list(range(1, rounds + 1))
        assert stores[0].verify_stream("s") is None
    finally:
        for s in stores:
            s.close()


def _process_writer(url: str, writer: int, rounds: int, barrier: object, results: object) -> None:
    store = EventStore.open(url, migrate=False)
    try:
        for round_ in range(rounds):
            barrier.wait()  # type: ignore[attr-defined]
            try:
                store.append("s", round_, [NewEvent("Won", {"writer": writer, "round": round_})])
                results.put((round_, writer, "won"))  # type: ignore[attr-defined]
            except ConcurrencyError:
                results.put((round_, writer, "conflict"))  # type: ignore[attr-defined]
    finally:
        store.close()


def test_conflicting_appends_from_processes_exactly_one_wins(db_url: str) -> None:
    EventStore.open(db_url).close()
    writers, rounds = 3, 6
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_process_writer, args=(db_url, w, rounds, barrier, results))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in range(writers * rounds)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for round_ in range(rounds):
        this_round = sorted(o for r, _, o in outcomes if r == round_)
        assert this_round == ["conflict"] * (writers - 1) + ["won"]
    with EventStore.open(db_url) as store:
        logged = store.read_stream("s")
        winners = {(r, w) for r, w, o in outcomes if o == "won"}
        assert {(e.data["round"], e.data["writer"]) for e in logged} == winners
        assert [e.version for e in logged] == list(range(1, rounds + 1))
        assert store.verify_stream("s") is None


def _tail_while_writing(
    db_url: str, writers: int = 4, per_writer: int = 40
) -> tuple[list[int], list[int]]:
    """Tail ``read_all`` while several stores append; return (positions seen, positions stored)."""
    with EventStore.open(db_url) as store:
        done = threading.Event()
        seen: list[int] = []

        def tail() -> None:
            after = 0
            while True:
                finished = done.is_set()
                page = store.read_all(after=after, limit=50)
                seen.extend(e.position for e in page)
                if page:
                    after = page[-1].position
                elif finished:
                    return

        def write(w: int) -> None:
            with EventStore.open(db_url, migrate=False) as own:
                for i in range(per_writer):
                    own.append(f"w{w}", i, [NewEvent("E", {"i": i, "pad": "x" * (i * 7)})])

        reader = threading.Thread(target=tail)
        reader.start()
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        done.set()
        reader.join(60)
        everything = [e.position for e in store.read_all(after=0, limit=10_000)]
        assert len(everything) == writers * per_writer
        return seen, everything


@pytest.fixture
def slow_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen the window between drawing a position and committing it, as a loaded server does."""
    insert = EventStore._insert_events

    def insert_then_dawdle(
        self: EventStore, cursor: object, rows: list[dict[str, object]]
    ) -> list[int]:
        positions = insert(self, cursor, rows)
        time.sleep(random.uniform(0, 0.004))
        return positions

    monkeypatch.setattr(EventStore, "_insert_events", insert_then_dawdle)


@pytest.mark.usefixtures("slow_commits")
def test_tailing_read_all_never_skips_an_event_that_commits_late(db_url: str) -> None:
    seen, everything = _tail_while_writing(db_url)
    assert seen == everything


@pytest.mark.postgres
@pytest.mark.usefixtures("slow_commits")
def test_tailing_would_skip_late_commits_without_the_append_lock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teeth for the test above: with positions no longer serialised, a tail skips events.

    Only PostgreSQL: SQLite serialises writers by itself.
    """
    monkeypatch.setattr(EventStore, "_SERIALISE_POSITIONS", False)
    for _ in range(10):
        seen, everything = _tail_while_writing(pg_url)
        if seen != everything:
            return
    pytest.fail("ten tails without the lock never skipped an event: the tail test has no teeth")


def test_store_is_usable_from_many_threads_without_losing_events(store: EventStore) -> None:
    def write(w: int) -> None:
        for i in range(25):
            store.append(f"w{w}", i, [NewEvent("E", {"i": i})])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert time.monotonic() - started < 120
    assert _count(store, events_table) == 100
    assert all(store.verify_stream(f"w{w}") is None for w in range(4))
