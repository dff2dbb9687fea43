"""Signed card reads against real HTTP servers on 127.0.0.1, branch by branch (R14, R3).

Which key set an agent's policy picks (a key file, a keys URL, the ``jku`` the signatures name) and
the exact one-line reason of each refusal; how a key set on the network is read (within the card's
bounds, in a request slot), kept for ``max_card_age`` (an injected clock, on both sides of the
boundary) and reported under the source it was asked for, from the cache too; how the pinned key set
is found in the agent's stream (incrementally, the public card's and the extended card's apart,
passing over every event that pins nothing); and how a read's key set is compared with the pinned
one: pinned, matched, accepted, or refused with both key sets and the kids named. The servers are
the raw HTTP/1.1 servers of ``tests/support/hostile.py``, told what to answer per path; the events
are appended by hand where that is the clearer way to reach a branch. Every test runs in well under
a second."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import ECKey, Key
from support.cards import card_document
from support.hostile import Reply, RoutedServer
from support.slots import RecordedSlots
from support.virtual_time import Clock

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.signature_policy import CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import FORM_RFC8785, SignatureCheck, Verified, sign_card
from cardfence.engine.core import events as ev
from cardfence.engine.discovery._agent_stream import append_agent_events
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import CardSignatureError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, RecordedEvent

CARD = "/.well-known/agent-card.json"
JWKS = "/.well-known/jwks.json"
JSON = {"Content-Type": "application/json"}
AGENT = "https://agent.example"  # an origin only the hand-made reads and events name
AGENT_CARD = AGENT + CARD


class ReadsSeen:
    """The store as the pinned key set's scan sees it: every ``read_stream`` is remembered, and
    ``during_read`` (when set) runs as each read is made (another worker's scan finishing)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.reads: list[tuple[str, int]] = []
        self.during_read: Callable[[], None] | None = None

    def read_stream(self, stream_id: str, from_version: int = 1) -> list[RecordedEvent]:
        self.reads.append((stream_id, from_version))
        if self.during_read is not None:
            self.during_read()
        return self.store.read_stream(stream_id, from_version)


def ec_key(kid: str | None = "card-key") -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid} if kid else None)


def jwks(*keys: Key) -> dict[str, Any]:
    return {"keys": [k.as_dict(private=False) for k in keys]}


def jwks_reply(*keys: Key) -> Reply:
    return Reply(body=json.dumps(jwks(*keys)).encode(), headers=dict(JSON))


def key_set(*keys: Key, source: str = "url", url: str = "https://keys.example/jwks") -> CardKeys:
    body = json.dumps(jwks(*keys)).encode()
    return parse_keys(body, source=source, url=url, card_url=AGENT_CARD)


def document() -> dict[str, Any]:
    return card_document("http://127.0.0.1:1/rpc", capabilities={"pushNotifications": True})


def card_reply(doc: Mapping[str, Any]) -> Reply:
    return Reply(body=json.dumps(doc).encode(), headers=dict(JSON))


def limits(origin: str, policy: SignaturePolicy, *, max_bytes: int = 1_048_576) -> CardLimits:
    return CardLimits(
        timeout=2.0,
        connect_timeout=1.0,
        max_bytes=max_bytes,
        signatures=CardSignatures.of({origin: policy}),
    )


def discovery(
    store: EventStore,
    client: httpx.AsyncClient,
    origin: str,
    policy: SignaturePolicy,
    *,
    max_bytes: int = 1_048_576,
    **options: Any,
) -> Discovery:
    """Card reads under ``policy`` for the agent at ``origin`` (``options``: the clock, the
    ``max_card_age``, the request slots)."""
    return Discovery(store, client, limits=limits(origin, policy, max_bytes=max_bytes), **options)


def append(store: EventStore, origin: str, *events: tuple[str, dict[str, Any]]) -> None:
    """Append hand-made events to the agent's stream, one at a time."""
    stream = ev.agent_stream_id(origin)
    for kind, data in events:
        store.append(stream, len(store.read_stream(stream)), [NewEvent(kind, data)])


def fetched(signature: object, *, extended: bool = False) -> tuple[str, dict[str, Any]]:
    """A ``CardFetched`` carrying ``signature`` (of the extended card when ``extended``)."""
    data: dict[str, Any] = {"url": AGENT_CARD, "status": 200, "signature": signature}
    if extended:
        data["extended"] = True
    return ev.CARD_FETCHED, data


def pinning(
    key_set: str, pin: str = "pinned", *, extended: bool = False
) -> tuple[str, dict[str, Any]]:
    """A ``CardFetched`` whose signature check pinned (or matched, accepted) ``key_set``."""
    signature = {
        "policy": "require",
        "status": "verified",
        "keys": {"key_set": key_set},
        "pin": pin,
    }
    return fetched(signature, extended=extended)


def hand_read(url: str = AGENT_CARD) -> CardRead:
    card = parse_card(json.dumps(document()).encode(), url=url)
    return CardRead(AGENT, card, url, 200, None, None, datetime(2026, 1, 1, tzinfo=UTC))


SIGNATURES = ({"protected": "eyJhbGciOiJFUzI1NiJ9", "signature": "c2ln"},)


def verified(keys: CardKeys, policy: str = "require") -> SignatureCheck:
    kid = keys.kids[0] if keys.kids else None
    return SignatureCheck(policy, SIGNATURES, Verified(0, kid, "ES256", FORM_RFC8785), keys)


def verified_record(keys: CardKeys, **more: Any) -> dict[str, Any]:
    return {
        "policy": "require",
        "status": "verified",
        "form": FORM_RFC8785,
        "alg": "ES256",
        "kid": keys.kids[0] if keys.kids else None,
        "index": 0,
        "signatures": list(SIGNATURES),
        "keys": keys.record(),
        **more,
    }


def events_of(store: EventStore, origin: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in store.read_stream(ev.agent_stream_id(origin))]


# -- which key set: a key file, a keys URL, the jku ------------------------------------------------


async def test_a_key_file_in_the_policy_is_read_from_disk_whatever_jku_is_named(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer, tmp_path: Path
) -> None:
    key = ec_key()
    path = tmp_path / "agent.jwks.json"
    path.write_text(json.dumps(jwks(key)))
    policy = SignaturePolicy("require", str(path), jku=True)
    reads = discovery(store, client, server.url, policy)

    keys = await reads._keys(server.url, policy, {server.url + JWKS}, server.url + CARD)

    assert (keys.source, keys.url) == ("file", path.resolve().as_uri())
    assert (keys.key_set, keys.kids) == (key_set(key).key_set, ("card-key",))
    assert server.requests == []


async def test_a_key_file_that_cannot_be_read_is_refused_naming_the_card_url(
    store: EventStore, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    path = str(tmp_path / "missing.jwks.json")
    policy = SignaturePolicy("require", path)
    reads = discovery(store, client, AGENT, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(AGENT, policy, set(), AGENT_CARD)

    assert (refused.value.url, refused.value.kind, refused.value.detail) == (
        AGENT_CARD,
        "signature",
        f"keys file {path} cannot be read (No such file or directory)",
    )


async def test_a_keys_url_in_the_policy_is_read_as_url_whatever_jku_is_named(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    server.routes["/agent-keys.json"] = jwks_reply(key)
    keys_url = server.url + "/agent-keys.json"
    policy = SignaturePolicy("require", keys_url)
    reads = discovery(store, client, server.url, policy)

    keys = await reads._keys(server.url, policy, {server.url + JWKS}, server.url + CARD)

    assert (keys.source, keys.url, keys.key_set) == ("url", keys_url, key_set(key).key_set)
    assert server.paths() == ["/agent-keys.json"]


async def test_a_keys_url_that_cannot_be_read_is_refused_naming_the_card_url_and_the_status(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    keys_url = server.url + "/agent-keys.json"
    policy = SignaturePolicy("prefer", keys_url)
    reads = discovery(store, client, server.url, policy)

    for _ in range(2):  # a failed read is not kept: asked again
        with pytest.raises(CardSignatureError) as refused:
            await reads._keys(server.url, policy, set(), server.url + CARD)
        assert (refused.value.url, refused.value.detail) == (
            server.url + CARD,
            f"keys at {keys_url} could not be read: 404",
        )
    assert server.paths() == ["/agent-keys.json", "/agent-keys.json"]


@pytest.mark.parametrize("jku", [False, True])
async def test_no_keys_configured_and_no_jku_named_leaves_nothing_to_verify_with(
    store: EventStore, client: httpx.AsyncClient, jku: bool
) -> None:
    policy = SignaturePolicy("require", jku=jku)
    reads = discovery(store, client, AGENT, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(AGENT, policy, set(), AGENT_CARD)

    assert (refused.value.url, refused.value.detail) == (
        AGENT_CARD,
        "no keys to verify the card's signatures with: none are configured for "
        "https://agent.example, and the signatures name no jku",
    )


@pytest.mark.parametrize(
    "named",
    [
        {AGENT + "/b.json"},
        {AGENT + "/b.json", AGENT + "/a.json"},  # the first in order is named
    ],
)
async def test_a_jku_is_refused_when_the_policy_does_not_allow_it_naming_the_first_jku(
    store: EventStore, client: httpx.AsyncClient, named: set[str]
) -> None:
    policy = SignaturePolicy("require")
    reads = discovery(store, client, AGENT, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(AGENT, policy, named, AGENT_CARD)

    assert (refused.value.url, refused.value.detail) == (
        AGENT_CARD,
        f"the signature names its keys by jku {min(named)}, and jku is not allowed for "
        "https://agent.example: configure keys, or allow jku",
    )


@pytest.mark.parametrize("count", [2, 3])
async def test_more_than_one_jku_is_refused_naming_how_many_and_none_is_read(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer, count: int
) -> None:
    key = ec_key()
    named = {f"{server.url}/keys-{n}.json" for n in range(count)}
    for n in range(count):
        server.routes[f"/keys-{n}.json"] = jwks_reply(key)
    policy = SignaturePolicy("require", jku=True)
    reads = discovery(store, client, server.url, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(server.url, policy, named, server.url + CARD)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        f"the signatures name {count} jku URLs",
    )
    assert server.requests == []


async def test_a_jku_on_another_origin_is_refused_and_not_read(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    elsewhere = f"http://localhost:{server.port}{JWKS}"  # another host name: another origin
    server.routes[JWKS] = jwks_reply(ec_key())
    policy = SignaturePolicy("require", jku=True)
    reads = discovery(store, client, server.url, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(server.url, policy, {elsewhere}, server.url + CARD)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        f"jku {elsewhere} is not on the agent's origin {server.url}: refused",
    )
    assert server.requests == []


@pytest.mark.parametrize("jku", ["not a url", "ftp://127.0.0.1/jwks.json", "http://"])
async def test_a_jku_that_is_not_an_http_url_is_refused_as_not_on_the_agents_origin(
    store: EventStore, client: httpx.AsyncClient, jku: str
) -> None:
    policy = SignaturePolicy("require", jku=True)
    reads = discovery(store, client, AGENT, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(AGENT, policy, {jku}, AGENT_CARD)

    assert (refused.value.url, refused.value.detail) == (
        AGENT_CARD,
        f"jku {jku} is not on the agent's origin https://agent.example: refused",
    )


async def test_a_jku_on_the_agents_origin_is_read_when_allowed_and_reported_as_jku(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    server.routes[JWKS] = jwks_reply(key)
    policy = SignaturePolicy("require", jku=True)
    reads = discovery(store, client, server.url, policy)

    keys = await reads._keys(server.url, policy, {server.url + JWKS}, server.url + CARD)

    assert (keys.source, keys.url) == ("jku", server.url + JWKS)
    assert (keys.key_set, keys.kids) == (key_set(key).key_set, ("card-key",))
    assert server.paths() == [JWKS]


async def test_a_jku_that_cannot_be_read_is_refused_naming_the_card_url_and_the_status(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    server.routes[JWKS] = Reply(status=503, body=b"busy", headers={"Content-Type": "text/plain"})
    policy = SignaturePolicy("require", jku=True)
    reads = discovery(store, client, server.url, policy)

    with pytest.raises(CardSignatureError) as refused:
        await reads._keys(server.url, policy, {server.url + JWKS}, server.url + CARD)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        f"keys at {server.url + JWKS} could not be read: 503",
    )


# -- a key set on the network: read within the card's bounds, kept for max_card_age ----------------


async def test_a_key_set_read_for_a_jku_is_kept_for_max_card_age_and_then_read_again(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    first, second = ec_key("first"), ec_key("second")
    server.routes[JWKS] = jwks_reply(first)
    clock = Clock(1000.0)
    reads = discovery(
        store, client, server.url, SignaturePolicy("require", jku=True), clock=clock,
        max_card_age=30.0,
    )  # fmt: skip
    url, card_url = server.url + JWKS, server.url + CARD

    read = await reads._fetch_keys(url, "jku", card_url)
    assert (read.source, read.url, read.kids) == ("jku", url, ("first",))
    server.routes[JWKS] = jwks_reply(second)  # rotated on the wire; the kept one is still used

    clock.now = 1029.999
    kept = await reads._fetch_keys(url, "jku", card_url)
    assert kept == read
    assert server.paths() == [JWKS]

    clock.now = 1030.0  # max_card_age since it was read: read again
    again = await reads._fetch_keys(url, "jku", card_url)
    assert (again.source, again.url, again.kids) == ("jku", url, ("second",))
    assert again.key_set == key_set(second).key_set
    assert server.paths() == [JWKS, JWKS]

    clock.now = 1059.999  # kept from the second read's time on
    assert await reads._fetch_keys(url, "jku", card_url) == again
    assert server.paths() == [JWKS, JWKS]
    clock.now = 1060.0
    await reads._fetch_keys(url, "jku", card_url)
    assert server.paths() == [JWKS, JWKS, JWKS]


async def test_a_kept_key_set_is_reported_under_the_source_it_is_asked_for(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    server.routes[JWKS] = jwks_reply(key)
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True))
    url, card_url = server.url + JWKS, server.url + CARD

    as_url = await reads._fetch_keys(url, "url", card_url)
    as_jku = await reads._fetch_keys(url, "jku", card_url)
    as_url_again = await reads._fetch_keys(url, "url", card_url)

    assert (as_url.source, as_jku.source, as_url_again.source) == ("url", "jku", "url")
    assert as_jku.record() == {**as_url.record(), "source": "jku"}
    assert (as_jku.keys, as_jku.body) == (as_url.keys, as_url.body)
    assert as_url_again == as_url
    assert server.paths() == [JWKS]


async def test_key_sets_are_kept_apart_by_url(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    one, other = ec_key("one"), ec_key("other")
    server.routes["/one.json"], server.routes["/other.json"] = jwks_reply(one), jwks_reply(other)
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True))

    got = [
        (await reads._fetch_keys(server.url + path, "url", server.url + CARD)).kids
        for path in ("/one.json", "/other.json", "/one.json", "/other.json")
    ]

    assert got == [("one",), ("other",), ("one",), ("other",)]
    assert server.paths() == ["/one.json", "/other.json"]


async def test_a_key_set_read_takes_a_request_slot_for_its_url(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    server.routes[JWKS] = jwks_reply(ec_key())
    slots = RecordedSlots()
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True), slots=slots)

    await reads._fetch_keys(server.url + JWKS, "jku", server.url + CARD)

    assert slots.urls == [server.url + JWKS]


async def test_a_key_set_over_the_card_size_limit_is_refused_as_unreadable(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    body = json.dumps(jwks(ec_key())).encode() + b" " * 400
    server.routes[JWKS] = Reply(body=body, headers=dict(JSON))
    reads = discovery(
        store, client, server.url, SignaturePolicy("require", jku=True), max_bytes=300
    )

    with pytest.raises(CardSignatureError) as refused:
        await reads._fetch_keys(server.url + JWKS, "jku", server.url + CARD)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        f"keys at {server.url + JWKS} could not be read: card body declared {len(body)} bytes, "
        "over the limit of 300",
    )


async def test_a_key_set_over_a_mebibyte_is_read_when_the_card_size_limit_allows_it(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    body = json.dumps(jwks(key)).encode() + b" " * 1_048_576  # past the default limit
    server.routes[JWKS] = Reply(body=body, headers=dict(JSON))
    reads = discovery(
        store, client, server.url, SignaturePolicy("require", jku=True), max_bytes=2_097_152
    )

    keys = await reads._fetch_keys(server.url + JWKS, "jku", server.url + CARD)

    assert (keys.key_set, keys.kids) == (key_set(key).key_set, ("card-key",))


async def test_a_key_set_that_is_not_a_jwks_is_refused_naming_the_card_url(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    server.routes[JWKS] = Reply(body=b'{"keys": "broken"}', headers=dict(JSON))
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True))

    with pytest.raises(CardSignatureError) as refused:
        await reads._fetch_keys(server.url + JWKS, "jku", server.url + CARD)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        f"keys at {server.url + JWKS}: not a JWK set (no keys list)",
    )


# -- the public path: a card read verifies with the jku's key set and pins it ----------------------


async def test_a_signed_card_read_pins_its_jku_key_set_and_the_next_read_matches_from_the_cache(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    server.routes[JWKS] = jwks_reply(key)
    server.routes[CARD] = card_reply(sign_card(document(), key, jku=server.url + JWKS))
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True))

    await reads.read(server.url)
    await reads.read(server.url)

    signatures = [d["signature"] for t, d in events_of(store, server.url) if t == ev.CARD_FETCHED]
    expected = key_set(key, source="jku", url=server.url + JWKS).record()
    assert [s["keys"] for s in signatures] == [expected, expected]
    assert [s["pin"] for s in signatures] == ["pinned", "matched"]
    assert server.paths() == [CARD, JWKS, CARD]
    stored = store.get_snapshot(expected["revision"])  # the key set, for the audit to verify
    assert stored is not None
    assert (stored.source_url, stored.body) == (server.url + JWKS, key_set(key).body)
    assert reads._pins == {
        (server.url, False): (1, expected["key_set"])
    }  # scanned before the append


async def test_a_card_read_whose_jku_is_on_another_origin_is_recorded_as_refused(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    key = ec_key()
    elsewhere = f"http://localhost:{server.port}{JWKS}"
    server.routes[JWKS] = jwks_reply(key)
    server.routes[CARD] = card_reply(sign_card(document(), key, jku=elsewhere))
    reads = discovery(store, client, server.url, SignaturePolicy("require", jku=True))

    with pytest.raises(CardSignatureError):
        await reads.read(server.url)

    [(kind, data)] = events_of(store, server.url)
    detail = f"jku {elsewhere} is not on the agent's origin {server.url}: refused"
    assert (kind, data["url"], data["kind"], data["detail"]) == (
        ev.DISCOVERY_FAILED,
        server.url + CARD,
        "signature",
        detail,
    )
    assert server.paths() == [CARD]


async def test_a_malformed_signature_is_refused_naming_the_url_the_card_came_from(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    doc = {**document(), "signatures": ["not a JWS object"]}
    server.routes[CARD] = card_reply(doc)
    reads = discovery(store, client, server.url, SignaturePolicy("prefer", jku=True))

    with pytest.raises(CardSignatureError) as refused:
        await reads.read(server.url)

    assert (refused.value.url, refused.value.detail) == (
        server.url + CARD,
        "signature 0: must be an object",
    )
    assert server.paths() == [CARD]  # no key set is looked for


async def test_an_unsigned_card_under_prefer_needs_no_keys_and_is_recorded_unsigned(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    server.routes[CARD] = card_reply(document())
    reads = discovery(store, client, server.url, SignaturePolicy("prefer", jku=True))

    read = await reads.read(server.url)

    assert read.status == 200
    [(kind, data)] = events_of(store, server.url)
    assert (kind, data["signature"]["policy"], data["signature"]["status"]) == (
        ev.CARD_FETCHED,
        "prefer",
        "unsigned",
    )
    assert "pin" not in data["signature"]
    assert server.paths() == [CARD]


# -- the pinned key set, from the agent's stream ---------------------------------------------------


async def test_nothing_is_pinned_for_an_agent_with_no_events(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))

    assert reads._pinned_key_set(AGENT) is None
    assert reads._pinned_key_set(AGENT, extended=True) is None
    assert reads._pins == {(AGENT, False): (0, None), (AGENT, True): (0, None)}


async def test_the_pinned_key_set_is_that_of_the_last_card_fetched_that_pinned_matched_or_accepted(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    append(store, AGENT, pinning("set-a"))
    assert reads._pinned_key_set(AGENT) == "set-a"
    append(store, AGENT, pinning("set-a", "matched"))
    assert reads._pinned_key_set(AGENT) == "set-a"
    append(store, AGENT, pinning("set-b", "accepted"))
    assert reads._pinned_key_set(AGENT) == "set-b"
    assert reads._pinned_key_set(AGENT) == "set-b"
    assert reads._pins == {(AGENT, False): (3, "set-b")}


def passed_over(*, extended: bool) -> list[tuple[str, dict[str, Any]]]:
    """Events that pin nothing for the card ``extended`` names: another type, no pin, a
    signature that is not an object or has no pin, the other card's pin."""
    pinned = {"pin": "pinned", "keys": {"key_set": "not-a-pin"}}
    return [
        (ev.DISCOVERY_FAILED, {"url": AGENT_CARD, "kind": "signature", "signature": pinned}),
        fetched({"policy": "prefer", "status": "unsigned"}, extended=extended),  # no "pin"
        fetched(["pin"], extended=extended),  # not a dict
        fetched("pin", extended=extended),  # not a dict either
        fetched({"status": "pin", "keys": {"key_set": "not-a-pin"}}, extended=extended),
        pinning("the-other-cards-set", extended=not extended),
    ]


@pytest.mark.parametrize("extended", [False, True])
async def test_events_that_pin_nothing_for_the_card_are_passed_over_before_and_after_the_pin(
    store: EventStore, client: httpx.AsyncClient, extended: bool
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    append(store, AGENT, pinning("set-a", extended=extended), *passed_over(extended=extended))
    append(store, AGENT, pinning("set-b", extended=extended), *passed_over(extended=extended))

    assert reads._pinned_key_set(AGENT, extended) == "set-b"
    assert reads._pinned_key_set(AGENT, not extended) == "the-other-cards-set"


@pytest.mark.parametrize("keys", [None, "set-a", ["set-a"]], ids=["absent", "string", "list"])
async def test_a_pin_without_a_key_set_object_leaves_nothing_pinned(
    store: EventStore, client: httpx.AsyncClient, keys: object
) -> None:
    """An unsigned card accepted after a pin (``accept_key_change``): nothing is pinned since."""
    reads = discovery(store, client, AGENT, SignaturePolicy("prefer", accept_key_change=True))
    signature: dict[str, Any] = {"policy": "prefer", "status": "unsigned", "pin": "accepted"}
    if keys is not None:
        signature["keys"] = keys
    append(store, AGENT, pinning("set-a"))
    assert reads._pinned_key_set(AGENT) == "set-a"

    append(store, AGENT, fetched({**signature, "previous": "set-a"}))

    assert reads._pinned_key_set(AGENT) is None
    assert reads._pins == {(AGENT, False): (2, None)}


async def test_the_public_and_the_extended_card_are_pinned_apart(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    append(store, AGENT, pinning("public-a"), pinning("extended-a", extended=True))

    assert reads._pinned_key_set(AGENT) == "public-a"
    assert reads._pinned_key_set(AGENT, True) == "extended-a"
    append(store, AGENT, pinning("public-b"))
    assert reads._pinned_key_set(AGENT, True) == "extended-a"
    assert reads._pinned_key_set(AGENT, False) == "public-b"
    assert reads._pins == {(AGENT, False): (3, "public-b"), (AGENT, True): (3, "extended-a")}


async def test_the_stream_is_read_from_where_the_last_call_left_off(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    seen = ReadsSeen(store)
    reads.store = seen  # type: ignore[assignment]
    stream = ev.agent_stream_id(AGENT)

    assert reads._pinned_key_set(AGENT) is None
    append(store, AGENT, pinning("set-a"), pinning("set-a", "matched"))
    assert reads._pinned_key_set(AGENT) == "set-a"
    assert reads._pinned_key_set(AGENT) == "set-a"
    append(store, AGENT, pinning("set-b", "accepted"))
    assert reads._pinned_key_set(AGENT) == "set-b"

    assert seen.reads == [(stream, 1), (stream, 1), (stream, 3), (stream, 3)]


async def test_what_was_remembered_is_kept_and_only_later_events_are_read(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    append(store, AGENT, pinning("set-a"), pinning("set-b"))
    reads._pins[(AGENT, False)] = (2, "remembered")  # as a scan up to version 2 left it

    assert reads._pinned_key_set(AGENT) == "remembered"
    append(store, AGENT, pinning("set-c"))
    assert reads._pinned_key_set(AGENT) == "set-c"


async def test_a_scan_that_ends_behind_one_made_meanwhile_does_not_move_the_place_back(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    seen = ReadsSeen(store)
    reads.store = seen  # type: ignore[assignment]
    append(store, AGENT, pinning("set-a"), pinning("set-b"))

    def finished_meanwhile() -> None:
        reads._pins[(AGENT, False)] = (9, "later")

    seen.during_read = finished_meanwhile
    assert reads._pinned_key_set(AGENT) == "set-b"  # this scan's own finding
    assert reads._pins == {(AGENT, False): (9, "later")}

    def caught_up() -> None:
        reads._pins[(AGENT, False)] = (2, "same-place")

    seen.during_read = caught_up  # a scan ending where another ended: this one is kept
    reads._pins.clear()
    assert reads._pinned_key_set(AGENT) == "set-b"
    assert reads._pins == {(AGENT, False): (2, "set-b")}


# -- pinning: pinned, matched, accepted, refused ---------------------------------------------------


async def test_the_first_signed_read_pins_its_key_set(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    keys = key_set(ec_key())
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))

    record = reads._pin(hand_read(), verified(keys))

    assert record == verified_record(keys, pin="pinned")


async def test_the_same_key_set_matches_the_pin(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    keys = key_set(ec_key())
    append(store, AGENT, pinning(keys.key_set))
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))

    assert reads._pin(hand_read(), verified(keys)) == verified_record(keys, pin="matched")


async def test_a_changed_key_set_is_accepted_with_the_previous_one_when_the_policy_accepts_it(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    old, new = key_set(ec_key("old")), key_set(ec_key("new"))
    append(store, AGENT, pinning(old.key_set))
    reads = discovery(store, client, AGENT, SignaturePolicy("require", accept_key_change=True))

    record = reads._pin(hand_read(), verified(new))

    assert record == verified_record(new, pin="accepted", previous=old.key_set)


async def test_an_unsigned_card_after_a_pin_is_accepted_when_the_policy_accepts_key_changes(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    old = key_set(ec_key("old"))
    append(store, AGENT, pinning(old.key_set))
    reads = discovery(store, client, AGENT, SignaturePolicy("prefer", accept_key_change=True))

    record = reads._pin(hand_read(), SignatureCheck("prefer"))

    assert record == {
        "policy": "prefer",
        "status": "unsigned",
        "pin": "accepted",
        "previous": old.key_set,
    }


async def test_an_unsigned_card_with_nothing_pinned_is_recorded_without_a_pin(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    reads = discovery(store, client, AGENT, SignaturePolicy("prefer"))
    assert reads._pin(hand_read(), SignatureCheck("prefer")) == {
        "policy": "prefer",
        "status": "unsigned",
    }

    append(store, AGENT, pinning("set-a"), fetched({"status": "unsigned", "pin": "accepted"}))
    assert reads._pin(hand_read(), SignatureCheck("prefer")) == {
        "policy": "prefer",
        "status": "unsigned",
    }


async def test_an_unsigned_card_after_a_pin_is_refused_as_a_downgrade_naming_the_pinned_set(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    pinned = "0123456789abcdef0123"
    append(store, AGENT, pinning(pinned))
    reads = discovery(store, client, AGENT, SignaturePolicy("prefer"))
    url = AGENT + "/cards/me.json"

    with pytest.raises(CardSignatureError) as refused:
        reads._pin(hand_read(url), SignatureCheck("prefer"))

    assert (refused.value.url, refused.value.detail) == (
        url,
        "the card is unsigned, and key set 0123456789ab is pinned for https://agent.example: "
        "refused as a downgrade (accept_key_change accepts it)",
    )


async def test_a_read_refused_against_the_pinned_key_set_is_recorded_as_a_failure_of_its_agent(
    store: EventStore, client: httpx.AsyncClient, server: RoutedServer
) -> None:
    server.routes[CARD] = Reply(body=json.dumps(document()).encode(), headers=dict(JSON))
    kind, pinned = pinning("0123456789abcdef0123")
    pin = NewEvent(kind, {**pinned, "url": server.url + CARD, "revision": "f" * 64})
    append_agent_events(store, server.url, lambda _: [pin])  # with the projection it folds to
    reads = discovery(store, client, server.url, SignaturePolicy("prefer"))

    with pytest.raises(CardSignatureError) as refused:
        await reads.read(server.url)

    *_, (kind, data) = events_of(store, server.url)
    assert kind == ev.DISCOVERY_FAILED
    assert (data["url"], data["kind"], data["detail"]) == (
        server.url + CARD,
        "signature",
        refused.value.detail,
    )
    assert "refused as a downgrade" in data["detail"]
    assert len(events_of(store, server.url)) == 2  # the pin, then the failure: no card recorded
    assert store.snapshot_revisions() == []


async def test_a_changed_key_set_is_refused_naming_both_key_sets_and_its_kids(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    pinned = "fedcba9876543210fedc"
    new = key_set(ec_key("k-two"), ec_key("k-one"))
    append(store, AGENT, pinning(pinned))
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))
    url = AGENT + "/cards/me.json"

    with pytest.raises(CardSignatureError) as refused:
        reads._pin(hand_read(url), verified(new))

    assert (refused.value.url, refused.value.detail) == (
        url,
        f"key set changed from fedcba987654 to {new.key_set[:12]} (kids: k-one, k-two) since it "
        "was pinned: refused (accept_key_change accepts it)",
    )


async def test_a_changed_key_set_without_kids_is_refused_naming_none(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    new = key_set(ec_key(None))
    append(store, AGENT, pinning("fedcba9876543210fedc"))
    reads = discovery(store, client, AGENT, SignaturePolicy("prefer"))

    with pytest.raises(CardSignatureError) as refused:
        reads._pin(hand_read(), verified(new, "prefer"))

    assert refused.value.detail == (
        f"key set changed from fedcba987654 to {new.key_set[:12]} (kids: none) since it was "
        "pinned: refused (accept_key_change accepts it)"
    )


async def test_the_extended_cards_key_set_is_compared_with_the_extended_pin_only(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    public, extended = key_set(ec_key("public")), key_set(ec_key("extended"))
    append(store, AGENT, pinning(public.key_set), pinning(extended.key_set, extended=True))
    reads = discovery(store, client, AGENT, SignaturePolicy("require"))

    assert reads._pin(hand_read(), verified(extended), extended=True) == verified_record(
        extended, pin="matched"
    )
    assert reads._pin(hand_read(), verified(public)) == verified_record(public, pin="matched")
    with pytest.raises(CardSignatureError) as refused:
        reads._pin(hand_read(), verified(public), extended=True)
    assert refused.value.detail.startswith(
        f"key set changed from {extended.key_set[:12]} to {public.key_set[:12]} (kids: public)"
    )
