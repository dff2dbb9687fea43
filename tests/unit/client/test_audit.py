"""Replay and audit over a store (R13, R14): no network, SQLite in memory."""

from __future__ import annotations

import base64
import copy
import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from joserfc.jwk import ECKey
from support.cards import card_document, fetched
from support.events import submitted

from cardfence.engine.cards.keys import parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.signature_policy import SignaturePolicy
from cardfence.engine.cards.signatures import apply_policy, sign_card
from cardfence.engine.client.audit import (
    _REVISION_FIELDS,
    AuditReport,
    Violation,
    _as_of_heads,
    _verified_keys,
    audit,
    rebuild_projections,
    replay,
)
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import content
from cardfence.engine.core import events as ev
from cardfence.engine.discovery._agent_stream import append_agent_events
from cardfence.store.chain import content_hash, verify_chain
from cardfence.store.event_store import EventStore, iter_all
from cardfence.store.records import CardSnapshot, NewEvent, Projection, RecordedEvent, StreamRecord
from cardfence.store.schema import card_snapshots, contents, events, streams

BODY = '{"name":"agent"}'
REVISION = content_hash(BODY)


@pytest.fixture
def store() -> Iterator[EventStore]:
    with EventStore.open("sqlite://") as opened:
        yield opened


def _submitted(key: str, **fields: Any) -> ev.TaskSubmitted:
    """Task ``key``'s first event, its card revision none unless given (no snapshot named)."""
    return submitted(key, **{"card_revision": None, **fields})


def _task(store: EventStore) -> None:
    store.put_snapshot(CardSnapshot(REVISION, BODY, "http://a/card", None, 200, datetime.now(UTC)))
    log = TaskLog(store)
    log.create("t1", [_submitted("t1", card_revision=REVISION)])
    change = ev.StateChanged(from_="submitted", to="working", source="poll", remote_timestamp=None)
    log.record("t1", lambda s: [change])


def _task_head(store: EventStore) -> StreamRecord:
    """A task written by the engine (``_task``), and its head."""
    _task(store)
    head = store.stream(task_stream_id("t1"))
    assert head is not None
    return head


def test_a_store_written_by_the_engine_audits_clean(store: EventStore) -> None:
    _task(store)
    report = audit(store)
    assert report.ok, report.violations
    assert (report.streams_checked, report.events_checked) == (1, 2)


@pytest.mark.parametrize(
    ("state", "why"),
    [("[1]", "is an array, not a JSON object"), ("{nope", "is not JSON (Expecting property")],
)
def test_a_projection_altered_into_no_json_object_is_reported_and_the_audit_goes_on(
    store: EventStore, state: str, why: str
) -> None:
    _task(store)
    TaskLog(store).create("t2", [_submitted("t2", card_revision=REVISION)])
    with store.engine.begin() as conn:
        conn.execute(streams.update().where(streams.c.stream_id == T1).values(state=state))
    positions = _positions(store, T1)
    (violation,) = audit(store).violations  # t2, after it, audited clean
    assert (violation.stream, violation.position, violation.kind) == (
        T1, positions[-1], "projection_invalid",
    )  # fmt: skip
    assert violation.detail.startswith(f"the stored projection {why}")
    assert violation.detail.endswith(": it was not compared")


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
        change = ev.StateChanged(
            from_="working", to="completed", source="push", remote_timestamp=None
        )
        TaskLog(store).record("t1", lambda s: [change])
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


# -- what each finding names -----------------------------------------------------------------------

T1 = task_stream_id("t1")


def _positions(store: EventStore, stream_id: str) -> list[int]:
    return [e.position for e in store.read_stream(stream_id)]


def test_every_stream_and_every_event_is_counted(store: EventStore) -> None:
    _task(store)
    TaskLog(store).create("t2", [_submitted("t2", card_revision=REVISION)])
    report = audit(store)
    assert report.ok, report.violations
    assert (report.streams_checked, report.events_checked) == (2, 3)


def test_a_broken_chain_is_reported_at_its_stream_and_position(store: EventStore) -> None:
    _task(store)
    second = _positions(store, T1)[1]
    with store.engine.begin() as conn:
        conn.execute(events.update().where(events.c.position == second).values(prev_hash="0" * 64))
    head = store.stream(T1)
    assert head is not None
    broken = verify_chain(T1, store.read_stream(T1), head.version)
    assert broken is not None
    assert audit(store).violations == (Violation(T1, second, broken.kind, broken.detail),)


def test_events_without_a_head_are_checked_and_their_projection_reported_missing(
    store: EventStore,
) -> None:
    _task(store)
    with store.engine.begin() as conn:
        conn.execute(streams.delete())
    report = audit(store)
    assert report.events_checked == 2
    assert report.violations == (
        Violation(T1, _positions(store, T1)[-1], "projection_missing", "no stored projection"),
    )


def test_a_head_whose_events_are_gone_is_reported_at_position_0(store: EventStore) -> None:
    _task(store)
    with store.engine.begin() as conn:
        conn.execute(events.delete())
    mismatch = [v for v in audit(store).violations if v.kind == "projection_mismatch"]
    assert [(v.stream, v.position) for v in mismatch] == [(T1, 0)]


def test_a_stream_of_no_known_kind_is_reported_by_name(store: EventStore) -> None:
    store.append("other-x", 0, [NewEvent(ev.STATE_CHANGED, {"x": 1})], projection=Projection({}))
    (position,) = _positions(store, "other-x")
    assert audit(store).violations == (
        Violation("other-x", position, "unknown_stream", "not an agent or task stream"),
    )


def test_an_unknown_event_type_is_reported_at_its_place_saying_what_it_may_be(
    store: EventStore,
) -> None:
    head = _task_head(store)
    store.append(
        T1,
        head.version,
        [NewEvent("FromTheFuture", {"x": 1}, schema_version=3)],
        projection=Projection(head.state, category="task", status=head.status),
    )
    assert audit(store).violations == (
        Violation(
            T1,
            _positions(store, T1)[-1],
            "unknown_event_type",
            "FromTheFuture (schema 3) is not in this cardfence's catalogue: written by a newer "
            "version?",
        ),
    )


def test_a_revision_field_that_is_not_text_references_nothing(store: EventStore) -> None:
    store.put_snapshot(CardSnapshot(REVISION, BODY, "http://a/card", None, 200, datetime.now(UTC)))
    TaskLog(store).create("t1", [_submitted("t1", card_revision=7)])
    assert [v.kind for v in audit(store).violations] == []


def test_streams_are_read_in_batches_each_stream_once(store: EventStore) -> None:
    for name in ("t1", "t2", "t3"):
        TaskLog(store).create(name, [_submitted(name)])
    read = [stream_id for stream_id, _ in _as_of_heads(store, batch=2)]
    assert read == [task_stream_id(n) for n in ("t1", "t2", "t3")]


@pytest.mark.parametrize(
    ("type_", "data", "keys"),
    [
        (ev.CARD_FETCHED, {"signature": {"status": "verified", "keys": {"revision": "k"}}}, "k"),
        (ev.CARD_FETCHED, {"signature": {"status": "unsigned"}}, None),
        (ev.CARD_FETCHED, {"signature": "verified"}, None),
        (ev.CARD_FETCHED, {}, None),
        (
            ev.CONTRACT_PINNED,
            {"signature": {"status": "verified", "keys": {"revision": "k"}}},
            None,
        ),
        (ev.CARD_FETCHED, {"signature": {"status": "verified", "keys": "k"}}, ""),
        (ev.CARD_FETCHED, {"signature": {"status": "verified", "keys": {"revision": 7}}}, ""),
        (ev.CARD_FETCHED, {"signature": {"status": "verified", "keys": {"revision": ""}}}, ""),
        (ev.CARD_FETCHED, {"signature": {"status": "verified", "keys": {}}}, ""),
    ],
)
def test_only_a_card_read_recorded_verified_names_a_key_set(
    type_: str, data: dict[str, Any], keys: str | None
) -> None:
    """``None``: not a verified read; ``""``: a verified read that names no key set (the audit's
    second look reports it as not stored)."""
    assert _verified_keys(type_, data) == keys


@pytest.mark.parametrize(
    ("type_", "field"),
    [(type_, field) for type_, fields in _REVISION_FIELDS.items() for field in fields],
)
def test_each_field_naming_a_card_revision_is_checked_for_its_snapshot(
    store: EventStore, type_: str, field: str
) -> None:
    revision = "f" * 64
    store.append("task-x", 0, [NewEvent(type_, {field: revision})], projection=Projection({}))
    missing = [v for v in audit(store).violations if v.kind.startswith("snapshot")]
    assert missing == [
        Violation(
            "task-x",
            1,
            "snapshot_missing",
            f"card revision {revision} is referenced but not stored",
        )
    ]


def test_a_snapshot_finding_names_the_first_event_that_references_it(store: EventStore) -> None:
    _task(store)
    TaskLog(store).create("t2", [_submitted("t2", card_revision=REVISION)])
    first = _positions(store, T1)[0]
    with store.engine.begin() as conn:
        conn.execute(card_snapshots.update().values(body='{"name":"forged"}'))
    assert audit(store).violations == (
        Violation(
            T1, first, "snapshot_mismatch", f"card snapshot {REVISION} does not hash to its key"
        ),
    )
    with store.engine.begin() as conn:
        conn.execute(card_snapshots.delete())
    assert audit(store).violations == (
        Violation(
            T1, first, "snapshot_missing", f"card revision {REVISION} is referenced but not stored"
        ),
    )


def test_a_snapshot_no_event_references_is_still_checked(store: EventStore) -> None:
    store.put_snapshot(CardSnapshot(REVISION, BODY, "http://a/card", None, 200, datetime.now(UTC)))
    with store.engine.begin() as conn:
        conn.execute(card_snapshots.update().values(body='{"name":"forged"}'))
    assert audit(store).violations == (
        Violation(
            "card_snapshots",
            0,
            "snapshot_mismatch",
            f"card snapshot {REVISION} does not hash to its key",
        ),
    )


def test_an_event_that_does_not_fold_is_reported_where_the_fold_stopped_and_the_audit_goes_on(
    store: EventStore,
) -> None:
    """A ``CardFetched`` without its ``url`` (altered, or written otherwise): the replay cannot
    fold it. The audit says so at that event and checks the other streams."""
    _task(store)
    agent = ev.agent_stream_id("https://a.example")
    fetched = NewEvent(ev.CARD_FETCHED, {"revision": REVISION})
    store.append(agent, 0, [fetched], projection=Projection({}))
    report = audit(store)
    assert report.streams_checked == 2
    assert report.violations == (
        Violation(
            agent,
            _positions(store, agent)[0],
            "replay_failed",
            "the fold stopped here (KeyError: 'url'): the payload lacks what its type holds",
        ),
    )


def test_a_projection_mismatch_names_each_key_that_differs_or_is_extra(store: EventStore) -> None:
    head = _task_head(store)
    tampered = {**head.state, "state": "completed", "extra": 1}
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state=json.dumps(tampered)))
    assert audit(store).violations == (
        Violation(
            T1,
            _positions(store, T1)[-1],
            "projection_mismatch",
            "replay differs from the stored projection in: extra, state",
        ),
    )


def test_why_an_event_did_not_fold_is_cut_to_200_characters(store: EventStore) -> None:
    head = _task_head(store)
    chunked = NewEvent(ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "chunks": "x" * 300})
    store.append(T1, head.version, [chunked], projection=Projection(head.state))
    (violation,) = audit(store).violations
    assert violation.kind == "replay_failed"
    reason = violation.detail.removeprefix("the fold stopped here (ValueError: ")
    assert (
        reason
        == ("invalid literal for int() with base 10: '" + "x" * 300 + "'")[:200]
        + "): the payload lacks what its type holds"
    )


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ("[1]", "is an array, not a JSON object"),
        ('"text"', "is a string, not a JSON object"),
        ("null", "is null, not a JSON object"),
        ("not json", "is not JSON (Expecting value: line 1 column 1 (char 0))"),
        ('{"skill": 5', "is not JSON (Expecting ',' delimiter: line 1 column 12 (char 11))"),
        ("1" * 5000, "is not JSON (Exceeds the limit (4300 digits) for integer string conversion:"),
    ],
)
def test_a_payload_altered_into_no_json_object_is_reported_not_crashed_on(
    store: EventStore, payload: str, why: str
) -> None:
    _task(store)
    TaskLog(store).create("t2", [_submitted("t2", card_revision=REVISION)])
    first = _positions(store, T1)[0]
    with store.engine.begin() as conn:
        conn.execute(events.update().where(events.c.position == first).values(payload=payload))
    report = audit(store)
    assert report.streams_checked == 2
    assert [(v.stream, v.position, v.kind) for v in report.violations] == [
        (T1, first, "hash_mismatch"),
        (T1, first, "payload_invalid"),
    ]
    assert report.violations[1].detail.startswith(f"the payload {why}")
    assert report.violations[1].detail.endswith(": nothing in it was read")


def test_the_events_after_an_unreadable_payload_are_still_checked(store: EventStore) -> None:
    head = _task_head(store)
    store.append(
        T1,
        head.version,
        [NewEvent("FromTheFuture", {"x": 1}, schema_version=3)],
        projection=Projection(head.state),
    )
    first, *_, last = _positions(store, T1)
    with store.engine.begin() as conn:
        conn.execute(events.update().where(events.c.position == first).values(payload="[1]"))
    kinds = [(v.position, v.kind) for v in audit(store).violations]
    assert kinds == [
        (first, "hash_mismatch"),
        (first, "payload_invalid"),
        (last, "unknown_event_type"),
    ]


# -- rebuilding projections from the log -----------------------------------------------------------


def test_projections_altered_in_the_store_are_rebuilt_from_their_events(store: EventStore) -> None:
    _task(store)
    log = TaskLog(store)
    log.create("t2", [_submitted("t2", card_revision=REVISION)])
    bound = ev.StateChanged(
        from_="submitted", to="working", source="send", remote_timestamp=None, remote_task_id="r2"
    )
    log.record("t2", lambda _state: [bound])  # live: it has a remote id
    T2 = task_stream_id("t2")
    assert [row.stream_id for row in store.due.rows()] == [T2]
    kept = {sid: store.stream(sid) for sid in (T1, T2)}
    with store.engine.begin() as conn:
        conn.execute(streams.update().where(streams.c.stream_id == T1).values(state="[1]"))
        conn.execute(
            streams.update()
            .where(streams.c.stream_id == T2)
            .values(state=json.dumps({"state": "completed"}), status="completed")
        )
        conn.execute(sa.text("DELETE FROM due_work"))
    assert {v.kind for v in audit(store).violations} == {
        "projection_invalid",
        "projection_mismatch",
    }

    report = rebuild_projections(store)

    assert (report.ok, report.rebuilt) == (True, (T1, T2))
    assert report.to_json()["rebuilt"] == [T1, T2]
    for sid, before in kept.items():
        after = store.stream(sid)
        assert after == before  # state, keys, version and time as the engine wrote them
    assert [row.stream_id for row in store.due.rows()] == [T2]  # live again
    assert rebuild_projections(store).rebuilt == ()  # nothing left to rebuild


def test_a_stream_whose_log_is_suspect_is_never_rebuilt(store: EventStore) -> None:
    _task(store)
    first = _positions(store, T1)[0]
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state='{"state": "completed"}'))
        conn.execute(
            events.update().where(events.c.position == first).values(payload='{"skill": "x"}')
        )
    with store.engine.connect() as conn:
        state = conn.execute(sa.select(streams.c.state)).scalar_one()

    report = rebuild_projections(store)

    assert report.rebuilt == ()
    assert {v.kind for v in report.violations} == {"hash_mismatch", "projection_mismatch"}
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(streams.c.state)).scalar_one() == state


def test_an_audit_not_asked_to_rebuild_says_nothing_of_it(store: EventStore) -> None:
    _task(store)
    assert "rebuilt" not in audit(store).to_json()


def test_an_agent_projection_is_rebuilt_with_its_keys(store: EventStore) -> None:
    _task(store)  # the card snapshot the read names is stored
    origin = "http://agent.test"
    fetched = {"url": f"{origin}/card", "revision": REVISION, "etag": '"e"', "version": "1"}
    append_agent_events(store, origin, lambda _state: [NewEvent(ev.CARD_FETCHED, fetched)])
    agent = ev.agent_stream_id(origin)
    before = store.stream(agent)
    with store.engine.begin() as conn:
        conn.execute(
            streams.update()
            .where(streams.c.stream_id == agent)
            .values(state="{}", category=None, alias=None)
        )

    assert rebuild_projections(store).rebuilt == (agent,)
    assert store.stream(agent) == before


def test_an_ended_task_rebuilt_loses_a_due_row_it_should_not_have(store: EventStore) -> None:
    _task(store)
    ended = ev.StateChanged(
        from_="working", to="completed", source="poll", remote_timestamp=None, remote_task_id="r1"
    )
    TaskLog(store).record("t1", lambda _state: [ended])
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state="[1]", status="working"))
    store.due.ensure([T1])

    assert rebuild_projections(store).rebuilt == (T1,)
    assert store.due.rows() == []
    head = store.stream(T1)
    assert head is not None
    assert (head.status, head.alias) == ("completed", "r1")


def test_a_rebuild_checks_signatures_again_only_when_asked(store: EventStore) -> None:
    _task(store)
    assert rebuild_projections(store).signatures_checked is None
    assert rebuild_projections(store, verify_signatures=True).signatures_checked == 0
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state="[1]"))
    report = rebuild_projections(store, verify_signatures=True)  # the second audit's count
    assert (report.rebuilt, report.signatures_checked) == ((T1,), 0)


def test_a_stream_whose_chain_fails_when_it_is_rebuilt_is_skipped_and_the_next_rebuilt(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the first audit and the rewrite a stream may be appended to (and its new
    events be broken): its chain is checked again, as of the head the rewrite would be made
    on, events beyond that head included. Stands in for that race: a first audit that saw
    only the projections' violations."""
    for key in ("t0", "t1", "t2"):
        TaskLog(store).create(key, [_submitted(key)])
    T0, T2 = task_stream_id("t0"), task_stream_id("t2")
    first = _positions(store, T0)[0]
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state="[1]"))
        conn.execute(events.update().where(events.c.position == first).values(payload="{}"))
        conn.execute(streams.update().where(streams.c.stream_id == T1).values(version=0))
    seen = [
        Violation(sid, 0, "projection_invalid", "the stored projection is an array")
        for sid in (T0, T1, T2)
    ]
    real = audit
    calls: list[int] = []

    def first_then_real(store: EventStore, *, verify_signatures: bool = False) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return AuditReport(3, 3, tuple(seen))
        return real(store, verify_signatures=verify_signatures)

    monkeypatch.setattr("cardfence.engine.client.audit.audit", first_then_real)
    report = rebuild_projections(store)

    assert report.rebuilt == (T2,)  # t0's payload altered; t1's event beyond its head
    with store.engine.connect() as conn:
        states = dict(conn.execute(sa.select(streams.c.stream_id, streams.c.state)).all())
    assert (states[T0], states[T1]) == ("[1]", "[1]")


def test_a_projection_invalid_is_placed_at_the_last_event_or_0_without_events(
    store: EventStore,
) -> None:
    _task(store)
    artifact = ev.ArtifactReceived(artifact_id="a", name=None, source="poll")
    TaskLog(store).record("t1", lambda _state: [artifact])
    last = _positions(store, T1)[-1]
    with store.engine.begin() as conn:
        conn.execute(streams.update().values(state="[1]"))
    assert [(v.position, v.kind) for v in audit(store).violations] == [(last, "projection_invalid")]
    with store.engine.begin() as conn:
        conn.execute(events.delete())
    found = {(v.position, v.kind) for v in audit(store).violations}
    assert (0, "projection_invalid") in found


def test_a_deleted_head_row_is_put_back_as_of_its_last_event(store: EventStore) -> None:
    _task(store)
    bound = ev.StateChanged(
        from_="working",
        to="input-required",
        source="poll",
        remote_timestamp=None,
        remote_task_id="r1",
    )
    TaskLog(store).record("t1", lambda _state: [bound])
    before = store.stream(T1)
    last = store.read_stream(T1)[-1]
    with store.engine.begin() as conn:
        conn.execute(streams.delete())
        conn.execute(sa.text("DELETE FROM due_work"))
    assert [v.kind for v in audit(store).violations] == ["projection_missing"]

    report = rebuild_projections(store)

    assert (report.ok, report.rebuilt) == (True, (T1,))
    after = store.stream(T1)
    assert after is not None
    assert before is not None
    assert (after.version, after.state, after.alias, after.status) == (
        before.version, before.state, "r1", "input-required",
    )  # fmt: skip
    assert after.updated_at == last.recorded_at
    assert [row.stream_id for row in store.due.rows()] == [T1]


# --------------------------------------------------------------------------------------------------
# The audit's second look at signed card reads (``audit(verify_signatures=True)``, R14): each card
# read recorded as verified is verified again from the stored snapshot and key set, and each way it
# can fail is one ``signature_invalid`` violation naming the read and why. SQLite in memory, no
# network.


ORIGIN = "https://agent.example"
URL = f"{ORIGIN}/.well-known/agent-card.json"
STREAM = ev.agent_stream_id(ORIGIN)
CARD = card_document()
NOT_VERIFIED = (
    "signature 0 (kid 'k1', ES256) does not verify: the card was altered after it was signed, "
    "or signed with another key"
)


def signed_read(
    store: EventStore,
    *,
    card_stored: bool = True,
    keys_stored: bool = True,
    change: Any = None,
    policy: str = "require",
) -> str:
    """Record one card read verified the way discovery records it; ``change`` alters the
    payload before it is appended. Returns the card's revision."""
    key = ECKey.generate_key("P-256", parameters={"kid": "k1"})
    card = parse_card(json.dumps(sign_card(CARD, key)).encode(), url=URL)
    body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    keys = parse_keys(body, source="url", url=f"{ORIGIN}/keys.json", card_url=URL)
    check = apply_policy(card, SignaturePolicy(policy), keys, URL)
    now = datetime.now(UTC)
    payload = fetched(card, URL, now.isoformat(), signature=check.record())
    if change is not None:
        change(payload)
    snapshots = []
    if card_stored:
        body_text = card.canonical_bytes().decode()
        snapshots.append(CardSnapshot(card.revision, body_text, URL, None, 200, now))
    if keys_stored:
        snapshots.append(CardSnapshot(keys.revision, keys.body, keys.url, None, 200, now))
    append_agent_events(
        store, ORIGIN, lambda state: [NewEvent(ev.CARD_FETCHED, payload)], snapshots=snapshots
    )
    return card.revision


def signature_findings(report: AuditReport) -> list[tuple[str, int, str]]:
    return [
        (v.stream, v.position, v.detail) for v in report.violations if v.kind == "signature_invalid"
    ]


def test_a_verified_read_checks_again_clean_and_is_counted(store: EventStore) -> None:
    signed_read(store)
    report = audit(store, verify_signatures=True)
    assert report.ok, report.violations
    assert report.signatures_checked == 1
    assert report.to_json() == {
        "streams_checked": 1,
        "events_checked": 1,
        "contents_checked": 0,
        "violations": [],
        "signatures_checked": 1,
    }


def test_without_the_second_look_nothing_is_counted_or_said_of_signatures(
    store: EventStore,
) -> None:
    signed_read(store, keys_stored=False)
    report = audit(store)
    assert report.signatures_checked is None
    assert "signatures_checked" not in report.to_json()
    assert signature_findings(report) == []


def test_a_read_recorded_unsigned_is_not_checked_again(store: EventStore) -> None:
    def unsigned(payload: dict[str, Any]) -> None:
        payload["signature"] = {"policy": "prefer", "status": "unsigned"}

    signed_read(store, change=unsigned, policy="prefer")
    report = audit(store, verify_signatures=True)
    assert report.ok, report.violations
    assert report.signatures_checked == 0


def test_a_verified_read_whose_card_is_not_stored_is_a_signature_violation(
    store: EventStore,
) -> None:
    revision = signed_read(store, card_stored=False)
    assert signature_findings(audit(store, verify_signatures=True)) == [
        (
            STREAM,
            1,
            f"card revision {revision[:12]}: the card snapshot it was verified with is not stored",
        )
    ]


def test_a_verified_read_whose_key_set_is_not_stored_is_a_signature_violation(
    store: EventStore,
) -> None:
    revision = signed_read(store, keys_stored=False)
    assert signature_findings(audit(store, verify_signatures=True)) == [
        (
            STREAM,
            1,
            f"card revision {revision[:12]}: the key set it was verified with is not stored",
        )
    ]


def test_a_verified_read_naming_no_key_set_is_a_signature_violation(store: EventStore) -> None:
    def nameless(payload: dict[str, Any]) -> None:
        payload["signature"]["keys"] = {**payload["signature"]["keys"], "revision": ""}

    revision = signed_read(store, change=nameless)
    assert signature_findings(audit(store, verify_signatures=True)) == [
        (
            STREAM,
            1,
            f"card revision {revision[:12]}: the key set it was verified with is not stored",
        )
    ]


def test_a_verified_read_naming_no_card_is_a_signature_violation(store: EventStore) -> None:
    def nameless(payload: dict[str, Any]) -> None:
        payload["revision"] = None

    signed_read(store, change=nameless)
    assert signature_findings(audit(store, verify_signatures=True)) == [
        (STREAM, 1, "card revision : the card snapshot it was verified with is not stored")
    ]


def test_a_recorded_signature_altered_is_a_signature_violation(store: EventStore) -> None:
    def altered(payload: dict[str, Any]) -> None:
        recorded = copy.deepcopy(payload["signature"]["signatures"])
        other = ECKey.generate_key("P-256", parameters={"kid": "k1"})
        recorded[0]["signature"] = sign_card(CARD, other)["signatures"][0]["signature"]
        payload["signature"]["signatures"] = recorded

    revision = signed_read(store, change=altered)
    report = audit(store, verify_signatures=True)
    assert signature_findings(report) == [
        (STREAM, 1, f"card revision {revision[:12]}: {NOT_VERIFIED}")
    ]
    assert [v.kind for v in report.violations] == ["signature_invalid"]


def test_each_failing_read_is_named_by_its_place(store: EventStore) -> None:
    signed_read(store)
    revision = signed_read(store, keys_stored=False)  # another key set: not stored
    report = audit(store, verify_signatures=True)
    assert report.signatures_checked == 2
    assert signature_findings(report) == [
        (
            STREAM,
            2,
            f"card revision {revision[:12]}: the key set it was verified with is not stored",
        )
    ]


def test_a_violation_and_a_report_as_json() -> None:
    violation = Violation("task-t1", 3, "projection_mismatch", "replay differs in: state")
    assert violation.to_json() == {
        "stream": "task-t1",
        "position": 3,
        "kind": "projection_mismatch",
        "detail": "replay differs in: state",
    }
    report = AuditReport(2, 5, (violation,))
    assert not report.ok
    assert report.to_json() == {
        "streams_checked": 2,
        "events_checked": 5,
        "contents_checked": 0,
        "violations": [violation.to_json()],
    }
    assert AuditReport(0, 0, signatures_checked=0).to_json()["signatures_checked"] == 0


# -- content out of line (R17) -----------------------------------------------------------------


def _task_with_content(db_url: str) -> EventStore:
    """A store holding task ``t1``, created with a message of two parts and answered with an
    artifact, every part's content kept out of line."""
    store = EventStore.open(db_url)
    store.put_snapshot(CardSnapshot(REVISION, BODY, "http://a/card", None, 200, datetime.now(UTC)))
    log = TaskLog(store)
    parts = [
        {"kind": "text", "media_type": "text/plain", "text": "summarise this"},
        {"kind": "data", "media_type": "application/json", "data": {"pages": [1, 2]}},
    ]
    log.create("t1", [submitted("t1", card_revision=REVISION, text=None, parts=parts)])
    artifact = ev.ArtifactReceived(
        artifact_id="a1", name="summary", source="poll",
        parts=[{"kind": "text", "media_type": "text/markdown", "text": "# Short"}],
    )  # fmt: skip
    log.record("t1", lambda _state: [artifact])
    return store


def _content_rows(store: EventStore) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.select(contents).order_by(contents.c.digest)))


def test_a_store_whose_content_is_out_of_line_audits_clean_each_record_checked(
    db_url: str,
) -> None:
    with _task_with_content(db_url) as store:
        report = audit(store)
        assert report.ok, report.violations
        assert report.contents_checked == 3 == len(_content_rows(store))
        assert report.to_json()["contents_checked"] == 3
        stored_text = " ".join(e.payload for e in store.read_stream(task_stream_id("t1")))
        assert "summarise" not in stored_text
        assert "Short" not in stored_text
        assert "summary" not in stored_text
        assert "pages" not in stored_text


@pytest.mark.parametrize("column", ["body", "salt"])
def test_an_edited_content_record_is_a_content_mismatch_at_the_event_naming_it(
    db_url: str, column: str
) -> None:
    with _task_with_content(db_url) as store:
        target = next(r for r in _content_rows(store) if "summarise" in r.body)
        edited = {"body": '{"text":"summarise that"}', "salt": "ff" * 16}[column]
        with store.engine.begin() as conn:
            conn.execute(
                contents.update().where(contents.c.digest == target.digest).values({column: edited})
            )
        [violation] = audit(store).violations
        first = store.read_stream(task_stream_id("t1"))[0]
        assert (violation.kind, violation.position) == ("content_mismatch", first.position)
        assert target.digest in violation.detail


def test_a_deleted_content_record_is_content_missing_and_the_chain_still_holds(
    db_url: str,
) -> None:
    with _task_with_content(db_url) as store:
        target = next(r for r in _content_rows(store) if "Short" in r.body)
        with store.engine.begin() as conn:
            conn.execute(contents.delete().where(contents.c.digest == target.digest))
        [violation] = audit(store).violations
        assert violation.kind == "content_missing"
        assert violation.position == store.read_stream(task_stream_id("t1"))[-1].position
        head = store.stream(task_stream_id("t1"))
        assert head is not None
        view = TaskLog(store).view(head.state)
        [part] = view.artifacts[0]["parts"]
        assert part["erased"] is True
        assert "text" not in part


# A store written by the engine of commit c677f25, which kept message and artifact content inline
# in the events (tests/support/data/write_store_before_content_out_of_line.py says how).
CONTENT_INLINE = (
    Path(__file__).parents[2] / "support" / "data" / "store_before_content_out_of_line.sqlite"
)


@pytest.fixture
def content_inline(tmp_path: Path) -> Iterator[EventStore]:
    copied = tmp_path / "inline.sqlite"
    shutil.copyfile(CONTENT_INLINE, copied)  # opening migrates: never the committed file
    with EventStore.open(f"sqlite:///{copied}") as opened:
        yield opened


def test_the_store_of_inline_content_holds_every_kind_of_content_it_recorded(
    content_inline: EventStore,
) -> None:
    recorded = list(iter_all(content_inline))
    artifacts = [e.data for e in recorded if e.type == ev.ARTIFACT_RECEIVED]
    kinds = {part["kind"] for a in artifacts for part in a.get("parts") or ()}
    asked = [e.data for e in recorded if e.type == ev.STATE_CHANGED and e.data.get("message_parts")]
    asked_kinds = {part["kind"] for message in asked for part in message["message_parts"]}
    assert kinds == {"text", "raw", "url", "data"}
    assert any(part.get("filename") for a in artifacts for part in a.get("parts") or ())
    assert asked_kinds == {"text", "raw", "data"}
    assert any(a.get("truncated") for a in artifacts)
    assert any(a.get("append") for a in artifacts)
    assert any(e.type == ev.STATE_CHANGED and e.data.get("payload_truncated") for e in recorded)
    assert any(e.type == ev.REPLY_SENT for e in recorded)


def test_the_store_of_inline_content_audits_clean(content_inline: EventStore) -> None:
    report = audit(content_inline)
    assert report.ok, report.violations
    assert report.events_checked == len(list(iter_all(content_inline)))


def test_every_stream_of_the_store_of_inline_content_replays_to_its_projection(
    content_inline: EventStore,
) -> None:
    for stream_id in content_inline.stream_ids():
        head = content_inline.stream(stream_id)
        assert head is not None
        assert replay(stream_id, content_inline.read_stream(stream_id)) == head.state, stream_id


def test_every_event_of_the_store_of_inline_content_reads_as_its_class_byte_for_byte(
    content_inline: EventStore,
) -> None:
    for event in iter_all(content_inline):
        typed = ev.stream_event(event.stream_id, event.type, event.data)
        assert not isinstance(typed, ev.UnknownEvent), event
        assert typed.extra == {}, (event.type, typed.extra)  # every key known to its class
        stored = json.dumps(typed.payload(), separators=(",", ":"), sort_keys=True)
        assert stored == event.payload, (event.stream_id, event.version)


def test_every_event_of_the_store_of_inline_content_upcasts_to_today_s_shape_its_content_whole(
    content_inline: EventStore,
) -> None:
    for event in iter_all(content_inline):
        assert event.schema_version == 1
        now = content.upcast(event.type, event.schema_version, event.data)
        if event.type == ev.TASK_SUBMITTED:
            [part] = now["parts"]
            assert (part["kind"], part["text"]) == ("text", event.data["text"])
        elif event.type == ev.STATE_CHANGED and isinstance(event.data.get("message"), str):
            texts = [p.get("text") for p in now["message_parts"] if p["kind"] == "text"]
            assert "message" not in now
            assert event.data["message"] in texts or not event.data.get("message_parts")
        parts = now.get("parts") or now.get("message_parts") or ()
        assert all(p["kind"] in ("text", "file", "url", "data") for p in parts), event
        files = [p for p in parts if p["kind"] == "file"]
        assert all(base64.b64decode(p["bytes"], validate=True) is not None for p in files)


def test_a_task_of_the_store_of_inline_content_goes_on_with_new_content_out_of_line(
    content_inline: EventStore,
) -> None:
    log = TaskLog(content_inline)
    key = next(
        e.stream_id.removeprefix("task:")
        for e in iter_all(content_inline)
        if e.type == ev.TASK_SUBMITTED
    )
    before = log.head(key).state
    assert log.first_event(key)["parts"][0]["kind"] == "text"  # a re-send reads it back
    artifact = ev.ArtifactReceived(
        artifact_id="later", name="later", source="poll",
        parts=[{"kind": "text", "media_type": "text/plain", "text": "after the upgrade"}],
    )  # fmt: skip
    log.record(key, lambda _state: [artifact])
    last = content_inline.read_stream(task_stream_id(key))[-1]
    assert (last.schema_version, "after" in last.payload) == (2, False)
    view = log.view(log.head(key).state)
    assert view.artifacts[-1]["name"] == "later"
    assert view.artifacts[-1]["parts"][0]["text"] == "after the upgrade"
    assert list(view.artifacts[:-1]) == list(TaskLog(content_inline).view(before).artifacts)
    assert audit(content_inline).ok
