"""The authenticated extended card (R15) read by :class:`Discovery`, field by field, against real
HTTP servers on 127.0.0.1.

Written to kill the mutants of ``Discovery.read_extended`` and ``Discovery._record_extended``,
``Discovery._memo_holds`` and ``extended_card_url``: where ``GetExtendedAgentCard`` is asked on
each binding and version, what a read records (every key of its ``CardFetched``) and stores,
when the memo answers instead of the wire (per key, per agent, up to ``max_card_age`` and 64
reads), how a signed extended card is checked and its key set pinned apart from the public
card's, what a failure records (a signature refusal) or leaves unrecorded (an answer that is not
a card, whatever the transport raises), and when a signed public card may be confirmed by a 304.
The agent is a raw HTTP/1.1 server of ``tests/support/hostile.py`` answering per path; every
test runs in well under a second.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import ECKey
from support.cards import card_document, skill
from support.hostile import Answer, Reply, Request, RoutedServer

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import AgentCard, Interface, parse_card
from cardfence.engine.cards.signature_policy import CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import FORM_RFC8785, sign_card
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import CardLimits, extended_card_url
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.discovery.signature_files import read_key_file
from cardfence.engine.errors import (
    CardInvalidError,
    CardSignatureError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
)
from cardfence.engine.http import deadline
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.event_store import EventStore

CARD = "/.well-known/agent-card.json"
RPC = "/rpc"
REST = "/rest"
REST03 = "/rest03"
JWKS = "/jwks.json"
JSON = {"Content-Type": "application/json"}
FAST = CardLimits(timeout=2.0, connect_timeout=1.0)
PUBLIC_REVISION = "the-public-revision"


def public_document() -> dict[str, Any]:
    return card_document(
        "http://127.0.0.1:1/rpc",
        capabilities={"pushNotifications": True, "extendedAgentCard": True},
    )


def extended_document(*, version: str = "2.0.0", push: bool = False) -> dict[str, Any]:
    """The extended card: one more skill than the public card, its own version."""
    doc = public_document()
    doc["version"] = version
    doc["capabilities"]["pushNotifications"] = push
    doc["skills"].append(skill("vip"))
    return doc


def rpc_card(doc: object) -> Callable[[Request], Reply]:
    """A JSON-RPC answer to ``GetExtendedAgentCard`` whose result is ``doc``."""

    def answer(request: Request) -> Reply:
        rid = json.loads(request.body)["id"]
        payload = {"jsonrpc": "2.0", "id": rid, "result": doc}
        return Reply(body=json.dumps(payload).encode(), headers=dict(JSON))

    return answer


def rpc_error(code: int, message: str) -> Callable[[Request], Reply]:
    def answer(request: Request) -> Reply:
        rid = json.loads(request.body)["id"]
        payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
        return Reply(body=json.dumps(payload).encode(), headers=dict(JSON))

    return answer


def rest_card(doc: object) -> Reply:
    return Reply(body=json.dumps(doc).encode(), headers=dict(JSON))


def parsed(doc: dict[str, Any], url: str) -> AgentCard:
    """The card as Discovery parses what the transport hands it (keys sorted, compact)."""
    raw = json.dumps(doc, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    return parse_card(raw, url=url)


@pytest.fixture
def key() -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": "card-key"})


def events_of(store: EventStore, origin: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in store.read_stream(ev.agent_stream_id(origin))]


def rpc_transport(client: httpx.AsyncClient, server: RoutedServer) -> A2ATransport:
    return A2ATransport(client, Interface(server.url + RPC, JSONRPC, "1.0"), timeout=2.0)


def key_file(tmp_path: Path, key: ECKey) -> str:
    path = tmp_path / "agent.jwks.json"
    path.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    return str(path)


def signed_limits(server: RoutedServer, policy: SignaturePolicy) -> CardLimits:
    signatures = CardSignatures.of({server.url: policy})
    return CardLimits(timeout=2.0, connect_timeout=1.0, signatures=signatures)


def fetched(read: CardRead, binding: str, public_revision: str | None) -> dict[str, Any]:
    """The ``CardFetched`` of an extended read, every key."""
    return {
        "url": read.url,
        "status": 200,
        "revision": read.card.revision,
        "version": read.card.version,
        "etag": None,
        "last_modified": None,
        "contract_hash": read.card.contract_hash,
        "push_notifications": read.card.push_notifications,
        "fetched_at": read.fetched_at.isoformat(),
        "extended": True,
        "binding": binding,
        "public_revision": public_revision,
    }


def verified(keys: CardKeys, doc: dict[str, Any], policy: str, pin: str) -> dict[str, Any]:
    """The ``signature`` of a read verified with ``keys``, every key."""
    return {
        "policy": policy,
        "status": "verified",
        "form": FORM_RFC8785,
        "alg": "ES256",
        "kid": "card-key",
        "index": 0,
        "signatures": doc["signatures"],
        "keys": keys.record(),
        "pin": pin,
    }


def failure(store: EventStore, origin: str, before: datetime) -> tuple[str, dict[str, Any]]:
    """The one event of a refused read, but its time (checked: between ``before`` and now)."""
    [(kind, data)] = events_of(store, origin)
    assert before <= datetime.fromisoformat(data["at"]) <= datetime.now(UTC)
    return kind, {k: v for k, v in data.items() if k != "at"}


# -- where the extended card is asked --------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "0.3"])
@pytest.mark.parametrize("url", ["https://a.test/rpc", "https://a.test/agents/X/"])
def test_over_jsonrpc_the_extended_card_is_asked_at_the_interface_url_itself(
    url: str, version: str
) -> None:
    assert extended_card_url(Interface(url, JSONRPC, version)) == url


@pytest.mark.parametrize(
    ("url", "version", "legacy", "expected"),
    [
        ("https://a.test/rest", "1.0", False, "https://a.test/rest/extendedAgentCard"),
        ("https://a.test/agents/X/", "1.0", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/agents/X//", "1.1", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/agents/X/", "", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/rest", "0.3", False, "https://a.test/rest/v1/card"),
        ("https://a.test/agents/X/", "0.3.0", False, "https://a.test/agents/X/v1/card"),
        ("https://a.test/agents/X/", "0.2", False, "https://a.test/agents/X/v1/card"),
        ("https://a.test/agents/X/", "", True, "https://a.test/agents/X/v1/card"),
    ],
)
def test_over_http_json_the_extended_card_is_under_the_url_without_its_trailing_slash(
    url: str, version: str, legacy: bool, expected: str
) -> None:
    """1.0: ``{url}/extendedAgentCard``; the 0.3 dialect (0.2 too, and a 0.x card declaring no
    version): ``{url}/v1/card``. Trailing slashes go, nothing else (``X`` is kept)."""
    interface = Interface(url, HTTP_JSON, version, legacy_card=legacy)
    assert extended_card_url(interface) == expected


# -- one extended read on the wire -----------------------------------------------------------------


async def test_an_extended_read_over_jsonrpc_records_every_field_and_stores_its_own_snapshot(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    doc = extended_document()
    server.routes[RPC] = rpc_card(doc)
    discovery = Discovery(store, client, limits=FAST)
    before = datetime.now(UTC)

    read = await discovery.read_extended(
        server.url + "/agents/a/", rpc_transport(client, server), public_revision=PUBLIC_REVISION
    )

    url = server.url + RPC
    card = parsed(doc, url)
    assert (read.agent, read.url, read.status) == (server.url, url, 200)
    assert (read.etag, read.last_modified, read.from_memo) == (None, None, False)
    assert read.card == card
    assert read.revision == card.revision
    assert read.card.source_url == url
    assert [skill.id for skill in read.card.skills] == ["echo", "vip"]
    assert before <= read.fetched_at <= datetime.now(UTC)
    [request] = server.requests
    assert (request.method, request.path, request.rpc_method) == (
        "POST",
        RPC,
        "GetExtendedAgentCard",
    )
    assert events_of(store, server.url) == [
        (ev.CARD_FETCHED, fetched(read, "JSONRPC", PUBLIC_REVISION))
    ]
    assert events_of(store, server.url)[0][1]["version"] == "2.0.0"
    assert store.snapshot_revisions() == [read.revision]
    snapshot = store.get_snapshot(read.revision)
    assert snapshot is not None
    assert (snapshot.body, snapshot.source_url) == (card.canonical_bytes().decode(), url)
    assert (snapshot.etag, snapshot.http_status, snapshot.fetched_at) == (
        None,
        200,
        read.fetched_at,
    )
    # The public card's fields of the agent's projection are left alone.
    state = await discovery.agent_state(server.url)
    assert (state["revision"], state["card_url"], state["etag"]) == (None, None, None)


@pytest.mark.parametrize(
    ("prefix", "version", "path"),
    [(REST, "1.0", REST + "/extendedAgentCard"), (REST03, "0.3", REST03 + "/v1/card")],
    ids=["1.0", "0.3"],
)
async def test_an_extended_read_over_http_json_is_recorded_at_the_path_it_was_asked(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    prefix: str,
    version: str,
    path: str,
) -> None:
    """Without ``public_revision``, the record says None; the binding is the interface's."""
    doc = extended_document(push=True)
    server.routes[path] = rest_card(doc)
    transport = A2ATransport(client, Interface(server.url + prefix + "/", HTTP_JSON, version))

    read = await Discovery(store, client, limits=FAST).read_extended(server.url, transport)

    assert [(r.method, r.path) for r in server.requests] == [("GET", path)]
    assert (read.url, read.status) == (server.url + path, 200)
    assert read.card == parsed(doc, server.url + path)
    assert events_of(store, server.url) == [(ev.CARD_FETCHED, fetched(read, "HTTP+JSON", None))]
    assert events_of(store, server.url)[0][1]["push_notifications"] is True
    assert store.snapshot_revisions() == [read.revision]


# -- the memo --------------------------------------------------------------------------------------


async def test_an_extended_read_not_fresh_is_served_from_its_memo_until_max_card_age_old(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    now = [1000.0]
    discovery = Discovery(store, client, limits=FAST, max_card_age=60.0, clock=lambda: now[0])

    first = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert first.status == 200  # nothing kept yet: from the wire
    assert len(server.requests) == 1

    now[0] += 59.5
    memo = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert memo == dataclasses.replace(first, status=0)
    assert memo.from_memo
    assert (memo.fetched_at, memo.url, memo.agent) == (first.fetched_at, first.url, server.url)
    assert len(server.requests) == 1
    assert len(events_of(store, server.url)) == 1

    now[0] += 0.5  # exactly max_card_age old: read again, and kept from now on
    second = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert second.status == 200
    assert second.fetched_at > first.fetched_at
    assert len(server.requests) == 2
    assert len(events_of(store, server.url)) == 2

    now[0] += 59.9
    again = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert again == dataclasses.replace(second, status=0)
    assert len(server.requests) == 2


async def test_an_extended_read_is_fresh_by_default_and_refreshes_what_its_memo_keeps(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    first = await discovery.read_extended(server.url, transport, memo="alice")
    second = await discovery.read_extended(server.url, transport, memo="alice")
    third = await discovery.read_extended(server.url, transport, memo="alice", fresh=True)
    assert [r.status for r in (first, second, third)] == [200, 200, 200]
    assert len(server.requests) == 3
    assert len(events_of(store, server.url)) == 3

    kept = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert kept == dataclasses.replace(third, status=0)
    assert kept.fetched_at == third.fetched_at != first.fetched_at
    assert len(server.requests) == 3


async def test_an_extended_read_without_a_memo_key_is_never_served_from_memory(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    for _ in range(3):
        read = await discovery.read_extended(server.url, transport, fresh=False)
        assert read.status == 200
    assert len(server.requests) == 3
    assert len(events_of(store, server.url)) == 3


async def test_the_extended_memo_is_kept_apart_per_key_and_per_agent(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)
    other = f"http://localhost:{server.port}"  # another origin, the same agent behind it

    alice = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    bob = await discovery.read_extended(server.url, transport, memo="bob", fresh=False)
    elsewhere = await discovery.read_extended(other, transport, memo="alice", fresh=False)
    assert [r.status for r in (alice, bob, elsewhere)] == [200, 200, 200]
    assert (alice.agent, elsewhere.agent) == (server.url, other)
    assert len(server.requests) == 3

    assert await discovery.read_extended(
        server.url, transport, memo="alice", fresh=False
    ) == dataclasses.replace(alice, status=0)
    assert await discovery.read_extended(
        server.url, transport, memo="bob", fresh=False
    ) == dataclasses.replace(bob, status=0)
    assert await discovery.read_extended(
        other, transport, memo="alice", fresh=False
    ) == dataclasses.replace(elsewhere, status=0)
    assert len(server.requests) == 3
    assert [t for t, _ in events_of(store, server.url)] == [ev.CARD_FETCHED] * 2
    assert [t for t, _ in events_of(store, other)] == [ev.CARD_FETCHED]


async def test_the_extended_memo_keeps_the_last_64_reads_and_forgets_the_least_recently_used(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    async def read(key: int, *, fresh: bool = False) -> bool:
        """Whether the read of memo key ``key`` went to the wire."""
        asked = len(server.requests)
        got = await discovery.read_extended(server.url, transport, memo=key, fresh=fresh)
        went = len(server.requests) > asked
        assert got.from_memo is not went
        return went

    assert all([await read(k) for k in range(64)])
    assert not any([await read(k) for k in range(64)])  # all 64 kept (the same order)
    assert not await read(0)  # served: now the most recently used
    assert await read(1, fresh=True)  # kept again: now the most recently used
    assert await read(64)  # the 65th: the least recently used (2) goes
    assert not await read(64)
    assert not any([await read(k) for k in (0, 1, 3, 63)])
    assert await read(2)
    assert len(server.requests) == 67


# -- a signed extended card ------------------------------------------------------------------------


async def test_a_signed_extended_card_is_verified_recorded_with_its_signature_and_key_set(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    keys_path = key_file(tmp_path, key)
    limits = signed_limits(server, SignaturePolicy("require", keys_path))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    url = server.url + RPC

    read = await discovery.read_extended(
        server.url, transport, public_revision=PUBLIC_REVISION, memo="alice"
    )
    again = await discovery.read_extended(server.url, transport, public_revision="p2")

    keys = read_key_file(keys_path, url, FAST.max_bytes)
    assert events_of(store, server.url) == [
        (
            ev.CARD_FETCHED,
            {
                **fetched(read, "JSONRPC", PUBLIC_REVISION),
                "signature": verified(keys, doc, "require", "pinned"),
            },
        ),
        (
            ev.CARD_FETCHED,
            {
                **fetched(again, "JSONRPC", "p2"),
                "signature": verified(keys, doc, "require", "matched"),
            },
        ),
    ]
    # The card is stored without its signatures, the key set as a snapshot of its own.
    assert set(store.snapshot_revisions()) == {read.revision, keys.revision}
    snapshot = store.get_snapshot(read.revision)
    assert snapshot is not None
    assert "signatures" not in json.loads(snapshot.body)
    stored_keys = store.get_snapshot(keys.revision)
    assert stored_keys is not None
    assert (stored_keys.body, stored_keys.source_url, stored_keys.etag) == (
        keys.body,
        keys.url,
        None,
    )
    assert (stored_keys.http_status, stored_keys.fetched_at) == (200, read.fetched_at)
    # A verified read is kept in its memo.
    kept = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert kept == dataclasses.replace(read, status=0)
    assert len(server.requests) == 2


async def test_an_extended_card_failing_its_agents_policy_is_recorded_and_neither_stored_nor_kept(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    server.routes[RPC] = rpc_card(extended_document())  # unsigned
    key = ECKey.generate_key("P-256", parameters={"kid": "card-key"})
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    before = datetime.now(UTC)

    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url + "/a/", transport, memo="alice", fresh=False)

    reason = "the card is not signed, and its agent's policy requires a signature"
    assert (caught.value.url, caught.value.kind, caught.value.detail) == (
        server.url + RPC,
        "signature",
        reason,
    )
    assert failure(store, server.url, before) == (
        ev.DISCOVERY_FAILED,
        {"url": server.url + RPC, "kind": "signature", "detail": reason},
    )
    assert store.snapshot_revisions() == []
    with pytest.raises(CardSignatureError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.requests) == 2
    assert [t for t, _ in events_of(store, server.url)] == [ev.DISCOVERY_FAILED] * 2
    assert store.snapshot_revisions() == []


async def test_an_extended_cards_signatures_are_checked_for_its_agent_at_the_url_it_came_from(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
) -> None:
    """The policy is the agent's (by its origin, not the interface's path), and a refusal names
    the agent and the extended card's URL."""
    server.routes[REST + "/extendedAgentCard"] = rest_card(sign_card(extended_document(), key))
    limits = signed_limits(server, SignaturePolicy("require"))  # no keys, no jku
    discovery = Discovery(store, client, limits=limits)
    transport = A2ATransport(client, Interface(server.url + REST, HTTP_JSON, "1.0"))
    before = datetime.now(UTC)

    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url + "/agents/a/", transport)

    url = server.url + REST + "/extendedAgentCard"
    reason = (
        f"no keys to verify the card's signatures with: none are configured for {server.url}, "
        "and the signatures name no jku"
    )
    assert (caught.value.url, caught.value.detail) == (url, reason)
    assert failure(store, server.url, before) == (
        ev.DISCOVERY_FAILED,
        {"url": url, "kind": "signature", "detail": reason},
    )
    assert store.snapshot_revisions() == []


async def test_the_extended_cards_key_set_is_read_within_the_card_timeout(
    server: RoutedServer, store: EventStore, key: ECKey
) -> None:
    jwks = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    server.routes[JWKS] = Reply(body=jwks, headers=dict(JSON))
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    seen: list[tuple[str, float | None, float]] = []

    async def note(request: httpx.Request) -> None:
        seen.append((request.url.path, deadline.current(), time.monotonic()))

    limits = signed_limits(server, SignaturePolicy("require", server.url + JWKS))
    async with httpx.AsyncClient(event_hooks={"request": [note]}) as client:
        discovery = Discovery(store, client, limits=limits)
        read = await discovery.read_extended(server.url, rpc_transport(client, server))

    assert [path for path, *_ in seen] == [RPC, JWKS]
    [(_, bound, at)] = [entry for entry in seen if entry[0] == JWKS]
    assert bound is not None
    assert limits.timeout - 0.5 < bound - at <= limits.timeout
    keys = parse_keys(
        jwks, source="url", url=server.url + JWKS, card_url=read.url, max_bytes=FAST.max_bytes
    )
    [(_, data)] = events_of(store, server.url)
    assert data["signature"] == verified(keys, doc, "require", "pinned")
    assert data["signature"]["keys"]["source"] == "url"
    assert set(store.snapshot_revisions()) == {read.revision, keys.revision}


async def test_the_extended_cards_key_set_is_pinned_apart_from_the_public_cards(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    """The public card's pin does not count for the extended card: its first verified read pins
    its own, the next matches it, and an unsigned extended card after it is a downgrade, refused
    and recorded, neither stored nor kept."""
    server.routes[CARD] = Reply(body=json.dumps(sign_card(public_document(), key)).encode())
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    keys_path = key_file(tmp_path, key)
    limits = signed_limits(server, SignaturePolicy("prefer", keys_path))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    url = server.url + RPC
    keys = read_key_file(keys_path, url, FAST.max_bytes)

    public = await discovery.read(server.url)
    first = await discovery.read_extended(server.url, transport, public_revision=public.revision)
    second = await discovery.read_extended(server.url, transport, public_revision=public.revision)
    pins = [d["signature"]["pin"] for _, d in events_of(store, server.url)]
    assert pins == ["pinned", "pinned", "matched"]
    assert events_of(store, server.url)[1:] == [
        (
            ev.CARD_FETCHED,
            {
                **fetched(read, "JSONRPC", public.revision),
                "signature": verified(keys, doc, "prefer", pin),
            },
        )
        for read, pin in ((first, "pinned"), (second, "matched"))
    ]
    stored = set(store.snapshot_revisions())

    server.routes[RPC] = rpc_card(extended_document(version="3.0.0"))  # unsigned
    before = datetime.now(UTC)
    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url, transport, memo="alice")
    reason = (
        f"the card is unsigned, and key set {keys.key_set[:12]} is pinned for {server.url}: "
        "refused as a downgrade (accept_key_change accepts it)"
    )
    assert (caught.value.url, caught.value.detail) == (url, reason)
    (kind, data) = events_of(store, server.url)[-1]
    assert (kind, data["url"], data["kind"], data["detail"]) == (
        ev.DISCOVERY_FAILED,
        url,
        "signature",
        reason,
    )
    assert before <= datetime.fromisoformat(data["at"]) <= datetime.now(UTC)
    assert set(data) == {"url", "kind", "detail", "at"}
    assert set(store.snapshot_revisions()) == stored
    with pytest.raises(CardSignatureError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.paths()) == 5


# -- what is not a card, and what the transport raises ---------------------------------------------


async def test_an_answer_that_is_not_a_card_is_refused_as_invalid_and_nothing_is_recorded(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card({"name": "not a card"})
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)
    transport = rpc_transport(client, server)

    with pytest.raises(CardInvalidError) as caught:
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)

    assert (caught.value.url, caught.value.kind) == (server.url + RPC, "invalid_card")
    assert events_of(store, server.url) == []
    assert store.snapshot_revisions() == []
    with pytest.raises(CardInvalidError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("route", "answer", "raised"),
    [
        (RPC, rpc_error(-32007, "Extended card not configured"), RemoteRefusedError),
        (RPC, rpc_card(["not", "an", "object"]), InvalidAgentResponseError),
        ("/elsewhere", rest_card({}), EndpointUnreachableError),  # the RPC path is a 404
    ],
    ids=["refused", "not-an-object", "unreachable"],
)
async def test_what_the_transport_raises_passes_through_and_nothing_is_recorded(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
    route: str,
    answer: Answer,
    raised: type[Exception],
) -> None:
    server.routes[route] = answer
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    discovery = Discovery(store, client, limits=limits)

    with pytest.raises(raised) as caught:
        await discovery.read_extended(server.url, rpc_transport(client, server), memo="alice")

    assert type(caught.value) is raised
    assert getattr(caught.value, "url", None) == server.url + RPC
    if isinstance(caught.value, RemoteRefusedError):
        assert caught.value.code == -32007
    assert events_of(store, server.url) == []
    assert store.snapshot_revisions() == []


# -- when a signed public card may be confirmed by a 304 -------------------------------------------


async def test_the_memo_holds_only_the_revision_last_read_from_that_origin(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(body=json.dumps(public_document()).encode())
    discovery = Discovery(store, client, limits=FAST)
    assert not discovery._memo_holds(server.url, None)
    assert not discovery._memo_holds(
        server.url, parse_card(json.dumps(public_document()).encode()).revision
    )

    read = await discovery.read(server.url)

    assert discovery._memo_holds(server.url, read.revision) is True
    assert discovery._memo_holds(server.url, "another-revision") is False
    assert discovery._memo_holds(server.url, None) is False
    assert discovery._memo_holds(f"http://localhost:{server.port}", read.revision) is False
    # An extended read is not the public card's memo.
    server.routes[RPC] = rpc_card(extended_document())
    extended = await discovery.read_extended(server.url, rpc_transport(client, server), memo="a")
    assert discovery._memo_holds(server.url, extended.revision) is False
    assert discovery._memo_holds(server.url, read.revision) is True


async def test_a_signed_card_is_confirmed_by_a_304_only_while_its_revision_is_in_memory(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    """A 304 confirms a signed card only when its signatures are at hand: the revision the
    agent's stream names is the one in memory. Otherwise the card is read whole, no validator."""

    def served(doc: dict[str, Any], etag: str) -> Callable[[Request], Reply]:
        def answer(request: Request) -> Reply:
            if "if-none-match" in request.headers:
                return Reply(status=304, body=b"", headers={})
            return Reply(body=json.dumps(doc).encode(), headers={**JSON, "ETag": etag})

        return answer

    server.routes[CARD] = served(sign_card(public_document(), key), '"e1"')
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    holder = Discovery(store, client, limits=limits)
    first = await holder.read(server.url)
    assert first.status == 200
    assert "if-none-match" not in server.requests[-1].headers

    assert (await holder.read(server.url)).status == 304  # in memory: confirmed
    assert server.requests[-1].headers["if-none-match"] == '"e1"'

    other = Discovery(store, client, limits=limits)  # nothing in memory: read whole
    assert (await other.read(server.url)).status == 200
    assert "if-none-match" not in server.requests[-1].headers

    changed = public_document()
    changed["version"] = "1.1.0"
    server.routes[CARD] = served(sign_card(changed, key), '"e2"')
    newer = await Discovery(store, client, limits=limits).read(server.url)
    assert newer.revision != first.revision
    # The stream names the newer revision; the holder's memory has the older one: read whole.
    again = await holder.read(server.url)
    assert (again.status, again.revision) == (200, newer.revision)
    assert "if-none-match" not in server.requests[-1].headers
    assert len(server.requests) == 5
