"""Discovery against a real a2a-sdk agent whose card the tests mutate and break (R2, R3, R14)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from support import Peer
from support.engine_fixtures import LoopWatch

from cardfence.engine.core import events as ev
from cardfence.engine.discovery import reads as discovery_module
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import CardInvalidError, ContractChangedError, DiscoveryError
from cardfence.engine.http.offload import StoreCalls
from cardfence.store.errors import ConcurrencyError
from cardfence.store.event_store import EventStore

FAST = CardLimits(timeout=1.0, connect_timeout=0.5)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


def _agent_events(store: EventStore, peer: Peer) -> list[tuple[str, dict[str, Any]]]:
    stream = ev.agent_stream_id(card_urls(peer.base_url)[0])
    return [(e.type, e.data) for e in store.read_stream(stream)]


def _rotate_security(card: dict[str, Any]) -> None:
    card["securitySchemes"] = {"mtls": {"mtlsSecurityScheme": {}}}
    card["securityRequirements"] = [{"schemes": {"mtls": {"list": []}}}]


# -- reading and recording -------------------------------------------------------------------------


async def test_first_read_records_the_card_and_stores_its_snapshot_once(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    read = await Discovery(sqlite_store, client).read(peer.base_url)

    assert (read.status, read.url, read.card.name) == (200, peer.card_url, "cardfence-peer")
    assert read.etag == peer.card_etag
    [(kind, data)] = _agent_events(sqlite_store, peer)
    assert kind == ev.CARD_FETCHED
    assert (data["revision"], data["status"], data["version"]) == (read.revision, 200, "1.0.0")
    snapshot = sqlite_store.get_snapshot(read.revision)
    assert snapshot is not None
    assert snapshot.body.encode() == read.card.canonical_bytes()
    assert sqlite_store.snapshot_revisions() == [read.revision]


async def test_unchanged_card_is_revalidated_with_its_etag_and_304_confirms_it(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(sqlite_store, client)
    first = await discovery.read(peer.base_url)
    again = await Discovery(sqlite_store, client).read(peer.base_url)  # a new process: no memo

    assert again.status == 304
    assert again.revision == first.revision
    assert peer.card_log[-1].if_none_match == first.etag
    assert [d["status"] for _, d in _agent_events(sqlite_store, peer)] == [200, 304]
    assert sqlite_store.snapshot_revisions() == [first.revision]


async def test_changed_card_is_read_whole_and_stored_as_a_new_revision(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(sqlite_store, client)
    first = await discovery.read(peer.base_url)
    peer.mutate_card(lambda c: c.update(version="2.0.0"))
    second = await discovery.read(peer.base_url)

    assert (second.status, second.card.version) == (200, "2.0.0")
    assert second.revision != first.revision
    assert sorted(sqlite_store.snapshot_revisions()) == sorted([first.revision, second.revision])


async def test_card_at_the_0_3_path_is_found_when_the_1_0_path_is_404(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("not_found_new_path")
    read = await Discovery(sqlite_store, client).read(peer.base_url)
    assert read.url == peer.base_url + "/.well-known/agent.json"
    assert [hit.path for hit in peer.card_log] == [
        "/.well-known/agent-card.json",
        "/.well-known/agent.json",
    ]


async def test_a_url_ending_in_json_is_the_card_itself(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    read = await Discovery(sqlite_store, client).read(peer.card_url)
    assert read.url == peer.card_url
    assert peer.card_requests == 1


async def test_same_origin_redirect_is_followed(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("redirect_same_origin")
    read = await Discovery(sqlite_store, client).read(peer.base_url)
    assert read.status == 200
    assert [hit.path for hit in peer.card_log] == [
        "/.well-known/agent-card.json",
        "/moved/agent-card.json",
    ]


# -- every failure kind, recorded -----------------------------------------------------------------


async def _failure(
    peer: Peer, store: EventStore, client: httpx.AsyncClient, limits: CardLimits = FAST
) -> DiscoveryError:
    with pytest.raises(DiscoveryError) as caught:
        await Discovery(store, client, limits=limits).read(peer.base_url)
    (kind, data) = _agent_events(store, peer)[-1]
    assert kind == ev.DISCOVERY_FAILED
    assert (data["kind"], data["url"]) == (caught.value.kind, caught.value.url)
    assert store.snapshot_revisions() == []
    return caught.value


async def test_card_503_is_a_discovery_error_of_kind_http_status(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("503")
    error = await _failure(peer, sqlite_store, client)
    assert (error.kind, error.detail) == ("http_status", "503")
    assert str(error) == f"GET {peer.card_url} -> 503"


async def test_both_card_paths_404_is_a_discovery_error(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("404")
    error = await _failure(peer, sqlite_store, client)
    assert (error.kind, error.detail) == ("http_status", "404")


async def test_hanging_card_endpoint_times_out_within_the_deadline(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("hang")
    started = time.monotonic()
    error = await _failure(peer, sqlite_store, client, CardLimits(timeout=0.5))
    assert error.kind == "timeout"
    assert time.monotonic() - started < 5


async def test_invalid_json_card_is_card_invalid_error(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("invalid_json")
    error = await _failure(peer, sqlite_store, client)
    assert isinstance(error, CardInvalidError)
    assert error.kind == "invalid_card"
    assert "not JSON" in str(error)


async def test_card_invalid_as_an_agent_card_names_the_field(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.mutate_card(lambda c: c["skills"][1].pop("id"))
    error = await _failure(peer, sqlite_store, client)
    assert isinstance(error, CardInvalidError)
    assert error.field == "skills[1].id"


async def test_5mb_card_is_refused_without_reading_it_whole(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("huge")
    limits = CardLimits(timeout=10.0, max_bytes=256 * 1024)
    error = await _failure(peer, sqlite_store, client, limits)
    assert isinstance(error, CardInvalidError)
    assert error.kind == "too_large"
    await asyncio.sleep(0.3)  # let the peer notice the disconnect
    assert peer.huge_bytes_sent < 2 * 1024 * 1024  # of 5 MiB


async def test_redirect_to_another_origin_is_refused_and_not_followed(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    peer.set_card_fault("redirect_cross_origin")
    error = await _failure(peer, sqlite_store, client)
    assert error.kind == "redirect"
    assert peer.cross_origin_requests == 0


async def test_closed_port_is_a_network_error(
    sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    with Peer() as gone:
        url = gone.base_url
    with pytest.raises(DiscoveryError) as caught:
        await Discovery(sqlite_store, client, limits=FAST).read(url)
    assert caught.value.kind == "network"


async def test_plain_http_to_a_remote_host_is_refused_before_any_request(
    sqlite_store: EventStore,
) -> None:
    requests: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={})

    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as offline:
        with pytest.raises(DiscoveryError) as caught:
            await Discovery(sqlite_store, offline).read("http://agent.example.org")
    assert caught.value.kind == "insecure"
    assert requests == []


# -- memo and freshness ----------------------------------------------------------------------------


async def test_memo_serves_reads_within_max_card_age_and_fresh_reads_always_go_out(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    now = [1000.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    discovery = Discovery(sqlite_store, client, max_card_age=120.0, clock=clock)
    await discovery.read(peer.base_url, fresh=True)
    assert peer.card_requests == 1

    memo = await discovery.read(peer.base_url, fresh=False)
    assert memo.from_memo
    assert peer.card_requests == 1
    await discovery.read(peer.base_url, fresh=True)
    assert peer.card_requests == 2

    now[0] += 121.0
    aged = await discovery.read(peer.base_url, fresh=False)
    assert not aged.from_memo
    assert peer.card_requests == 3
    assert len(_agent_events(sqlite_store, peer)) == 3  # memo hits are not reads


# -- contract pinning (R3) -------------------------------------------------------------------------


async def test_first_contract_is_pinned_and_the_same_contract_matches(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(sqlite_store, client)
    read = await discovery.read(peer.base_url)
    assert (await discovery.check_contract(read)).outcome == "pinned"
    peer.mutate_card(lambda c: c.update(description="reworded", version="1.0.1"))
    reread = await discovery.read(peer.base_url)
    assert (await discovery.check_contract(reread)).outcome == "matched"
    pins = [t for t, _ in _agent_events(sqlite_store, peer) if t == ev.CONTRACT_PINNED]
    assert pins == [ev.CONTRACT_PINNED]


async def test_rotated_contract_is_refused_naming_old_and_new_hashes(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(sqlite_store, client)
    pinned = await discovery.check_contract(await discovery.read(peer.base_url))
    peer.mutate_card(_rotate_security)
    rotated = await discovery.read(peer.base_url)
    with pytest.raises(ContractChangedError) as caught:
        await discovery.check_contract(rotated)
    assert caught.value.pinned == pinned.contract_hash
    assert caught.value.fresh == rotated.card.contract_hash
    assert "security_schemes" in str(caught.value)
    state = await discovery.agent_state(peer.base_url)
    assert state["pinned_contract"] == pinned.contract_hash


async def test_accepted_contract_is_recorded_and_becomes_the_pin(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(sqlite_store, client)
    first = await discovery.check_contract(await discovery.read(peer.base_url))
    peer.mutate_card(_rotate_security)
    rotated = await discovery.read(peer.base_url)
    accepted = await discovery.check_contract(rotated, accept=True)
    assert (accepted.outcome, accepted.previous) == ("accepted", first.contract_hash)
    assert (await discovery.check_contract(rotated)).outcome == "matched"
    (kind, data) = [e for e in _agent_events(sqlite_store, peer) if e[0].startswith("Contract")][-1]
    assert kind == ev.CONTRACT_ACCEPTED
    assert data["previous"] == first.contract_hash


async def test_many_reads_of_one_agent_at_once_never_conflict_with_each_other(
    peer: Peer, db_url: str, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read records a ``CardFetched`` in the agent's one stream; reads of one process at
    once take turns there instead of failing on each other's appends and retrying."""
    conflicts: list[str] = []
    append = EventStore.append

    def counted(store: EventStore, stream_id: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return append(store, stream_id, *args, **kwargs)
        except ConcurrencyError:
            conflicts.append(stream_id)
            raise

    monkeypatch.setattr(EventStore, "append", counted)
    with EventStore.open(db_url) as store:
        calls = StoreCalls(store)  # worker threads, as the engine runs it (4 on PostgreSQL)
        try:
            discovery = Discovery(store, client, calls=calls)
            await discovery.read(peer.base_url)
            await asyncio.gather(*(discovery.read(peer.base_url) for _ in range(40)))
        finally:
            calls.close()
        fetched = [t for t, _ in _agent_events(store, peer) if t == ev.CARD_FETCHED]
    assert conflicts == []
    assert len(fetched) == 41  # every read recorded


async def test_a_large_card_is_parsed_while_the_event_loop_goes_on(
    peer: Peer, sqlite_store: EventStore, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a card is pure Python (~0.13 s for 700 KB): a large one is parsed on a worker
    thread, so a process driving tasks and answering deliveries on the loop never stalls on an
    agent serving one (changed at every read, it would be parsed at every read)."""
    peer.mutate_card(lambda c: c.update(description="A large card. " * 20_000))  # 280 KB
    watch = LoopWatch()
    watch.patch(monkeypatch, discovery_module, "parse_card")
    async with watch.watched():
        read = await Discovery(sqlite_store, client).read(peer.base_url)

    assert watch.calls == [("parse_card", True)]
    assert len(read.card.canonical_bytes()) > 280_000
    assert sqlite_store.snapshot_revisions() == [read.revision]


async def test_two_first_uses_racing_pin_the_contract_once(
    peer: Peer, db_url: str, client: httpx.AsyncClient
) -> None:
    stores = [EventStore.open(db_url), EventStore.open(db_url)]
    try:
        discoveries = [Discovery(s, client) for s in stores]
        reads = await asyncio.gather(*(d.read(peer.base_url) for d in discoveries))
        checks = await asyncio.gather(
            *(d.check_contract(r) for d, r in zip(discoveries, reads, strict=True))
        )
        assert sorted(c.outcome for c in checks) == ["matched", "pinned"]
        pins = [t for t, _ in _agent_events(stores[0], peer) if t == ev.CONTRACT_PINNED]
        assert len(pins) == 1
        assert stores[0].verify_stream(ev.agent_stream_id(card_urls(peer.base_url)[0])) is None
    finally:
        for s in stores:
            s.close()
