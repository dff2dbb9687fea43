"""The hash chain as a pure function over recorded events."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from cardfence.store.chain import event_hash, verify_chain
from cardfence.store.records import GENESIS_HASH, RecordedEvent

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _chain(n: int, stream: str = "s") -> list[RecordedEvent]:
    out: list[RecordedEvent] = []
    prev = GENESIS_HASH
    for version in range(1, n + 1):
        when = T0 + timedelta(seconds=version)
        payload = f'{{"i":{version}}}'
        digest = event_hash(stream, version, "E", 1, when, payload, prev)
        out.append(
            RecordedEvent(version * 10, stream, version, "E", 1, payload, when, prev, digest)
        )
        prev = digest
    return out


def test_an_intact_chain_verifies() -> None:
    assert verify_chain("s", _chain(5), head_version=5) is None
    assert verify_chain("s", [], head_version=None) is None


def test_hash_covers_type_schema_version_and_time() -> None:
    base = _chain(3)
    for change in ({"type": "Other"}, {"schema_version": 2}, {"recorded_at": T0}):
        tampered = [*base[:1], dataclasses.replace(base[1], **change), base[2]]
        broken = verify_chain("s", tampered)
        assert broken is not None
        assert (broken.version, broken.kind) == (2, "hash_mismatch"), change


def test_a_rewritten_event_with_a_recomputed_hash_breaks_the_next_link() -> None:
    base = _chain(3)
    forged_payload = '{"i":200}'
    forged = dataclasses.replace(
        base[1],
        payload=forged_payload,
        hash=event_hash("s", 2, "E", 1, base[1].recorded_at, forged_payload, base[1].prev_hash),
    )
    broken = verify_chain("s", [base[0], forged, base[2]])
    assert broken is not None
    assert (broken.version, broken.kind) == (3, "broken_link")


def test_a_missing_first_event_is_a_gap() -> None:
    broken = verify_chain("s", _chain(3)[1:])
    assert broken is not None
    assert (broken.kind, broken.version) == ("gap", 2)


def test_positions_running_backwards_are_a_reordering() -> None:
    events = _chain(3)
    events[2] = dataclasses.replace(events[2], position=5)
    broken = verify_chain("s", events)
    assert broken is not None
    assert broken.kind == "reordered"


def test_a_head_ahead_of_the_log_is_reported() -> None:
    broken = verify_chain("s", _chain(2), head_version=3)
    assert broken is not None
    assert broken.kind == "head_mismatch"
