"""What each event does to its stream's projection (engine/core/replay.py), field by field.

The engine computes the projections it writes with these same functions, so the audit's replay
agrees with any fold, a wrong one too: only a test that names the fields an event sets catches a
field set wrong, under the wrong name, or not at all. Each test folds events from the initial
state (or a given one) and compares what changed, exactly. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from support.cards import card_document
from support.events import submitted

from cardfence.engine.client.audit import audit
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import Event
from cardfence.engine.core.replay import (
    apply_agent_event,
    apply_task_events,
    fold_agent,
    fold_task,
    initial_agent_state,
    initial_task_state,
    lacking,
)
from cardfence.store.chain import content_hash
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot

ORIGIN = "https://agent.example"
GONE = "<gone>"  # a field the fold removed


def changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The fields ``after`` adds or sets otherwise than ``before``, and those it removed."""
    out = {k: v for k, v in after.items() if k not in before or before[k] != v}
    out.update({k: GONE for k in before if k not in after})
    return out


def task_after(*events: tuple[str, dict[str, Any]], state: Mapping[str, Any] | None = None) -> Any:
    return fold_task("t1", events, None if state is None else dict(state))


def task_changes(
    *events: tuple[str, dict[str, Any]], state: Mapping[str, Any] | None = None
) -> Any:
    start = initial_task_state("t1") if state is None else state
    return changed(start, task_after(*events, state=start))


def agent_changes(
    *events: tuple[str, dict[str, Any]], state: Mapping[str, Any] | None = None
) -> Any:
    start = initial_agent_state(ORIGIN) if state is None else state
    return changed(start, fold_agent(ORIGIN, events, dict(start)))


# --- what a stored projection lacks ---------------------------------------------------------------


def test_a_projection_lacking_fields_is_said_to_with_the_first_five_named() -> None:
    fields = frozenset("abcdef")
    assert lacking({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}, fields) is None
    assert lacking({"f": 1}, fields) == "lacks 5 of its fields (a, b, c, d, e)"
    assert lacking({}, fields) == "lacks 6 of its fields (a, b, c, d, e, …)"
    assert lacking({"z": 1}, frozenset("ba")) == "lacks 2 of its fields (a, b)"


# --- the agent stream -----------------------------------------------------------------------------

CARD = {
    "url": f"{ORIGIN}/.well-known/agent-card.json",
    "revision": "r1",
    "version": "2.1.0",
    "etag": '"e1"',
    "last_modified": "Sun, 06 Dec 2026 00:00:00 GMT",
    "contract_hash": "c1",
    "push_notifications": True,
    "fetched_at": "2026-12-06T00:00:00+00:00",
}


def test_a_card_read_sets_the_public_card_fields_and_counts_the_read() -> None:
    assert agent_changes((ev.CARD_FETCHED, {**CARD, "extended": False, "skills": 3})) == {
        "card_url": CARD["url"],
        "revision": "r1",
        "version": "2.1.0",
        "etag": '"e1"',
        "last_modified": CARD["last_modified"],
        "contract_hash": "c1",
        "push_notifications": True,
        "fetched_at": CARD["fetched_at"],
        "reads": 1,
    }


def test_a_card_read_without_validators_clears_those_of_the_read_before() -> None:
    bare = {"url": CARD["url"], "revision": "r2"}
    assert agent_changes((ev.CARD_FETCHED, CARD), (ev.CARD_FETCHED, bare)) == {
        "card_url": CARD["url"],
        "revision": "r2",
        "reads": 2,
    }


def test_an_extended_card_read_adds_its_own_fields_and_leaves_the_public_ones() -> None:
    extended = {**CARD, "revision": "x1", "fetched_at": "2026-12-06T01:00:00+00:00"}
    public = fold_agent(ORIGIN, [(ev.CARD_FETCHED, CARD)])
    assert agent_changes((ev.CARD_FETCHED, {**extended, "extended": True}), state=public) == {
        "extended_revision": "x1",
        "extended_fetched_at": "2026-12-06T01:00:00+00:00",
    }
    assert agent_changes((ev.CARD_FETCHED, {"revision": "x2", "extended": True})) == {
        "extended_revision": "x2",
        "extended_fetched_at": None,
    }


@pytest.mark.parametrize("type_", [ev.CONTRACT_PINNED, ev.CONTRACT_ACCEPTED])
def test_a_contract_pinned_or_accepted_is_the_agent_pinned_contract(type_: str) -> None:
    assert agent_changes((type_, {"contract_hash": "c2", "revision": "r2", "by": "me"})) == {
        "pinned_contract": "c2",
        "pinned_revision": "r2",
    }
    pinned = fold_agent(ORIGIN, [(type_, {"contract_hash": "c1", "revision": "r1"})])
    assert agent_changes((type_, {"contract_hash": "c3"}), state=pinned) == {
        "pinned_contract": "c3",
        "pinned_revision": None,
    }


@pytest.mark.parametrize("type_", [ev.TASK_CREATION_REFUSED, ev.CREDENTIALS_MISSING])
def test_a_creation_refused_on_the_agent_is_counted(type_: str) -> None:
    assert agent_changes((type_, {"reason": "x"}), (type_, {})) == {"refusals": 2}


def test_an_agent_event_of_an_unknown_type_changes_nothing_and_the_state_is_never_modified() -> (
    None
):
    state = initial_agent_state(ORIGIN)
    assert apply_agent_event(state, "FromANewerRelease", {"revision": "r9"}) == state
    apply_agent_event(state, ev.CARD_FETCHED, CARD)
    assert state == initial_agent_state(ORIGIN)


# --- the task stream: creation --------------------------------------------------------------------

SUBMITTED = {
    "agent": ORIGIN,
    "agent_url": f"{ORIGIN}/rpc",
    "card_url": f"{ORIGIN}/.well-known/agent-card.json",
    "skill": "invoices",
    "message_id": "m1",
    "context_id": "c1",
    "card_revision": "r1",
    "card_version": "2.1.0",
    "contract_hash": "h1",
    "skill_hash": "s1",
    "endpoint": {"url": f"{ORIGIN}/rpc", "binding": "JSONRPC"},
    "submitted_at": "2026-12-06T00:00:00+00:00",
    "media_type": "text/plain",
}


def test_a_submission_records_where_and_under_which_card_the_task_was_sent() -> None:
    assert task_changes((ev.TASK_SUBMITTED, {**SUBMITTED, "text": "hello"})) == {
        **SUBMITTED,
        "latest_card_revision": "r1",
    }


def test_a_submission_keeps_authorization_extended_card_and_extensions_only_when_recorded() -> None:
    extra = {
        "authorization": {"origin": ORIGIN, "schemes": ["bearer"]},
        "extended": True,
        "public_revision": "p1",
        "public_contract_hash": "ph1",
        "extensions": ("urn:a", "urn:b"),
    }
    assert task_changes((ev.TASK_SUBMITTED, {**SUBMITTED, **extra})) == {
        **SUBMITTED,
        **extra,
        "latest_card_revision": "r1",
        "extensions": ["urn:a", "urn:b"],
    }


def test_the_agent_refusing_the_creation_closes_the_task_as_never_created() -> None:
    refused = {"code": -32602, "message": "bad params", "data": {"x": 1}}
    assert task_changes((ev.TASK_CREATION_REFUSED, refused)) == {
        "closed": "never_created",
        "creation_refused": {"code": -32602, "message": "bad params"},
        "flags": ["never_created"],
    }


# --- the task stream: reports ---------------------------------------------------------------------


def test_a_transition_binds_the_remote_ids_once_and_counts() -> None:
    first = {"to": "working", "remote_task_id": "R1", "remote_context_id": "C1"}
    second = {"to": "completed", "remote_task_id": "R2", "remote_context_id": "C2"}
    assert task_changes((ev.STATE_CHANGED, first), (ev.STATE_CHANGED, second)) == {
        "state": "completed",
        "transitions": 2,
        "remote_task_id": "R1",
        "remote_context_id": "C1",
    }


def test_a_transition_moves_the_watermark_to_its_timestamp_and_generation() -> None:
    moved = {"to": "working", "remote_timestamp": "2026-12-06T00:00:01Z", "generation": 4}
    assert task_changes((ev.STATE_CHANGED, moved)) == {
        "state": "working",
        "transitions": 1,
        "remote_timestamp": "2026-12-06T00:00:01Z",
        "generation": 4,
    }


def test_a_transition_message_is_kept_with_its_parts_until_one_without_parts() -> None:
    parts = [{"kind": "data", "data": {"field": "amount"}}]
    asked = {"to": "input-required", "message": "which amount?", "message_parts": parts}
    state = task_after((ev.STATE_CHANGED, asked))
    assert changed(initial_task_state("t1"), state) == {
        "state": "input-required",
        "transitions": 1,
        "last_message": "which amount?",
        "last_message_parts": parts,
    }
    again = {"to": "working", "message": "thanks"}
    assert task_changes((ev.STATE_CHANGED, again), state=state) == {
        "state": "working",
        "transitions": 2,
        "last_message": "thanks",
        "last_message_parts": GONE,
    }
    assert task_changes((ev.STATE_CHANGED, {"to": "completed"}), state=state) == {
        "state": "completed",
        "transitions": 2,
    }


def test_an_ignored_report_is_counted_and_moves_the_watermark_only_when_it_repeats_the_state() -> (
    None
):
    stale = {"reason": "stale", "remote_timestamp": "2026-12-06T00:00:09Z", "generation": 9}
    assert task_changes((ev.OBSERVATION_IGNORED, stale)) == {"ignored": 1}
    same = {**stale, "reason": "same_state", "remote_task_id": "R1", "remote_context_id": "C1"}
    assert task_changes((ev.OBSERVATION_IGNORED, same)) == {
        "ignored": 1,
        "remote_timestamp": "2026-12-06T00:00:09Z",
        "generation": 9,
        "remote_task_id": "R1",
        "remote_context_id": "C1",
    }


def test_report_fingerprints_are_kept_as_seen_or_repeated_and_a_reply_clears_them() -> None:
    seen = (ev.STATE_CHANGED, {"to": "working", "report": "f1"})
    repeated = (ev.OBSERVATION_IGNORED, {"reason": "same_state", "report": "f1", "repeat": True})
    state = task_after(seen, repeated)
    assert changed(initial_task_state("t1"), state) == {
        "state": "working",
        "transitions": 1,
        "ignored": 1,
        "last_report": "f1",
        "reports_seen": ["f1"],
        "reports_repeated": ["f1"],
    }
    assert task_changes((ev.REPLY_SENT, {"text": "x"}), state=state) == {
        "last_report": None,
        "reports_seen": [],
        "reports_repeated": [],
    }
    assert task_changes((ev.REPLY_SENT, {"text": "x"})) == {}  # a log from before fingerprints


@pytest.mark.parametrize("counted", [ev.REPEATS_IGNORED, ev.FAILURES_REPEATED])
def test_reports_counted_not_appended_are_added_up_from_any_event(counted: str) -> None:
    assert task_changes((ev.DISCOVERY_UNAVAILABLE, {counted: 0})) == {}  # no field for nothing
    assert task_changes(
        (ev.DISCOVERY_UNAVAILABLE, {counted: 3}),
        (ev.CARD_REVISION_CHANGED, {counted: 2, "new": "r2"}),
        (ev.DISCOVERY_UNAVAILABLE, {counted: 0}),
        (ev.DISCOVERY_UNAVAILABLE, {counted: -4}),
        (ev.DISCOVERY_UNAVAILABLE, {counted: "7"}),
    ) == {counted: 5, "latest_card_revision": "r2"}


# --- the task stream: delivery, card, flags -------------------------------------------------------

WEBHOOK = {
    "config_id": "cf-1",
    "url": "https://me.test/hook",
    "token_sha256": "t",
    "auth_sha256": "a",
}


def test_a_webhook_registered_is_provisional_and_makes_the_delivery_push() -> None:
    assert task_changes((ev.WEBHOOK_REGISTERED, {**WEBHOOK, "token": "never kept"})) == {
        "webhook": {**WEBHOOK, "status": "provisional"},
        "delivery_mode": "push",
    }
    assert task_changes((ev.WEBHOOK_REGISTERED, {"config_id": "cf-2"})) == {
        "webhook": {
            "config_id": "cf-2",
            "url": None,
            "token_sha256": None,
            "auth_sha256": None,
            "status": "provisional",
        },
        "delivery_mode": "push",
    }


def test_the_first_delivery_confirms_the_webhook_and_without_one_nothing_is_confirmed() -> None:
    registered = task_after((ev.WEBHOOK_REGISTERED, WEBHOOK))
    assert task_changes((ev.WEBHOOK_CONFIRMED, {}), state=registered) == {
        "webhook": {**WEBHOOK, "status": "confirmed"}
    }
    assert task_changes((ev.WEBHOOK_CONFIRMED, {})) == {}


def test_a_delivery_downgraded_goes_back_to_polling_and_is_flagged() -> None:
    registered = task_after((ev.WEBHOOK_REGISTERED, WEBHOOK))
    assert task_changes((ev.DELIVERY_DOWNGRADED, {"reason": "x"}), state=registered) == {
        "delivery_mode": "polling",
        "flags": ["delivery_downgraded"],
    }


def test_a_card_revision_changed_is_the_latest_revision_seen() -> None:
    submitted = task_after((ev.TASK_SUBMITTED, SUBMITTED))
    assert task_changes(
        (ev.CARD_REVISION_CHANGED, {"old": "r1", "new": "r2"}), state=submitted
    ) == {"latest_card_revision": "r2"}


def test_review_flags_are_kept_sorted_and_once_each() -> None:
    assert task_changes(
        (ev.FLAGGED_FOR_REVIEW, {"reason": "skill_withdrawn"}),
        (ev.FLAGGED_FOR_REVIEW, {"reason": "revision_skew"}),
        (ev.FLAGGED_FOR_REVIEW, {"reason": "skill_withdrawn"}),
        (ev.FLAGGED_FOR_REVIEW, {}),
    ) == {"flags": ["None", "revision_skew", "skill_withdrawn"]}


def test_an_endpoint_moved_is_the_endpoint_used_and_is_flagged() -> None:
    moved = {"old": "https://a.test/rpc", "new": {"url": "https://b.test/rpc"}}
    assert task_changes((ev.ENDPOINT_MOVED, moved)) == {
        "endpoint": {"url": "https://b.test/rpc"},
        "flags": ["endpoint_moved"],
    }


def test_credentials_moved_follow_the_endpoint_only_for_a_task_that_carries_credentials() -> None:
    authorized = task_after((ev.TASK_SUBMITTED, {**SUBMITTED, "authorization": {"origin": "a"}}))
    assert task_changes((ev.CREDENTIALS_MOVED, {"new": "b"}), state=authorized) == {
        "authorization": {"origin": "b"}
    }
    assert task_changes((ev.CREDENTIALS_MOVED, {"new": "b"})) == {}


def test_a_cancel_requested_is_recorded_and_changes_no_state() -> None:
    assert task_changes((ev.CANCEL_REQUESTED, {})) == {"cancel_requested": True}


@pytest.mark.parametrize(
    ("type_", "flag"),
    [
        (ev.CONTRACT_DIVERGED, "contract_diverged"),
        (ev.TASK_ORPHANED, "orphaned"),
        (ev.DEADLINE_EXCEEDED, "deadline_exceeded"),
        (ev.AUTHORIZATION_FAILED, "credentials_rejected"),
    ],
)
def test_events_that_call_for_review_flag_the_task(type_: str, flag: str) -> None:
    assert task_changes((type_, {"reason": "x"})) == {"flags": [flag]}


@pytest.mark.parametrize(
    "type_",
    [ev.DISCOVERY_UNAVAILABLE, ev.ENDPOINT_UNREACHABLE, ev.CANCEL_REFUSED, "FromANewerRelease"],
)
def test_annotations_change_nothing_in_the_projection(type_: str) -> None:
    assert task_changes((type_, {"new": "x", "to": "failed", "reason": "y"})) == {}


# --- the task stream: artifacts -------------------------------------------------------------------


def text(value: str) -> dict[str, str]:
    return {"kind": "text", "text": value}


def test_an_artifact_started_in_several_chunks_counts_those_after_its_first() -> None:
    (record,) = task_after(
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "parts": [text("Hel")], "chunks": 3})
    )["artifacts"]
    assert record == {"artifact_id": "a", "name": None, "parts": [text("Hel")], "chunks": 2}
    (single,) = task_after((ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "chunks": 1}))["artifacts"]
    assert "chunks" not in single


def test_chunks_appended_are_counted_and_a_partial_artifact_stays_partial() -> None:
    start = {"artifact_id": "a", "parts": [text("He")], "partial": True, "name": "n"}
    (record,) = task_after(
        (ev.ARTIFACT_RECEIVED, start),
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "parts": [text("l")], "append": True}),
        (
            ev.ARTIFACT_RECEIVED,
            {"artifact_id": "a", "parts": [text("lo")], "append": True, "chunks": 4},
        ),
    )["artifacts"]
    assert record == {
        "artifact_id": "a",
        "name": "n",
        "parts": [text("Hello")],
        "partial": True,
        "chunks": 5,
    }


def test_a_chunk_appended_to_a_truncated_artifact_keeps_it_without_parts() -> None:
    truncated = {"artifact_id": "a", "truncated": True, "bytes": 9, "sha256": "d1"}
    (record,) = task_after(
        (ev.ARTIFACT_RECEIVED, truncated),
        (ev.ARTIFACT_RECEIVED, {**truncated, "bytes": 12, "sha256": "d2", "append": True}),
    )["artifacts"]
    assert record == {**truncated, "name": None, "bytes": 12, "sha256": "d2", "chunks": 1}


def test_an_artifact_replaced_keeps_the_digest_of_each_version_it_replaced_once() -> None:
    def version(digest: str | None) -> tuple[str, dict[str, Any]]:
        data: dict[str, Any] = {"artifact_id": "a", "parts": [text(str(digest))]}
        if digest is not None:
            data["sha256"] = digest
        return ev.ARTIFACT_RECEIVED, data

    state = task_after(version("d1"), version("d2"), version("d1"), version("d2"), version(None))
    assert state["artifacts"] == [{"artifact_id": "a", "name": None, "parts": [text("None")]}]
    assert state[ev.SUPERSEDED_ARTIFACTS] == {"a": ["d1", "d2"]}
    later = task_changes(version("d3"), version("d4"), state=state)
    assert later[ev.SUPERSEDED_ARTIFACTS] == {"a": ["d1", "d2", "d3"]}
    assert state[ev.SUPERSEDED_ARTIFACTS] == {"a": ["d1", "d2"]}  # the state given: untouched


def test_artifacts_are_kept_in_the_order_first_seen_and_replaced_in_place() -> None:
    state = task_after(
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "parts": [text("1")]}),
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "b", "parts": [text("2")]}),
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "name": "x", "parts": [text("3")]}),
    )
    assert [(a["artifact_id"], a["name"], a["parts"]) for a in state["artifacts"]] == [
        ("a", "x", [text("3")]),
        ("b", None, [text("2")]),
    ]
    assert ev.SUPERSEDED_ARTIFACTS not in state  # no digest, nothing kept


def test_folding_on_never_modifies_the_state_or_the_lists_it_was_given() -> None:
    state = task_after(
        (ev.ARTIFACT_RECEIVED, {"artifact_id": "a", "parts": [text("1")]}),
        (ev.STATE_CHANGED, {"to": "working", "report": "f1"}),
        (ev.OBSERVATION_IGNORED, {"reason": "same_state", "report": "f1", "repeat": True}),
    )
    frozen = {k: (list(v) if isinstance(v, list) else v) for k, v in state.items()}
    apply_task_events(
        state,
        [
            (ev.ARTIFACT_RECEIVED, {"artifact_id": "b", "parts": [text("2")]}),
            (ev.STATE_CHANGED, {"to": "completed", "report": "f2"}),
            (ev.OBSERVATION_IGNORED, {"reason": "same_state", "report": "f2", "repeat": True}),
        ],
    )
    assert state == frozen


def test_a_task_fold_goes_on_from_the_state_it_is_given() -> None:
    working = task_after((ev.STATE_CHANGED, {"to": "working"}))
    done = fold_task("t1", [(ev.STATE_CHANGED, {"to": "completed"})], working)
    assert (done["state"], done["transitions"]) == ("completed", 2)


# --------------------------------------------------------------------------------------------------
# The projections the replay folds (engine/core/replay.py), field by field, where no end-to-end test
# looks: what a failed card read leaves on the agent stream, a fold continued from a state, and the
# defaults of an artifact record and of a chunk appended to one. Pure.


def test_a_failed_card_read_is_kept_as_the_last_failure_and_counted() -> None:
    failure = {"kind": "timeout", "detail": "no answer in 5 s", "at": "2026-12-06T00:00:00+00:00"}
    state = fold_agent(ORIGIN, [(ev.DISCOVERY_FAILED, {**failure, "extra": 1})] * 2)
    assert state["last_failure"] == failure
    assert state["failures"] == 2


def test_an_agent_fold_goes_on_from_the_state_it_is_given() -> None:
    before = {**initial_agent_state(ORIGIN), "failures": 3}
    after = fold_agent(ORIGIN, [(ev.DISCOVERY_FAILED, {"kind": "http"})], before)
    assert after["failures"] == 4
    assert before["failures"] == 3  # the state given is not modified


def artifacts(*events: dict[str, object]) -> list[dict[str, object]]:
    state = fold_task("t1", [(ev.ARTIFACT_RECEIVED, data) for data in events])
    return list(state["artifacts"])


def test_an_artifact_without_a_name_or_parts_is_recorded_with_none_and_no_parts() -> None:
    assert artifacts({"artifact_id": "a"}) == [{"artifact_id": "a", "name": None, "parts": []}]


def test_a_truncated_artifact_is_recorded_without_parts() -> None:
    truncated = {"artifact_id": "a", "truncated": True, "bytes": 9, "sha256": "f" * 64}
    assert artifacts(truncated) == [{**truncated, "name": None}]


def test_a_chunk_appended_keeps_the_name_the_artifact_was_first_given() -> None:
    first = {"artifact_id": "a", "name": "answer", "parts": [{"kind": "text", "text": "Hel"}]}
    chunk = {
        "artifact_id": "a",
        "name": "other",
        "parts": [{"kind": "text", "text": "lo"}],
        "append": True,
    }
    (record,) = artifacts(first, chunk)
    assert record["name"] == "answer"
    assert record["parts"] == [{"kind": "text", "text": "Hello"}]
    assert record["chunks"] == 1


# --------------------------------------------------------------------------------------------------
# A poll or card read that fails as one of the task's last events, all such failures, did is
# counted, not appended (engine/client/tasklog.py): an agent down for a day grows the log by an
# event or two a task, not one a poll, and the count rides on the task's next event, where the fold
# adds it up (the projection stays its replay, R13).


KEY = "t-failing"
URL = "http://agent.example/a2a/jsonrpc"
REFUSED = "ConnectError: [Errno 111] Connection refused"
# An event that is no failure: the next one appended, which carries the counts.
DEADLINE = ev.DeadlineExceeded(state="submitted", seconds=30.0, until="terminal")


def _failed(detail: str = REFUSED, *, during: str = "poll", url: str = URL) -> Event:
    return ev.EndpointUnreachable(url=url, detail=detail, during=during)


def _log(store: EventStore) -> TaskLog:
    """A task log holding the task ``KEY``, created on a card whose snapshot is stored."""
    body = json.dumps(card_document())
    revision = content_hash(body)
    card_url = "http://agent.example/.well-known/agent-card.json"
    store.put_snapshot(CardSnapshot(revision, body, card_url, None, 200, datetime.now(UTC)))
    log = TaskLog(store)
    log.create(KEY, [submitted(KEY, card_url=card_url, agent_url=URL, card_revision=revision)])
    return log


def _types_and_data(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, dict(e.data)) for e in store.read_stream(task_stream_id(KEY))]


def test_the_same_failure_poll_after_poll_is_appended_once_then_counted_on_the_next_event(
    store: EventStore,
) -> None:
    log = _log(store)
    for _ in range(5):
        log.record(KEY, lambda _state: [_failed()])
    log.record(KEY, lambda _state: [DEADLINE])

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
        log.record(KEY, lambda _state: [DEADLINE])

    types = [t for t, _ in _types_and_data(store)]
    assert types.count(ev.ENDPOINT_UNREACHABLE) == 2
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == (3 - 1) + (2 - 1)
    assert audit(store).ok


def test_an_agent_down_fails_polls_and_card_reads_alike_and_each_kind_is_appended_once(
    store: EventStore,
) -> None:
    log = _log(store)
    card_down = ev.DiscoveryUnavailable(
        kind="network", detail=REFUSED, url="http://agent.example/.well-known/agent-card.json",
        during="revalidation",
    )  # fmt: skip
    for _ in range(3):  # an hour of it: polls, and a re-validation now and then
        for _ in range(4):
            log.record(KEY, lambda _state: [_failed()])
        log.record(KEY, lambda _state: [card_down])
    log.record(KEY, lambda _state: [DEADLINE])

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
    other.record(KEY, lambda _state: [DEADLINE])

    log.record(KEY, lambda _state: [_failed()])

    types = [t for t, _ in _types_and_data(store)]
    assert types[1:] == [ev.ENDPOINT_UNREACHABLE, ev.DEADLINE_EXCEEDED, ev.ENDPOINT_UNREACHABLE]
    assert audit(store).ok


def _refused(status: int, at: str) -> Event:
    return ev.AuthorizationFailed(
        url=URL, status=status, schemes=["bearer"], detail=f"HTTP {status}", during="poll", at=at
    )


def test_polls_refused_alike_are_counted_whatever_their_moment_and_another_status_is_not(
    store: EventStore,
) -> None:
    log = _log(store)
    for second in range(4):  # revoked credentials: refused poll after poll
        log.record(KEY, lambda _state, s=second: [_refused(401, f"2026-12-03T10:00:0{s}Z")])
    log.record(KEY, lambda _state: [_refused(403, "2026-12-03T10:00:05Z")])
    log.record(KEY, lambda _state: [_refused(401, "2026-12-03T10:00:06Z")])  # as before
    log.record(KEY, lambda _state: [DEADLINE])

    recorded = _types_and_data(store)
    assert [d["status"] for t, d in recorded if t == ev.AUTHORIZATION_FAILED] == [401, 403]
    assert recorded[1][1]["at"] == "2026-12-03T10:00:00Z"  # the first refusal's moment
    assert log.head(KEY).state[ev.FAILURES_REPEATED] == 3 + 1
    assert audit(store).ok
