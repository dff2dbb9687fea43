"""Signed cards, the pure part (engine/cards/keys.py, signature_policy.py, signatures.py): keys,
entries, verification, the policy file, a2a-sdk's view of a card, and the audit's check. No
network."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import ECKey, Key, OctKey, OKPKey, RSAKey
from support.cards import card_document

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.signature_policy import PREFER, REQUIRE, CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import (
    FORM_A2A_SDK,
    FORM_RFC8785,
    apply_policy,
    entries,
    reverify,
    sdk_form,
    sign_card,
    uncovered,
    verify,
)
from cardfence.engine.discovery.signature_files import load_card_signatures
from cardfence.engine.errors import CardSignatureError, DiscoveryError, UsageError

URL = "https://agent.example/.well-known/agent-card.json"

CARD = card_document()


def ec_key(kid: str = "k1") -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid})


def key_set(*keys: Key, source: str = "file") -> CardKeys:
    body = json.dumps({"keys": [k.as_dict(private=False) for k in keys]}).encode()
    return parse_keys(body, source=source, url="file:///keys.json", card_url=URL)


def checked(document: dict[str, Any], keys: CardKeys) -> str:
    """The form the card verified in, or the one-line reason it was refused."""
    card = parse_card(json.dumps(document).encode(), url=URL)
    try:
        return verify(card, entries(card, URL), keys, URL).form
    except CardSignatureError as refused:
        reason = refused.detail
    assert "\n" not in reason
    return f"refused: {reason}"


def b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


# -- signing and verifying -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alg", "key"),
    [
        ("ES256", ECKey.generate_key("P-256", parameters={"kid": "k"})),
        ("ES384", ECKey.generate_key("P-384", parameters={"kid": "k"})),
        ("RS256", RSAKey.generate_key(2048, parameters={"kid": "k"})),
        ("PS256", RSAKey.generate_key(2048, parameters={"kid": "k"})),
        ("EdDSA", OKPKey.generate_key("Ed25519", parameters={"kid": "k"})),
        ("Ed25519", OKPKey.generate_key("Ed25519", parameters={"kid": "k"})),
    ],
)
def test_a_card_signed_with_each_accepted_algorithm_verifies(alg: str, key: Key) -> None:
    assert checked(sign_card(CARD, key, alg=alg), key_set(key)) == FORM_RFC8785


def test_a_signature_covers_exactly_the_revision_bytes_so_signing_leaves_the_revision_alone() -> (
    None
):
    key = ec_key()
    signed = sign_card(CARD, key)
    plain, card = parse_card(json.dumps(CARD).encode()), parse_card(json.dumps(signed).encode())
    assert card.revision == plain.revision
    assert card.canonical_bytes() == plain.canonical_bytes()
    [entry] = signed["signatures"]
    assert json.loads(base64.urlsafe_b64decode(entry["protected"] + "==")) == {
        "alg": "ES256",
        "typ": "JOSE",
        "kid": "k1",
    }


def test_a_skill_added_after_signing_is_refused() -> None:
    key = ec_key()
    signed = sign_card(CARD, key)
    signed["skills"].append({"id": "steal", "name": "Steal", "description": "", "tags": []})
    assert checked(signed, key_set(key)) == (
        "refused: signature 0 (kid 'k1', ES256) does not verify: the card was altered after it "
        "was signed, or signed with another key"
    )


def test_a_signature_by_another_key_under_a_known_kid_is_refused() -> None:
    signed = sign_card(CARD, ec_key("k1"))
    assert checked(signed, key_set(ec_key("k1"))).startswith(
        "refused: signature 0 (kid 'k1', ES256) does not verify"
    )


def test_a_kid_the_key_set_lacks_is_refused_naming_the_kids_it_has() -> None:
    signed = sign_card(CARD, ec_key("other"))
    assert checked(signed, key_set(ec_key("k1"), ec_key("k2"))) == (
        "refused: signature 0 (kid 'other', ES256): kid 'other' is not in the key set "
        "(kids: k1, k2)"
    )


def test_a_named_key_that_does_not_fit_the_algorithm_refuses_the_card() -> None:
    """No algorithm confusion: the key named is used with its own algorithm or not at all."""
    signed = sign_card(CARD, ec_key("k1"))
    p384 = ECKey.generate_key("P-384", parameters={"kid": "k1"})
    rsa = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    for wrong in (p384, rsa):
        assert checked(signed, key_set(wrong)) == (
            "refused: signature 0 (kid 'k1', ES256): the key 'k1' does not fit ES256"
        )
    unnamed = sign_card(CARD, ECKey.generate_key("P-256"), kid=None)
    assert checked(unnamed, key_set(rsa)) == (
        "refused: signature 0 (ES256): no key of the set does fit ES256"
    )


def test_while_keys_rotate_one_good_signature_is_enough_and_an_unknown_kid_is_passed_over() -> None:
    old, new = ec_key("old"), ec_key("new")
    signed = sign_card(sign_card(CARD, old), new)
    assert checked(signed, key_set(new)) == FORM_RFC8785
    assert checked(signed, key_set(old)) == FORM_RFC8785


def test_one_bad_signature_refuses_the_card_even_beside_a_good_one() -> None:
    good, forged = ec_key("good"), ec_key("forged")
    signed = sign_card(CARD, good)
    signed["signatures"].append(sign_card(CARD, forged, kid="good")["signatures"][0])
    assert checked(signed, key_set(good)).startswith("refused: signature 1 (kid 'good', ES256)")


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({"alg": "none"}, "alg none (an unsigned JWS) is refused"),
        ({"alg": "HS256", "kid": "k1"}, "alg HS256 (HMAC) is refused"),
        ({"alg": "HS512"}, "alg HS512 (HMAC) is refused"),
        ({"alg": "ES256K"}, "alg ES256K is not accepted"),
        ({"kid": "k1"}, "the protected header names no alg"),
        ({"alg": "ES256", "crit": ["b64"], "b64": False}, "crit header parameters"),
        ({"alg": "ES256", "kid": 7}, "kid must be a string"),
    ],
)
def test_a_refused_header_is_refused_before_any_key_is_looked_for(
    header: dict[str, Any], reason: str
) -> None:
    forged = {**CARD, "signatures": [{"protected": b64(header), "signature": "c2ln"}]}
    card = parse_card(json.dumps(forged).encode(), url=URL)
    with pytest.raises(CardSignatureError) as refused:
        entries(card, URL)
    assert refused.value.detail.startswith("signature 0: ")
    assert reason in refused.value.detail
    assert isinstance(refused.value, DiscoveryError)
    assert refused.value.kind == "signature"
    assert str(refused.value) == f"GET {URL} -> card signature refused: {refused.value.detail}"


def test_an_hmac_signature_made_with_the_public_key_as_secret_is_refused() -> None:
    """The classic confusion: HS256 keyed with the verifier's public key. Refused by name."""
    key = ec_key()
    secret = OctKey.import_key(json.dumps(key.as_dict(private=False)).encode())
    header = {"alg": "HS256", "kid": "k1"}
    card = parse_card(json.dumps(CARD).encode())
    from joserfc.jws import JWSRegistry

    payload = base64.urlsafe_b64encode(card.canonical_bytes()).rstrip(b"=").decode()
    mac = JWSRegistry.algorithms["HS256"].sign(f"{b64(header)}.{payload}".encode(), secret)
    signature = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    forged = {**CARD, "signatures": [{"protected": b64(header), "signature": signature}]}
    assert checked(forged, key_set(key)) == (
        "refused: signature 0: alg HS256 (HMAC) is refused: a shared secret proves no signer"
    )


@pytest.mark.parametrize(
    ("signatures", "reason"),
    [
        ({"protected": "x"}, "signatures: must be a list of JWS objects"),
        (["x"], "signature 0: must be an object"),
        ([{"signature": "c2ln"}], "signature 0: protected must be a base64url header"),
        ([{"protected": "e30", "signature": 5}], "signature 0: signature must be a base64url"),
        ([{"protected": "not b64!", "signature": "c2ln"}], "signature 0: not base64url JSON"),
        ([{"protected": b64([1]), "signature": "c2ln"}], "signature 0: the protected header is"),
    ],
)
def test_a_malformed_signatures_member_is_refused(signatures: object, reason: str) -> None:
    card = parse_card(json.dumps({**CARD, "signatures": signatures}).encode())
    with pytest.raises(CardSignatureError) as refused:
        entries(card, URL)
    assert refused.value.detail.startswith(reason)


def test_the_kid_may_come_from_the_unprotected_header_but_jku_only_from_the_protected_one() -> None:
    key = ec_key("k1")
    signed = sign_card(CARD, key, kid=None, header={"kid": "k1", "jku": "https://evil.example/"})
    signed["signatures"][0]["protected"] = b64({"alg": "ES256", "typ": "JOSE"})
    card = parse_card(json.dumps(signed).encode())
    [entry] = entries(card, URL)
    assert (entry.kid, entry.jku) == ("k1", None)


def test_an_a2a_sdk_style_null_jku_in_the_protected_header_is_no_jku() -> None:
    forged = {**CARD, "signatures": [{"protected": b64({"alg": "ES256", "jku": None}),
                                      "signature": "c2ln"}]}  # fmt: skip
    [entry] = entries(parse_card(json.dumps(forged).encode()), URL)
    assert entry.jku is None


# -- the policy ------------------------------------------------------------------------------------


def test_require_refuses_an_unsigned_card_and_prefer_records_it_as_unsigned() -> None:
    card = parse_card(json.dumps(CARD).encode())
    with pytest.raises(CardSignatureError, match="not signed"):
        apply_policy(card, SignaturePolicy(REQUIRE), None, URL)
    check = apply_policy(card, SignaturePolicy(PREFER), None, URL)
    assert check.record() == {"policy": "prefer", "status": "unsigned"}


def test_a_verified_check_records_the_raw_signatures_and_the_key_set() -> None:
    key = ec_key()
    signed = sign_card(CARD, key)
    keys = key_set(key)
    card = parse_card(json.dumps(signed).encode())
    record = apply_policy(card, SignaturePolicy(PREFER), keys, URL).record()
    assert record == {
        "policy": "prefer",
        "status": "verified",
        "form": FORM_RFC8785,
        "alg": "ES256",
        "kid": "k1",
        "index": 0,
        "signatures": signed["signatures"],
        "keys": {
            "source": "file",
            "url": "file:///keys.json",
            "revision": keys.revision,
            "key_set": keys.key_set,
            "kids": ["k1"],
        },
    }


def test_an_unknown_policy_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="expected one of require, prefer, ignore"):
        SignaturePolicy("always")


def test_policies_are_looked_up_by_normalised_origin_and_default_to_ignore() -> None:
    config = CardSignatures.of({"HTTPS://Agent.Example:443/": "require"})
    assert config.policy("https://agent.example").policy == REQUIRE
    assert config.policy("https://other.example").policy == "ignore"
    with pytest.raises(UsageError, match="written twice"):
        CardSignatures.of({"https://a.example": "require", "https://a.example:443": "prefer"})
    with pytest.raises(UsageError, match="not an agent origin"):
        CardSignatures.of({"ftp://a.example": "require"})


def test_the_policy_file_reads_each_agent_and_resolves_a_relative_key_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "signatures.toml"
    path.write_text(
        '[agents."https://a.example"]\npolicy = "require"\nkeys = "a.jwks.json"\n'
        '[agents."https://b.example"]\npolicy = "prefer"\njku = true\n'
        'keys = "https://b.example/jwks.json"\naccept_key_change = true\n'
    )
    config = load_card_signatures(path)
    assert config.policy("https://a.example") == SignaturePolicy(
        "require", str(tmp_path / "a.jwks.json")
    )
    assert config.policy("https://b.example") == SignaturePolicy(
        "prefer", "https://b.example/jwks.json", True, True
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[agents.x", "not valid TOML"),
        ("[other]\nx = 1\n", 'expected only [agents."ORIGIN"] tables'),
        ('[agents."https://a.example"]\nkeys = "k"\n', "policy is required"),
        ('[agents."https://a.example"]\npolicy = "require"\npin = 1\n', "unknown key(s) pin"),
        ('[agents."https://a.example"]\npolicy = "maybe"\n', "expected one of"),
        ('[agents."https://a.example"]\npolicy = "prefer"\njku = "yes"\n', "true or false"),
        ('[agents."https://a.example"]\npolicy = "prefer"\nkeys = 3\n', "file path or an http"),
    ],
)
def test_a_malformed_policy_file_is_a_usage_error(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "signatures.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as refused:
        load_card_signatures(path)
    assert reason in str(refused.value)


# -- keys ------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::joserfc.errors.SecurityWarning")  # the 1024-bit key
def test_a_key_set_keeps_public_signing_keys_only() -> None:
    signing, rsa = ec_key("sig"), RSAKey.generate_key(2048, parameters={"kid": "rsa"})
    document = {
        "keys": [
            signing.as_dict(private=True),  # private members are dropped
            rsa.as_dict(private=False),
            OctKey.generate_key(256, parameters={"kid": "mac"}).as_dict(private=True),
            ec_key("enc").as_dict(private=False) | {"use": "enc"},
            RSAKey.generate_key(1024, parameters={"kid": "weak"}).as_dict(private=False),
            OKPKey.generate_key("X25519", parameters={"kid": "dh"}).as_dict(private=False),
            {"kty": "EC", "crv": "P-256", "x": "broken"},
            "not a key",
        ]
    }
    keys = parse_keys(json.dumps(document).encode(), source="url", url="u", card_url=URL)
    assert keys.kids == ("rsa", "sig")
    stored = json.loads(keys.body)["keys"]
    assert all("d" not in jwk and "p" not in jwk for jwk in stored)


def test_the_pinned_hash_depends_on_the_keys_only() -> None:
    a, b = ec_key("a"), ec_key("b")
    one = key_set(a, b)
    other = parse_keys(
        json.dumps({"keys": [b.as_dict(private=False) | {"x5u": "https://meta"},
                             a.as_dict(private=False)]}).encode(),
        source="jku", url="elsewhere", card_url=URL,
    )  # fmt: skip
    assert one.key_set == other.key_set
    assert key_set(a).key_set != one.key_set
    assert key_set(a).key_set == key_set(a).key_set


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not JSON"),
        (b'{"keys": 5}', "not a JWK set"),
        (b'{"keys": []}', "no public signing key"),
        (b'{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "no public signing key"),
    ],
)
def test_a_key_set_without_a_usable_key_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(CardSignatureError, match=reason):
        parse_keys(body, source="url", url="https://a.example/jwks", card_url=URL)


def test_a_single_jwk_is_read_as_a_set_of_one() -> None:
    key = ec_key()
    keys = parse_keys(
        json.dumps(key.as_dict(private=False)).encode(), source="file", url="u", card_url=URL
    )
    assert keys.kids == ("k1",)


# -- a2a-sdk's view of a card ----------------------------------------------------------------------


def test_a_signature_over_a2a_sdks_view_counts_when_that_view_decides_alike() -> None:
    """The served card carries what the SDK's view drops (an empty ``params``, a member its
    schema lacks): signed over the view, verified over the view, nothing decided differs."""
    pytest.importorskip("a2a.client.card_resolver")
    served = copy.deepcopy(CARD)
    served["capabilities"]["extensions"] = [{"uri": "urn:x", "params": {}}]
    view = sdk_form(served)
    assert view is not None
    assert view != parse_card(json.dumps(served).encode()).canonical_bytes()
    key = ec_key()
    signed = sign_card(json.loads(view), key)
    served["signatures"] = signed["signatures"]
    assert checked(served, key_set(key)) == FORM_A2A_SDK


def test_a_signature_over_a2a_sdks_view_that_drops_a_security_requirement_is_refused() -> None:
    """a2a-sdk drops ``{"schemes": {"bearer": {}}}`` whole: its signature does not say the
    agent requires a bearer token, so it covers less than cardfence decides on."""
    pytest.importorskip("a2a.client.card_resolver")
    served = copy.deepcopy(CARD)
    served["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    served["securityRequirements"] = [{"schemes": {"bearer": {}}}]
    view = sdk_form(served)
    assert view is not None
    assert uncovered(parse_card(json.dumps(served).encode()), view) == (
        "securityRequirements",
        "contract",
    )
    key = ec_key()
    served["signatures"] = sign_card(json.loads(view), key)["signatures"]
    assert checked(served, key_set(key)) == (
        "refused: signature 0 (kid 'k1', ES256) covers only a2a-sdk's view of the card, which "
        "leaves out what cardfence decides on (securityRequirements, contract)"
    )


def test_a_view_that_is_no_card_covers_nothing() -> None:
    assert uncovered(parse_card(json.dumps(CARD).encode()), b"{}") == ("the whole card",)


# -- the audit's check -----------------------------------------------------------------------------


def test_reverify_holds_for_the_recorded_read_and_fails_for_an_altered_snapshot() -> None:
    key = ec_key()
    signed = sign_card(CARD, key)
    keys = key_set(key)
    card = parse_card(json.dumps(signed).encode())
    record = apply_policy(card, SignaturePolicy(REQUIRE), keys, URL).record()
    body = card.canonical_bytes().decode()
    assert reverify(body, record, keys.body) is None
    altered = body.replace('"Echoes."', '"Echoes, and more."')
    assert reverify(altered, record, keys.body) == (
        "signature 0 (kid 'k1', ES256) does not verify: the card was altered after it was "
        "signed, or signed with another key"
    )
    assert reverify(body, {**record, "signatures": []}, keys.body) == (
        "the recorded signatures are missing"
    )
    assert reverify(body, record, key_set(ec_key()).body) is not None
    assert (reverify("[1", record, keys.body) or "").startswith("the stored card cannot be read")


def test_sign_card_refuses_hmac_none_and_a_key_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="not accepted"):
        sign_card(CARD, ec_key(), alg="HS256")
    with pytest.raises(ValueError, match="not accepted"):
        sign_card(CARD, ec_key(), alg="none")
    with pytest.raises(ValueError, match="needs a private RSA key"):
        sign_card(CARD, ec_key(), alg="RS256")
    public = ECKey.import_key(ec_key().as_dict(private=False))
    with pytest.raises(ValueError, match="needs a private EC key"):
        sign_card(CARD, public)
