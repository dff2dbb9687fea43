"""The event store suite, written once, run on SQLite and PostgreSQL (fixture ``db_url``)."""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from support.engine_fixtures import events_refused

from cardfence.store.chain import content_hash, salted_hash
from cardfence.store.errors import (
    ConcurrencyError,
    ContentMismatchError,
    CorruptRecordError,
    LeaseLostError,
    PayloadError,
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
)
from cardfence.store.event_store import EventStore
from cardfence.store.groupcommit import CommitStats
from cardfence.store.records import (
    CardSnapshot,
    ContentRecord,
    NewEvent,
    Projection,
    RecordedEvent,
)
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


def test_streams_by_alias_are_every_head_with_it_in_stream_order(store: EventStore) -> None:
    # A remote task id is unique per agent only (R16): several heads may share one alias.
    for stream_id, category in [("task-b", "task"), ("task-a", "task"), ("agent-a", "agent")]:
        state = {"state": "working", "stream": stream_id}
        projection = Projection(state, category=category, alias="r-1", status="working")
        store.append(stream_id, 0, [NewEvent("E", {})], projection=projection)
    store.append("task-c", 0, [NewEvent("E", {})], projection=Projection({}, alias="r-2"))

    found = store.streams(alias="r-1")

    assert [r.stream_id for r in found] == ["agent-a", "task-a", "task-b"]
    assert found == [store.stream(r.stream_id) for r in found]  # the whole head, as by id
    assert all(r.updated_at.tzinfo is not None for r in found)
    tasks = store.streams(category="task", alias="r-1")
    assert [(r.stream_id, r.state["stream"]) for r in tasks] == [
        ("task-a", "task-a"),
        ("task-b", "task-b"),
    ]
    assert store.streams(category="task", alias="r-1", status="completed") == []
    assert store.streams(alias="no-such-alias") == []


def test_streams_starting_a_prefix_match_it_as_text_in_id_or_alias_case_sensitively(
    store: EventStore,
) -> None:
    heads = [
        ("task-ab1", "task", "r-%x"),
        ("task-ab2", "task", "R-Q"),
        ("task-AB3", "task", "zz"),
        ("task-a_4", "task", None),
        ("agent-ab", "agent", "r-agent"),
    ]
    for stream_id, category, alias in heads:
        state = {"stream": stream_id}
        projection = Projection(state, category=category, alias=alias)
        store.append(stream_id, 0, [NewEvent("E", {})], projection=projection)

    def ids(id_prefix: str, alias_prefix: str, category: str | None = "task") -> list[str]:
        found = store.streams_starting(
            id_prefix=id_prefix, alias_prefix=alias_prefix, category=category
        )
        assert found == [store.stream(r.stream_id) for r in found]  # whole heads, as by id
        return [r.stream_id for r in found]

    assert ids("task-ab", "") == ["task-ab1", "task-ab2"]  # not task-AB3: case counts
    assert ids("task-AB", "") == ["task-AB3"]
    assert ids("task-a_", "") == ["task-a_4"]  # `_` is itself, not any one character
    assert ids("", "r-%") == ["task-ab1"]  # `%` is itself; not R-Q
    assert ids("", "r-") == ["task-ab1"]  # agent-ab: another category
    assert ids("", "r-", category=None) == ["agent-ab", "task-ab1"]
    assert sorted(ids("task-ab2", "zz")) == ["task-AB3", "task-ab2"]  # either one
    assert ids("task-x", "x") == []
    assert ids("", "") == []  # an empty prefix matches nothing


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


def test_an_append_a_trigger_refuses_is_the_refusal_not_a_concurrency_loss(
    db_url: str, store: EventStore
) -> None:
    store.append("s", 0, [NewEvent("A")], projection=Projection({"v": 1}))
    marks = (store.last_position(), store.stream("s"))

    # On SQLite the trigger's RAISE(ABORT) reaches the driver as an integrity error.
    with events_refused(db_url), pytest.raises(StoreUnavailableError) as caught:
        store.append("s", 1, [NewEvent("B")], projection=Projection({"v": 2}))

    assert "the disk is on fire" in str(caught.value)
    assert "nothing was written" in str(caught.value)
    assert (store.last_position(), store.stream("s")) == marks


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


# -- content out of line (R17) ------------------------------------------------------------------


def _content(stream_id: str, body: str, salt: str = "00" * 16) -> ContentRecord:
    return ContentRecord(stream_id, salted_hash(salt, body), salt, body)


def test_content_records_are_kept_with_their_append_once_each_and_read_by_digest(
    store: EventStore,
) -> None:
    text, data = _content("t", '{"text":"hello"}'), _content("t", '{"data":{"a":1}}')
    store.append("t", 0, [NewEvent("A", {"sha256": text.digest})], contents=[text, data])
    store.append("t", 1, [NewEvent("B", {"sha256": text.digest})], contents=[text])
    assert store.contents("t") == {text.digest: text, data.digest: data}
    assert store.contents("t", [data.digest, "f" * 64]) == {data.digest: data}
    assert store.contents("other") == {}
    assert store.content_salt("t") == "00" * 16
    assert store.content_salt("other") is None


def test_content_whose_body_and_salt_do_not_hash_to_its_digest_is_refused_with_its_events(
    store: EventStore,
) -> None:
    honest = _content("t", '{"text":"hello"}')
    forged = ContentRecord("t", honest.digest, honest.salt, '{"text":"HELLO"}')
    with pytest.raises(ContentMismatchError, match="nothing was written"):
        store.append("t", 0, [NewEvent("A")], contents=[forged])
    with pytest.raises(PayloadError, match="another stream"):
        store.append("t", 0, [NewEvent("A")], contents=[_content("u", "{}")])
    assert _count(store, events_table) == 0
    assert store.contents("t") == {}


def test_content_and_events_roll_back_together_on_conflict(store: EventStore) -> None:
    store.append("t", 0, [NewEvent("A")])
    with pytest.raises(ConcurrencyError):
        store.append("t", 0, [NewEvent("B")], contents=[_content("t", '{"text":"x"}')])
    assert store.contents("t") == {}


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


@pytest.mark.parametrize(
    ("payload", "why"),
    [("[1]", "is an array, not a JSON object"), ('{"i": 2', "is not JSON (Expecting ")],
)
def test_a_payload_altered_in_the_store_is_a_typed_error_naming_its_event(
    store: EventStore, payload: str, why: str
) -> None:
    positions = _chain_of_four(store)
    with store.engine.begin() as conn:
        conn.execute(
            events_table.update()
            .where(events_table.c.position == positions[1])
            .values(payload=payload)
        )
    logged = store.read_stream("s")
    assert [logged[0].data, logged[2].data] == [{"i": 1}, {"i": 3}]  # the others still read
    with pytest.raises(CorruptRecordError) as caught:
        _ = logged[1].data
    assert isinstance(caught.value, StoreError)
    assert (caught.value.stream_id, caught.value.record) == (
        "s",
        f"event 2 (position {positions[1]}, B)",
    )
    message = str(caught.value)
    assert message.startswith(
        f"stream 's', event 2 (position {positions[1]}, B): its payload {why}"
    )
    assert message.endswith("(nothing was changed; 'cardfence audit' lists every such record)")
    assert "\n" not in message


def test_a_projection_altered_in_the_store_is_a_typed_error_unless_read_leniently(
    store: EventStore,
) -> None:
    for stream_id, k in (("s", 1), ("t", 2)):
        store.append(stream_id, 0, [NewEvent("A", {})], projection=Projection({"k": k}, "c", "x"))
    with store.engine.begin() as conn:
        conn.execute(
            streams_table.update().where(streams_table.c.stream_id == "s").values(state="[1]")
        )
    why = "is an array, not a JSON object"
    for read in (
        lambda: store.stream("s"),
        lambda: store.streams(category="c"),
        lambda: store.streams(alias="x"),  # the push path's lookup
    ):
        with pytest.raises(
            CorruptRecordError, match=rf"^stream 's', its projection: the stored text {why}: "
        ):
            read()
    for lenient in (
        store.streams(category="c", lenient=True),
        store.streams(alias="x", lenient=True),
    ):
        assert [(r.stream_id, r.state, r.unreadable) for r in lenient] == [
            ("s", {}, why), ("t", {"k": 2}, None),
        ]  # fmt: skip
    head, logged = store.read_as_of_head("s")  # the audit's read
    assert head is not None
    assert (head.version, head.unreadable, len(logged)) == (1, why, 1)
    assert store.verify_stream("s") is None  # only the projection was altered: the chain holds


def test_a_projection_is_rewritten_at_its_head_with_its_keys_and_due_row_and_nothing_appended(
    store: EventStore,
) -> None:
    store.append("s", 0, [NewEvent("A", {})], projection=Projection({"k": 1}, "c", "x", "a", True))
    store.append("s", 1, [NewEvent("B", {})], projection=Projection({"k": 2}, "c", "x", "a"))
    before = store.stream("s")
    assert before is not None
    last = store.last_position()

    ended = store.rewrite_projection("s", 2, Projection({"k": 3}, "d", "y", "done", False))

    after = store.stream("s")
    assert ended is True
    assert after is not None
    assert (after.state, after.category, after.alias, after.status) == ({"k": 3}, "d", "y", "done")
    assert (after.version, after.updated_at, store.last_position()) == (2, before.updated_at, last)
    assert store.due.rows() == []  # no longer live: its due-work row went with it
    assert store.rewrite_projection("s", 2, Projection({"k": 4}, "d", "y", "live", True))
    assert [row.stream_id for row in store.due.rows()] == ["s"]
    assert store.verify_stream("s") is None
    # An append after it starts from the head as it stands, its keys the ones rewritten.
    store.append("s", 2, [NewEvent("C", {})], projection=Projection({"k": 5}, "d", "y", "live"))
    assert [r.stream_id for r in store.streams(alias="y", status="live")] == ["s"]


def test_a_projection_rewrite_at_a_head_that_moved_on_writes_nothing(store: EventStore) -> None:
    store.append("s", 0, [NewEvent("A", {})], projection=Projection({"k": 1}, live=True))
    store.append("s", 1, [NewEvent("B", {})], projection=Projection({"k": 2}))

    assert store.rewrite_projection("s", 1, Projection({"k": 9}, live=False)) is False
    assert store.rewrite_projection("none", 0, Projection({"k": 9})) is False

    head = store.stream("s")
    assert head is not None
    assert (head.version, head.state) == (2, {"k": 2})
    assert [row.stream_id for row in store.due.rows()] == ["s"]
    assert store.stream("none") is None
    with pytest.raises(PayloadError, match=r"^stream 's': projection is not JSON-serialisable"):
        store.rewrite_projection("s", 2, Projection({"k": object()}))


def test_a_deleted_head_row_is_put_back_once_and_never_over_a_head(store: EventStore) -> None:
    store.append("s", 0, [NewEvent("A", {})], projection=Projection({"k": 1}, "c", "x", live=True))
    store.append("s", 1, [NewEvent("B", {})], projection=Projection({"k": 2}, "c", "x"))
    last = store.read_stream("s")[-1]
    with store.engine.begin() as conn:
        conn.execute(streams_table.delete())
        conn.execute(sa.text("DELETE FROM due_work"))

    put_back = store.restore_head(
        "s", 2, Projection({"k": 2}, "c", "x", "st", True), last.recorded_at
    )
    again = store.restore_head("s", 2, Projection({"k": 9}, live=False), last.recorded_at)

    head = store.stream("s")
    assert (put_back, again) == (True, False)
    assert head is not None
    assert (head.version, head.state, head.category, head.alias, head.status) == (
        2, {"k": 2}, "c", "x", "st",
    )  # fmt: skip
    assert head.updated_at == last.recorded_at
    assert [row.stream_id for row in store.due.rows()] == ["s"]
    assert store.verify_stream("s") is None
    store.append("s", 2, [NewEvent("C", {})], projection=Projection({"k": 3}, "c", "x"))


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


def test_a_stream_read_as_of_its_head_leaves_out_what_a_writer_appends_meanwhile(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_of_four(store)
    store.append("t", 0, [NewEvent("E", {"i": 1})])
    events_of = store._events_of
    appended = []

    def after_a_writer(stream_ids: Sequence[str]) -> dict[str, list[RecordedEvent]]:
        if not appended:  # between the heads and the events
            version = store.stream("s").version  # type: ignore[union-attr]
            appended.append(store.append("s", version, [NewEvent("E", {"i": version + 1})]))
        return events_of(stream_ids)

    monkeypatch.setattr(store, "_events_of", after_a_writer)
    head, logged = store.read_as_of_head("s")
    assert appended
    assert head is not None
    assert (head.version, [event.version for event in logged]) == (4, [1, 2, 3, 4])
    appended.clear()
    both = store.read_as_of_heads(["s", "t", "none"])
    assert [(h and h.version, [e.version for e in ev]) for h, ev in both.values()] == [
        (5, [1, 2, 3, 4, 5]), (1, [1]), (None, []),
    ]  # fmt: skip  # "s" as of its head when read: the sixth, appended meanwhile, left out
    monkeypatch.undo()
    assert store.verify_stream("s") is None  # the sixth, as of the head now
    assert list(both) == ["s", "t", "none"]


def test_chain_detects_an_event_written_without_moving_its_head(store: EventStore) -> None:
    _chain_of_four(store)
    with store.engine.begin() as conn:
        conn.execute(streams_table.update().values(version=3))
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
    db_url: str, stores: int = 4, threads_per_store: int = 1, per_writer: int = 40
) -> tuple[list[int], list[int]]:
    """Tail ``read_all`` while several stores append, each from ``threads_per_store`` threads
    (which then share transactions: group commit); return (positions seen, positions stored)."""
    writers = stores * threads_per_store
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

        def write(own: EventStore, w: int) -> None:
            for i in range(per_writer):
                own.append(f"w{w}", i, [NewEvent("E", {"i": i, "pad": "x" * (i * 7)})])

        writing = [EventStore.open(db_url, migrate=False) for _ in range(stores)]
        try:
            reader = threading.Thread(target=tail)
            reader.start()
            threads = [
                threading.Thread(target=write, args=(writing[w % stores], w))
                for w in range(writers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            done.set()
            reader.join(60)
            if threads_per_store > 1:  # the threads of a store did share transactions
                assert all(own.stats.commits < own.stats.appends for own in writing)
        finally:
            for own in writing:
                own.close()
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


_WRITERS = pytest.mark.parametrize(
    ("stores", "threads_per_store"),
    [(4, 1), (4, 8)],
    ids=["4-stores-1-thread-each", "4-stores-8-threads-each-group-commit"],
)


@_WRITERS
@pytest.mark.usefixtures("slow_commits")
def test_tailing_read_all_never_skips_an_event_that_commits_late(
    db_url: str, stores: int, threads_per_store: int
) -> None:
    seen, everything = _tail_while_writing(db_url, stores, threads_per_store)
    assert seen == everything


@_WRITERS
@pytest.mark.postgres
@pytest.mark.usefixtures("slow_commits")
def test_tailing_would_skip_late_commits_without_the_append_lock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, stores: int, threads_per_store: int
) -> None:
    """Teeth for the test above: with positions no longer serialised, a tail skips events.

    Only PostgreSQL: SQLite serialises writers by itself.
    """
    monkeypatch.setattr(EventStore, "_SERIALISE_POSITIONS", False)
    for _ in range(10):
        seen, everything = _tail_while_writing(pg_url, stores, threads_per_store)
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


# -- group commit --------------------------------------------------------------------------------


@pytest.mark.usefixtures("slow_commits")
def test_concurrent_appends_to_different_streams_share_commits_and_each_commits_once(
    store: EventStore,
) -> None:
    writers, per_writer = 32, 15
    barrier = threading.Barrier(writers)
    returned: dict[int, list[int]] = {}

    def write(w: int) -> None:
        barrier.wait()
        mine: list[int] = []
        for i in range(per_writer):
            mine += store.append(
                f"w{w}",
                i,
                [NewEvent("E", {"w": w, "i": i})],
                projection=Projection({"i": i}, category="bench", status=f"s{i % 3}"),
            )
        returned[w] = mine

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(returned) == list(range(writers))
    logged = store.read_all(after=0, limit=10_000)
    positions = [e.position for e in logged]
    assert positions == sorted(set(positions))  # strictly increasing (gaps allowed)
    assert sorted(p for mine in returned.values() for p in mine) == positions
    for w, mine in returned.items():
        assert mine == sorted(mine)
        assert [e.data for e in store.read_stream(f"w{w}")] == [
            {"w": w, "i": i} for i in range(per_writer)
        ]
        assert store.verify_stream(f"w{w}") is None
        head = store.stream(f"w{w}")
        assert head is not None
        assert (head.version, head.state) == (per_writer, {"i": per_writer - 1})
    stats = store.stats
    assert stats.appends == writers * per_writer
    assert stats.commits < stats.appends  # transactions were shared
    assert stats.splits == 0


class _HeldLeader:
    """Appends queued behind a leader held inside its transaction, then let go together: the
    next leader takes them all, so they are committed as one batch."""

    def __init__(self, store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.holding = threading.Event()
        self.release = threading.Event()
        insert = EventStore._insert_events

        def held(self_: EventStore, cursor: object, rows: list[dict[str, object]]) -> list[int]:
            if rows[0]["stream_id"] == "holder" and not self.release.is_set():
                self.holding.set()
                assert self.release.wait(30)
            return insert(self_, cursor, rows)

        monkeypatch.setattr(EventStore, "_insert_events", held)

    def run(self, appends: list[Callable[[], list[int]]]) -> list[list[int] | Exception]:
        group = self.store._group
        assert group is not None, "group commit is on by default"
        outcomes: list[list[int] | Exception | None] = [None] * len(appends)

        def call(index: int) -> None:
            try:
                outcomes[index] = appends[index]()
            except Exception as exc:
                outcomes[index] = exc

        holder = threading.Thread(target=self.store.append, args=("holder", 0, [NewEvent("H")]))
        holder.start()
        assert self.holding.wait(30)
        self.store._heads.pop("holder", None)
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(appends))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while group.queued < len(appends):
            assert time.monotonic() < deadline, "the appends never queued"
            time.sleep(0.001)
        self.release.set()
        for t in [holder, *threads]:
            t.join(60)
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]


def _conflict_in_a_batch(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append("stale", 0, [NewEvent("A")], projection=Projection({"v": 1}))
    before = store.stats
    appends: list[Callable[[], list[int]]] = [
        lambda i=i: store.append(f"ok{i}", 0, [NewEvent("A", {"i": i})])  # type: ignore[misc]
        for i in range(5)
    ]
    appends.insert(
        2, lambda: store.append("stale", 0, [NewEvent("B")], projection=Projection({"v": "x"}))
    )
    outcomes = _HeldLeader(store, monkeypatch).run(appends)
    stale = outcomes.pop(2)
    assert isinstance(stale, ConcurrencyError), stale
    assert stale.actual_version == 1
    assert all(isinstance(o, list) and len(o) == 1 for o in outcomes), outcomes
    after = store.stats
    # The holder's transaction, then one for the six queued appends: the conflict was settled
    # inside the batch, which committed the others without being rolled back.
    assert (after.commits - before.commits, after.appends - before.appends) == (2, 6)
    assert after.splits == before.splits
    assert [e.type for e in store.read_stream("stale")] == ["A"]
    head = store.stream("stale")
    assert head is not None
    assert (head.version, head.state) == (1, {"v": 1})
    for i in range(5):
        assert [e.data for e in store.read_stream(f"ok{i}")] == [{"i": i}]


def test_a_conflicting_append_in_a_batch_fails_alone_while_the_others_commit(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _conflict_in_a_batch(store, monkeypatch)


def test_the_batch_conflict_test_fails_if_the_per_append_version_check_is_skipped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teeth for the test above: a batch that skipped each append's own version check would be
    caught only by the (stream, version) constraint, failing the whole transaction."""
    advance = EventStore._advance_head

    def unchecked(self: EventStore, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(ConcurrencyError):
            advance(self, *args, **kwargs)

    monkeypatch.setattr(EventStore, "_advance_head", unchecked)
    with pytest.raises(AssertionError):
        _conflict_in_a_batch(store, monkeypatch)
    # The constraint still kept the stale append out of the log.
    assert [e.type for e in store.read_stream("stale")] == ["A"]
    assert store.stats.splits == 1


def _reject_poison(store: EventStore) -> None:
    """A trigger that makes the database refuse any event whose payload says ``poison``."""
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER reject_poison BEFORE INSERT ON events "
                "WHEN instr(NEW.payload, 'poison') > 0 BEGIN SELECT RAISE(ABORT, 'poison'); END"
            )
            return
        conn.exec_driver_sql(
            "CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF position('poison' in NEW.payload) > 0 THEN "
            "RAISE EXCEPTION 'poison' USING ERRCODE = '22023'; END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER reject_poison BEFORE INSERT ON events "
            "FOR EACH ROW EXECUTE FUNCTION reject_poison()"
        )


def test_a_payload_the_database_refuses_mid_batch_fails_alone_and_nothing_is_half_written(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reject_poison(store)
    good_card, bad_card = _snapshot('{"name":"good"}'), _snapshot('{"name":"bad"}')
    before = store.stats

    def good(i: int) -> Callable[[], list[int]]:
        return lambda: store.append(
            f"ok{i}",
            0,
            [NewEvent("A", {"i": i}), NewEvent("B", {"i": i})],
            projection=Projection({"i": i}),
            snapshots=[good_card] if i == 0 else [],
        )

    appends = [good(i) for i in range(4)]
    appends.insert(
        2,
        lambda: store.append(
            "bad",
            0,
            [NewEvent("A", {"fine": True}), NewEvent("B", {"text": "poison"})],
            projection=Projection({"bad": True}),
            snapshots=[bad_card],
        ),
    )
    outcomes = _HeldLeader(store, monkeypatch).run(appends)
    refused = outcomes.pop(2)
    assert isinstance(refused, StoreError), refused
    if store.engine.dialect.name == "postgresql":
        assert isinstance(refused, PayloadError)
        assert "refused" in str(refused)
    assert all(isinstance(o, list) and len(o) == 2 for o in outcomes), outcomes
    after = store.stats
    # The batch was rolled back whole, then each append written alone.
    assert after.splits - before.splits == 1
    assert after.appends - before.appends == 5  # the holder and the four good ones
    assert store.read_stream("bad") == []
    assert store.stream("bad") is None
    assert store.get_snapshot(bad_card.revision) is None
    assert store.get_snapshot(good_card.revision) is not None
    for i in range(4):
        assert [e.type for e in store.read_stream(f"ok{i}")] == ["A", "B"]
        assert store.verify_stream(f"ok{i}") is None


def test_two_appends_to_one_stream_never_share_a_batch(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = store.stats
    outcomes = _HeldLeader(store, monkeypatch).run(
        [
            lambda: store.append("s", 0, [NewEvent("A")]),
            lambda: store.append("other", 0, [NewEvent("A")]),
            lambda: store.append("s", 1, [NewEvent("B")]),
        ]
    )
    assert all(isinstance(o, list) for o in outcomes), outcomes
    after = store.stats
    # The holder's transaction, then "s" and "other" together, then "s" again.
    assert after.commits - before.commits == 3
    assert [e.type for e in store.read_stream("s")] == ["A", "B"]
    assert store.verify_stream("s") is None


def test_without_group_commit_every_append_is_its_own_transaction(db_url: str) -> None:
    with EventStore.open(db_url, group_commit=False) as store:
        threads = [
            threading.Thread(
                target=lambda w=w: [store.append(f"w{w}", i, [NewEvent("E")]) for i in range(5)]
            )
            for w in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert store.stats == CommitStats(appends=20, commits=20, splits=0)


def test_in_a_batch_a_lost_lease_and_a_stale_end_fail_alone_and_leave_due_work_as_it_was(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases and due work under group commit: an append under a lost lease and a stale append
    that would end its task each fail alone, their due-work rows untouched; the append that ends
    its task in the same batch removes its row."""
    for stream in ("leased", "stale", "ending"):
        store.append(stream, 0, [NewEvent("Live")], projection=Projection({}, live=True))
    leases = {lease.stream_id: lease for lease in store.due.claim("a", ttl=60, limit=3)}
    lost = leases["leased"]
    store.due.release("a")
    store.due.claim("b", ttl=60, limit=3)  # b holds all three now
    appends: list[Callable[[], list[int]]] = [
        lambda: store.append("leased", 1, [NewEvent("Polled")], lease=lost),
        lambda: store.append("stale", 0, [NewEvent("End")], projection=Projection({}, live=False)),
        lambda: store.append("ending", 1, [NewEvent("End")], projection=Projection({}, live=False)),
    ]
    leased, stale, ending = _HeldLeader(store, monkeypatch).run(appends)
    assert isinstance(leased, LeaseLostError), leased
    assert isinstance(stale, ConcurrencyError), stale
    assert isinstance(ending, list), ending
    assert {row.stream_id: row.owner for row in store.due.rows()} == {"leased": "b", "stale": "b"}
    assert [e.type for e in store.read_stream("leased")] == ["Live"]
