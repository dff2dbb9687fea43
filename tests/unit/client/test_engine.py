"""What the engine's parts stand on (``engine/client/engine.py``, ``_records.py``,
``_background.py``, ``_connections.py``): an engine opened on a URL and the client it owns, a
task shown now or as of a past point, the state a follow-up starts from without a store read,
and the annotations of a refused or unreached request."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import make_tls
from support.cards import ORIGIN, card_document
from support.events import submitted
from support.mocked import (
    ScriptedAgent,
    answering,
    engine_on,
    rpc_result,
    submitted_task,
    task_answer,
)
from support.virtual_time import run_virtual, virtual_deadlines, virtual_engine

from cardfence.engine.client import _background, _records
from cardfence.engine.client import tasklog as tasklog_module
from cardfence.engine.client._records import _authorization_failed, _unreachable
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import AsOf, TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.observations import Observation
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import AuthorizationFailedError, EndpointUnreachableError
from cardfence.store.chain import content_hash
from cardfence.store.errors import LeaseLostError
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot


def test_a_refused_request_is_recorded_with_what_was_refused_and_when() -> None:
    refused = AuthorizationFailedError(f"{ORIGIN}/a2a", 403, schemes=("bearer",))
    before = dt.datetime.now(dt.UTC)
    event = _authorization_failed(refused, "poll")
    after = dt.datetime.now(dt.UTC)
    data = event.payload()
    at = dt.datetime.fromisoformat(data.pop("at"))
    assert event.type == ev.AUTHORIZATION_FAILED
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
    assert _unreachable(failure, "cancel").payload() == {
        "url": url,
        "detail": str(failure),
        "during": "cancel",
    }


async def test_an_engine_connected_to_a_url_owns_its_client_and_closes_it() -> None:
    async with Engine.connect("sqlite://") as engine:
        client = engine.client
        assert not client.is_closed
    assert client.is_closed


async def test_an_engine_connected_with_a_client_leaves_it_open(store: EventStore) -> None:
    async with httpx.AsyncClient() as client:
        async with Engine.connect("sqlite://", client=client):
            pass
        assert not client.is_closed
        async with Engine(store, client):  # made directly: the client is the caller's too
            pass
        assert not client.is_closed


async def test_an_engines_token_source_follows_its_configuration(
    store: EventStore, tmp_path: Path
) -> None:
    limits = CardLimits(allow_insecure=True)
    config = EngineConfig(request_timeout=2.5, card_limits=limits, ca_file=str(tmp_path / "ca"))
    async with engine_on(store, None, config) as engine, engine_on(store) as default:
        tokens = engine.tokens
        assert engine.authorizer.tokens is tokens
        assert (tokens.timeout, tokens.allow_insecure) == (2.5, True)
        assert (tokens._verify, default.tokens._verify) == (str(tmp_path / "ca"), True)
        assert default.tokens.allow_insecure is False
        # An OpenID Connect discovery document the token source reads is recorded for the tasks
        # it serves: its URL, digest and token endpoint.
        url = "https://login.example/.well-known/openid-configuration"
        body = b'{"token_endpoint": "https://login.example/token"}'
        assert tokens._on_discovery is not None
        await tokens._on_discovery(url, body)
    assert engine.access.oidc == {
        url: {
            "url": url,
            "sha256": hashlib.sha256(body).hexdigest(),
            "token_endpoint": "https://login.example/token",
        }
    }


async def test_secrets_are_fingerprinted_under_the_configured_key_or_one_of_the_engines_own(
    store: EventStore,
) -> None:
    key = b"k" * 32
    async with (
        engine_on(store, None, EngineConfig(fingerprint_key=key)) as keyed,
        engine_on(store) as one,
        engine_on(store) as other,
    ):
        assert keyed.authorizer.key == key
        assert len({keyed.authorizer.key, one.authorizer.key, other.authorizer.key}) == 3


async def test_requests_are_bounded_per_agent_and_in_all_card_reads_included(
    store: EventStore,
) -> None:
    in_flight: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async def agent(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        in_flight[host] += 1
        in_flight["all"] += 1
        most[host] = max(most[host], in_flight[host])
        most["all"] = max(most["all"], in_flight["all"])
        await asyncio.sleep(0.01)
        in_flight[host] -= 1
        in_flight["all"] -= 1
        if request.method == "GET":
            card = card_document()
            card["supportedInterfaces"][0]["url"] = f"https://{host}/a2a"
            return httpx.Response(200, json=card)
        return rpc_result(json.loads(request.content), task_answer("working"))

    config = EngineConfig(requests_per_agent=1, requests_in_flight=2)
    hosts = ("one.example", "two.example", "three.example")
    async with engine_on(store, httpx.MockTransport(agent), config) as engine:
        endpoints = [
            {"url": f"https://{host}/a2a", "binding": "JSONRPC", "protocol_version": "1.0"}
            for host in hosts
        ]
        polls = [
            engine.connections.transport(endpoint).get_task("r-1") for endpoint in endpoints * 2
        ]
        reads = [engine.discovery.read(f"https://{host}", fresh=True) for host in hosts * 2]
        await asyncio.gather(*polls, *reads)
    assert most == {"one.example": 1, "two.example": 1, "three.example": 1, "all": 2}


async def test_an_engine_connected_to_a_url_trusts_only_the_configured_authorities(
    tmp_path: Path,
) -> None:
    tls = make_tls(tmp_path)
    async with Engine.connect("sqlite://", config=EngineConfig(ca_file=str(tls.ca))) as engine:
        transport: Any = engine.client._transport
        authorities = transport._context.get_ca_certs()
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
        now = await engine.task(key)
        then = await engine.task(key, as_of=AsOf.parse(f"@{submitted}"))
    assert (now.state, then.state) == ("completed", "submitted")
    head = store.stream(f"task:{key}")
    assert head is not None
    assert now.updated_at == head.updated_at
    assert then.updated_at is not None
    assert then.updated_at <= now.updated_at


async def test_every_task_is_listed_as_it_is_or_as_it_was_and_by_state(store: EventStore) -> None:
    agent = ScriptedAgent(answering("completed"))
    async with engine_on(store, agent.transport()) as engine:
        ended = (await engine.start_task(ORIGIN, skill="echo", text="one")).task
        between = store.last_position()
        await engine.poll(ended)
        live = (await engine.start_task(ORIGIN, skill="echo", text="two")).task
        now = {view.task: view.state for view in await engine.tasks()}
        assert now == {ended: "completed", live: "submitted"}
        assert [view.task for view in await engine.tasks("completed")] == [ended]
        assert [view.task for view in await engine.tasks("submitted")] == [live]
        then = await engine.tasks(as_of=AsOf.parse(f"@{between}"))
        assert [(view.task, view.state) for view in then] == [(ended, "submitted")]
        assert await engine.tasks("completed", as_of=AsOf.parse(f"@{between}")) == []
        head = store.stream(f"task:{ended}")
        assert head is not None
        assert [view.updated_at for view in await engine.tasks("completed")] == [head.updated_at]


async def test_a_follow_up_starts_from_the_state_the_engine_last_wrote_with_no_store_read(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        expected = await engine.records.state(key)

        async def no_read(_key: str) -> Any:
            raise AssertionError("the store was read")

        engine.records.state = no_read  # type: ignore[method-assign]
        assert await engine.records.known_state(key) == expected


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
        first = engine.records.card(revision)
        again = engine.records.card(revision)
    assert first is not None
    assert again is first
    assert reads == [revision]
    assert first.source_url == f"{ORIGIN}/.well-known/agent-card.json"


async def test_the_oldest_parsed_card_is_let_go_past_the_number_kept(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_records, "_CARDS_KEPT", 2)
    revisions = [_snapshot(store, name) for name in ("one", "two", "three")]
    async with engine_on(store) as engine:
        for revision in revisions:
            engine.records.card(revision)
        kept = list(engine.records.cards)
    assert kept == revisions[1:]


async def test_a_stored_card_is_parsed_whatever_its_size(store: EventStore) -> None:
    # A snapshot was bounded when it was read; a card read under a larger limit is shown all
    # the same (the default limit of a read is 1 MiB).
    revision = _snapshot(store, "large", "x" * 2_000_000)
    async with engine_on(store) as engine:
        card = engine.records.card(revision)
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
        await engine.background.contained(decided())
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
        await engine.background.contained(check())
    (record,) = [r for r in caplog.records if r.exc_info]
    assert record.getMessage() == "background card check failed"
    assert record.levelno == logging.ERROR
    assert engine.background_errors == [broken]


async def test_settling_waits_for_every_background_job_and_a_cancelled_one_is_no_error(
    store: EventStore,
) -> None:
    finished: list[str] = []

    async def job(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        finished.append(name)

    async with engine_on(store) as engine:
        engine.background.spawn(job("quick", 0))
        engine.background.spawn(job("later", 0.01))
        started = set(engine.background.jobs)
        engine.background.spawn(job("never", 60))
        (stopped,) = engine.background.jobs - started
        await asyncio.sleep(0)  # every job has started
        stopped.cancel()
        await engine.settle()
        assert engine.background.jobs == set()
    assert finished == ["quick", "later"]


def _answering_get_task_after(seconds: float) -> httpx.MockTransport:
    """An agent whose card and ``SendMessage`` are answered at once, and ``GetTask`` with the
    task completed ``seconds`` later."""

    async def agent(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=card_document())
        call = json.loads(request.content)
        if call["method"] == "SendMessage":
            return submitted_task(call)
        await asyncio.sleep(seconds)
        return rpc_result(call, task_answer("completed"))

    return httpx.MockTransport(agent)


async def _ended_by_a_push(engine: Engine) -> str:
    """A new task a push of one status update ended: its closing read is started."""
    key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
    state = await engine.records.state(key)
    pushed = Observation(source="push", state="completed")
    engine.observing.observed(key, pushed, state, {**state, "state": "completed"}, whole=False)
    assert key in engine.background.closing
    return key


async def test_closing_an_engine_lets_the_closing_reads_in_flight_finish(store: EventStore) -> None:
    # The closing read is still in flight as the engine closes.
    async with engine_on(store, _answering_get_task_after(0.05)) as engine:
        key = await _ended_by_a_push(engine)
    head = store.stream(f"task:{key}")
    assert head is not None
    assert head.state["state"] == "completed"
    assert store.read_stream(f"task:{key}")[-1].data["source"] == "poll"


def test_closing_an_engine_waits_for_its_closing_reads_no_longer_than_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Sixteen closing reads whose agent never answers: eight at a time (the engine's bound on
    # closing reads), each cut at the 2 s request timeout. Closing the engine half a second in
    # waits 2 s for them, not the 3.5 s they all take: the first eight end meanwhile, and the
    # other eight are stopped before the client and the store they use are closed.
    async def scenario() -> tuple[float, list[bool]]:
        loop = asyncio.get_running_loop()
        config = EngineConfig(request_timeout=2.0, requests_per_agent=32)
        async with virtual_engine(_answering_get_task_after(3600), config) as engine:
            for _ in range(16):
                await _ended_by_a_push(engine)
            await asyncio.sleep(0.5)  # the first eight end at 2 s, the others would at 4 s
            started = loop.time()
            left = list(engine.background.closing.values())
            assert len(left) == 16
        return loop.time() - started, [job.cancelled() for job in left]

    with virtual_deadlines(monkeypatch):
        closed, cancelled = run_virtual(scenario())
    assert closed == 2.0
    assert cancelled == [False] * 8 + [True] * 8
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# --------------------------------------------------------------------------------------------------
# What a long-running engine keeps in memory is bounded, whatever happens to the tasks it has seen:
# the task heads it last wrote or read, repeat counts and failures being counted, waiting for a
# task's next event (R12), and the background failures kept for ``Engine.settle`` during an outage.


# A task event that is no failure, appended to a task already created.
DEADLINE = ev.DeadlineExceeded(state="submitted", seconds=30.0, until="terminal")


def _task(log: TaskLog, key: str) -> None:
    log.create(key, [submitted(key)])


def _carried(store: EventStore, key: str) -> object:
    return store.read_stream(task_stream_id(key))[-1].data.get(ev.REPEATS_IGNORED)


def test_heads_are_kept_for_so_many_tasks_the_one_used_longest_ago_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasklog_module, "_HEADS_KEPT", 3)
    log = TaskLog(store)
    for key in ("first", "second", "third"):
        _task(log, key)
    log.record("first", lambda _state: [DEADLINE])
    _task(log, "fourth")  # one over: "second" is the one used longest ago

    assert [key for key in ("first", "second", "third", "fourth") if log.kept(key)] == [
        "first",
        "third",
        "fourth",
    ]
    # A dropped head is read from the store once, and the task goes on from it.
    log.record("second", lambda _state: [DEADLINE])
    assert log.head("second").version == 2
    assert log.kept("second") is not None
    assert log.kept("third") is None


def test_repeat_counts_are_held_for_so_many_tasks_the_longest_held_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasklog_module, "_COUNTS_KEPT", 3)
    log = TaskLog(store)
    for key in ("oldest", "kept"):
        _task(log, key)
    log.count_repeat("oldest")
    log.count_repeat("kept")
    log.count_repeat("kept")
    for n in range(2):  # two more tasks counted: four in all, one over
        log.count_repeat(f"ended-{n}")

    log.record("oldest", lambda _state: [DEADLINE])
    log.record("kept", lambda _state: [DEADLINE])
    assert _carried(store, "oldest") is None  # dropped, as if its process had restarted
    assert _carried(store, "kept") == 2


def test_failures_being_counted_are_held_for_so_many_tasks_the_longest_held_dropped(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task failing as before is counted, not appended, while its failure is held; a process
    whose tasks move on to others (leases taken over) holds at most so many of them."""
    monkeypatch.setattr(tasklog_module, "_COUNTS_KEPT", 3)
    log = TaskLog(store)
    unreachable = ev.EndpointUnreachable(
        url="http://agent.example", during="poll", detail="ConnectError: refused"
    )
    keys = ["oldest", "kept", "moved-0", "moved-1"]  # four held, one over
    for key in keys:
        _task(log, key)
        log.record(key, lambda _state: [unreachable])

    def failures(key: str) -> int:
        return [e.type for e in store.read_stream(task_stream_id(key))].count(
            ev.ENDPOINT_UNREACHABLE
        )

    log.record("kept", lambda _state: [unreachable])  # the same failure again: held, counted
    assert (failures("kept"), log.failures_held("kept")) == (1, 1)
    log.record("oldest", lambda _state: [unreachable])  # dropped: recorded anew, as on restart
    assert (failures("oldest"), log.failures_held("oldest")) == (2, 0)


async def test_background_failures_kept_for_settle_are_the_first_hundred_each_logged(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    async def failing(n: int) -> None:
        raise RuntimeError(f"store down ({n})")

    async with httpx.AsyncClient() as client, Engine(store, client) as engine:
        for n in range(_background._ERRORS_KEPT + 50):
            await engine.background.contained(failing(n))

        assert len(engine.background_errors) == _background._ERRORS_KEPT
        assert len([r for r in caplog.records if r.exc_info]) == _background._ERRORS_KEPT + 50
        with pytest.raises(RuntimeError, match=r"store down \(0\)"):
            await engine.settle()
