"""Signed cards against a real a2a-sdk agent: a card signed by a2a-sdk's signer verifies here, one
signed here verifies in a2a-sdk's verifier, and a card that fails its agent's policy is neither
used for a decision nor stored as trusted (nothing is sent). The audit verifies again.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import ECKey, Key
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from support import Peer
from support.engine_fixtures import FAST, LoopWatch, agent_events, calls, data_of, restored, types
from support.extended_peer import EXTENDED_ONLY, ExtendedPeer

from cardfence.engine.cards.signature_policy import CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import FORM_A2A_SDK, FORM_RFC8785, sign_card
from cardfence.engine.client.audit import audit
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.discovery import _signed_reads as signed_reads
from cardfence.engine.discovery import reads as discovery_module
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import CardSignatureError
from cardfence.store.event_store import EventStore

signing = pytest.importorskip("a2a.utils.signing")  # a2a-sdk's signer needs PyJWT (dev extra)

JWKS_PATH = "/.well-known/jwks.json"
LIMITS = CardLimits(timeout=2.0, connect_timeout=1.0)


class KeyedPeer(Peer):
    """The test agent, also publishing a JWK set at ``/.well-known/jwks.json`` on its origin."""

    card_paths = (*Peer.card_paths, JWKS_PATH)

    def __init__(self) -> None:
        super().__init__()
        self.jwks: dict[str, Any] = {"keys": []}

    async def _answer_card(
        self, request: Request, path: str, host: str, fault: str | None
    ) -> Response:
        if path == JWKS_PATH:
            return JSONResponse(self.jwks)
        return await super()._answer_card(request, path, host, fault)


@pytest.fixture(scope="module")
def keyed_peer() -> Iterator[KeyedPeer]:
    with KeyedPeer() as running:
        yield running


@pytest.fixture
def peer(keyed_peer: KeyedPeer) -> Iterator[KeyedPeer]:
    with restored(keyed_peer) as fresh:
        fresh.jwks = {"keys": []}
        yield fresh


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


@pytest.fixture
def key() -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": "card-key"})


def jwks(*keys: Key) -> dict[str, Any]:
    return {"keys": [k.as_dict(private=False) for k in keys]}


def key_file(tmp_path: Path, *keys: Key) -> str:
    path = tmp_path / "agent.jwks.json"
    path.write_text(json.dumps(jwks(*keys)))
    return str(path)


def limits(peer: Peer, policy: str, keys: str | None = None, **options: bool) -> CardLimits:
    signatures = CardSignatures.of({peer.base_url: SignaturePolicy(policy, keys, **options)})
    return CardLimits(timeout=2.0, connect_timeout=1.0, signatures=signatures)


def sdk_signed(key: ECKey, card: Any) -> Any:
    """A copy of ``card`` (an a2a-sdk protobuf ``AgentCard``) signed by a2a-sdk's signer (PyJWT)
    over its canonical form."""
    from a2a.types import AgentCard

    proto = AgentCard()
    proto.CopyFrom(card)
    signer = signing.create_agent_card_signer(
        key.as_pem(private=True),
        {"kid": str(key.kid), "alg": "ES256", "jku": None, "typ": "JOSE"},
    )
    return signer(proto)


def sdk_sign(peer: Peer, key: ECKey, card: Any = None) -> None:
    """Serve ``card`` (the agent's own by default) as a2a-sdk signs and serves it: its signer
    over its canonical form, then its card route's ``agent_card_to_dict``."""
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict

    peer.card = agent_card_to_dict(sdk_signed(key, peer.agent_card if card is None else card))


def add_skill(card: dict[str, Any]) -> None:
    card["skills"].append({"id": "exfiltrate", "name": "X", "description": "Added later."})


def signature_of(store: EventStore, peer: Peer) -> dict[str, Any]:
    """The ``signature`` of the agent's last ``CardFetched``."""
    fetched = [d for t, d in agent_events(store, peer) if t == ev.CARD_FETCHED]
    return dict(fetched[-1]["signature"])


async def refused(peer: Peer, store: EventStore, client: httpx.AsyncClient, lim: CardLimits) -> str:
    """Read under ``lim``, expecting a refusal; check that nothing was stored; the reason."""
    with pytest.raises(CardSignatureError) as caught:
        await Discovery(store, client, limits=lim).read(peer.base_url)
    (kind, data) = agent_events(store, peer)[-1]
    assert (kind, data["kind"], data["detail"]) == (ev.DISCOVERY_FAILED, "signature",
                                                   caught.value.detail)  # fmt: skip
    assert "\n" not in caught.value.detail
    return caught.value.detail


# -- interop with a2a-sdk --------------------------------------------------------------------------


async def test_a_card_signed_by_a2a_sdk_verifies_and_is_recorded_with_its_signatures(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    sdk_sign(peer, key)
    lim = limits(peer, "require", key_file(tmp_path, key))
    read = await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)

    record = signature_of(sqlite_store, peer)
    assert (record["status"], record["form"], record["kid"]) == ("verified", FORM_RFC8785,
                                                                "card-key")  # fmt: skip
    assert record["signatures"] == peer.card["signatures"]
    assert record["pin"] == "pinned"
    assert record["keys"]["source"] == "file"
    # The snapshot is the card without signatures (the revision is unchanged by signing); the
    # signatures are in the event, the key set in a snapshot of its own.
    snapshot = sqlite_store.get_snapshot(read.revision)
    assert snapshot is not None
    assert "signatures" not in json.loads(snapshot.body)
    keys = sqlite_store.get_snapshot(record["keys"]["revision"])
    assert keys is not None
    assert json.loads(keys.body) == jwks(key)
    report = audit(sqlite_store, verify_signatures=True)
    assert report.ok, report.violations
    assert report.signatures_checked == 1


async def test_a_large_signed_card_is_parsed_and_verified_while_the_event_loop_goes_on(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A signature check canonicalises and decodes the card again (pure Python, like parsing
    it): on a large card, both happen on a worker thread, never stalling the loop."""
    peer.card = sign_card({**peer.card, "description": "A large card. " * 20_000}, key)
    watch = LoopWatch()
    watch.patch(monkeypatch, discovery_module, "parse_card")
    watch.patch(monkeypatch, signed_reads, "apply_policy")
    lim = limits(peer, "require", key_file(tmp_path, key))
    async with watch.watched():
        read = await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)

    assert watch.calls == [("parse_card", True), ("apply_policy", True)]
    assert signature_of(sqlite_store, peer)["status"] == "verified"
    assert read.revision in sqlite_store.snapshot_revisions()


async def test_a_card_signed_here_verifies_in_a2a_sdks_verifier_and_an_altered_one_does_not(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    from a2a.client.card_resolver import A2ACardResolver
    from jwt.api_jwk import PyJWK

    peer.card = sign_card(peer.card, key)
    verifier = signing.create_signature_verifier(
        lambda kid, jku: PyJWK(key.as_dict(private=False)), ["ES256"]
    )
    resolver = A2ACardResolver(client, peer.base_url)
    card = await resolver.get_agent_card(signature_verifier=verifier)
    assert card.name == "cardfence-peer"
    lim = limits(peer, "require", key_file(tmp_path, key))
    await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)

    peer.mutate_card(add_skill)
    with pytest.raises(signing.InvalidSignaturesError):
        await resolver.get_agent_card(signature_verifier=verifier)


async def test_a2a_sdks_dual_card_verifies_in_its_form_since_that_form_decides_alike(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A card with a 0.3 interface is served with 0.3 members (``url``, ``protocolVersion``,
    ``preferredTransport``, ...) a2a-sdk's signer never sees: the served JSON's canonical form
    differs, a2a-sdk's view of it verifies and decides everything as the served card does."""
    from a2a.types import AgentCard, AgentInterface

    dual = AgentCard()
    dual.CopyFrom(peer.agent_card)
    dual.supported_interfaces.append(
        AgentInterface(url=peer.jsonrpc_url, protocol_binding="JSONRPC", protocol_version="0.3")
    )
    sdk_sign(peer, key, dual)
    assert peer.card["protocolVersion"] == "0.3"
    lim = limits(peer, "require", key_file(tmp_path, key))
    await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)

    assert signature_of(sqlite_store, peer)["form"] == FORM_A2A_SDK
    assert audit(sqlite_store, verify_signatures=True).ok


async def test_a2a_sdks_card_with_a_requirement_without_scopes_is_refused(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    """a2a-sdk's signer drops ``{"schemes": {"bearer": {}}}`` (empty, to its cleaning): its
    signature says nothing of the requirement, so it cannot vouch for the card's contract."""
    from a2a.types import AgentCard, HTTPAuthSecurityScheme, SecurityScheme

    secured = AgentCard()
    secured.CopyFrom(peer.agent_card)
    secured.security_schemes["bearer"].CopyFrom(
        SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))
    )
    secured.security_requirements.add().schemes["bearer"].SetInParent()
    sdk_sign(peer, key, secured)
    assert peer.card["securityRequirements"] == [{"schemes": {"bearer": {}}}]

    reason = await refused(
        peer, sqlite_store, client, limits(peer, "require", key_file(tmp_path, key))
    )
    assert reason == (
        "signature 0 (kid 'card-key', ES256) covers only a2a-sdk's view of the card, which "
        "leaves out what cardfence decides on (securityRequirements, contract)"
    )


# -- refusals: never used, never stored, nothing sent ----------------------------------------------


async def test_a_skill_added_after_signing_refuses_the_creation_and_nothing_is_stored_or_sent(
    peer: KeyedPeer, db_url: str, key: ECKey, tmp_path: Path
) -> None:
    sdk_sign(peer, key)
    peer.mutate_card(add_skill)
    config = EngineConfig(
        max_poll_interval=FAST.max_poll_interval,
        card_limits=limits(peer, "require", key_file(tmp_path, key)),
        follow_streams=False,
    )
    async with Engine.connect(db_url, config=config) as engine:
        with pytest.raises(CardSignatureError) as caught:
            await engine.start_task(peer.base_url, skill="exfiltrate", text="hi")
        assert caught.value.consequence == "nothing was sent"
        assert str(caught.value).endswith("(nothing was sent)")
        # Not kept anywhere as trusted: the next read goes to the wire and is refused again.
        requests = peer.card_requests
        with pytest.raises(CardSignatureError):
            await engine.discovery.read(peer.base_url, fresh=False)
        assert peer.card_requests == requests + 1
        store = engine.store
        assert [t for t, _ in agent_events(store, peer)] == [
            ev.DISCOVERY_FAILED,
            ev.TASK_CREATION_REFUSED,
            ev.DISCOVERY_FAILED,
        ]
        assert store.snapshot_revisions() == []
        assert [s for s in store.stream_ids() if s.startswith(ev.TASK_STREAM_PREFIX)] == []
        assert audit(store, verify_signatures=True).ok
    assert peer.calls == []


async def test_prefer_uses_an_unsigned_card_and_records_it_as_unsigned(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient
) -> None:
    read = await Discovery(sqlite_store, client, limits=limits(peer, "prefer")).read(peer.base_url)
    assert read.card.skill("echo") is not None
    assert signature_of(sqlite_store, peer) == {"policy": "prefer", "status": "unsigned"}


async def test_require_refuses_an_unsigned_card(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    lim = limits(peer, "require", key_file(tmp_path, ECKey.generate_key("P-256")))
    assert await refused(peer, sqlite_store, client, lim) == (
        "the card is not signed, and its agent's policy requires a signature"
    )
    assert sqlite_store.snapshot_revisions() == []


def _header(alg: str, **more: str) -> str:
    text = json.dumps({"alg": alg, **more}).encode()
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("altered", "signature 0 (kid 'card-key', ES256) does not verify: the card was altered "
                    "after it was signed, or signed with another key"),
        ("wrong_key", "signature 0 (kid 'card-key', ES256) does not verify"),
        ("unknown_kid", "signature 0 (kid 'stranger', ES256): kid 'stranger' is not in the key "
                        "set (kids: card-key)"),
        ("alg_none", "signature 0: alg none (an unsigned JWS) is refused"),
        ("hs256", "signature 0: alg HS256 (HMAC) is refused: a shared secret proves no signer"),
        ("jku_not_allowed", "the signature names its keys by jku {jku}, and jku is not allowed for "
                            "{origin}: configure keys, or allow jku"),
    ],
)  # fmt: skip
async def test_prefer_refuses_a_signature_that_does_not_hold_with_a_one_line_reason(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path, case: str, reason: str,
) -> None:  # fmt: skip
    keys: str | None = key_file(tmp_path, key)
    jku = peer.base_url + JWKS_PATH
    if case == "altered":
        peer.card = sign_card(peer.card, key)
        peer.mutate_card(add_skill)
    elif case == "wrong_key":
        peer.card = sign_card(peer.card, ECKey.generate_key("P-256"), kid="card-key")
    elif case == "unknown_kid":
        peer.card = sign_card(peer.card, ECKey.generate_key("P-256"), kid="stranger")
    elif case in ("alg_none", "hs256"):
        alg = "none" if case == "alg_none" else "HS256"
        entry = {"protected": _header(alg, kid="card-key"), "signature": "c2lnbmF0dXJl"}
        peer.mutate_card(lambda c: c.update(signatures=[entry]))
    else:
        peer.card, keys = sign_card(peer.card, key, jku=jku), None
        peer.jwks = jwks(key)
    detail = await refused(peer, sqlite_store, client, limits(peer, "prefer", keys))
    assert detail.startswith(reason.format(jku=jku, origin=peer.base_url))
    assert sqlite_store.snapshot_revisions() == []


# -- where the keys come from ----------------------------------------------------------------------


async def test_keys_named_by_jku_on_the_agents_origin_are_used_when_allowed(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey
) -> None:
    peer.jwks = jwks(key)
    peer.card = sign_card(peer.card, key, jku=peer.base_url + JWKS_PATH)
    await Discovery(sqlite_store, client, limits=limits(peer, "require", jku=True)).read(
        peer.base_url
    )
    keys = signature_of(sqlite_store, peer)["keys"]
    assert (keys["source"], keys["url"]) == ("jku", peer.base_url + JWKS_PATH)
    stored = sqlite_store.get_snapshot(keys["revision"])
    assert stored is not None
    assert stored.source_url == peer.base_url + JWKS_PATH


async def test_a_jku_on_another_origin_is_refused_even_when_jku_is_allowed(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey
) -> None:
    elsewhere = f"http://localhost:{peer.port}{JWKS_PATH}"  # another host name: another origin
    peer.jwks = jwks(key)
    peer.card = sign_card(peer.card, key, jku=elsewhere)
    requests = peer.card_requests
    reason = await refused(peer, sqlite_store, client, limits(peer, "require", jku=True))
    assert reason == f"jku {elsewhere} is not on the agent's origin {peer.base_url}: refused"
    assert peer.card_requests == requests + 1  # the card; the key set was not asked for


async def test_keys_at_a_url_are_read_within_the_cards_bounds_and_stored(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey
) -> None:
    peer.jwks = jwks(key)
    peer.card = sign_card(peer.card, key)
    url = peer.base_url + JWKS_PATH
    await Discovery(sqlite_store, client, limits=limits(peer, "require", url)).read(peer.base_url)
    assert signature_of(sqlite_store, peer)["keys"]["source"] == "url"

    peer.jwks = {"keys": "broken"}
    reason = await refused(peer, sqlite_store, client, limits(peer, "require", url))
    assert reason == f"keys at {url}: not a JWK set (no keys list)"


# -- pinning (R3's way) ----------------------------------------------------------------------------


async def test_a_key_set_changed_after_pinning_is_refused_unless_accepted(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    async def read(lim: CardLimits) -> CardRead:
        return await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)

    peer.card = sign_card(peer.card, key)
    await read(limits(peer, "require", key_file(tmp_path, key)))
    pinned = signature_of(sqlite_store, peer)["keys"]["key_set"]
    await read(limits(peer, "require", key_file(tmp_path, key)))
    assert signature_of(sqlite_store, peer)["pin"] == "matched"

    rotated = ECKey.generate_key("P-256", parameters={"kid": "card-key-2"})
    peer.card = sign_card({k: v for k, v in peer.card.items() if k != "signatures"}, rotated)
    files = key_file(tmp_path, rotated)
    reason = await refused(peer, sqlite_store, client, limits(peer, "require", files))
    assert reason.startswith(f"key set changed from {pinned[:12]} to ")
    assert reason.endswith("(kids: card-key-2) since it was pinned: refused "
                           "(accept_key_change accepts it)")  # fmt: skip

    await read(limits(peer, "require", files, accept_key_change=True))
    record = signature_of(sqlite_store, peer)
    assert (record["pin"], record["previous"]) == ("accepted", pinned)
    await read(limits(peer, "require", files))
    assert signature_of(sqlite_store, peer)["pin"] == "matched"
    assert audit(sqlite_store, verify_signatures=True).ok


async def test_an_unsigned_card_after_a_pin_is_refused_under_prefer_as_a_downgrade(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    peer.card = sign_card(peer.card, key)
    lim = limits(peer, "prefer", key_file(tmp_path, key))
    await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)
    peer.mutate_card(lambda c: c.pop("signatures"))
    reason = await refused(peer, sqlite_store, client, lim)
    assert reason.startswith("the card is unsigned, and key set ")
    assert reason.endswith("refused as a downgrade (accept_key_change accepts it)")


async def test_a_304_confirms_a_signed_card_only_with_its_signatures_in_memory(
    peer: KeyedPeer, sqlite_store: EventStore, client: httpx.AsyncClient, key: ECKey,
    tmp_path: Path,
) -> None:  # fmt: skip
    peer.card = sign_card(peer.card, key)
    lim = limits(peer, "require", key_file(tmp_path, key))
    discovery = Discovery(sqlite_store, client, limits=lim)
    await discovery.read(peer.base_url)
    again = await discovery.read(peer.base_url)  # the memo holds its signatures: conditional
    assert again.status == 304
    assert signature_of(sqlite_store, peer)["status"] == "verified"
    other = await Discovery(sqlite_store, client, limits=lim).read(peer.base_url)
    assert other.status == 200  # a new process holds none: read whole, verified again
    assert peer.card_log[-1].if_none_match is None


# -- the audit -------------------------------------------------------------------------------------


async def test_audit_verify_signatures_catches_a_tampered_snapshot_and_a_tampered_signature(
    peer: KeyedPeer, client: httpx.AsyncClient, key: ECKey, tmp_path: Path
) -> None:
    path = tmp_path / "cardfence.db"
    peer.card = sign_card(peer.card, key)
    with EventStore.open(f"sqlite:///{path}") as store:
        lim = limits(peer, "require", key_file(tmp_path, key))
        read = await Discovery(store, client, limits=lim).read(peer.base_url)
    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE card_snapshots SET body = replace(body, '\"Echo\"', '\"Exfiltrate\"') "
            "WHERE revision = ?",
            (read.revision,),
        )
    with EventStore.open(f"sqlite:///{path}") as store:
        assert [v.kind for v in audit(store).violations] == ["snapshot_mismatch"]
        violations = audit(store, verify_signatures=True).violations
    assert [v.kind for v in violations] == ["snapshot_mismatch", "signature_invalid"]
    assert "does not verify: the card was altered" in violations[1].detail

    with sqlite3.connect(path) as raw:  # the snapshot put back, a signature's byte changed
        raw.execute("UPDATE card_snapshots SET body = replace(body, '\"Exfiltrate\"', '\"Echo\"')")
        signature = peer.card["signatures"][0]["signature"]
        forged = ("A" if signature[0] != "A" else "B") + signature[1:]
        raw.execute("UPDATE events SET payload = replace(payload, ?, ?)", (signature, forged))
    with EventStore.open(f"sqlite:///{path}") as store:
        kinds = [v.kind for v in audit(store, verify_signatures=True).violations]
    assert kinds == ["hash_mismatch", "signature_invalid"]


# -- the authenticated extended card (R15) ---------------------------------------------------------
#
# Its agent's policy holds for it as for the public card. The agent is `ExtendedPeer` without its
# bearer requirement: a2a-sdk's signer leaves a requirement without scopes out of what it signs
# (refused above for the public card), and the extended card comes over the task's own interface.


@pytest.fixture(scope="module")
def shared_extended() -> Iterator[ExtendedPeer]:
    with ExtendedPeer(bearer=False) as running:
        yield running


@pytest.fixture
def extended_peer(shared_extended: ExtendedPeer) -> Iterator[ExtendedPeer]:
    """The agent with an extended card, in normal service; both its cards restored afterwards."""
    served = shared_extended.handler.extended_agent_card
    with restored(shared_extended) as fresh:
        try:
            yield fresh
        finally:
            fresh.handler.extended_agent_card = served


def engine_config(
    peer: Peer, policy: str, keys: str | None = None, **options: bool
) -> EngineConfig:
    return EngineConfig(
        max_poll_interval=FAST.max_poll_interval,
        card_limits=limits(peer, policy, keys, **options),
        follow_streams=False,
    )


def serve_extended(peer: ExtendedPeer, key: ECKey | None, *, altered: bool = False) -> Any:
    """Serve the extended card signed by a2a-sdk's signer with ``key`` (unsigned when None);
    ``altered``: a skill added after signing. The card served (protobuf)."""
    card = peer.extended_card if key is None else sdk_signed(key, peer.extended_card)
    if altered:
        card.skills.add(id="exfiltrate", name="X", description="Added later.")
    peer.handler.extended_agent_card = card
    return card


def extended_reads(store: EventStore, peer: Peer) -> list[dict[str, Any]]:
    """The agent's ``CardFetched`` of its extended card, in order."""
    return [d for t, d in agent_events(store, peer) if t == ev.CARD_FETCHED and d.get("extended")]


async def test_an_extended_card_signed_by_a2a_sdk_is_verified_and_the_task_created_under_it(
    extended_peer: ExtendedPeer, db_url: str, key: ECKey, tmp_path: Path
) -> None:
    peer = extended_peer
    sdk_sign(peer, key)
    served = serve_extended(peer, key)
    config = engine_config(peer, "require", key_file(tmp_path, key))
    async with Engine.connect(db_url, config=config) as engine:
        view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
        done = await engine.drive(view.task, until="terminal", timeout=10)
        store = engine.store

        assert done.state == "completed"
        [read] = extended_reads(store, peer)
        record = read["signature"]
        assert (record["policy"], record["status"], record["pin"]) == ("require", "verified",
                                                                      "pinned")  # fmt: skip
        assert record["kid"] == "card-key"
        assert [e["protected"] for e in record["signatures"]] == [
            e.protected for e in served.signatures
        ]
        assert view.card_revision == read["revision"]  # frozen under the verified card
        snapshot = store.get_snapshot(read["revision"])
        assert snapshot is not None
        assert "signatures" not in json.loads(snapshot.body)
        assert store.get_snapshot(record["keys"]["revision"]) is not None
        report = audit(store, verify_signatures=True)
        assert report.ok, report.violations
        assert report.signatures_checked == 2  # the public card and the extended one


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("unsigned", "the card is not signed, and its agent's policy requires a signature"),
        ("altered", "signature 0 (kid 'card-key', ES256) does not verify: the card was altered "
                    "after it was signed, or signed with another key"),
    ],
    ids=["unsigned", "altered"],
)  # fmt: skip
async def test_an_extended_card_failing_require_refuses_creation_and_nothing_is_stored_or_sent(
    extended_peer: ExtendedPeer, db_url: str, key: ECKey, tmp_path: Path, case: str, reason: str
) -> None:
    peer = extended_peer
    sdk_sign(peer, key)  # the public card verifies
    serve_extended(peer, None if case == "unsigned" else key, altered=case == "altered")
    config = engine_config(peer, "require", key_file(tmp_path, key))
    async with Engine.connect(db_url, config=config) as engine:
        said: list[tuple[str, str]] = []
        for skill in (EXTENDED_ONLY, "echo"):  # a skill of the public card too
            with pytest.raises(CardSignatureError) as caught:
                await engine.start_task(peer.base_url, skill=skill, text="slow 0.1")
            assert caught.value.detail == reason
            assert caught.value.url == peer.jsonrpc_url
            assert str(caught.value).endswith("(nothing was sent)")
            said.append((skill, str(caught.value)))
        store = engine.store

        public = [d for t, d in agent_events(store, peer) if t == ev.CARD_FETCHED]
        assert [t for t, _ in agent_events(store, peer)] == 2 * [
            ev.CARD_FETCHED, ev.DISCOVERY_FAILED, ev.TASK_CREATION_REFUSED
        ]  # fmt: skip
        failed = [d for t, d in agent_events(store, peer) if t == ev.DISCOVERY_FAILED]
        assert {(d["kind"], d["detail"]) for d in failed} == {("signature", reason)}
        refused = [d for t, d in agent_events(store, peer) if t == ev.TASK_CREATION_REFUSED]
        assert [(d["reason"], d["skill"], d["detail"]) for d in refused] == [
            ("discovery_failed", skill, message) for skill, message in said
        ]
        assert extended_reads(store, peer) == []
        # Only the public card and its key set are stored; no task was created.
        assert set(store.snapshot_revisions()) == {
            public[0]["revision"], public[0]["signature"]["keys"]["revision"]
        }  # fmt: skip
        assert [s for s in store.stream_ids() if s.startswith(ev.TASK_STREAM_PREFIX)] == []
        assert audit(store, verify_signatures=True).ok
    assert calls(peer, "GetExtendedAgentCard") == 2
    assert calls(peer, "SendMessage") == 0


async def test_prefer_uses_an_unsigned_extended_card_and_refuses_an_altered_one(
    extended_peer: ExtendedPeer, db_url: str, key: ECKey, tmp_path: Path
) -> None:
    """As for the public card: unsigned, used and recorded as unsigned; signed, it must verify."""
    peer = extended_peer
    config = engine_config(peer, "prefer", key_file(tmp_path, key))
    async with Engine.connect(db_url, config=config) as engine:
        view = await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        [read] = extended_reads(engine.store, peer)
        assert read["signature"] == {"policy": "prefer", "status": "unsigned"}
        assert view.card_revision == read["revision"]

        serve_extended(peer, key, altered=True)
        with pytest.raises(CardSignatureError) as caught:
            await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        assert caught.value.detail.startswith("signature 0 (kid 'card-key', ES256) does not verify")
        assert len(extended_reads(engine.store, peer)) == 1
    assert calls(peer, "SendMessage") == 1


async def test_the_extended_cards_key_set_is_pinned_apart_from_the_public_cards(
    extended_peer: ExtendedPeer, db_url: str, key: ECKey, tmp_path: Path
) -> None:
    """Under prefer, an unsigned public card beside a signed extended card: the extended card's
    key set is pinned from its own reads, and an unsigned extended card after it is refused as
    a downgrade while the unsigned public card is still accepted."""
    peer = extended_peer
    serve_extended(peer, key)
    config = engine_config(peer, "prefer", key_file(tmp_path, key))
    async with Engine.connect(db_url, config=config) as engine:
        for _ in range(2):
            await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        pins = [d["signature"]["pin"] for d in extended_reads(engine.store, peer)]
        assert pins == ["pinned", "matched"]

        serve_extended(peer, None)
        with pytest.raises(CardSignatureError) as caught:
            await engine.start_task(peer.base_url, skill="echo", text="echo hi")
        assert caught.value.detail.startswith("the card is unsigned, and key set ")
        assert caught.value.detail.endswith("refused as a downgrade (accept_key_change accepts it)")
        public = [
            d["signature"]
            for t, d in agent_events(engine.store, peer)
            if t == ev.CARD_FETCHED and not d.get("extended")
        ]
        assert public == 3 * [{"policy": "prefer", "status": "unsigned"}]
    assert calls(peer, "SendMessage") == 2


async def test_an_extended_card_altered_mid_task_is_not_used_and_the_public_card_stands_in(
    extended_peer: ExtendedPeer, db_url: str, key: ECKey, tmp_path: Path
) -> None:
    peer = extended_peer
    sdk_sign(peer, key)
    serve_extended(peer, key)
    peer.hold()
    config = engine_config(peer, "require", key_file(tmp_path, key))
    async with Engine.connect(db_url, config=config) as engine:
        view = await engine.start_task(peer.base_url, skill=EXTENDED_ONLY, text="slow 0.1")
        assert (await engine.poll(view.task)).state == "working"
        serve_extended(peer, key, altered=True)

        resumed = await engine.resume(view.task)  # R9 reads the extended card again
        assert resumed.state == "working"
        assert resumed.card_revision == view.card_revision
        unread = data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)
        assert [(d["kind"], d["during"]) for d in unread] == [("extended_card", "resume")]
        assert "CardSignatureError" in str(unread[0]["detail"])
        assert not {ev.FLAGGED_FOR_REVIEW, ev.TASK_ORPHANED} & set(types(engine.store, view.task))
        assert len(extended_reads(engine.store, peer)) == 1  # the altered card was not stored
        peer.release()
        done = await engine.drive(view.task, until="terminal", timeout=10)
        assert done.state == "completed"
        assert audit(engine.store, verify_signatures=True).ok


# -- the command line ------------------------------------------------------------------------------


def cli(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cardfence", *args, "--db", db],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_run_under_a_signatures_file_refuses_an_altered_card_with_exit_3_and_audit_finds_none(
    peer: KeyedPeer, key: ECKey, tmp_path: Path
) -> None:
    keys = key_file(tmp_path, key)
    policies = tmp_path / "signatures.toml"
    policies.write_text(f'[agents."{peer.base_url}"]\npolicy = "require"\nkeys = "{keys}"\n')
    env = {"CARDFENCE_CARD_SIGNATURES": str(policies)}
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"
    peer.card = sign_card(peer.card, key)
    ok = cli(db, "run", peer.base_url, "--skill", "echo", "--text", "echo hi",
             "--until", "terminal", "--json", env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr

    peer.mutate_card(add_skill)
    calls = len(peer.calls)
    bad = cli(db, "run", peer.base_url, "--skill", "exfiltrate", "--text", "x", env=env)
    assert bad.returncode == 3, bad.stderr
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"CardSignatureError: GET {peer.card_url} -> card signature refused: signature 0 "
            "(kid 'card-key', ES256) does not verify"
        )
    )
    assert len(peer.calls) == calls

    audited = cli(db, "audit", "--verify-signatures", "--json")
    assert audited.returncode == 0, audited.stderr
    assert json.loads(audited.stdout)["signatures_checked"] == 1
    assert "signatures_checked" not in json.loads(cli(db, "audit", "--json").stdout)

    with sqlite3.connect(tmp_path / "cardfence.db") as raw:
        raw.execute("UPDATE card_snapshots SET body = replace(body, '\"Echo\"', '\"Ech0\"')")
    tampered = cli(db, "audit", "--verify-signatures", "--json")
    assert tampered.returncode == 5
    kinds = [v["kind"] for v in json.loads(tampered.stdout)["violations"]]
    assert kinds == ["snapshot_mismatch", "signature_invalid"]


def test_a_malformed_signatures_file_is_a_usage_error_before_anything_is_read(
    peer: KeyedPeer, tmp_path: Path
) -> None:
    policies = tmp_path / "signatures.toml"
    policies.write_text(f'[agents."{peer.base_url}"]\npolicy = "sometimes"\n')
    db = f"sqlite:///{tmp_path / 'cardfence.db'}"
    result = cli(db, "run", peer.base_url, "--skill", "echo", "--text", "hi",
                 env={"CARDFENCE_CARD_SIGNATURES": str(policies)})  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("UsageError: card signatures ")
    assert peer.card_requests == 0
