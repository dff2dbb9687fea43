"""The human renderings: every catalogued event in words, anything else shown safely, and a task's
path as a mermaid state diagram with the lifecycle's own state ids."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table
from support.cards import card_document

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.cli._render import describe, summary, task_path, task_table, timeline
from cardfence.engine.client._records import _authorization_failed
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import (
    downgrade,
    reconcile_card,
    resume_check,
    throttled,
    unavailable,
)
from cardfence.engine.core.lifecycle import mermaid as lifecycle_mermaid
from cardfence.engine.core.observations import ArtifactRecord, Observation, apply_observation
from cardfence.engine.core.replay import fold_task, initial_task_state
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import AuthorizationFailedError, DiscoveryError
from cardfence.store.records import GENESIS_HASH, RecordedEvent

CARD_URL = "http://a.test/.well-known/agent-card.json"
BASE = card_document("http://a.test/rpc", capabilities={"pushNotifications": True})
T0 = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


def card(change: Any = None) -> AgentCard:
    doc = copy.deepcopy(BASE)
    if change is not None:
        change(doc)
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


def recorded(
    type_: str,
    data: Any,
    version: int = 1,
    *,
    payload: str | None = None,
    stream_id: str | None = None,
) -> RecordedEvent:
    """The event as stored, on an agent's stream for a type of the agent stream (the one
    ``TaskCreationRefused`` of :data:`PAYLOADS` included), else on the task ``k``'s."""
    if stream_id is None:
        stream_id = "agent:http://a.test" if type_ in ev.AGENT_EVENTS else "task:k"
    return RecordedEvent(
        position=version + 10, stream_id=stream_id, version=version, type=type_, schema_version=1,
        payload=json.dumps(data) if payload is None else payload,
        recorded_at=T0 + timedelta(seconds=version), prev_hash=GENESIS_HASH, hash="0" * 64,
    )  # fmt: skip


def _first(events: Sequence[ev.Event], type_: str) -> dict[str, Any]:
    return next(event.payload() for event in events if event.type == type_)


def representative_payloads() -> dict[str, dict[str, Any]]:
    """One payload per catalogued type, made by the recording code itself where it is pure, else
    with exactly the fields the engine and discovery record (engine/client/,
    engine/discovery/reads.py)."""
    old, new = card(), card()
    task = {
        **initial_task_state("k"),
        "skill": "echo",
        "card_revision": old.revision,
        "latest_card_revision": old.revision,
        "contract_hash": old.contract_hash,
        "skill_hash": old.compatibility_hash("echo"),
        "endpoint": {"url": "http://a.test/rpc", "binding": "JSONRPC"},
        "delivery_mode": "push",
        "state": "working",
    }

    def rotate(doc: dict[str, Any]) -> None:
        doc["capabilities"]["pushNotifications"] = False
        doc["skills"] = [{"id": "other", "name": "Other", "description": "other"}]
        doc["securitySchemes"] = {"mtls": {"mtlsSecurityScheme": {}}}

    new = card(rotate)
    reconciled = reconcile_card(task, new, None, old)
    moved = card(lambda d: d["supportedInterfaces"][0].update(url="https://b.test/rpc"))
    orphaned = resume_check(task, new, None).events
    relocated = resume_check(task, moved, None).events
    failure = DiscoveryError(CARD_URL, "http_status", "503")
    observed = apply_observation(
        {**initial_task_state("k")},
        Observation(
            source="poll", state="working", remote_timestamp=T0, message="on it",
            artifacts=(ArtifactRecord("a1", "answer", ({"text": "42"},)),),
            remote_task_id="r1", remote_context_id="c1",
        ),
    )  # fmt: skip
    ignored = apply_observation(task, Observation(source="push", state="unknown"))
    payloads: dict[str, dict[str, Any]] = {
        ev.CARD_FETCHED: {
            "url": CARD_URL, "status": 200, "revision": old.revision, "version": "1.0.0",
            "etag": '"e1"', "last_modified": None, "contract_hash": old.contract_hash,
            "push_notifications": True, "fetched_at": T0.isoformat(),
        },
        ev.DISCOVERY_FAILED: {
            "url": CARD_URL, "kind": "http_status", "detail": "503", "at": T0.isoformat()
        },
        ev.CONTRACT_PINNED: {"contract_hash": old.contract_hash, "revision": old.revision},
        ev.CONTRACT_ACCEPTED: {
            "previous": old.contract_hash, "contract_hash": new.contract_hash,
            "revision": new.revision,
        },
        ev.TASK_CREATION_REFUSED: {
            "reason": "skill_absent", "detail": "skill 'x' is absent", "skill": "x",
            "at": T0.isoformat(),
        },
        ev.TASK_SUBMITTED: {
            "task": "k", "agent": "http://a.test", "agent_url": "http://a.test",
            "card_url": CARD_URL, "skill": "echo", "message_id": "m-1", "context_id": "c-1",
            "text": "echo hi", "media_type": "text/plain", "card_revision": old.revision,
            "card_version": "1.0.0", "contract_hash": old.contract_hash,
            "skill_hash": old.compatibility_hash("echo"),
            "endpoint": {"url": "http://a.test/rpc", "binding": "JSONRPC"},
            "submitted_at": T0.isoformat(),
        },
        ev.STATE_CHANGED: _first(observed, ev.STATE_CHANGED),
        ev.ARTIFACT_RECEIVED: _first(observed, ev.ARTIFACT_RECEIVED),
        ev.OBSERVATION_IGNORED: _first(ignored, ev.OBSERVATION_IGNORED),
        ev.WEBHOOK_REGISTERED: {
            "config_id": "cf-1", "url": "http://me.test/webhook", "token_sha256": "t" * 64,
            "auth_sha256": None, "status": "provisional", "card_revision": old.revision,
        },
        ev.WEBHOOK_CONFIRMED: {"config_id": "cf-1"},
        ev.DELIVERY_DOWNGRADED: downgrade("push_not_advertised", "card says no push").payload(),
        ev.DISCOVERY_UNAVAILABLE: unavailable(failure, "revalidation").payload(),
        ev.CARD_REVISION_CHANGED: _first(reconciled, ev.CARD_REVISION_CHANGED),
        ev.FLAGGED_FOR_REVIEW: _first(reconciled, ev.FLAGGED_FOR_REVIEW),
        ev.CONTRACT_DIVERGED: _first(reconciled, ev.CONTRACT_DIVERGED),
        ev.TASK_ORPHANED: _first(list(orphaned), ev.TASK_ORPHANED),
        ev.ENDPOINT_MOVED: _first(list(relocated), ev.ENDPOINT_MOVED),
        ev.ENDPOINT_UNREACHABLE: {
            "url": "http://a.test/rpc", "detail": "http://a.test/rpc: HTTP 404", "during": "poll"
        },
        ev.CANCEL_REQUESTED: {"at": T0.isoformat()},
        ev.CANCEL_REFUSED: {"code": -32002, "detail": "task is not cancelable"},
        ev.REPLY_SENT: {"message_id": "m-2", "chars": 2},
        ev.DEADLINE_EXCEEDED: {"state": "working", "seconds": 5.0, "until": "terminal"},
        ev.AUTHORIZATION_FAILED: _authorization_failed(
            AuthorizationFailedError("http://a.test/rpc", 401, schemes=("bearer",)), "poll"
        ).payload(),
        ev.THROTTLED: throttled(
            {"flags": []}, "http://a.test/rpc", 429, 20.0, 20.0, "poll"
        )[0].payload(),
        ev.CREDENTIALS_MOVED: {
            "old": "http://a.test", "new": "http://b.test", "revision": "r" * 64,
            "at": T0.isoformat(),
        },
        ev.CREDENTIALS_MISSING: {
            "reason": "credentials_missing", "skill": "echo", "at": T0.isoformat(),
            "detail": "[bearer]: bearer not configured",
        },
    }  # fmt: skip
    return payloads


PAYLOADS = representative_payloads()


def test_the_payloads_cover_exactly_the_event_catalogue() -> None:
    assert set(PAYLOADS) == ev.KNOWN_EVENTS


@pytest.mark.parametrize("type_", sorted(ev.KNOWN_EVENTS))
def test_every_catalogued_event_type_renders_in_words_not_as_json(type_: str) -> None:
    data = PAYLOADS[type_]
    event = recorded(type_, data)
    words = describe(ev.stream_event(event.stream_id, type_, data))
    shown = summary(event)

    assert words, f"{type_} has no words"
    assert shown == words
    assert not shown.startswith(type_)  # the fallback's form
    assert "{" not in shown, shown
    assert '":' not in shown, shown


def test_the_words_say_what_the_payload_says() -> None:
    def said(type_: str) -> str:
        return summary(recorded(type_, PAYLOADS[type_]))

    assert said(ev.STATE_CHANGED) == "submitted → working  via poll  “on it”"
    assert said(ev.REPLY_SENT) == "reply of 2 characters sent (message m-2)"
    assert said(ev.CANCEL_REFUSED) == (
        "the remote refused to cancel (code -32002): task is not cancelable"
    )
    assert said(ev.DEADLINE_EXCEEDED) == "still working after 5.0s waiting for terminal"
    assert (
        said(ev.ENDPOINT_MOVED) == "http://a.test/rpc (JSONRPC) → https://b.test/rpc (JSONRPC 1.0)"
    )
    assert "during poll" in said(ev.ENDPOINT_UNREACHABLE)
    assert "cf-1" in said(ev.WEBHOOK_CONFIRMED)
    diverged = PAYLOADS[ev.CONTRACT_DIVERGED]
    assert said(ev.CONTRACT_DIVERGED) == (
        f"card {diverged['revision'][:12]} has contract {diverged['observed'][:12]}; "
        f"the task keeps {diverged['frozen'][:12]}"
    )


def test_a_chunk_of_an_artifact_says_it_was_appended() -> None:
    chunk = {"artifact_id": "text", "name": "text", "parts": [{"kind": "text", "text": "beta "}],
             "append": True, "source": "stream"}  # fmt: skip
    whole = {**chunk, "append": None}

    assert summary(recorded(ev.ARTIFACT_RECEIVED, chunk)) == (
        "text via stream, a chunk appended: beta "
    )
    assert summary(recorded(ev.ARTIFACT_RECEIVED, whole)) == "text via stream: beta "
    burst = {**chunk, "parts": [{"kind": "text", "text": "beta gamma "}], "chunks": 2}
    assert summary(recorded(ev.ARTIFACT_RECEIVED, burst)) == (
        "text via stream, 2 chunks appended: beta gamma "
    )


def test_an_artifact_kept_over_another_version_in_its_report_says_so() -> None:
    kept = {"artifact_id": "a1", "name": None, "parts": [{"kind": "text", "text": "final"}],
            "source": "poll", "dropped": [{"bytes": 70, "sha256": "ab" * 32}]}  # fmt: skip

    assert summary(recorded(ev.ARTIFACT_RECEIVED, kept)) == (
        "a1 via poll, 1 other version in the report dropped: final"
    )


def test_a_task_submitted_with_extensions_names_each_one() -> None:
    plain = summary(recorded(ev.TASK_SUBMITTED, PAYLOADS[ev.TASK_SUBMITTED]))
    uris = ["https://ext.example/trace/v1", "https://ext.example/geo/v2"]
    extended = {**PAYLOADS[ev.TASK_SUBMITTED], "extensions": uris}

    assert "extension" not in plain
    assert summary(recorded(ev.TASK_SUBMITTED, extended)) == (
        f"{plain}  extension {uris[0]}  extension {uris[1]}"
    )


def test_a_task_submitted_names_its_parts_its_conversation_and_its_references() -> None:
    plain = summary(recorded(ev.TASK_SUBMITTED, PAYLOADS[ev.TASK_SUBMITTED]))
    one = [{"kind": "text", "media_type": "text/plain", "text": "hi"}]
    two = [*one, {"kind": "data", "media_type": "application/json", "data": {}}]
    with_parts = {**PAYLOADS[ev.TASK_SUBMITTED], "parts": one}
    assert summary(recorded(ev.TASK_SUBMITTED, with_parts)) == plain
    continued = {
        **with_parts,
        "parts": two,
        "context_task": "k-0",
        "referenced_tasks": ["k-0", "k-9"],
    }
    assert summary(recorded(ev.TASK_SUBMITTED, continued)) == (
        f"{plain}  2 parts  continues k-0  references k-0  references k-9"
    )


def test_a_reply_of_parts_says_how_many_are_not_text() -> None:
    parts = [
        {"kind": "text", "media_type": "text/plain", "text": "hi"},
        {"kind": "file", "media_type": "application/pdf", "bytes": "JVBERg=="},
        {"kind": "data", "media_type": "application/json", "data": {}},
    ]
    reply = {**PAYLOADS[ev.REPLY_SENT], "parts": parts}
    assert summary(recorded(ev.REPLY_SENT, reply)) == (
        "reply of 2 characters and 2 other parts sent (message m-2)"
    )
    one = {**reply, "parts": parts[:2]}
    assert "and 1 other part sent" in summary(recorded(ev.REPLY_SENT, one))


def test_an_event_carrying_counted_failures_says_how_many() -> None:
    data = {"until": "terminal", "state": "working", "seconds": 5.0, ev.FAILURES_REPEATED: 7}
    said = summary(recorded(ev.DEADLINE_EXCEEDED, data))

    assert said.endswith("(after 7 more polls or card reads failed as recorded before)")
    assert "failed as recorded" not in summary(recorded(ev.DEADLINE_EXCEEDED, {"until": "x"}))


def test_an_unknown_event_type_falls_back_to_its_type_and_compact_json() -> None:
    event = recorded("SomethingNewer", {"b": [1, 2], "a": "x"})

    assert describe(ev.stream_event(event.stream_id, "SomethingNewer", event.data)) is None
    assert summary(event) == 'SomethingNewer {"a":"x","b":[1,2]}'


def test_a_payload_missing_a_key_its_class_always_holds_falls_back_to_its_type_and_json() -> None:
    partial = {"until": "terminal", "state": "working"}  # no "seconds"

    assert summary(recorded(ev.DEADLINE_EXCEEDED, partial)) == (
        'DeadlineExceeded {"state":"working","until":"terminal"}'
    )


def test_the_agents_refusal_of_a_creation_on_the_task_stream_says_what_the_agent_answered() -> None:
    refusal = ev.CreationRefusedRemotely(
        reason="remote_refused", code=-32005, message="content type not supported",
        url="http://a.test/rpc",
    )  # fmt: skip

    assert summary(recorded(refusal.TYPE, refusal.payload(), stream_id="task:k")) == (
        "the agent refused the creation at http://a.test/rpc (code -32005): "
        "content type not supported"
    )


def test_a_long_unknown_payload_is_cut_short() -> None:
    shown = summary(recorded("SomethingNewer", {"blob": "x" * 500}))

    assert shown.startswith('SomethingNewer {"blob":"xxx')
    assert shown.endswith("…")
    assert len(shown) < 130


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        (ev.STATE_CHANGED, "[1, 2]"),  # not an object
        (ev.STATE_CHANGED, "{not json"),
        (ev.CARD_REVISION_CHANGED, json.dumps({"old": 1, "new": None, "changes": "everything"})),
        (ev.ARTIFACT_RECEIVED, json.dumps({"parts": 7})),
        (ev.ARTIFACT_RECEIVED, json.dumps({"parts": [None, 3, {"text": None}]})),
        (ev.ENDPOINT_MOVED, json.dumps({"old": [1], "new": "somewhere"})),
        (ev.TASK_SUBMITTED, "{}"),
        ("", "{}"),
    ],
)
def test_a_payload_of_an_unexpected_shape_never_breaks_a_rendering(
    type_: str, payload: str
) -> None:
    event = recorded(type_, None, payload=payload)
    view = TaskView.of(initial_task_state("k"))

    assert summary(event)
    assert timeline(view, [event], None)
    assert task_path([event]).startswith("stateDiagram-v2\n")


def test_what_a_remote_said_is_printed_verbatim_never_as_markup_or_terminal_control() -> None:
    message = "[bold]not bold[/bold] [/] :smile: \x1b[31mred\x1b[0m\nsecond line"
    changed = recorded(
        ev.STATE_CHANGED,
        ev.StateChanged(
            from_="working", to="input-required", source="poll", remote_timestamp=None,
            message=message,
        ).payload(),
    )  # fmt: skip
    view = TaskView.of(fold_task("k", [(changed.type, changed.data)]))

    text = timeline(view, [changed], None, as_of="@11")

    assert text.startswith("as of @11: ")
    assert "[bold]not bold[/bold] [/] :smile:" in text
    assert "\x1b" not in text
    assert "\\x1b[31mred\\x1b[0m\\x0asecond line" in text


# -- the task list ---------------------------------------------------------------------------------


def _listed(key: str, **fields: Any) -> TaskView:
    view = TaskView.of(initial_task_state(key), datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    return dataclasses.replace(view, **fields)


def _as_rich_draws_it(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """The rendering the task list had when rich drew it (a table that fits in 160 columns)."""
    table = Table(show_edge=False, pad_edge=False)
    for column in header:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None, markup=False, emoji=False).print(table)
    return buffer.getvalue()


def test_the_task_list_looks_as_it_did_when_rich_drew_it() -> None:
    views = [
        _listed("a" * 32, remote_task_id="r-" + "9" * 30, agent="http://agent.example:8000",
                skill="echo", state="working", delivery_mode="push",
                flags=("review", "orphaned")),
        _listed("b" * 32, state="input-required"),
    ]  # fmt: skip
    rows = [
        ("aaaaaaaaaaaa", "r-9999999999", "http://agent.example:8000", "echo", "working", "push",
         "review, orphaned", "2026-01-02 03:04:05"),
        ("bbbbbbbbbbbb", "-", "-", "-", "input-required", "polling", "-", "2026-01-02 03:04:05"),
    ]  # fmt: skip
    header = ("task", "remote", "agent", "skill", "state", "delivery", "flags", "updated")

    assert task_table(views) == _as_rich_draws_it(header, rows)


def test_a_task_list_row_is_one_printable_line_whatever_its_cells_hold() -> None:
    hostile = "ski\x1b[31mll\nnext"
    text = task_table([_listed("c" * 32, skill=hostile, agent="[bold]a[/bold]")])

    assert len(text.splitlines()) == 3  # header, rule, the one row
    assert "\x1b" not in text
    assert "ski\\x1b[31mll\\x0anext" in text
    assert "[bold]a[/bold]" in text


def _timeline_rows(events: list[RecordedEvent]) -> list[tuple[str, ...]]:
    return [
        (str(e.version), f"@{e.position}", e.recorded_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
         e.type, summary(e))
        for e in events
    ]  # fmt: skip


def test_a_timeline_that_fits_looks_as_it_did_when_rich_drew_it() -> None:
    events = [recorded(type_, PAYLOADS[type_], v) for v, type_ in enumerate(sorted(PAYLOADS), 1)]
    view = TaskView.of(fold_task("k", [(ev.TASK_SUBMITTED, PAYLOADS[ev.TASK_SUBMITTED])]))
    header = ("v", "pos", "recorded (UTC)", "event", "what")
    fitting = [e for e in events if len(summary(e)) < 100]
    assert len(fitting) > 15

    body = timeline(view, fitting, None).split("\n", 2)[2]

    assert body == _as_rich_draws_it(header, _timeline_rows(fitting))


def test_a_long_what_is_wrapped_at_words_to_160_columns_and_nothing_is_cut() -> None:
    word = "w" * 300  # longer than the column: folded, where rich cut it short with "..."
    message = " ".join(["several words of a long question"] * 8 + [word, "end"])
    changed = recorded(
        ev.STATE_CHANGED,
        ev.StateChanged(
            from_="working", to="input-required", source="poll", remote_timestamp=None,
            message=message,
        ).payload(),
    )  # fmt: skip
    view = TaskView.of(fold_task("k", [(changed.type, changed.data)]))

    lines = timeline(view, [changed], None).splitlines()[2:]
    table = [line for line in lines if "│" in line]

    assert all(len(line) <= 160 for line in table)
    assert len(table) > 3  # the one row took several lines
    what = [line.split(" │ ")[-1].rstrip() for line in table]
    assert all(line.split(" │ ")[0].strip() == "" for line in table[1:])  # continuation lines
    assert "".join(what).replace(" ", "") == summary(changed).replace(" ", "")
    assert "…" not in "".join(lines)


# -- a task's path as a mermaid state diagram ------------------------------------------------------


def changes(*steps: tuple[str, str, str]) -> list[RecordedEvent]:
    out = [recorded(ev.TASK_SUBMITTED, PAYLOADS[ev.TASK_SUBMITTED])]
    for version, (from_, to, source) in enumerate(steps, start=2):
        out.append(recorded(ev.STATE_CHANGED, {"from": from_, "to": to, "source": source}, version))
        out.append(recorded(ev.REPLY_SENT, PAYLOADS[ev.REPLY_SENT], version + 100))
    return out


def test_the_path_of_an_asked_then_answered_task_is_exactly_its_transitions_in_order() -> None:
    events = changes(
        ("submitted", "working", "send"),
        ("working", "input-required", "poll"),
        ("input-required", "working", "send"),
        ("working", "completed", "push"),
    )

    assert task_path(events) == (
        "stateDiagram-v2\n"
        '    state "submitted" as submitted\n'
        '    state "working" as working\n'
        '    state "input-required" as input_required\n'
        '    state "completed" as completed\n'
        "    [*] --> submitted\n"
        "    submitted --> working : 1 send\n"
        "    working --> input_required : 2 poll\n"
        "    input_required --> working : 3 send\n"
        "    working --> completed : 4 push\n"
        "    completed --> [*]\n"
    )


def test_a_path_not_yet_terminal_has_no_final_edge_and_a_fresh_task_is_just_submitted() -> None:
    waiting = task_path(changes(("submitted", "auth-required", "poll")))
    fresh = task_path(changes())

    assert waiting.splitlines()[-1] == "    submitted --> auth_required : 1 poll"
    assert "[*]\n" not in waiting
    assert fresh == 'stateDiagram-v2\n    state "submitted" as submitted\n    [*] --> submitted\n'


def test_the_path_declares_states_as_the_lifecycle_diagram_does() -> None:
    declared = set(re.findall(r'    state "[^"]+" as \w+', lifecycle_mermaid()))
    every_state = changes(
        ("submitted", "working", "poll"), ("working", "input-required", "poll"),
        ("input-required", "auth-required", "poll"), ("auth-required", "rejected", "poll"),
        ("rejected", "failed", "poll"), ("failed", "canceled", "poll"),
        ("canceled", "completed", "poll"),
    )  # fmt: skip

    assert set(re.findall(r'    state "[^"]+" as \w+', task_path(every_state))) == declared


def test_a_state_or_source_outside_the_lifecycle_becomes_a_safe_mermaid_word() -> None:
    path = task_path(changes(("submitted", 'we"ird --> [*]', "str eam;")))

    assert '    state "we_ird --> [*]" as s_we_ird________\n' in path
    assert "    submitted --> s_we_ird________ : 1 str_eam_\n" in path
