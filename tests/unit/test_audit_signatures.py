"""The audit's second look at signed card reads (``audit(verify_signatures=True)``, R14): each
card read recorded as verified is verified again from the stored snapshot and key set, and each
way it can fail is one ``signature_invalid`` violation naming the read and why. SQLite in
memory, no network.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from joserfc.jwk import ECKey
from support.cards import card_document, fetched

from cardfence.engine.cards.keys import parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.signature_policy import SignaturePolicy
from cardfence.engine.cards.signatures import apply_policy, sign_card
from cardfence.engine.client.audit import AuditReport, Violation, audit
from cardfence.engine.core import events as ev
from cardfence.engine.discovery._agent_stream import append_agent_events
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot, NewEvent

ORIGIN = "https://agent.example"
URL = f"{ORIGIN}/.well-known/agent-card.json"
STREAM = ev.agent_stream_id(ORIGIN)
CARD = card_document()
NOT_VERIFIED = (
    "signature 0 (kid 'k1', ES256) does not verify: the card was altered after it was signed, "
    "or signed with another key"
)


@pytest.fixture
def store() -> Iterator[EventStore]:
    with EventStore.open("sqlite://") as opened:
        yield opened


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
        "violations": [violation.to_json()],
    }
    assert AuditReport(0, 0, signatures_checked=0).to_json()["signatures_checked"] == 0
