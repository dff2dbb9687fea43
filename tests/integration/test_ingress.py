"""The webhook ingress (``cardfence.engine.serve.ingress``) over real HTTP: the app served by
uvicorn on
127.0.0.1, on the test's event loop as ``cardfence serve`` runs it beside its engine; pushes sent
by a real a2a-sdk agent (``peer``); SQLite and PostgreSQL stores (``db_url``).

Every refusal is checked against the write marks of the store: nothing is written, whatever the
defect. Forged deliveries carry the right credentials, so only the property under test differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp
from store_marks import write_marks
from support import Peer
from support.engine_fixtures import (
    FAST,
    assert_audit_ok,
    audited_engine,
    calls,
    data_of,
    events_refused,
    held_delivery,
    push_headers,
    read_answer,
    state_of,
    status_update_body,
    transitions,
    types,
    wait_until,
)

from cardfence.engine.client.creation import WebhookOutcome
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.views import TaskView
from cardfence.engine.demo.server import bind
from cardfence.engine.serve.ingress import HEALTH_PATH, READY_PATH, webhook_app
from cardfence.engine.wire.push import MAX_DELIVERY_BYTES, IngressLimits
from cardfence.store.database import normalise_url
from cardfence.store.event_store import EventStore

AUTH = "Bearer hook-secret"
CHUNK = 64 * 1024


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) on this event loop; its base URL."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or running.done(), what="uvicorn to start")
        if running.done():
            running.result()  # it failed to start: say why
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await running
        sock.close()


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[Engine]:
    """An engine on a fresh store (both databases); audited once the test is done."""
    async with audited_engine(db_url) as running:
        yield running


@pytest.fixture
async def ingress(engine: Engine) -> AsyncIterator[str]:
    """The base URL of the engine's webhook app, served on the test's loop."""
    async with serving(webhook_app(engine)) as base_url:
        yield base_url


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as http:
        yield http


async def registered_task(
    engine: Engine, peer: Peer, webhook_url: str, *, script: str = "ask"
) -> tuple[TaskView, WebhookOutcome]:
    """A task with a webhook pointing at the app; the agent's own pushes are dropped, so only
    what the test POSTs reaches the app."""
    peer.set_push_dropped(True)
    view = await engine.start_task(peer.base_url, skill=script, text=script)
    outcome = await engine.register_webhook(
        view.task, webhook_url, auth_scheme="Bearer", auth_credentials="hook-secret"
    )
    assert outcome.registered
    return view, outcome


async def post_head_only(url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST a request head and not one byte of its body; the status and JSON the server answers
    (it can only answer from the head)."""
    parsed = httpx.URL(url)
    reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
    try:
        lines = [f"POST {parsed.raw_path.decode()} HTTP/1.1", f"host: {parsed.netloc.decode()}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        fields = dict(
            line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
        )
        body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return int(head.split()[1]), json.loads(body)


def forged(view: TaskView, state: str, at: datetime) -> bytes:
    return status_update_body(view.remote_task_id or "", view.context_id, state, at)


# -- push-only progress ---------------------------------------------------------------------------


async def test_task_reaches_terminal_through_pushes_the_agent_sends_to_the_app(
    peer: Peer, engine: Engine, ingress: str
) -> None:
    peer.hold()  # the task stays working until the webhook is registered
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0")
    outcome = await engine.register_webhook(
        view.task, ingress + "/webhook", auth_scheme="Bearer", auth_credentials="hook-secret"
    )
    assert outcome.registered
    peer.release()

    # Not driven: nothing polls, so only the agent's pushes through the app can move the task.
    await wait_until(
        lambda: state_of(engine, view.task)["state"] == "completed", what="completed by push"
    )
    # The store shows `completed` a moment before the delivery that applied it has started the
    # closing read: wait for that read, then for what it records.
    await wait_until(lambda: calls(peer, "GetTask") >= 1, what="the closing read")
    await engine.settle()

    assert calls(peer, "GetTask") == 1  # only the closing read after the push that ended it
    changed = data_of(engine.store, view.task, ev.STATE_CHANGED)
    assert changed[-1]["to"] == "completed"
    assert {c["source"] for c in changed} <= {"send", "push"}
    assert changed[-1]["source"] == "push"
    assert [to for _, to in transitions(engine.store, view.task)].count("completed") == 1
    assert types(engine.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
    assert state_of(engine, view.task)["webhook"]["status"] == "confirmed"


# -- hostile requests: each refused with its code, nothing written --------------------------------

HOSTILE = [
    # (case, status)
    ("over_limit_by_content_length", 413),
    ("over_limit_chunked", 413),
    ("text_plain", 415),
    ("no_content_type", 415),
    ("malformed_json", 400),
    ("not_a_stream_response", 400),
    ("token_header_twice", 400),
    ("missing_token", 401),
    ("wrong_token", 401),
    ("wrong_authorization", 401),
    ("missing_authorization", 401),
    ("unknown_remote_task", 404),
    ("task_without_webhook", 404),
]


@pytest.mark.parametrize(("case", "status"), HOSTILE)
async def test_hostile_delivery_is_answered_with_its_code_and_writes_nothing(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient, case: str, status: int
) -> None:
    url = ingress + "/webhook"
    view, outcome = await registered_task(engine, peer, url)
    token = outcome.token or ""
    now = datetime.now(UTC)
    valid_body = forged(view, "input-required", now)
    valid_headers = push_headers(token, authorization=AUTH)
    body, headers = valid_body, dict(valid_headers)
    raw_headers: list[tuple[str, str]] | None = None
    if case == "text_plain":
        headers["content-type"] = "text/plain"
    elif case == "no_content_type":
        del headers["content-type"]
    elif case == "malformed_json":
        body = b'{"statusUpdate": {"taskId": '
    elif case == "not_a_stream_response":
        body = json.dumps({"hello": "world"}).encode()
    elif case == "token_header_twice":
        raw_headers = [*headers.items(), ("x-a2a-notification-token", "not-the-token")]
    elif case == "missing_token":
        del headers["x-a2a-notification-token"]
    elif case == "wrong_token":
        headers["x-a2a-notification-token"] = "not-the-token"
    elif case == "wrong_authorization":
        headers["authorization"] = "Bearer guessed"
    elif case == "missing_authorization":
        del headers["authorization"]
    elif case == "unknown_remote_task":
        body = status_update_body("no-such-remote-task", view.context_id, "working", now)
    elif case == "task_without_webhook":
        plain = await engine.start_task(peer.base_url, skill="ask", text="ask")
        body = forged(plain, "working", now)
    marks = write_marks(engine.store)
    snapshot = state_of(engine, view.task)

    if case == "over_limit_by_content_length":
        # The head alone says too much: answered before one byte of the body is sent.
        headers["content-length"] = str(MAX_DELIVERY_BYTES + 1)
        code, answer = await post_head_only(url, headers)
    elif case == "over_limit_chunked":

        async def ten_megabytes() -> AsyncIterator[bytes]:
            for _ in range(10 * 1024 * 1024 // CHUNK):
                yield b" " * CHUNK

        response = await client.post(url, content=ten_megabytes(), headers=headers)
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
        code, answer = response.status_code, response.json()
    else:
        sent = raw_headers if raw_headers is not None else headers
        response = await client.post(url, content=body, headers=sent)
        code, answer = response.status_code, response.json()

    assert (code, answer["outcome"]) == (status, "refused")
    assert token not in answer["detail"]
    assert "hook-secret" not in answer["detail"]
    assert write_marks(engine.store) == marks
    assert state_of(engine, view.task) == snapshot
    assert snapshot["webhook"]["status"] == "provisional"  # a refused delivery confirms nothing
    # The same delivery without the defect is applied: the refusal was for that defect alone.
    accepted = await client.post(url, content=valid_body, headers=valid_headers)
    assert (accepted.status_code, accepted.json()["outcome"]) == (200, "applied")
    assert state_of(engine, view.task)["webhook"]["status"] == "confirmed"


@contextlib.asynccontextmanager
async def bounded_ingress(
    engine: Engine, peer: Peer, limits: IngressLimits
) -> AsyncIterator[tuple[Starlette, str, TaskView, dict[str, str], bytes]]:
    """The engine's webhook app under ``limits``, served; a task registered with it; and a
    genuine delivery for that task: (app, webhook URL, task, headers, body)."""
    app = webhook_app(engine, limits=limits)
    async with serving(app) as base_url:
        url = base_url + "/webhook"
        view, outcome = await registered_task(engine, peer, url)
        headers = push_headers(outcome.token or "", authorization=AUTH)
        yield app, url, view, headers, forged(view, "input-required", datetime.now(UTC))


async def test_a_delivery_beyond_the_in_flight_bound_is_answered_503_unread_and_writes_nothing(
    peer: Peer, engine: Engine, client: httpx.AsyncClient
) -> None:
    limits = IngressLimits(deliveries=2, body_seconds=60)
    async with bounded_ingress(engine, peer, limits) as (app, url, view, headers, body):
        marks = write_marks(engine.store)
        snapshot = state_of(engine, view.task)
        async with (
            held_delivery(url, headers, body, sent=len(body) // 2),
            held_delivery(url, headers, body, sent=len(body) // 2),
        ):
            await wait_until(lambda: app.state.ingress.in_flight == 2, what="two bodies held")

            busy = await client.post(url, content=body, headers=headers)

            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["outcome"] == "refused"
            assert "2 deliveries already in flight" in busy.json()["detail"]
            assert write_marks(engine.store) == marks
            assert state_of(engine, view.task) == snapshot
        # The held senders hung up mid-body: their slots are free again, nothing was written.
        await wait_until(lambda: app.state.ingress.in_flight == 0, what="the slots to free")
        assert write_marks(engine.store) == marks
        accepted = await client.post(url, content=body, headers=headers)
        assert (accepted.status_code, accepted.json()["outcome"]) == (200, "applied")
        assert state_of(engine, view.task)["state"] == "input-required"


async def test_a_body_slower_than_its_time_limit_is_answered_408_and_writes_nothing(
    peer: Peer, engine: Engine, client: httpx.AsyncClient
) -> None:
    limits = IngressLimits(deliveries=1, body_seconds=0.5)
    async with bounded_ingress(engine, peer, limits) as (app, url, view, headers, body):
        marks = write_marks(engine.store)
        snapshot = state_of(engine, view.task)

        async with held_delivery(url, headers, body, sent=len(body) - 1) as (reader, _):
            status, _, answer = await read_answer(reader)  # the last byte never comes

        assert (status, answer["outcome"]) == (408, "refused")
        assert "within 0.5 s" in answer["detail"]
        assert write_marks(engine.store) == marks
        assert state_of(engine, view.task) == snapshot
        # Its one slot was given back: the same delivery sent whole is applied.
        assert app.state.ingress.in_flight == 0
        accepted = await client.post(url, content=body, headers=headers)
        assert (accepted.status_code, accepted.json()["outcome"]) == (200, "applied")


async def test_a_source_that_keeps_sending_refused_deliveries_is_shed_429_unread_alone(
    peer: Peer,
    engine: Engine,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = IngressLimits(refusals=3)
    async with bounded_ingress(engine, peer, limits) as (app, url, view, headers, body):
        lookups: list[str] = []
        by_remote_id = engine.log.by_remote_id

        def counted(remote_id: str) -> Any:
            lookups.append(remote_id)
            return by_remote_id(remote_id)

        monkeypatch.setattr(engine.log, "by_remote_id", counted)
        forger, agent = {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "198.51.100.2"}
        wrong = {**headers, "x-a2a-notification-token": "guessed", **forger}
        marks = write_marks(engine.store)
        snapshot = state_of(engine, view.task)

        with caplog.at_level(logging.WARNING, logger="cardfence.ingress"):
            refused = [await client.post(url, content=body, headers=wrong) for _ in range(3)]
            shed = await client.post(url, content=body, headers=wrong)
            genuine = await client.post(url, content=body, headers={**headers, **forger})

        assert [r.status_code for r in refused] == [401, 401, 401]
        assert (shed.status_code, shed.json()["outcome"]) == (429, "refused")
        assert shed.headers["retry-after"] == "20"  # one refusal is given back every 60/3 s
        assert "203.0.113.7: 3 refused within 60 s" in shed.json()["detail"]
        assert "body not read, nothing written" in shed.json()["detail"]
        # Genuine credentials from the shed source wait their turn too; nothing is looked up.
        assert genuine.status_code == 429
        assert len(lookups) == 3
        assert write_marks(engine.store) == marks
        assert state_of(engine, view.task) == snapshot
        shed_lines = [r for r in caplog.records if getattr(r, "outcome", None) == "shed"]
        assert [getattr(r, "source", None) for r in shed_lines] == ["203.0.113.7"]
        # Another source is heard as ever.
        applied = await client.post(url, content=body, headers={**headers, **agent})
        assert (applied.status_code, applied.json()["outcome"]) == (200, "applied")
        assert state_of(engine, view.task)["state"] == "input-required"
        assert app.state.ingress.refusals.shed() == 1


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"deliveries": 0}, "deliveries must be at least 1"),
        ({"body_seconds": 0.0}, "body_seconds must be more than 0"),
        ({"refusals": 0}, "refusals must be at least 1"),
    ],
)
def test_ingress_limits_below_their_minimum_are_refused(
    limits: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        IngressLimits(**limits)


def test_ingress_limits_at_their_minimum_or_off_are_accepted() -> None:
    least = IngressLimits(deliveries=1, body_seconds=0.001, refusals=1)
    assert (least.deliveries, least.body_seconds, least.refusals) == (1, 0.001, 1)
    assert IngressLimits(refusals=None).refusals is None  # no refusal budget at all


@pytest.fixture
async def idle_ingress(tmp_path: Path) -> AsyncIterator[tuple[Engine, str]]:
    """An engine on an empty SQLite store and its webhook app's base URL (nothing to audit)."""
    async with (
        Engine.connect(f"sqlite:///{tmp_path / 'cardfence.db'}") as engine,
        serving(webhook_app(engine)) as base_url,
    ):
        yield engine, base_url


async def test_get_on_the_webhook_path_is_405_and_writes_nothing(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient
) -> None:
    engine, base_url = idle_ingress
    marks = write_marks(engine.store)

    response = await client.get(base_url + "/webhook")

    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert write_marks(engine.store) == marks


async def test_the_app_serves_no_metrics_unless_asked_to(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient
) -> None:
    _, base_url = idle_ingress
    assert (await client.get(base_url + "/metrics")).status_code == 404


async def test_healthz_answers_ok_without_touching_the_store(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient
) -> None:
    engine, base_url = idle_ingress
    marks = write_marks(engine.store)

    response = await client.get(base_url + HEALTH_PATH)

    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert write_marks(engine.store) == marks


# -- repeats and reordering -----------------------------------------------------------------------


async def test_duplicate_and_out_of_order_deliveries_record_each_transition_once(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient
) -> None:
    url = ingress + "/webhook"
    view, outcome = await registered_task(engine, peer, url)
    headers = push_headers(outcome.token, authorization=AUTH)
    base = datetime.now(UTC)

    def at(seconds: float) -> datetime:
        return base + timedelta(seconds=seconds)

    async def post(state: str, when: datetime) -> tuple[int, str]:
        response = await client.post(url, content=forged(view, state, when), headers=headers)
        return response.status_code, response.json()["outcome"]

    before = transitions(engine.store, view.task)
    answers = [
        await post("working", at(0.2)),
        await post("working", at(0.2)),  # redelivered
        await post("working", at(0.1)),  # sent before the first, arriving after it
        await post("input-required", at(0.3)),
        await post("completed", at(0.5)),
        await post("completed", at(0.5)),  # redelivered
        await post("working", at(0.4)),  # sent before `completed`, arriving after it
    ]
    await engine.settle()  # the closing read the first `completed` started

    assert answers == [
        (200, "applied"),
        (200, "duplicate"),
        (200, "stale"),
        (200, "applied"),
        (200, "applied"),
        (200, "duplicate"),
        (200, "ignored"),  # a terminal state absorbs it (R10): `after_terminal`
    ]
    assert (await engine.task(view.task)).state == "completed"
    assert [to for _, to in transitions(engine.store, view.task)[len(before) :]] == [
        "working",
        "input-required",
        "completed",
    ]
    reasons = [d["reason"] for d in data_of(engine.store, view.task, ev.OBSERVATION_IGNORED)]
    assert "stale" in reasons
    assert reasons[-1] == "after_terminal"
    assert types(engine.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
    assert calls(peer, "GetTask") == 1  # the closing read: it changes no state


async def test_a_push_of_the_whole_ended_task_needs_no_closing_read(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient
) -> None:
    view, outcome = await registered_task(engine, peer, ingress + "/webhook")
    task = {
        "id": view.remote_task_id,
        "contextId": view.context_id,
        "status": {"state": "TASK_STATE_COMPLETED", "timestamp": datetime.now(UTC).isoformat()},
        "artifacts": [{"artifactId": "answer", "parts": [{"text": "42"}]}],
    }
    headers = push_headers(outcome.token, authorization=AUTH)
    gets = calls(peer, "GetTask")

    response = await client.post(
        ingress + "/webhook", content=json.dumps({"task": task}), headers=headers
    )
    await engine.settle()

    assert (response.status_code, response.json()["outcome"]) == (200, "applied")
    assert (await engine.task(view.task)).state == "completed"
    assert [a["artifact_id"] for a in data_of(engine.store, view.task, ev.ARTIFACT_RECEIVED)] == [
        "answer"
    ]
    assert calls(peer, "GetTask") == gets  # every artifact came with it: nothing to read back


async def test_a_webhook_replaced_after_the_lookup_refuses_the_old_token_and_writes_nothing(
    peer: Peer,
    engine: Engine,
    ingress: str,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ingress + "/webhook"
    view, first = await registered_task(engine, peer, url)
    # The lookup by remote id sees the task as it was; the webhook is replaced before the append
    # (another process would do it between the two).
    looked_up = engine.log.by_remote_id(view.remote_task_id or "")
    second = await engine.register_webhook(
        view.task, url, auth_scheme="Bearer", auth_credentials="hook-secret"
    )
    assert second.registered
    assert second.token != first.token
    monkeypatch.setattr(engine.log, "by_remote_id", lambda _remote_id: looked_up)
    body = forged(view, "working", datetime.now(UTC))
    marks = write_marks(engine.store)

    stale = await client.post(
        url, content=body, headers=push_headers(first.token, authorization=AUTH)
    )

    assert (stale.status_code, stale.json()["outcome"]) == (401, "refused")
    assert write_marks(engine.store) == marks
    monkeypatch.undo()
    current = await client.post(
        url, content=body, headers=push_headers(second.token, authorization=AUTH)
    )
    assert (current.status_code, current.json()["outcome"]) == (200, "applied")
    assert (await engine.task(view.task)).state == "working"


# -- failures inside the engine -------------------------------------------------------------------


async def test_a_store_failing_inside_deliver_answers_503_to_retry_and_writes_nothing(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient, db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    url = ingress + "/webhook"
    view, outcome = await registered_task(engine, peer, url)
    body = forged(view, "input-required", datetime.now(UTC))
    headers = push_headers(outcome.token, authorization=AUTH)
    marks = write_marks(engine.store)
    snapshot = state_of(engine, view.task)

    with events_refused(db_url), caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        response = await client.post(url, content=body, headers=headers)

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json() == {
        "outcome": "error",
        "detail": "the event store is unavailable: nothing written; retry later",
    }
    assert "disk is on fire" not in response.text  # the cause is in the log, not in the answer
    assert write_marks(engine.store) == marks
    assert state_of(engine, view.task) == snapshot
    [logged] = [r for r in caplog.records if r.name == "cardfence.ingress"]
    assert (logged.levelno, logged.status) == (logging.ERROR, 503)  # type: ignore[attr-defined]
    assert "disk is on fire" in logged.reason  # type: ignore[attr-defined]
    # The database took nothing half-way: the same delivery applies once it accepts events.
    again = await client.post(url, content=body, headers=headers)
    assert (again.status_code, again.json()["outcome"]) == (200, "applied")
    assert (await engine.task(view.task)).state == "input-required"


async def test_a_delivery_to_a_task_whose_record_was_altered_answers_500_and_writes_nothing(
    peer: Peer, db_url: str, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Not the audited engine: this store is broken on purpose.
    async with Engine.connect(db_url, config=FAST) as engine, serving(webhook_app(engine)) as base:
        url = base + "/webhook"
        view, outcome = await registered_task(engine, peer, url)
        stream_id = f"task:{view.task}"
        with engine.store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :id"), {"id": stream_id}
            )
        marks = write_marks(engine.store)
        body = forged(view, "input-required", datetime.now(UTC))

        with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
            response = await client.post(
                url, content=body, headers=push_headers(outcome.token, authorization=AUTH)
            )

        assert response.status_code == 500
        assert response.json() == {"outcome": "error", "detail": "internal error"}
        assert write_marks(engine.store) == marks
    [logged] = [r for r in caplog.records if r.name == "cardfence.ingress"]
    assert (logged.levelno, logged.status, logged.exc_info) == (logging.ERROR, 500, None)  # type: ignore[attr-defined]
    assert logged.reason.startswith(  # type: ignore[attr-defined]
        f"stream {stream_id!r}, its projection: the stored text is an array, not a JSON object"
    )


async def test_a_push_ending_a_task_is_applied_though_its_agents_record_was_altered(
    peer: Peer, db_url: str, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A `failed` report compares the card revision in force with the task's (R11); the agent's
    record unreadable, there is nothing to compare with, and the report is applied all the
    same: card state never holds up a task."""
    async with Engine.connect(db_url, config=FAST) as engine, serving(webhook_app(engine)) as base:
        url = base + "/webhook"
        view, outcome = await registered_task(engine, peer, url)
        agent = state_of(engine, view.task)["agent"]
        with engine.store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :id"),
                {"id": ev.agent_stream_id(agent)},
            )
        body = forged(view, "failed", datetime.now(UTC))

        with caplog.at_level(logging.WARNING, logger="cardfence.engine"):
            response = await client.post(
                url, content=body, headers=push_headers(outcome.token, authorization=AUTH)
            )

        assert (response.status_code, response.json()["outcome"]) == (200, "applied")
        assert (await engine.task(view.task)).state == "failed"
        assert transitions(engine.store, view.task)[-1][1] == "failed"
    [logged] = [r for r in caplog.records if getattr(r, "event", None) == "RecordUnreadable"]
    assert (logged.levelno, logged.task) == (logging.WARNING, view.task)  # type: ignore[attr-defined]
    assert logged.reason.startswith(f"stream {ev.agent_stream_id(agent)!r}, its projection")  # type: ignore[attr-defined]


@contextlib.contextmanager
def postgres_database(admin_url: str) -> Iterator[tuple[str, sa.Engine]]:
    """A PostgreSQL database of its own (so that cutting it off disturbs no other test): its
    URL, and an engine on the server's own database to cut it off with; dropped at the end."""
    name = f"cut_{uuid.uuid4().hex[:12]}"
    server = sa.create_engine(
        normalise_url(admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield (
            normalise_url(admin_url).set(database=name).render_as_string(hide_password=False),
            server,
        )
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
        server.dispose()


def cut_off(server: sa.Engine, url: str, *, cut: bool) -> None:
    """Refuse (``cut``) or allow again every connection to the database at ``url``; refusing
    also ends those open, as a database restarting or failing over does."""
    name = sa.make_url(url).database
    with server.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(not cut).lower()}")
        if cut:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )


@pytest.mark.postgres
async def test_a_database_that_goes_away_makes_readyz_and_deliveries_answer_503_until_back(
    peer: Peer, client: httpx.AsyncClient, pg_admin_url: str
) -> None:
    with postgres_database(pg_admin_url) as (url, server):
        async with Engine.connect(url, config=FAST) as engine, serving(webhook_app(engine)) as base:
            hook = base + "/webhook"
            view, outcome = await registered_task(engine, peer, hook)
            body = forged(view, "input-required", datetime.now(UTC))
            headers = push_headers(outcome.token, authorization=AUTH)
            assert (await client.get(base + READY_PATH)).json() == {"status": "ready"}
            marks = write_marks(engine.store)

            cut_off(server, url, cut=True)
            not_ready = await client.get(base + READY_PATH)
            refused = await client.post(hook, content=body, headers=headers)
            alive = await client.get(base + HEALTH_PATH)  # liveness does not ask the store
            cut_off(server, url, cut=False)

            assert (not_ready.status_code, not_ready.json()["status"]) == (503, "unavailable")
            assert (refused.status_code, refused.json()["outcome"]) == (503, "error")
            assert refused.headers["retry-after"] == "1"
            assert alive.status_code == 200
            assert write_marks(engine.store) == marks
            assert (await client.get(base + READY_PATH)).status_code == 200
            again = await client.post(hook, content=body, headers=headers)
            assert (again.status_code, again.json()["outcome"]) == (200, "applied")
            await engine.settle()
            assert_audit_ok(engine.store)


async def test_readyz_answers_503_when_the_store_does_not_answer_within_its_time(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient
) -> None:
    engine, base_url = idle_ingress
    assert (await client.get(base_url + READY_PATH)).json() == {"status": "ready"}
    # The store's one worker thread is busy for longer than readiness waits.
    busy = asyncio.ensure_future(engine.records.calls.run(time.sleep, 3))
    try:
        response = await client.get(base_url + READY_PATH)
    finally:
        await busy
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert (await client.get(base_url + READY_PATH)).status_code == 200


async def test_readiness_asked_many_times_at_once_reads_the_store_once(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client hammering ``/readyz`` (it is on the port agents reach) holds one store worker at
    most, never the store's every worker, so deliveries go on."""
    _, base_url = idle_ingress
    reads: list[EventStore] = []
    last_position = EventStore.last_position

    def counted(store: EventStore) -> int:
        reads.append(store)
        time.sleep(0.3)  # a slow store: every request below arrives while this read runs
        return last_position(store)

    monkeypatch.setattr(EventStore, "last_position", counted)
    answers = await asyncio.gather(*(client.get(base_url + READY_PATH) for _ in range(30)))

    assert [a.status_code for a in answers] == [200] * 30
    assert len(reads) < 5  # one read per round of requests in flight, not one per request


async def test_an_unexpected_error_inside_deliver_answers_500_without_its_cause(
    idle_ingress: tuple[Engine, str], client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    engine, ingress = idle_ingress

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug with a secret inside")

    monkeypatch.setattr(engine, "deliver", broken)
    marks = write_marks(engine.store)

    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        response = await client.post(
            ingress + "/webhook",
            content=b"{}",
            headers=push_headers("no-such-token", authorization=AUTH),
        )

    assert response.status_code == 500
    assert response.json() == {"outcome": "error", "detail": "internal error"}
    assert write_marks(engine.store) == marks
    [logged] = [r for r in caplog.records if r.name == "cardfence.ingress"]
    assert (logged.levelno, logged.status) == (logging.ERROR, 500)  # type: ignore[attr-defined]
    assert logged.exc_info is not None  # the traceback is in the log, for whoever fixes it


# -- the log --------------------------------------------------------------------------------------


async def test_each_delivery_decision_is_logged_once_without_secrets(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    url = ingress + "/webhook"
    view, outcome = await registered_task(engine, peer, url)
    token = outcome.token or ""
    body = forged(view, "input-required", datetime.now(UTC))
    good = push_headers(token, authorization=AUTH)
    wrong_auth = push_headers(token, authorization="Bearer guessed-secret")

    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        for headers in (wrong_auth, good, good):
            await client.post(url, content=body, headers=headers)

    logged = [r for r in caplog.records if r.name == "cardfence.ingress"]
    decisions = [(r.outcome, r.status) for r in logged]  # type: ignore[attr-defined]
    assert decisions == [("refused", 401), ("applied", 200), ("duplicate", 200)]
    assert [r.task for r in logged] == [None, view.task, view.task]  # type: ignore[attr-defined]
    assert [r.levelno for r in logged] == [logging.WARNING, logging.INFO, logging.INFO]
    for record in logged:
        line = record.getMessage()
        assert token not in line
        assert "hook-secret" not in line
        assert "guessed-secret" not in line
        assert "reason=" in line


async def test_a_presented_secret_echoed_by_a_refusal_is_redacted_a_short_one_where_it_stands_alone(
    peer: Peer, engine: Engine, ingress: str, client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A refusal may quote the body (here, an unknown task id): credentials the sender put
    there too are redacted from the answer and the log. One of eight characters or more is
    redacted wherever it appears; a shorter one only where it stands alone, or a token ``t``
    would blank every ``t`` of the sender's own answer."""
    url = ingress + "/webhook"
    await registered_task(engine, peer, url)  # a task of another id, with its webhook
    long_secret = "s3cret-token-value"
    cases = [  # token, Authorization credentials, remote task id -> the id as the answer quotes it
        (long_secret, "other", f"id-{long_secret}-2", "'id-[redacted]-2'"),
        ("tok", long_secret, long_secret, "'[redacted]'"),
        (long_secret[:9], long_secret, f"{long_secret}!", "'[redacted]!'"),  # not '[redacted]oken…'
        ("t", "b", "t", "'[redacted]'"),
        ("t", "b", "tt-b", "'tt-b'"),
        ("t", "b", "b t", "'[redacted] [redacted]'"),
    ]
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        for token, credentials, task_id, quoted in cases:
            body = status_update_body(task_id, None, "working", datetime.now(UTC))
            headers = push_headers(token, authorization=f"Bearer {credentials}")
            answer = await client.post(url, content=body, headers=headers)
            assert (answer.status_code, answer.json()["outcome"]) == (404, "refused")
            assert answer.json()["detail"] == f"no task with remote id {quoted}"

    lines = [r.getMessage() for r in caplog.records if r.name == "cardfence.ingress"]
    assert len(lines) == len(cases)
    for line, (_, _, _, quoted) in zip(lines, cases, strict=True):
        assert f"no task with remote id {quoted}" in line
        assert long_secret not in line
    assert "task" in lines[-1]  # the words of the line are whole
