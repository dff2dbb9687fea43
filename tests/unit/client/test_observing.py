"""Pieces of the one observation path (engine/client/_observing.py) read on their own: what a
push delivery is answered, whether a task holds an artifact made of chunks (its end is then read
whole), and the agent's card revision a failure is reviewed against."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
import pytest
import sqlalchemy as sa
from support.cards import ORIGIN, card_document
from support.events import stored
from support.mocked import ScriptedAgent, engine_on, rpc_result, task_answer, task_card_as

from cardfence.engine.cards.diff import diff
from cardfence.engine.cards.model import parse_card
from cardfence.engine.client._observing import _chunked, _delivery_outcome, _truncated
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.observations import Observation
from cardfence.engine.errors import DiscoveryError, WrongTaskAnswerError
from cardfence.engine.http import deadline
from cardfence.engine.wire import push as webhook
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, Projection

AGENT = "http://agent.test"


def _changed(to: str) -> ev.StateChanged:
    return ev.StateChanged(from_="submitted", to=to, source="push", remote_timestamp=None)


def _ignored(reason: str) -> ev.ObservationIgnored:
    return ev.ObservationIgnored(
        reason=reason, state="working", source="push", remote_timestamp=None
    )


_ARTIFACT: Final = ev.ArtifactReceived(artifact_id="a", name=None, source="push")


@pytest.mark.parametrize(
    ("recorded", "outcome"),
    [
        ([_changed("working")], "applied"),
        ([_ARTIFACT], "applied"),
        ([_ignored("stale"), _changed("x")], "applied"),
        ([_ignored("duplicate")], "duplicate"),
        ([_ignored("stale")], "stale"),
        ([_ignored("stale"), _ignored("duplicate")], "duplicate"),
        ([_ignored("terminal")], "ignored"),
        ([ev.WebhookConfirmed(config_id="c")], "duplicate"),
        ([], "duplicate"),  # nothing appended: a repeat, counted
    ],
)
def test_a_delivery_is_answered_applied_duplicate_stale_or_ignored(
    recorded: list[ev.Event], outcome: str
) -> None:
    assert _delivery_outcome(recorded) == outcome


@pytest.mark.parametrize(
    ("event", "cut"),
    [
        (dataclasses.replace(_ARTIFACT, truncated=True), True),
        (dataclasses.replace(_changed("working"), payload_truncated=True), True),
        (dataclasses.replace(_ARTIFACT, truncated=False), False),
        (_changed("working"), False),
        (_ignored("stale"), False),
    ],
)
def test_an_event_says_whether_it_kept_part_of_a_report_as_its_digest(
    event: ev.Event, cut: bool
) -> None:
    assert _truncated(event) is cut


@pytest.mark.parametrize(
    ("artifacts", "chunked"),
    [
        (None, False),
        ([], False),
        ([{"artifact_id": "a"}], False),
        ([{"artifact_id": "a", "chunks": 0, "partial": False}], False),
        ([{"artifact_id": "a"}, {"artifact_id": "b", "chunks": 2}], True),
        ([{"artifact_id": "a", "partial": True}], True),
        ([{"artifact_id": "a", "chunks": 3, "partial": True}], True),
    ],
)
def test_a_task_holds_an_artifact_made_of_chunks_when_one_has_chunks_or_is_partial(
    artifacts: list[dict[str, Any]] | None, chunked: bool
) -> None:
    assert _chunked({"task": "k", "artifacts": artifacts}) is chunked


def _agent_record(store: EventStore, revision: object) -> None:
    state = {"agent": AGENT, "revision": revision}
    store.append(
        ev.agent_stream_id(AGENT),
        0,
        [NewEvent(ev.CARD_FETCHED, {"revision": revision})],
        projection=Projection(state, category=ev.AGENT_CATEGORY, alias=AGENT),
    )


@pytest.mark.parametrize(("revision", "read"), [("rev-9", "rev-9"), (None, None), (7, None)])
async def test_the_agents_recorded_revision_is_read_when_it_is_one(
    store: EventStore, revision: object, read: str | None
) -> None:
    _agent_record(store, revision)
    async with engine_on(store) as engine:
        assert engine.records.agent_revision({"task": "k", "agent": AGENT}) == read


async def test_no_agent_record_is_no_revision(store: EventStore) -> None:
    async with engine_on(store) as engine:
        assert engine.records.agent_revision({"task": "k", "agent": AGENT}) is None


async def test_an_altered_agent_record_is_no_revision_and_one_warning_naming_the_task(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    _agent_record(store, "rev-9")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE streams SET state = '[1]'"))
    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store) as engine:
        assert engine.records.agent_revision({"task": "k", "agent": AGENT}) is None
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage() == (
        "the agent's record cannot be read: the task's card is not compared"
    )
    assert (warning.task, warning.event) == ("k", "RecordUnreadable")  # type: ignore[attr-defined]
    assert warning.reason.startswith(f"stream '{ev.agent_stream_id(AGENT)}'")  # type: ignore[attr-defined]


# -- the closing read of a task a push ended -------------------------------------------------------


async def test_a_closing_read_refused_is_recorded_as_a_refused_poll(store: EventStore) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(401)).transport()
    async with engine_on(store, agent) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        await engine.observing.closing_read_now(view.task)
    last = store.read_stream(f"task:{view.task}")[-1]
    assert last.type == ev.AUTHORIZATION_FAILED
    assert (last.data["during"], last.data["status"], last.data["url"]) == (
        "poll",
        401,
        f"{ORIGIN}/a2a",
    )


async def test_a_closing_read_that_fails_is_logged_naming_the_task_and_records_nothing(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(503)).transport()
    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store, agent) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        recorded = len(store.read_stream(f"task:{view.task}"))
        caplog.clear()
        await engine.observing.closing_read_now(view.task)
    assert len(store.read_stream(f"task:{view.task}")) == recorded
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "ClosingReadFailed"]
    assert line.getMessage() == "closing read failed"
    assert line.task == view.task  # type: ignore[attr-defined]
    assert line.reason == (  # type: ignore[attr-defined]
        f"{ORIGIN}/a2a: HTTP 503 without an A2A error body (nothing was changed)"
    )


async def test_an_answer_about_another_task_is_recorded_with_its_state_and_source(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(lambda call: httpx.Response(503)).transport()
    wrong = WrongTaskAnswerError(f"{ORIGIN}/a2a", "r-1", "r-other", "completed")
    async with engine_on(store, agent) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        await engine.records.record_wrong_task(view.task, wrong, "cancel")
    ignored, flagged = store.read_stream(f"task:{view.task}")[-2:]
    assert (ignored.type, flagged.type) == (ev.OBSERVATION_IGNORED, ev.FLAGGED_FOR_REVIEW)
    assert ignored.data == {
        "reason": "wrong_task",
        "state": "completed",
        "source": "cancel",
        "remote_timestamp": None,
        "asked": "r-1",
        "answered": "r-other",
    }


def _ended(call: dict[str, Any]) -> httpx.Response:
    """GetTask: the task completed, with the artifact whose own push was lost."""
    artifact = {"artifactId": "a-1", "parts": [{"text": "the output"}]}
    return rpc_result(
        call, {**task_answer("completed", "2026-01-01T00:00:05Z"), "artifacts": [artifact]}
    )


async def test_a_closing_read_is_applied_as_a_poll(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        await engine.observing.closing_read_now(view.task)
    applied = {
        (e.type, e.data["source"])
        for e in store.read_stream(f"task:{view.task}")
        if e.type in (ev.STATE_CHANGED, ev.ARTIFACT_RECEIVED)
    }
    assert applied == {(ev.ARTIFACT_RECEIVED, "poll"), (ev.STATE_CHANGED, "poll")}


async def test_an_ended_task_is_shown_once_its_closing_read_is_done(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        before = await engine.records.state(view.task)
        engine.background.closing[view.task] = asyncio.ensure_future(
            engine.observing.closing_read_now(view.task)
        )
        shown = await engine.observing.closed(view.task, before)
    assert (shown.state, [a["artifact_id"] for a in shown.artifacts]) == ("completed", ["a-1"])


async def test_waiting_for_a_closing_read_ends_at_the_deadline_with_the_task_as_it_was(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        before = await engine.records.state(view.task)
        never = asyncio.ensure_future(asyncio.sleep(30))
        engine.background.closing[view.task] = never
        try:
            async with asyncio.timeout(5):
                with deadline.within(0.1):
                    shown = await engine.observing.closed(view.task, before)
        finally:
            never.cancel()
            del engine.background.closing[view.task]
    assert (shown.state, shown.artifacts) == ("submitted", ())


async def test_tasks_of_one_agent_revalidated_at_once_share_one_card_read(
    store: EventStore,
) -> None:
    card_reads: list[str] = []
    answer = ScriptedAgent(lambda call: httpx.Response(503)).transport()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            card_reads.append(str(request.url))
            await asyncio.sleep(0.05)  # both re-validations are in flight at once
        return answer.handle_request(request)

    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        first = await engine.start_task(ORIGIN, skill="echo", text="one")
        second = await engine.start_task(ORIGIN, skill="echo", text="two")
    mocked = httpx.MockTransport(handler)
    async with engine_on(store, mocked) as engine:
        await asyncio.gather(
            engine.observing.revalidate(first.task), engine.observing.revalidate(second.task)
        )
    assert card_reads == [f"{ORIGIN}/.well-known/agent-card.json"]


async def test_a_revalidation_just_after_a_read_is_answered_from_the_card_read(
    store: EventStore,
) -> None:
    card_reads: list[str] = []
    answer = ScriptedAgent(_ended).transport()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            card_reads.append(str(request.url))
        return answer.handle_request(request)

    mocked = httpx.MockTransport(handler)
    async with engine_on(store, mocked) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="one")
        await engine.observing.revalidate(view.task)
    assert card_reads == [f"{ORIGIN}/.well-known/agent-card.json"]  # creation's (R2) only


@pytest.mark.parametrize("push_mode", [False, True])
async def test_an_extended_card_not_read_again_has_the_public_card_stand_in(
    store: EventStore, push_mode: bool
) -> None:
    """R7 for a task created under the extended card: what the revalidation records is what
    ``guards.reconcile_stand_in`` decides on the task, the public card or its failure, and why
    the extended card was not read."""
    unread = DiscoveryError(f"{ORIGIN}/a2a", "extended_card", "AuthorizationFailedError: 401")
    failure = DiscoveryError(ORIGIN, "network", "connection refused")
    document = card_document()
    document["capabilities"]["pushNotifications"] = False
    public = parse_card(json.dumps(document).encode())
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        if push_mode:
            await engine.records.record(view.task, [_registered()])
        state = await engine.records.state(view.task)
        decided = []
        for card, failed in ((public, None), (None, failure)):
            task_card_as(engine, card, failed, unread)
            mark = len(store.read_stream(f"task:{view.task}"))
            await engine.observing.revalidate(view.task)
            recorded = store.read_stream(f"task:{view.task}")[mark:]
            expected = guards.reconcile_stand_in(state, card, failed, unread)
            assert [(e.type, e.data) for e in recorded] == stored(expected)
            decided.append([e.type for e in recorded])
            state = await engine.records.state(view.task)
    unavailable = ev.DISCOVERY_UNAVAILABLE
    downgraded = [unavailable, ev.DELIVERY_DOWNGRADED] if push_mode else [unavailable]
    assert decided == [downgraded, [unavailable] * 2]


def _serving(
    document: dict[str, Any] | None, card_reads: list[str] | None = None, delay: float = 0.0
) -> httpx.MockTransport:
    """The agent of ``ScriptedAgent(_ended)``, its card now ``document`` (None: 503); each card read
    kept in ``card_reads`` when given, answered after ``delay`` seconds."""
    answer = ScriptedAgent(_ended).transport()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            return answer.handle_request(request)
        if card_reads is not None:
            card_reads.append(str(request.url))
        await asyncio.sleep(delay)
        return httpx.Response(503) if document is None else httpx.Response(200, json=document)

    return httpx.MockTransport(handler)


async def test_a_revalidation_records_what_changed_since_the_revision_the_task_last_saw(
    store: EventStore,
) -> None:
    v2 = card_document()
    v2["version"] = "2.0.0"
    v2["description"] = "An agent, revised."
    v3 = card_document()
    v3["version"] = "3.0.0"
    v3["skills"][0]["description"] = "Echoes, and more."
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    for document in (v2, v3, None):  # each read by an engine of its own: nothing remembered
        mocked = _serving(document)
        async with engine_on(store, mocked) as engine:
            state = await engine.records.state(view.task)
            previous = engine.records.card(state["latest_card_revision"])
            assert previous is not None
            mark = len(store.read_stream(f"task:{view.task}"))
            await engine.observing.revalidate(view.task)
        recorded = [(e.type, e.data) for e in store.read_stream(f"task:{view.task}")[mark:]]
        if document is None:
            failure = DiscoveryError(ORIGIN, "http_status", "")
            assert [(t, d["kind"], d["during"]) for t, d in recorded] == [
                (ev.DISCOVERY_UNAVAILABLE, failure.kind, "revalidation")
            ]
            continue
        card = parse_card(json.dumps(document).encode())
        assert recorded == stored(guards.reconcile_card(state, card, None, previous))
        assert recorded[0][1]["changes"] == diff(previous, card).to_json() != {}


# -- push deliveries ------------------------------------------------------------------------------

TOKEN = "the-webhook-token"
HEADERS = {"content-type": "application/json", "x-a2a-notification-token": TOKEN}


def _registered() -> ev.WebhookRegistered:
    """Webhook ``cf-1`` registered with :data:`TOKEN`, as a creation records it."""
    return ev.WebhookRegistered(
        config_id="cf-1",
        url="https://hooks.test/w",
        token_sha256=webhook.digest(TOKEN),
        auth_sha256=None,
        status="provisional",
        card_revision=None,
    )


async def _with_webhook(engine: Engine) -> str:
    """A task bound to remote task ``r-1``, its webhook registered with :data:`TOKEN`."""
    view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    await engine.records.record(view.task, [_registered()])
    return view.task


def _status_push(text: str, forms: int = 0) -> bytes:
    parts = [{"text": text}, *({"data": {"field": n}} for n in range(forms))]
    message = {"messageId": "m-9", "role": "ROLE_AGENT", "parts": parts}
    status = {
        "state": "TASK_STATE_WORKING",
        "timestamp": "2026-01-01T00:00:03Z",
        "message": message,
    }
    return json.dumps(
        {"statusUpdate": {"taskId": "r-1", "contextId": "c-1", "status": status}}
    ).encode()


async def test_a_push_whose_record_would_be_over_the_limit_is_refused_413_naming_the_task(
    tmp_path: Any,
) -> None:
    limit = 8 * 1024
    small = EventStore.open(f"sqlite:///{tmp_path / 'small.db'}", max_projection_bytes=limit)
    with small:
        async with engine_on(small, ScriptedAgent(_ended).transport()) as engine:
            key = await _with_webhook(engine)
            before = len(small.read_stream(f"task:{key}"))
            # R17: content is out of line; the outlines of many parts still weigh
            answered = await engine.deliver(_status_push("x", forms=limit // 64), HEADERS)
        assert len(small.read_stream(f"task:{key}")) == before  # nothing written
    assert (answered.status, answered.outcome, answered.task) == (413, "refused", key)
    assert re.fullmatch(
        rf"stream 'task:{key}': projection is \d+ bytes, over the {limit}-byte limit "
        r"\(nothing was written\)",
        answered.detail,
    )


async def test_a_pushed_message_is_answered_ignored_naming_the_task(store: EventStore) -> None:
    message = {"messageId": "m-9", "role": "ROLE_AGENT", "parts": [{"text": "hi"}], "taskId": "r-1"}
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        key = await _with_webhook(engine)
        answered = await engine.deliver(json.dumps({"message": message}).encode(), HEADERS)
    assert answered == webhook.Delivery(200, "ignored", "a message, not a task update", key)


async def test_a_pushed_transition_is_applied_and_wakes_a_drive_waiting_on_the_task(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        key = await _with_webhook(engine)
        waiting = engine.observing.pushed[key] = asyncio.Event()
        answered = await engine.deliver(_status_push("working on it"), HEADERS)
        await engine.settle()  # R6's boundary re-check it set off
    assert answered == webhook.Delivery(200, "applied", "", key)
    assert waiting.is_set()


# -- R6: the boundary re-check ---------------------------------------------------------------------


async def test_a_boundary_recheck_reads_the_card_again_even_just_after_a_read(
    store: EventStore,
) -> None:
    card_reads: list[str] = []
    mocked = _serving(card_document(), card_reads)
    async with engine_on(store, mocked) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        await engine.observing.boundary_recheck(view.task)
    assert len(card_reads) == 2  # creation's, and the re-check's own (R6: not the memo)


async def test_boundary_rechecks_of_one_agent_at_once_share_one_read(store: EventStore) -> None:
    card_reads: list[str] = []
    mocked = _serving(card_document(), card_reads, delay=0.05)
    async with engine_on(store, mocked) as engine:
        first = await engine.start_task(ORIGIN, skill="echo", text="one")
        second = await engine.start_task(ORIGIN, skill="echo", text="two")
        card_reads.clear()
        await asyncio.gather(
            engine.observing.boundary_recheck(first.task),
            engine.observing.boundary_recheck(second.task),
        )
    assert len(card_reads) == 1


async def test_a_boundary_recheck_that_finds_push_withdrawn_switches_to_polling(
    store: EventStore,
) -> None:
    withdrawn = card_document()
    withdrawn["capabilities"]["pushNotifications"] = False
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        key = await _with_webhook(engine)
    async with engine_on(store, _serving(withdrawn)) as engine:
        await engine.observing.boundary_recheck(key)
        state = await engine.records.state(key)
    last = store.read_stream(f"task:{key}")[-1]
    assert (last.type, last.data["reason"]) == (ev.DELIVERY_DOWNGRADED, "push_withdrawn")
    assert state["delivery_mode"] == "polling"


# -- what an applied report sets off: the closing read --------------------------------------------


@pytest.mark.parametrize(
    ("source", "whole", "before", "after", "chunked", "closing"),
    [
        ("push", False, "working", "completed", False, True),
        ("push", False, "submitted", "failed", False, True),
        ("push", True, "working", "completed", False, False),  # the whole task: nothing lost
        ("push", False, "working", "input-required", False, False),  # not ended
        ("push", False, "completed", "completed", False, False),  # ended before
        ("poll", False, "working", "completed", True, False),  # a poll read it whole
        ("stream", False, "working", "completed", True, True),  # chunks: read it whole
        ("stream", False, "working", "completed", False, False),  # a stream loses nothing
        ("send", False, "working", "completed", True, False),
    ],
)
async def test_an_ended_task_is_read_once_more_after_a_push_or_a_chunked_stream(
    store: EventStore,
    source: str,
    whole: bool,
    before: str,
    after: str,
    chunked: bool,
    closing: bool,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        state = await engine.records.state(view.task)
        artifacts = [{"artifact_id": "a-1", "chunks": 2}] if chunked else []
        observed = Observation(source=source, state=after)
        was, now = {**state, "state": before}, {**state, "state": after, "artifacts": artifacts}
        engine.observing.observed(view.task, observed, was, now, whole=whole)
        job = engine.background.closing.get(view.task)
        assert (job is not None) == closing
        if job is not None:
            engine.observing.observed(view.task, observed, was, now, whole=whole)
            assert engine.background.closing[view.task] is job  # one closing read at a time
            await job
            await asyncio.sleep(0)  # its done callback
            assert view.task not in engine.background.closing


async def test_a_boundary_recheck_whose_read_fails_records_the_card_unavailable(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        key = await _with_webhook(engine)
    async with engine_on(store, _serving(None)) as engine:
        await engine.observing.boundary_recheck(key)
    last = store.read_stream(f"task:{key}")[-1]
    assert (last.type, last.data["kind"], last.data["during"]) == (
        ev.DISCOVERY_UNAVAILABLE,
        "http_status",
        "boundary_recheck",
    )


@pytest.mark.parametrize(
    ("before", "after", "rechecked"),
    [
        ("submitted", "working", True),
        ("working", "working", False),  # no boundary crossed (an artifact, a message)
        ("working", "completed", False),  # ended: nothing left to wait for
    ],
)
async def test_a_push_mode_task_is_rechecked_when_it_crosses_a_live_boundary(
    store: EventStore, before: str, after: str, rechecked: bool
) -> None:
    card_reads: list[str] = []
    async with engine_on(store, _serving(card_document(), card_reads)) as engine:
        key = await _with_webhook(engine)
        state = await engine.records.state(key)
        card_reads.clear()
        observed = Observation(source="poll", state=after)
        engine.observing.observed(
            key, observed, {**state, "state": before}, {**state, "state": after}, whole=True
        )
        await engine.settle()
    assert bool(card_reads) == rechecked


async def test_a_report_observed_is_taken_as_one_event_and_what_it_recorded_is_given(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        recorded: list[Any] = []
        stamp = datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC)
        pushed = Observation(source="push", state="completed", remote_timestamp=stamp)
        await engine.observing.observe_state(view.task, pushed, recorded)
        job = engine.background.closing.get(view.task)  # one event of the task: read it whole once
        assert job is not None
        await job
    [changed] = recorded
    assert isinstance(changed, ev.StateChanged)
    assert changed.to == "completed"


# -- one report applied: what the store's half adds to the lifecycle's decision ------------------


async def _applied(engine: Engine, key: str, observation: Observation) -> list[Any]:
    recorded: list[Any] = []
    await engine.observing.observe_state(key, observation, recorded)
    return recorded


def _flags(recorded: list[Any]) -> dict[str, str]:
    return {e.reason: e.detail for e in recorded if isinstance(e, ev.FlaggedForReview)}


async def test_a_report_without_a_receipt_time_is_stamped_on_arrival_bounding_its_timestamp(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        ahead = datetime.now(UTC) + timedelta(hours=1)
        arrived = datetime.now(UTC)
        recorded = await _applied(
            engine, view.task, Observation(source="poll", state="working", remote_timestamp=ahead)
        )
        done = datetime.now(UTC)
    changed = next(e for e in recorded if isinstance(e, ev.StateChanged))
    assert changed.clock_skew is True
    assert changed.remote_timestamp is None
    stamped = re.search(r"ahead of its receipt at (\S+);", _flags(recorded)["clock_skew"])
    assert stamped is not None
    assert arrived <= datetime.fromisoformat(stamped[1]) <= done


async def test_a_report_keeps_the_receipt_time_it_came_with(store: EventStore) -> None:
    # Received (by this report's own account) an hour from now: its timestamp, 10 s later, is
    # within the bound of that receipt, and would not be of one stamped now.
    received = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    stamp = received + timedelta(seconds=10)
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        observed = Observation(
            source="poll", state="working", remote_timestamp=stamp, received_at=received
        )
        recorded = await _applied(engine, view.task, observed)
    changed = next(e for e in recorded if isinstance(e, ev.StateChanged))
    assert datetime.fromisoformat(changed.remote_timestamp) == stamp
    assert "clock_skew" not in changed.payload()
    assert not _flags(recorded)


@pytest.mark.parametrize(("max_clock_skew", "skewed"), [(5.0, True), (60.0, False)])
async def test_the_engines_clock_skew_bound_decides_which_timestamps_order_reports(
    store: EventStore, max_clock_skew: float, skewed: bool
) -> None:
    now = datetime.now(UTC)
    config = EngineConfig(max_clock_skew=max_clock_skew)
    async with engine_on(store, ScriptedAgent(_ended).transport(), config) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        observed = Observation(
            source="poll", state="working", remote_timestamp=now + timedelta(seconds=30),
            received_at=now,
        )  # fmt: skip
        recorded = await _applied(engine, view.task, observed)
    assert ("clock_skew" in _flags(recorded)) is skewed
    if skewed:
        assert f"more than {max_clock_skew:g} s ahead" in _flags(recorded)["clock_skew"]


async def test_a_report_in_another_context_is_applied_and_flagged_naming_both_contexts(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        observed = Observation(source="push", state="working", remote_context_id="c-other")
        recorded = await _applied(engine, view.task, observed)
    assert [e.type for e in recorded] == [ev.STATE_CHANGED, ev.FLAGGED_FOR_REVIEW]
    assert _flags(recorded) == {
        "context_mismatch": "the task's context is c-1, a report named c-other"
    }


def _card_revised(store: EventStore, revision: str) -> None:
    """The agent's record now holds ``revision`` (a later read saw the card revised)."""
    stream_id = ev.agent_stream_id(ORIGIN)
    head = store.stream(stream_id)
    assert head is not None
    store.append(
        stream_id,
        head.version,
        [NewEvent(ev.CARD_FETCHED, {"revision": revision})],
        projection=Projection(
            {**head.state, "revision": revision}, category=ev.AGENT_CATEGORY, alias=ORIGIN
        ),
    )


@pytest.mark.parametrize(
    ("message", "revised", "flagged"),
    [
        (None, True, True),  # failed bare after the card moved: for review (R11)
        ("out of quota", True, False),  # it said why
        (None, False, False),  # the card the task was created under: nothing to review
    ],
)
async def test_a_bare_failure_after_the_card_was_revised_is_flagged_naming_the_revision(
    store: EventStore, message: str | None, revised: bool, flagged: bool
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        if revised:
            _card_revised(store, "rev-next")
        observed = Observation(source="poll", state="failed", message=message)
        recorded = await _applied(engine, view.task, observed)
    assert next(e.to for e in recorded if isinstance(e, ev.StateChanged)) == "failed"
    reviews = [e for e in recorded if isinstance(e, ev.FlaggedForReview)]
    expected = ev.FlaggedForReview(
        reason="revision_skew",
        detail="failed without a diagnostic after the card revision changed",
        revision="rev-next",
    )
    assert reviews == ([expected] if flagged else [])


async def test_the_first_push_confirms_the_webhook_naming_its_config(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        key = await _with_webhook(engine)
        first = await _applied(engine, key, Observation(source="push", state="working"))
        then = await _applied(engine, key, Observation(source="push", state="input-required"))
        state = await engine.records.state(key)
    assert ev.WebhookConfirmed(config_id="cf-1") in first
    assert ev.WEBHOOK_CONFIRMED not in [e.type for e in then]  # confirmed once
    assert state["webhook"]["status"] == "confirmed"


async def test_a_repeated_report_is_counted_on_the_tasks_next_event(store: EventStore) -> None:
    stamp = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)
    working = Observation(source="poll", state="working", remote_timestamp=stamp)
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        assert await _applied(engine, view.task, working)
        assert await _applied(engine, view.task, working) == []  # a repeat: nothing appended
        await _applied(engine, view.task, Observation(source="poll", state="completed"))
        state = await engine.records.state(view.task)
    assert state["repeats_ignored"] == 1


async def test_a_report_without_a_state_that_adds_nothing_is_not_counted_as_a_repeat(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_ended).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        records = await _applied(engine, view.task, Observation(source="push", state=None))
        await _applied(engine, view.task, Observation(source="poll", state="completed"))
        state = await engine.records.state(view.task)
    assert records == []
    assert state.get("repeats_ignored", 0) == 0
