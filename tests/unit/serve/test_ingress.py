"""The webhook app's own decisions, through its ASGI interface: what it refuses from a request's
head, how it answers a client gone mid-body, a store that is down and an engine that fails, what
it logs, counts and redacts, and whom it sheds. No server and no store: the engine is a stand-in
whose answer each test sets, so each decision of the app is seen alone. The same decisions over
real HTTP, with a real engine, agent and store, are in ``tests/integration/test_ingress.py``."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any, cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.types import Message
from support.asgi import CLIENT, post_webhook

from cardfence.engine.client.engine import Engine
from cardfence.engine.serve import ingress
from cardfence.engine.serve._metrics import CONTENT_TYPE, Family
from cardfence.engine.serve._shedding import RefusalBudget
from cardfence.engine.serve.ingress import (
    HEALTH_PATH,
    METRICS_PATH,
    READY_PATH,
    read_bounded,
    webhook_app,
)
from cardfence.engine.wire.push import MAX_DELIVERY_BYTES, TOKEN_HEADER, Delivery, IngressLimits
from cardfence.store.errors import CorruptRecordError, StoreUnavailableError

BASE = "http://ingress.test"
JSON = {"content-type": "application/json"}
APPLIED = Delivery(200, "applied", "working -> completed", "task-1")
UNKNOWN = Delivery(404, "refused", "no task with remote id 'r-9'")
STORE_DOWN = "the event store is unavailable: nothing written; retry later"


class StandInStore:
    """The store the app's readiness check reads: its position, or ``failure`` raised."""

    def __init__(self) -> None:
        self.failure: Exception | None = None

    def last_position(self) -> int:
        if self.failure is not None:
            raise self.failure
        return 7


class OnTheLoop:
    """The engine's store calls, made on the loop; with ``hang``, a call that never returns."""

    def __init__(self) -> None:
        self.hang = False

    async def run(self, fn: Callable[[], int]) -> int:
        if self.hang:
            await asyncio.Event().wait()
        return fn()


class StandInRecords:
    """The engine's records: their store calls, made on the loop."""

    def __init__(self) -> None:
        self.calls = OnTheLoop()


class StandIn:
    """In place of the engine: each delivery it is given is kept, waits for ``gate``, then is
    answered ``answer`` (an exception is raised)."""

    def __init__(self, answer: Delivery | Exception = APPLIED) -> None:
        self.answer = answer
        self.bodies: list[bytes] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.store = StandInStore()
        self.records = StandInRecords()

    async def deliver(self, body: bytes, headers: dict[str, str]) -> Delivery:
        self.bodies.append(body)
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def app_for(engine: StandIn, **options: Any) -> Starlette:
    return webhook_app(cast(Engine, engine), **options)


@pytest.fixture
def engine() -> StandIn:
    return StandIn()


@pytest.fixture
async def client(engine: StandIn) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the stand-in's app (its metrics served), from 127.0.0.1."""
    async with client_of(app_for(engine, metrics=())) as http:
        yield http


def client_of(app: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=CLIENT)
    return httpx.AsyncClient(transport=transport, base_url=BASE)


async def call(
    app: Starlette,
    headers: Iterable[tuple[str, str]],
    messages: Iterable[Message],
    *,
    client: tuple[str, int] | None = CLIENT,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One POST /webhook with these headers and body messages (:func:`post_webhook`)."""
    incoming = iter(messages)

    async def receive() -> Message:
        return next(incoming)

    encoded = [(name.encode(), value.encode()) for name, value in headers]
    return await post_webhook(app, encoded, receive, client=client)


def body_of(data: bytes, *, chunk: int = 64 * 1024) -> list[Message]:
    """``data`` as the request messages of an ASGI server, ``chunk`` bytes each."""
    parts = [data[at : at + chunk] for at in range(0, len(data), chunk)] or [b""]
    return [
        {"type": "http.request", "body": part, "more_body": at < len(parts) - 1}
        for at, part in enumerate(parts)
    ]


def ingress_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "cardfence.ingress"]


@pytest.mark.parametrize("path", [HEALTH_PATH, READY_PATH, METRICS_PATH])
def test_the_webhook_path_cannot_be_a_path_the_app_serves_for_get(path: str) -> None:
    with pytest.raises(ValueError, match=f"^the webhook path cannot be {path}, which the app"):
        app_for(StandIn(), path=path)


@pytest.mark.parametrize(
    ("headers", "status", "detail"),
    [
        (
            [("content-type", "application/json"), ("content-type", "application/json")],
            400,
            "content-type header given more than once",
        ),
        (
            [("content-type", "application/json"), (TOKEN_HEADER, "a"), (TOKEN_HEADER, "b")],
            400,
            f"{TOKEN_HEADER} header given more than once",
        ),
        (
            [("content-type", "application/json"), ("content-length", "12a")],
            400,
            "Content-Length is not a number",
        ),
        (
            [("content-type", "application/json"), ("content-length", f"{MAX_DELIVERY_BYTES + 1}")],
            413,
            f"body of {MAX_DELIVERY_BYTES + 1} bytes is over {MAX_DELIVERY_BYTES}",
        ),
    ],
    ids=["content-type-twice", "token-twice", "length-not-a-number", "length-over-the-limit"],
)
async def test_a_head_that_is_refused_is_answered_from_the_head_alone_naming_its_fault(
    engine: StandIn, headers: list[tuple[str, str]], status: int, detail: str
) -> None:
    answer = await call(app_for(engine), headers, body_of(b"{}"))
    assert answer == (
        status,
        {"content-length": answer[1]["content-length"], "content-type": "application/json"},
        {"outcome": "refused", "detail": detail},
    )
    assert engine.bodies == []


async def test_a_body_of_exactly_the_announced_limit_reaches_the_engine(engine: StandIn) -> None:
    data = b" " * MAX_DELIVERY_BYTES
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    status, _, answer = await call(app_for(engine), headers, body_of(data))
    assert (status, answer["outcome"]) == (200, "applied")
    assert engine.bodies == [data]


async def test_a_body_past_the_limit_without_a_length_is_refused_413_naming_the_limit(
    engine: StandIn,
) -> None:
    data = b" " * (MAX_DELIVERY_BYTES + 1)
    status, _, answer = await call(app_for(engine), JSON.items(), body_of(data))
    assert (status, answer) == (
        413,
        {"outcome": "refused", "detail": f"body of more than {MAX_DELIVERY_BYTES} bytes"},
    )
    assert engine.bodies == []


async def test_a_client_gone_mid_body_is_answered_400_and_nothing_reaches_the_engine(
    engine: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"statusUpdate": ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        status, _, answer = await call(app_for(engine), JSON.items(), messages)
    assert (status, answer) == (
        400,
        {"outcome": "refused", "detail": "client disconnected mid-body"},
    )
    assert engine.bodies == []
    [record] = ingress_records(caplog)
    assert (record.levelno, record.status, record.outcome) == (logging.WARNING, 400, "refused")  # type: ignore[attr-defined]


async def test_a_delivery_beyond_the_in_flight_bound_is_answered_503_naming_the_bound(
    engine: StandIn,
) -> None:
    app = app_for(engine, limits=IngressLimits(deliveries=1), metrics=())
    engine.gate.clear()
    async with client_of(app) as http:
        first = asyncio.create_task(http.post("/webhook", content=b"{}", headers=JSON))
        while app.state.ingress.in_flight < 1:
            await asyncio.sleep(0.001)
        gauge = (await http.get(METRICS_PATH)).text
        second = await http.post("/webhook", content=b"{}", headers=JSON)
        engine.gate.set()
        assert (await first).status_code == 200

    assert "\ncardfence_deliveries_in_flight 1\n" in gauge
    assert (second.status_code, second.headers["retry-after"]) == (503, "1")
    assert second.json() == {
        "outcome": "refused",
        "detail": "1 deliveries already in flight, the most this server takes at once: "
        "body not read, nothing written; retry later",
    }
    assert engine.bodies == [b"{}"]  # the second was never read
    assert app.state.ingress.in_flight == 0


async def test_a_store_down_inside_deliver_is_answered_503_and_logged_with_its_cause(
    engine: StandIn, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    down = StoreUnavailableError("sqlite:///events.db", "disk I/O error")
    engine.answer = down
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.post("/webhook", content=b"{}", headers=JSON)

    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    assert answer.json() == {"outcome": "error", "detail": STORE_DOWN}
    [record] = ingress_records(caplog)
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "delivery not applied: the event store is unavailable task=- outcome=error status=503"
    )
    assert fields_of(record) == {
        "task": None,
        "outcome": "error",
        "status": 503,
        "reason": str(down),
    }


async def test_an_engine_failing_is_answered_500_without_its_cause_which_is_logged(
    engine: StandIn, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    engine.answer = RuntimeError("the cause, with a secret in it")
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.post("/webhook", content=b"{}", headers=JSON)

    assert answer.status_code == 500
    assert "retry-after" not in answer.headers
    assert answer.json() == {"outcome": "error", "detail": "internal error"}
    [record] = ingress_records(caplog)
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "delivery failed task=- outcome=error status=500"
    assert record.exc_info is not None
    assert record.exc_info[1] is engine.answer
    assert fields_of(record) == {
        "task": None,
        "outcome": "error",
        "status": 500,
        "reason": "internal error",
    }


async def test_a_task_record_altered_in_the_store_is_answered_500_and_logged_in_one_line(
    engine: StandIn, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    altered = CorruptRecordError.in_projection("task:t1", "the stored text is an array")
    engine.answer = altered
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.post("/webhook", content=b"{}", headers=JSON)

    assert answer.status_code == 500
    assert "retry-after" not in answer.headers
    assert answer.json() == {"outcome": "error", "detail": "internal error"}
    [record] = ingress_records(caplog)
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "delivery not applied: the task's record cannot be read task=- outcome=error status=500"
    )
    assert record.exc_info is None  # what was altered is said; there is no bug to trace
    assert fields_of(record) == {
        "task": None,
        "outcome": "error",
        "status": 500,
        "reason": str(altered),
    }


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields every decision line carries."""
    return {name: getattr(record, name) for name in ("task", "outcome", "status", "reason")}


@pytest.mark.parametrize(
    ("delivery", "level", "line"),
    [
        (APPLIED, logging.INFO, "delivery task=task-1 outcome=applied status=200 "
         "reason='working -> completed'"),
        (Delivery(304, "duplicate", "seen before"), logging.INFO,
         "delivery task=- outcome=duplicate status=304 reason='seen before'"),
        (Delivery(400, "refused", "not JSON"), logging.WARNING,
         "delivery task=- outcome=refused status=400 reason='not JSON'"),
    ],
    ids=["applied", "answered-below-400", "refused-400"],
)  # fmt: skip
async def test_each_decision_is_logged_on_one_line_at_its_level_with_its_fields(
    engine: StandIn,
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    delivery: Delivery,
    level: int,
    line: str,
) -> None:
    engine.answer = delivery
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.post("/webhook", content=b"{}", headers=JSON)
    assert (answer.status_code, answer.json()) == (
        delivery.status,
        {"outcome": delivery.outcome, "detail": delivery.detail},
    )
    [record] = ingress_records(caplog)
    assert (record.levelno, record.getMessage()) == (level, line)
    assert fields_of(record) == {
        "task": delivery.task,
        "outcome": delivery.outcome,
        "status": delivery.status,
        "reason": delivery.detail,
    }


@pytest.mark.parametrize(
    ("headers", "echoed", "answered"),
    [
        # Eight characters or more: redacted wherever they appear, inside a word too.
        ({TOKEN_HEADER: "abcd1234"}, "id xabcd1234y", "id x[redacted]y"),
        # The longest first: the token holds the credentials, and sorts before them by its text.
        (
            {TOKEN_HEADER: "aa-secret-12345", "authorization": "Bearer secret-12345"},
            "id aa-secret-12345",
            "id [redacted]",
        ),
        # The credentials are all that follows the scheme, spaces and all.
        (
            {"authorization": "Custom secret with spaces-long"},
            "id secret with spaces-long",
            "id [redacted]",
        ),
        # A token is one secret, spaces and all: only Authorization has a scheme to leave out.
        (
            {TOKEN_HEADER: "part-one part-two-of-it", "authorization": "Bearer x"},
            "id part-two-of-it",
            "id part-two-of-it",
        ),
        # Nothing presented, nothing redacted.
        ({}, "id XXXX", "id XXXX"),
    ],
    ids=[
        "eight-characters-inside-a-word",
        "longest-first",
        "credentials-after-scheme",
        "token-whole",
        "none",
    ],
)
async def test_a_presented_secret_is_redacted_from_the_answer_and_the_log(
    engine: StandIn,
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    headers: dict[str, str],
    echoed: str,
    answered: str,
) -> None:
    engine.answer = Delivery(404, "refused", echoed)
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.post("/webhook", content=b"{}", headers={**JSON, **headers})
    assert answer.json() == {"outcome": "refused", "detail": answered}
    [record] = ingress_records(caplog)
    assert record.reason == answered  # type: ignore[attr-defined]
    assert repr(answered) in record.getMessage()


async def test_a_source_past_its_refusals_is_shed_even_when_room_comes_within_a_second(
    engine: StandIn, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 refusals a minute give one back every 0.6 s: the 101st delivery, sent at once, waits
        less than a second and is still shed, told to retry after 1 s (never 0), as is the next; the
    source is reported shed once."""
    engine.answer = UNKNOWN
    # The budget's clock stands still, so however slow the machine, nothing is given back.
    monkeypatch.setattr(
        ingress, "RefusalBudget", functools.partial(RefusalBudget, clock=lambda: 0.0)
    )
    app = app_for(engine, limits=IngressLimits(refusals=100), metrics=())
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        async with client_of(app) as http:
            refused = [
                (await http.post("/webhook", content=b"{}", headers=JSON)).status_code
                for _ in range(100)
            ]
            shed = await http.post("/webhook", content=b"{}", headers=JSON)
            again = await http.post("/webhook", content=b"{}", headers=JSON)
            text = (await http.get(METRICS_PATH)).text

    assert refused == [404] * 100
    assert (shed.status_code, shed.headers["retry-after"]) == (429, "1")
    assert shed.json() == {
        "outcome": "refused",
        "detail": "deliveries from 127.0.0.1: 100 refused within 60 s: body not read, "
        "nothing written; retry after 1 s",
    }
    assert again.status_code == 429
    assert len(engine.bodies) == 100  # the shed deliveries were not read
    [report] = [r for r in ingress_records(caplog) if r.getMessage().startswith("source shed")]
    reason = (
        "100 deliveries refused within 60 s: its deliveries are answered 429 unread until it "
        "has room for one more"
    )
    assert report.levelno == logging.WARNING
    assert report.getMessage() == f"source shed source=127.0.0.1 reason={reason!r}"
    assert {**fields_of(report), "source": report.source} == {  # type: ignore[attr-defined]
        "task": None,
        "outcome": "shed",
        "status": 429,
        "reason": reason,
        "source": "127.0.0.1",
    }
    assert 'cardfence_deliveries_total{status="429",outcome="refused"} 2\n' in text
    assert "\ncardfence_delivery_sources_shed 1\n" in text
    assert "\ncardfence_delivery_sources_shed_total 1\n" in text  # reported once


async def test_deliveries_with_no_client_address_are_one_source_named_dash(
    engine: StandIn,
) -> None:
    engine.answer = UNKNOWN
    app = app_for(engine, limits=IngressLimits(refusals=1))
    first = await call(app, JSON.items(), body_of(b"{}"), client=None)
    second = await call(app, JSON.items(), body_of(b"{}"), client=None)
    assert first[0] == 404
    assert second[0] == 429
    assert second[2]["detail"].startswith("deliveries from -: 1 refused within 60 s")


async def test_without_a_refusal_budget_no_source_is_ever_shed(engine: StandIn) -> None:
    engine.answer = UNKNOWN
    app = app_for(engine, limits=IngressLimits(refusals=None), metrics=())
    async with client_of(app) as http:
        statuses = {
            (await http.post("/webhook", content=b"{}", headers=JSON)).status_code
            for _ in range(300)  # more than the default budget of 256
        }
        text = (await http.get(METRICS_PATH)).text
    assert statuses == {404}
    assert "\ncardfence_delivery_sources_shed 0\n" in text
    assert "\ncardfence_delivery_sources_shed_total 0\n" in text


class Counted:
    """A metrics source of the host's: one gauge."""

    def families(self) -> list[Family]:
        return [Family.single("host_things", "Things the host counts.", "gauge", 7)]


async def test_metrics_count_every_answer_by_status_and_outcome_then_the_sources_given(
    engine: StandIn,
) -> None:
    app = app_for(engine, metrics=[Counted()])
    async with client_of(app) as http:
        for answer in (UNKNOWN, APPLIED, UNKNOWN):
            engine.answer = answer
            await http.post("/webhook", content=b"{}", headers=JSON)
        exposition = await http.get(METRICS_PATH)
        post = await http.post(METRICS_PATH)

    assert exposition.status_code == 200
    assert exposition.headers["content-type"] == CONTENT_TYPE
    assert exposition.text == (
        "# HELP cardfence_deliveries_total Push deliveries answered, by HTTP status and outcome.\n"
        "# TYPE cardfence_deliveries_total counter\n"
        'cardfence_deliveries_total{status="200",outcome="applied"} 1\n'
        'cardfence_deliveries_total{status="404",outcome="refused"} 2\n'
        "# HELP cardfence_deliveries_in_flight Push deliveries being read or applied now.\n"
        "# TYPE cardfence_deliveries_in_flight gauge\n"
        "cardfence_deliveries_in_flight 0\n"
        "# HELP cardfence_delivery_sources_shed Sources whose deliveries are answered 429 now "
        "(their refusals spent).\n"
        "# TYPE cardfence_delivery_sources_shed gauge\n"
        "cardfence_delivery_sources_shed 0\n"
        "# HELP cardfence_delivery_sources_shed_total Times a source was shed for its refused "
        "deliveries (at most once a minute each).\n"
        "# TYPE cardfence_delivery_sources_shed_total counter\n"
        "cardfence_delivery_sources_shed_total 0\n"
        "# HELP host_things Things the host counts.\n"
        "# TYPE host_things gauge\n"
        "host_things 7\n"
    )
    assert post.status_code == 405


async def test_readyz_answers_ready_while_the_store_answers_a_read(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get(READY_PATH)
    assert (answer.status_code, answer.json()) == (200, {"status": "ready"})


async def test_readyz_answers_503_while_the_store_fails_and_logs_why(
    engine: StandIn, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    down = StoreUnavailableError("sqlite:///events.db", "unable to open database file")
    engine.store.failure = down
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.get(READY_PATH)
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    assert answer.json() == {"status": "unavailable", "detail": STORE_DOWN}
    [record] = ingress_records(caplog)
    assert (record.levelno, record.getMessage()) == (
        logging.WARNING,
        "not ready: the event store is unavailable",
    )
    assert (record.event, record.status, record.reason) == ("NotReady", 503, str(down))  # type: ignore[attr-defined]


async def test_readyz_answers_503_when_the_store_does_not_answer_in_time_and_says_so(
    engine: StandIn,
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ingress, "_READY_SECONDS", 0.05)
    engine.records.calls.hang = True
    with caplog.at_level(logging.INFO, logger="cardfence.ingress"):
        answer = await client.get(READY_PATH)
    assert answer.status_code == 503
    [record] = ingress_records(caplog)
    assert record.reason == "no answer within 0.05 s"  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", [HEALTH_PATH, READY_PATH])
async def test_the_probes_answer_get_only(client: httpx.AsyncClient, path: str) -> None:
    assert (await client.post(path)).status_code == 405
    assert (await client.get(path)).status_code == 200


# --------------------------------------------------------------------------------------------------
# The webhook ingress reads a delivery's body only as far as it must: it stops as soon as the body
# passes 256 KiB (``read_bounded``, and the ASGI app around it), and refuses from the head alone
# (size announced, content type) without reading the body at all. No server, no store: the app's
# engine is a stand-in that fails the test if a delivery ever reaches it.


CHUNK = 64 * 1024
TEN_MEGABYTES = 10 * 1024 * 1024


class NoEngine:
    """What the app is given: reaching ``deliver`` means the body was not refused in time."""

    async def deliver(self, body: bytes, headers: dict[str, str]) -> Any:
        raise AssertionError(f"a body of {len(body)} bytes reached the engine")


class Drip:
    """An HTTP request body of ``total`` bytes in ``CHUNK``-byte ASGI messages, counting how many
    the app asked for."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.received = 0

    async def receive(self) -> Message:
        self.received += 1
        size = min(CHUNK, self.left)
        self.left -= size
        return {"type": "http.request", "body": b" " * size, "more_body": self.left > 0}


async def call_app(headers: list[tuple[bytes, bytes]], drip: Drip) -> tuple[int, dict[str, Any]]:
    app = webhook_app(cast(Engine, NoEngine()))
    status, _, answer = await post_webhook(app, headers, drip.receive)
    return status, answer


async def test_read_bounded_stops_reading_ten_megabytes_just_past_the_limit() -> None:
    consumed = 0
    closed = False

    async def ten_megabytes() -> AsyncGenerator[bytes, None]:
        nonlocal consumed, closed
        try:
            for _ in range(TEN_MEGABYTES // CHUNK):
                consumed += 1
                yield b" " * CHUNK
        finally:
            closed = True

    assert await read_bounded(ten_megabytes(), MAX_DELIVERY_BYTES) is None
    assert consumed == MAX_DELIVERY_BYTES // CHUNK + 1  # the chunk that passed the limit, no more
    assert closed  # the source is closed at once, not left to the garbage collector


async def test_read_bounded_keeps_a_body_of_exactly_the_limit_and_refuses_one_byte_more() -> None:
    async def body(total: int) -> AsyncGenerator[bytes, None]:
        while total > 0:
            size = min(CHUNK, total)
            total -= size
            yield b"x" * size

    kept = await read_bounded(body(MAX_DELIVERY_BYTES), MAX_DELIVERY_BYTES)
    assert kept is not None
    assert len(kept) == MAX_DELIVERY_BYTES
    assert await read_bounded(body(MAX_DELIVERY_BYTES + 1), MAX_DELIVERY_BYTES) is None


async def test_app_cuts_a_chunked_ten_megabyte_body_after_the_limit() -> None:
    drip = Drip(TEN_MEGABYTES)

    status, answer = await call_app([(b"content-type", b"application/json")], drip)

    assert (status, answer["outcome"]) == (413, "refused")
    assert drip.received == MAX_DELIVERY_BYTES // CHUNK + 1
    assert drip.left == TEN_MEGABYTES - drip.received * CHUNK


async def test_app_refuses_an_announced_oversize_body_without_reading_it() -> None:
    drip = Drip(TEN_MEGABYTES)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"10485760")]

    status, answer = await call_app(headers, drip)

    assert (status, answer["outcome"]) == (413, "refused")
    assert drip.received == 0


async def test_app_refuses_a_content_type_other_than_json_without_reading_the_body() -> None:
    drip = Drip(1024)

    status, answer = await call_app([(b"content-type", b"text/plain")], drip)

    assert (status, answer["outcome"]) == (415, "refused")
    assert drip.received == 0
