"""R16, the remote is bounded: in bytes after decoding, in time, and in the URLs it may name.

Against real parts: a hostile HTTP server on 127.0.0.1 (``tests/support/hostile.py``: stacked
encodings, compression bombs, bodies that drip forever), a TCP port that accepts and never answers,
and PostgreSQL. Time bounds carry generous margins (loaded machines); memory is measured with
``tracemalloc`` around the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from support import Peer
from support.engine_fixtures import audited_engine, types
from support.hostile import SKILL, HostileAgent, Reply, SilentListener, zeros_gzip

from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import Interface, parse_card
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.cards.urls import url_refusal
from cardfence.engine.cli.main import run as cli
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import (
    CardInvalidError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
)
from cardfence.engine.http import deadline
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.database import postgres_connect_args
from cardfence.store.errors import StoreUnavailableError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent

MiB = 1 << 20
GiB = 1 << 30
LIMIT = MiB
MARGIN = 3.0  # seconds past a bound a loaded machine may take
JSON_TYPE = {"Content-Type": "application/json"}
CONFIG = EngineConfig(
    max_poll_interval=0.2,
    first_poll_interval=0.02,
    max_card_age=60.0,
    card_limits=CardLimits(timeout=5.0, connect_timeout=2.0),
    request_timeout=30.0,  # the fixed default a deadline must cut short
)
TEST_NET = "http://192.0.2.10"  # RFC 5737: never routed; nothing may be sent there anyway


@pytest.fixture
def agent() -> Iterator[HostileAgent]:
    with HostileAgent() as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


@contextlib.contextmanager
def traced() -> Iterator[list[int]]:
    """Trace allocations in the block; the list receives their peak, in bytes."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """The list receives the seconds the block took."""
    took: list[float] = []
    started = time.monotonic()
    try:
        yield took
    finally:
        took.append(time.monotonic() - started)


def encoded(body: bytes, encoding: str) -> Reply:
    return Reply(body=body, headers={**JSON_TYPE, "Content-Encoding": encoding})


def rpc_task(rid: object, state: str = "TASK_STATE_WORKING") -> bytes:
    task = {"id": "t-1", "contextId": "c-1", "status": {"state": state}}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": task}).encode()


def transport_on(
    agent: HostileAgent, client: httpx.AsyncClient, *, timeout: float = 30.0, max_bytes: int = LIMIT
) -> A2ATransport:
    interface = Interface(agent.rpc_url, JSONRPC, "1.0")
    return A2ATransport(client, interface, timeout=timeout, max_bytes=max_bytes)


def agent_events(store: EventStore, agent_url: str) -> list[tuple[str, dict[str, Any]]]:
    stream = ev.agent_stream_id(card_urls(agent_url)[0])
    return [(e.type, e.data) for e in store.read_stream(stream)]


# -- 7. bytes: the limit applies to decoded bytes, one encoding at most ------------------------


async def test_stacked_gzip_card_is_refused_without_expanding_past_the_limit(
    agent: HostileAgent, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    bomb = zeros_gzip(GiB, layers=2)
    assert len(bomb) < 4096  # a couple of kilobytes that decode to a gigabyte
    agent.card = encoded(bomb, "gzip, gzip")
    discovery = Discovery(sqlite_store, client, limits=CardLimits(max_bytes=LIMIT))

    with traced() as peak, pytest.raises(CardInvalidError) as refused:
        await discovery.read(agent.url)

    assert peak[0] < 4 * LIMIT, f"peak {peak[0]} bytes"
    assert refused.value.kind == "invalid_card"
    assert "content encodings gzip, gzip refused" in str(refused.value)
    [(kind, data)] = agent_events(sqlite_store, agent.url)
    assert (kind, data["kind"]) == (ev.DISCOVERY_FAILED, "invalid_card")


async def test_gzip_bomb_card_stops_at_the_limit_once_decoded(
    agent: HostileAgent, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    bomb = zeros_gzip(GiB)  # one layer: about a megabyte that decodes to a gigabyte
    agent.card = encoded(bomb, "gzip")
    discovery = Discovery(sqlite_store, client, limits=CardLimits(max_bytes=LIMIT))

    with traced() as peak, pytest.raises(CardInvalidError) as refused:
        await discovery.read(agent.url)

    assert peak[0] < 4 * LIMIT, f"peak {peak[0]} bytes"
    assert refused.value.kind == "too_large"
    assert f"over the limit of {LIMIT} bytes once decoded" in str(refused.value)


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
    ids=["gzip", "deflate"],
)
async def test_a_compressed_card_within_the_limit_is_read_and_recorded(
    agent: HostileAgent,
    sqlite_store: EventStore,
    client: httpx.AsyncClient,
    encoding: str,
    encode: Callable[[bytes], bytes],
) -> None:
    agent.card = encoded(encode(json.dumps(agent.card_document()).encode()), encoding)

    read = await Discovery(sqlite_store, client).read(agent.url)

    assert read.card.name == "hostile-agent"
    assert agent.requests[0].headers["accept-encoding"] == "gzip, deflate"
    assert [kind for kind, _ in agent_events(sqlite_store, agent.url)] == [ev.CARD_FETCHED]


async def test_decoding_a_bomb_yields_to_the_event_loop_so_a_deadline_fires_mid_body(
    agent: HostileAgent, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    agent.card = encoded(zeros_gzip(GiB), "gzip")
    discovery = Discovery(sqlite_store, client, limits=CardLimits(timeout=60, max_bytes=64 * MiB))

    async def fire_once_decoding(bound: asyncio.Timeout) -> None:
        # Runs only when the read gives the loop a turn; then the deadline falls at once.
        while tracemalloc.get_traced_memory()[0] < 4 * MiB:
            await asyncio.sleep(0)
        bound.reschedule(asyncio.get_running_loop().time())

    async def read_under_a_deadline() -> None:
        async with asyncio.timeout(None) as bound:
            watcher = asyncio.ensure_future(fire_once_decoding(bound))
            try:
                await discovery.read(agent.url)
            finally:
                watcher.cancel()

    with traced() as peak, pytest.raises(TimeoutError):
        await read_under_a_deadline()

    assert peak[0] < 16 * MiB, f"peak {peak[0]} bytes: the read was not stopped mid-body"


async def test_stacked_gzip_answer_is_refused_as_an_invalid_agent_response(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    agent.rpc["GetTask"] = lambda rid: encoded(zeros_gzip(GiB, layers=2), "gzip, gzip")

    with traced() as peak, pytest.raises(InvalidAgentResponseError) as refused:
        await transport_on(agent, client, max_bytes=LIMIT).get_task("t-1")

    assert peak[0] < 4 * LIMIT, f"peak {peak[0]} bytes"
    assert "content encodings gzip, gzip refused" in str(refused.value)
    assert "nothing was changed" in str(refused.value)


async def test_gzip_bomb_answer_stops_at_the_transport_limit_once_decoded(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    bomb = zeros_gzip(GiB)
    agent.rpc["GetTask"] = lambda rid: encoded(bomb, "gzip")

    with traced() as peak, pytest.raises(InvalidAgentResponseError, match="over the limit"):
        await transport_on(agent, client, max_bytes=LIMIT).get_task("t-1")

    assert peak[0] < 4 * LIMIT, f"peak {peak[0]} bytes"


async def test_a_404_whose_body_is_a_stack_of_encodings_is_still_an_unreachable_endpoint(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    agent.rpc["GetTask"] = lambda rid: Reply(
        status=404, body=zeros_gzip(GiB, layers=2), headers={"Content-Encoding": "gzip, gzip"}
    )

    with pytest.raises(EndpointUnreachableError, match="HTTP 404 without an A2A") as failed:
        await transport_on(agent, client).get_task("t-1")

    assert failed.value.status == 404  # R11: the engine's R9 check still follows


async def test_an_answer_in_an_encoding_we_do_not_decode_is_refused_naming_it(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    agent.rpc["GetTask"] = lambda rid: encoded(rpc_task(rid), "br")

    with pytest.raises(InvalidAgentResponseError, match="content encoding 'br' refused"):
        await transport_on(agent, client).get_task("t-1")


async def test_a_gzip_answer_within_the_limit_is_read(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    agent.rpc["GetTask"] = lambda rid: encoded(gzip.compress(rpc_task(rid)), "gzip")

    task = await transport_on(agent, client).get_task("t-1")

    assert (task.id, task.state) == ("t-1", "working")
    assert agent.posts("GetTask")[0].headers["accept-encoding"] == "gzip, deflate"


# -- 9. time: every request ends by the deadline in force ---------------------------------------


def drip(rid: object) -> Reply:
    return Reply(body=rpc_task(rid), drip=0.05)


async def test_a_request_ends_by_the_deadline_in_force_not_its_own_timeout(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    agent.rpc["GetTask"] = drip
    transport = transport_on(agent, client, timeout=30.0)

    with (
        timed() as took,
        pytest.raises(EndpointUnreachableError, match="timeout"),
        deadline.within(1.0),
    ):
        await transport.get_task("t-1")

    assert took[0] < 1.0 + MARGIN


async def test_a_request_starting_after_the_deadline_is_not_sent(
    agent: HostileAgent, client: httpx.AsyncClient
) -> None:
    with pytest.raises(EndpointUnreachableError, match="not sent"), deadline.within(0.0):
        await transport_on(agent, client).get_task("t-1")

    assert agent.requests == []


async def test_a_card_that_drips_forever_ends_by_the_deadline_in_force(
    agent: HostileAgent, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    agent.card = Reply(body=json.dumps(agent.card_document()).encode(), drip=0.05)
    discovery = Discovery(sqlite_store, client, limits=CardLimits(timeout=30.0))

    with timed() as took, pytest.raises(DiscoveryError) as failed, deadline.within(1.0):
        await discovery.read(agent.url)

    assert took[0] < 1.0 + MARGIN
    assert failed.value.kind == "timeout"


async def test_drive_against_a_poll_that_drips_forever_ends_by_its_timeout(
    agent: HostileAgent, db: str
) -> None:
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        agent.rpc["GetTask"] = drip

        with timed() as took, pytest.raises(EndpointUnreachableError, match="timeout"):
            await engine.drive(view.task, until="terminal", timeout=2.0)

        assert took[0] < 2.0 + MARGIN
        assert types(engine.store, view.task)[-2:] == [
            ev.ENDPOINT_UNREACHABLE,
            ev.DEADLINE_EXCEEDED,
        ]


async def test_a_healthy_task_at_its_deadline_is_deadline_exceeded_after_a_poll_that_answered(
    agent: HostileAgent, db: str
) -> None:
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")

        with timed() as took, pytest.raises(DeadlineExceeded):
            await engine.drive(view.task, until="terminal", timeout=1.5)

        assert 1.4 < took[0] < 1.5 + MARGIN
        assert len(agent.posts("GetTask")) >= 2
        assert ev.ENDPOINT_UNREACHABLE not in types(engine.store, view.task)


@pytest.mark.parametrize("where", ["SendMessage", "GetTask"])
def test_run_with_timeout_5_against_an_endpoint_that_drips_forever_ends_by_then(
    agent: HostileAgent, db: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.rpc[where] = drip

    with timed() as took:
        code = cli(["run", agent.url, "--skill", SKILL, "--text", "hi", "--timeout", "5",
                    "--until", "terminal", "--db", db])  # fmt: skip

    err = capsys.readouterr().err
    assert took[0] < 5.0 + MARGIN
    assert code == 9, err
    assert err.strip().splitlines()[-1].startswith("EndpointUnreachableError: "), err


# -- 9. time: a PostgreSQL that never answers ----------------------------------------------------


def test_a_postgres_port_that_never_answers_is_store_unavailable_within_the_connect_timeout() -> (
    None
):
    with (
        SilentListener() as silent,
        timed() as took,
        pytest.raises(StoreUnavailableError) as failed,
    ):
        EventStore.open(f"postgresql://cf@127.0.0.1:{silent.port}/cf", connect_timeout=2)

    assert took[0] < 2.0 + MARGIN
    message = str(failed.value)
    assert "connecting timed out" in message
    assert message.endswith("(nothing was written)")
    assert "\n" not in message


@pytest.mark.parametrize(
    "command", [["tasks"], ["run", "http://127.0.0.1:9", "--skill", SKILL, "--text", "hi"]]
)
def test_commands_on_a_postgres_that_never_answers_exit_10_within_the_url_connect_timeout(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with SilentListener() as silent, timed() as took:
        url = f"postgresql://cf@127.0.0.1:{silent.port}/cf?connect_timeout=2"
        code = cli([*command, "--db", url])

    assert took[0] < 2.0 + MARGIN
    assert code == 10
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("StoreUnavailableError: ")
    assert "connecting timed out" in last
    assert last.endswith("(nothing was written)")


def test_postgres_timeouts_default_unless_the_url_sets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("PGOPTIONS", raising=False)
    plain = sa.make_url("postgresql+psycopg://cf@h/db")
    assert postgres_connect_args(plain, 10, 30) == {
        "connect_timeout": 10,
        "options": "-c statement_timeout=30000",
    }
    own = sa.make_url("postgresql+psycopg://cf@h/db?connect_timeout=3&options=-csearch_path%3Ds")
    assert postgres_connect_args(own, 10, 30) == {
        "options": "-csearch_path=s -c statement_timeout=30000"
    }
    set_already = sa.make_url("postgresql+psycopg://cf@h/db?options=-c%20statement_timeout%3D0")
    assert postgres_connect_args(set_already, 10, 30) == {"connect_timeout": 10}
    assert postgres_connect_args(plain, None, None) == {}


@pytest.mark.postgres
def test_postgres_sessions_carry_the_statement_timeout_and_keep_the_url_options(
    pg_url: str,
) -> None:
    with EventStore.open(pg_url) as store, store.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "30s"
        schema = sa.make_url(pg_url).query["options"]
        assert str(conn.exec_driver_sql("SHOW search_path").scalar()) in str(schema)


@pytest.mark.postgres
def test_a_statement_past_the_statement_timeout_is_store_unavailable_and_writes_nothing(
    pg_url: str,
) -> None:
    with EventStore.open(pg_url, statement_timeout=0.5) as store:
        blocker = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with blocker.connect() as held:
                held.exec_driver_sql("BEGIN")
                held.exec_driver_sql("LOCK TABLE streams IN ACCESS EXCLUSIVE MODE")
                with timed() as took, pytest.raises(StoreUnavailableError) as failed:
                    store.append("agent-x", 0, [NewEvent("Probe", {"n": 1})])
                held.exec_driver_sql("ROLLBACK")
        finally:
            blocker.dispose()

        assert took[0] < 0.5 + MARGIN
        assert "a statement timed out" in str(failed.value)
        assert str(failed.value).endswith("(nothing was written)")
        assert store.stream("agent-x") is None
        assert store.read_stream("agent-x") == []


# -- 10. URLs: interfaces obey the card rule ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://agent.example/rpc", True),
        ("http://127.0.0.1:8000/rpc", True),
        ("http://[::1]:8000/rpc", True),
        ("http://LOCALHOST/rpc", True),
        ("http://agent.example/rpc", False),
        ("http://192.0.2.10/rpc", False),
        ("ftp://agent.example/rpc", False),
        ("https:///no-host", False),
    ],
)
def test_one_rule_for_remote_urls_plain_http_only_to_loopback(url: str, allowed: bool) -> None:
    assert (url_refusal(url) is None) == allowed
    assert url_refusal(url, allow_insecure=True) is None or url.startswith(("ftp", "https:///"))


async def test_a_loopback_card_naming_a_plain_http_remote_interface_is_refused_before_sending(
    agent: HostileAgent, db: str
) -> None:
    agent.interfaces = [f"{TEST_NET}/rpc"]
    async with audited_engine(db, CONFIG) as engine:
        with pytest.raises(CardInvalidError) as refused:
            await engine.start_task(agent.url, skill=SKILL, text="secret")

        assert refused.value.kind == "insecure"
        assert refused.value.field == "supportedInterfaces"
        message = str(refused.value)
        assert f"{TEST_NET}/rpc: plain http to a non-loopback host refused" in message
        assert message.endswith("(nothing was sent)")
        assert agent.posts("SendMessage") == []
        assert await engine.tasks() == []
        kinds = [kind for kind, _ in agent_events(engine.store, agent.url)]
        assert kinds[-1] == ev.TASK_CREATION_REFUSED


async def test_a_usable_interface_is_chosen_over_a_plain_http_remote_one_listed_first(
    agent: HostileAgent, db: str
) -> None:
    agent.interfaces = [f"{TEST_NET}/rpc", agent.rpc_url]
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")

        assert engine.log.head(view.task).state["endpoint"]["url"] == agent.rpc_url
        assert len(agent.posts("SendMessage")) == 1


def test_allow_insecure_http_lets_a_plain_http_remote_interface_be_chosen() -> None:
    document = {
        "name": "a",
        "supportedInterfaces": [{"url": f"{TEST_NET}/rpc", "protocolBinding": "JSONRPC"}],
        "skills": [{"id": SKILL, "name": "Echo"}],
    }
    card = parse_card(json.dumps(document).encode())
    with pytest.raises(CardInvalidError):
        select_interface(card)
    assert select_interface(card, allow_insecure=True).url == f"{TEST_NET}/rpc"


async def test_a_plain_http_webhook_to_a_remote_host_is_not_registered_and_polling_goes_on(
    agent: HostileAgent, db: str
) -> None:
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        card_reads = len([r for r in agent.requests if r.method == "GET"])

        outcome = await engine.register_webhook(view.task, f"{TEST_NET}/hook")

        assert (outcome.registered, outcome.reason) == (False, "insecure_url")
        assert "plain http to a non-loopback host refused" in outcome.detail
        assert agent.posts("CreateTaskPushNotificationConfig") == []
        assert len([r for r in agent.requests if r.method == "GET"]) == card_reads
        assert types(engine.store, view.task)[-1] == ev.DELIVERY_DOWNGRADED
        assert (await engine.task(view.task)).delivery_mode == "polling"


def test_run_on_a_card_naming_an_interface_on_port_99999_exits_3_and_sends_nothing(
    agent: HostileAgent, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.interfaces = ["http://127.0.0.1:99999/rpc"]

    code = cli(["run", agent.url, "--skill", SKILL, "--text", "hi", "--db", db])

    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3, last
    assert last.startswith("CardInvalidError: ")
    assert "supportedInterfaces[0].url: its port is not a number from 1 to 65535" in last
    assert last.endswith("(nothing was sent)")
    assert agent.posts("SendMessage") == []


def test_resume_all_keeps_a_task_whose_card_moved_it_to_port_99999_and_drives_the_others(
    agent: HostileAgent, peer: Peer, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def start() -> tuple[str, str]:
        async with audited_engine(db, CONFIG) as engine:
            stayed = await engine.start_task(agent.url, skill=SKILL, text="hi")
            other = await engine.start_task(peer.base_url, skill="slow", text="slow 0.5")
            return stayed.task, other.task

    stayed, other = asyncio.run(start())
    agent.interfaces = ["http://127.0.0.1:99999/rpc"]  # an invalid card: a failed read (R8, R9)
    done = {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-01T00:00:01Z"}
    result = {"id": "t-1", "contextId": "c-1", "status": done}
    agent.rpc["GetTask"] = lambda rid: Reply(
        body=json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()
    )

    code = cli(["resume", "--all", "--until", "terminal", "--timeout", "20",
                "--max-poll-interval", "0.2", "--json", "--db", db])  # fmt: skip

    out, err = capsys.readouterr()
    assert code == 0, err
    states = {t["task"]: t["state"] for t in json.loads(out)["tasks"]}
    assert states == {stayed: "completed", other: "completed"}
    with EventStore.open(db) as store:
        assert ev.DISCOVERY_UNAVAILABLE in types(store, stayed)
        assert ev.ENDPOINT_MOVED not in types(store, stayed)
        assert store.stream(f"task:{stayed}").state["endpoint"]["url"] == agent.rpc_url


async def test_resume_does_not_move_a_task_to_a_plain_http_remote_interface(
    agent: HostileAgent, db: str
) -> None:
    async with audited_engine(db, CONFIG) as engine:
        view = await engine.start_task(agent.url, skill=SKILL, text="hi")
        agent.interfaces = [f"{TEST_NET}/rpc"]

        resumed = await engine.resume(view.task)

        assert engine.log.head(resumed.task).state["endpoint"]["url"] == agent.rpc_url
        assert ev.ENDPOINT_MOVED not in types(engine.store, view.task)
        assert ev.TASK_ORPHANED not in types(engine.store, view.task)
