"""What every layer of the engine stands on (``engine/engine/base.py``): an engine opened on a URL
and the client it owns, a task shown now or as of a past point, the state a follow-up starts from
without a store read, and the annotations of a refused or unreached request."""

from __future__ import annotations

import datetime as dt
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import make_tls
from support.cards import ORIGIN, card_document
from support.mocked import ScriptedAgent, answering, engine_on

from cardfence.engine import events as ev
from cardfence.engine.engine import Engine, EngineConfig, base
from cardfence.engine.engine.base import _authorization_failed, _unreachable
from cardfence.engine.errors import AuthorizationFailedError, EndpointUnreachableError
from cardfence.engine.tasklog import AsOf
from cardfence.store import CardSnapshot, EventStore, LeaseLostError
from cardfence.store.chain import content_hash


def test_a_refused_request_is_recorded_with_what_was_refused_and_when() -> None:
    refused = AuthorizationFailedError(f"{ORIGIN}/a2a", 403, schemes=("bearer",))
    before = dt.datetime.now(dt.UTC)
    kind, data = _authorization_failed(refused, "poll")
    after = dt.datetime.now(dt.UTC)
    at = dt.datetime.fromisoformat(data.pop("at"))
    assert kind == ev.AUTHORIZATION_FAILED
    assert data == {
        "url": f"{ORIGIN}/a2a",
        "status": 403,
        "schemes": ["bearer"],
        "detail": str(refused),
        "during": "poll",
    }
    assert "HTTP 403: the agent refused credentials of bearer" in data["detail"]
    assert before - dt.timedelta(seconds=1) <= at <= after + dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    ("failure", "url"),
    [
        (EndpointUnreachableError(f"{ORIGIN}/a2a", "HTTP 503"), f"{ORIGIN}/a2a"),
        (TimeoutError("read timed out"), ""),  # a failure that names no URL
    ],
)
def test_an_unreached_endpoint_is_recorded_with_its_url_and_why(
    failure: Exception, url: str
) -> None:
    assert _unreachable(failure, "cancel") == {
        "url": url,
        "detail": str(failure),
        "during": "cancel",
    }


async def test_an_engine_opened_on_a_url_owns_its_client_and_closes_it() -> None:
    engine = Engine.open("sqlite://")
    client = engine.client
    await engine.aclose()
    assert client.is_closed


async def test_an_engine_opened_with_a_client_leaves_it_open() -> None:
    async with httpx.AsyncClient() as client:
        engine = Engine.open("sqlite://", client=client)
        await engine.aclose()
        assert not client.is_closed


async def test_an_engine_opened_on_a_url_trusts_only_the_configured_authorities(
    tmp_path: Path,
) -> None:
    tls = make_tls(tmp_path)
    engine = Engine.open("sqlite://", config=EngineConfig(ca_file=str(tls.ca)))
    try:
        transport: Any = engine.client._transport
        authorities = transport._context.get_ca_certs()
    finally:
        await engine.aclose()
    assert [dict(item[0] for item in ca["subject"])["commonName"] for ca in authorities] == [
        "cardfence test CA"
    ]


async def test_a_task_is_shown_as_it_is_or_as_it_was(store: EventStore) -> None:
    agent = ScriptedAgent(answering("working", "completed"))
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        submitted = store.read_stream(f"task:{key}")[-1].position
        await engine.poll(key)
        await engine.poll(key)
    now = engine.task(key)
    then = engine.task(key, as_of=AsOf.parse(f"@{submitted}"))
    assert (now.state, then.state) == ("completed", "submitted")
    head = store.stream(f"task:{key}")
    assert head is not None
    assert now.updated_at == head.updated_at
    assert then.updated_at is not None
    assert then.updated_at <= now.updated_at


async def test_a_follow_up_starts_from_the_state_the_engine_last_wrote_with_no_store_read(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        expected = await engine._state(key)

        async def no_read(_key: str) -> Any:
            raise AssertionError("the store was read")

        engine._state = no_read  # type: ignore[method-assign]
        assert await engine._known_state(key) == expected


def _snapshot(store: EventStore, name: str, description: str = "") -> str:
    """A card snapshot stored as a read of the agent's card would store it; its revision."""
    document = card_document()
    document["name"] = name
    document["description"] = description or name
    body = json.dumps(document)
    revision = content_hash(body)
    url = f"{ORIGIN}/.well-known/agent-card.json"
    store.put_snapshot(CardSnapshot(revision, body, url, None, 200, datetime.now(UTC)))
    return revision


async def test_a_card_revision_is_parsed_once_and_kept(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision = _snapshot(store, "one")
    reads: list[str] = []
    real = store.get_snapshot
    monkeypatch.setattr(store, "get_snapshot", lambda r: reads.append(r) or real(r))
    async with engine_on(store) as engine:
        first = engine._card(revision)
        again = engine._card(revision)
    assert first is not None
    assert again is first
    assert reads == [revision]
    assert first.source_url == f"{ORIGIN}/.well-known/agent-card.json"


async def test_the_oldest_parsed_card_is_let_go_past_the_number_kept(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_CARDS_KEPT", 2)
    revisions = [_snapshot(store, name) for name in ("one", "two", "three")]
    async with engine_on(store) as engine:
        for revision in revisions:
            engine._card(revision)
        kept = list(engine._cards)
    assert kept == revisions[1:]


async def test_a_stored_card_is_parsed_whatever_its_size(store: EventStore) -> None:
    # A snapshot was bounded when it was read; a card read under a larger limit is shown all
    # the same (the default limit of a read is 1 MiB).
    revision = _snapshot(store, "large", "x" * 2_000_000)
    async with engine_on(store) as engine:
        card = engine._card(revision)
    assert card is not None
    assert card.name == "large"


async def test_a_background_decision_whose_lease_was_lost_is_logged_as_such_and_kept_as_no_error(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    lost = LeaseLostError("task:k-1", "driver-a", 3, "driver-b")

    async def decided() -> None:
        raise lost

    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store) as engine:
        await engine._contained(decided())
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "LeaseLost"]
    assert record.getMessage() == "background decision not recorded: the lease was lost"
    assert record.levelno == logging.INFO
    assert (record.task, record.reason) == ("k-1", str(lost))  # type: ignore[attr-defined]
    assert engine.background_errors == []


async def test_a_background_check_that_fails_is_logged_with_its_traceback_and_kept(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    broken = RuntimeError("a bug")

    async def check() -> None:
        raise broken

    caplog.set_level(logging.INFO, logger="cardfence")
    async with engine_on(store) as engine:
        await engine._contained(check())
    (record,) = [r for r in caplog.records if r.exc_info]
    assert record.getMessage() == "background card check failed"
    assert record.levelno == logging.ERROR
    assert engine.background_errors == [broken]
