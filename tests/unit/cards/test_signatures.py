"""Signed cards at their edges (engine/cards/signatures.py, keys.py, signature_policy.py): every
refusal names the card and says exactly why, each bound holds at its limit and not one past it,
a key that may not verify never lets a signature through, private key members never survive a
read, and the audit's check reads what was recorded. Pure: no network.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import ECKey, Key, OctKey, OKPKey, RSAKey
from support.cards import card_document

from cardfence.engine.cards import signatures
from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.signature_policy import PREFER, REQUIRE, CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import (
    FORM_A2A_SDK,
    FORM_RFC8785,
    SignatureCheck,
    Verified,
    apply_policy,
    entries,
    reverify,
    sdk_form,
    sign_card,
    uncovered,
    verify,
)
from cardfence.engine.cards.urls import origin_of
from cardfence.engine.discovery.signature_files import load_card_signatures, read_key_file
from cardfence.engine.errors import CardSignatureError, DiscoveryError, UsageError

URL = "https://agent.example/.well-known/agent-card.json"
KEYS_URL = "https://agent.example/keys.json"
CARD = card_document()
ALGS = "ES256, ES384, ES512, Ed25519, EdDSA, PS256, PS384, PS512, RS256, RS384, RS512"


def ec_key(kid: str | None = "k1") -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid} if kid else None)


def jwks(*members: dict[str, Any]) -> bytes:
    return json.dumps({"keys": list(members)}).encode()


def key_set(*members: dict[str, Any], max_bytes: int = 1_048_576) -> CardKeys:
    return parse_keys(jwks(*members), source="url", url=KEYS_URL, card_url=URL, max_bytes=max_bytes)


def public(key: Key, **extra: Any) -> dict[str, Any]:
    return {**key.as_dict(private=False), **extra}


def card_of(document: dict[str, Any]) -> Any:
    return parse_card(json.dumps(document).encode(), url=URL, max_bytes=1 << 22)


def refusal(call: Any, *args: Any, **kwargs: Any) -> CardSignatureError:
    with pytest.raises(CardSignatureError) as refused:
        call(*args, **kwargs)
    assert refused.value.url == URL
    assert str(refused.value).startswith(f"GET {URL} -> card signature refused: ")
    return refused.value


def with_signatures(value: object) -> Any:
    return card_of({**CARD, "signatures": value})


def entry(protected: object = None, signature: object = "AAAA", **extra: Any) -> dict[str, Any]:
    if protected is None:
        protected = signatures._b64encode(json.dumps({"alg": "ES256"}).encode())
    return {"protected": protected, "signature": signature, **extra}


def protected_of(header: object) -> str:
    return signatures._b64encode(json.dumps(header).encode())


# --- entries: each refusal names the card, and the bounds hold at their limits --------------------


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ({"a": 1}, "signatures: must be a list of JWS objects"),
        ([entry()] * 17, "signatures: more than 16 entries"),
        (["x"], "signature 0: must be an object"),
        ([entry(protected="")], "signature 0: protected must be a base64url header"),
        ([entry(protected=5)], "signature 0: protected must be a base64url header"),
        ([entry(protected="A" * 4097)], "signature 0: protected must be a base64url header"),
        ([entry(signature="")], "signature 0: signature must be a base64url string"),
        ([entry(signature=5)], "signature 0: signature must be a base64url string"),
        ([entry(signature="A" * 2049)], "signature 0: signature must be a base64url string"),
        ([entry(header=[1])], "signature 0: header must be an object"),
        ([entry(protected="!!")], "signature 0: not base64url JSON"),
        (
            [entry(protected=protected_of([1]))],
            "signature 0: the protected header is not a JSON object",
        ),
        (
            # RFC 7515 §4: a header name given twice is refused, not read as its last value.
            [entry(protected=signatures._b64encode(b'{"alg": "ES256", "alg": "none"}'))],
            "signature 0: protected header: alg: duplicate member name",
        ),
        (
            [entry(protected=protected_of({"alg": ""}))],
            "signature 0: the protected header names no alg",
        ),
        (
            [entry(protected=protected_of({"alg": 5}))],
            "signature 0: the protected header names no alg",
        ),
        (
            [entry(protected=protected_of({"alg": "XS1"}))],
            f"signature 0: alg XS1 is not accepted ({ALGS})",
        ),
        (
            [entry(protected=protected_of({"alg": "ES256", "kid": 5}))],
            "signature 0: kid must be a string",
        ),
        (
            [entry(protected=protected_of({"alg": "ES256", "jku": 5}))],
            "signature 0: jku must be a URL",
        ),
    ],
)
def test_a_malformed_signature_entry_is_refused_naming_the_card_and_why(
    value: object, detail: str
) -> None:
    assert refusal(entries, with_signatures(value), URL).detail == detail


def test_sixteen_signatures_and_headers_and_signatures_at_their_bounds_are_read() -> None:
    assert len(entries(with_signatures([entry()] * 16), URL)) == 16
    # a protected header of exactly 4,096 characters: 3,072 bytes of JSON
    header = {"alg": "ES256", "pad": ""}
    header["pad"] = "a" * (3072 - len(json.dumps(header).encode()))
    head = protected_of(header)
    assert len(head) == 4096
    assert entries(with_signatures([entry(protected=head)]), URL)[0].alg == "ES256"
    long_signature = entries(with_signatures([entry(signature="A" * 2048)]), URL)[0]
    assert len(long_signature.signature) == 1536


def test_base64url_text_loses_only_its_padding() -> None:
    assert signatures._b64encode(b"\x00\x00\x17") == "AAAX"
    assert signatures._b64encode(b"\x00") == "AA"


# --- verify: which keys may verify, and what each refusal says ------------------------------------


def test_a_signature_without_a_kid_is_tried_with_every_key_that_fits() -> None:
    signer = ec_key(kid=None)
    signed = sign_card(CARD, signer)
    assert "kid" not in json.loads(signatures._b64decode(signed["signatures"][0]["protected"]))
    keys = key_set(public(signer, kid="named-later"))
    found = entries(card_of(signed), URL)
    assert verify(card_of(signed), found, keys, URL) == Verified(0, None, "ES256", "rfc8785")


def test_a_key_for_another_algorithm_never_verifies() -> None:
    """A JWK that states its ``alg`` verifies that algorithm only: an RSA key kept for RS256
    does not verify a PS256 signature, even one it made."""
    signer = RSAKey.generate_key(2048, parameters={"kid": "r1"})
    signed = sign_card(CARD, signer, alg="PS256")
    keys = key_set(public(signer, alg="RS256"))
    card = card_of(signed)
    assert refusal(verify, card, entries(card, URL), keys, URL).detail == (
        "signature 0 (kid 'r1', PS256): the key 'r1' does not fit PS256"
    )


def test_a_key_that_may_not_verify_never_lets_a_signature_through() -> None:
    """``key_ops`` without ``verify``: the key refuses the operation, and the card is refused
    as not verifying -- never accepted because the check could not be made."""
    signer = ec_key()
    signed = sign_card(CARD, signer)
    keys = key_set(public(signer, key_ops=["encrypt"]))
    card = card_of(signed)
    assert refusal(verify, card, entries(card, URL), keys, URL).detail == (
        "signature 0 (kid 'k1', ES256) does not verify: the card was altered after it was "
        "signed, or signed with another key"
    )


def test_no_signatures_to_verify_is_not_signed() -> None:
    card = card_of(CARD)
    assert refusal(verify, card, (), key_set(public(ec_key())), URL).detail == (
        "the card is not signed"
    )


def test_a_kid_not_in_a_key_set_without_kids_says_it_has_none() -> None:
    signed = sign_card(CARD, ec_key())
    card = card_of(signed)
    keys = key_set(public(ec_key(kid=None)))
    assert refusal(verify, card, entries(card, URL), keys, URL).detail == (
        "signature 0 (kid 'k1', ES256): kid 'k1' is not in the key set (kids: none)"
    )


def test_a_signature_over_a2a_sdks_view_is_recorded_with_its_place_kid_and_alg() -> None:
    pytest.importorskip("a2a.client.card_resolver")
    served = copy.deepcopy(CARD)
    served["capabilities"]["extensions"] = [{"uri": "urn:x", "params": {}}]
    view = sdk_form(served)
    assert view is not None
    other, signer = ec_key("other"), ec_key("k2")
    first = sign_card(CARD, other)["signatures"]
    served["signatures"] = [*first, *sign_card(json.loads(view), signer, alg="ES256")["signatures"]]
    card = card_of(served)
    keys = key_set(public(signer))  # the first signature's kid is unknown: passed over
    assert verify(card, entries(card, URL), keys, URL) == Verified(1, "k2", "ES256", FORM_A2A_SDK)


def test_a_signature_that_verifies_over_no_form_is_refused_naming_the_card() -> None:
    served = copy.deepcopy(CARD)
    served["signatures"] = sign_card(CARD, ec_key())["signatures"]
    served["description"] = "Altered."
    card = card_of(served)
    keys = key_set(public(ec_key()))
    refusal(verify, card, entries(card, URL), keys, URL)


def test_a_signature_over_a_view_that_leaves_a_decision_out_is_refused_naming_the_card() -> None:
    pytest.importorskip("a2a.client.card_resolver")
    served = copy.deepcopy(CARD)
    served["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    served["securityRequirements"] = [{"schemes": {"bearer": {}}}]
    view = sdk_form(served)
    assert view is not None
    key = ec_key()
    served["signatures"] = sign_card(json.loads(view), key)["signatures"]
    card = card_of(served)
    refusal(verify, card, entries(card, URL), key_set(public(key)), URL)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (
            {"supportedInterfaces": [{**CARD["supportedInterfaces"][0], "url": "https://x/a2a"}]},
            "supportedInterfaces",
        ),
        ({"capabilities": {"streaming": False}}, "capabilities"),
        ({"defaultInputModes": ["application/json"]}, "defaultModes"),
        (
            {
                "securitySchemes": {
                    "k": {"apiKeySecurityScheme": {"location": "header", "name": "k"}}
                }
            },
            "securitySchemes",
        ),
        ({"skills": [{**CARD["skills"][0], "id": "other"}]}, "skills"),
    ],
)
def test_each_part_a_view_decides_otherwise_is_named(change: dict[str, Any], name: str) -> None:
    view = json.dumps({**CARD, **change}).encode()
    assert name in uncovered(card_of(CARD), view)


def test_a_view_of_a_card_over_a_mebibyte_is_still_read() -> None:
    big = {**CARD, "description": "x" * 1_100_000}
    assert uncovered(card_of(big), json.dumps(big).encode()) == ()


def test_sdk_form_leaves_the_card_it_reads_unchanged() -> None:
    """a2a-sdk's reader rewrites legacy members in place: it must get a copy."""
    pytest.importorskip("a2a.client.card_resolver")
    document = {
        **copy.deepcopy(CARD),
        "securitySchemes": {"k": {"type": "apiKey", "in": "header", "name": "k"}},
        "skills": [{**CARD["skills"][0], "security": [{"k": []}]}],
    }
    before = copy.deepcopy(document)
    assert sdk_form(document) is not None
    assert document == before


# --- signing --------------------------------------------------------------------------------------


def test_sign_card_refuses_a_key_for_encryption_or_another_algorithm() -> None:
    for key in (
        ECKey.generate_key("P-256", parameters={"use": "enc"}),
        ECKey.generate_key("P-256", parameters={"alg": "ES384"}),
    ):
        with pytest.raises(ValueError, match="needs a private EC key that fits it"):
            sign_card(CARD, key)
    with pytest.raises(ValueError, match="HS256") as refused:
        sign_card(CARD, ec_key(), alg="HS256")
    assert str(refused.value) == f"alg HS256 is not accepted for cards ({ALGS})"
    sig_key = ECKey.generate_key("P-256", parameters={"use": "sig", "alg": "ES256", "kid": "s"})
    signed = sign_card(CARD, sig_key)
    card = card_of(signed)
    verified = verify(card, entries(card, URL), key_set(public(sig_key)), URL)
    assert verified.kid == "s"


def test_a_card_over_a_mebibyte_is_signed_and_verified() -> None:
    key = ec_key()
    big = {**CARD, "description": "x" * 1_100_000}
    signed = sign_card(big, key)
    card = parse_card(json.dumps(signed).encode(), url=URL, max_bytes=1 << 22)
    assert verify(card, entries(card, URL), key_set(public(key)), URL).form == "rfc8785"


# --- the policy applied, and what is recorded -----------------------------------------------------


def test_a_signed_card_with_no_keys_is_refused_naming_the_card() -> None:
    signed = card_of(sign_card(CARD, ec_key()))
    assert refusal(apply_policy, signed, SignaturePolicy(PREFER), None, URL).detail == (
        "no keys to verify the card's signatures with"
    )


def test_apply_policy_refusals_name_the_card() -> None:
    refusal(apply_policy, with_signatures({"a": 1}), SignaturePolicy(REQUIRE), None, URL)
    signed = sign_card(CARD, ec_key())
    keys = key_set(public(ec_key()))
    refusal(apply_policy, card_of(signed), SignaturePolicy(REQUIRE), keys, URL)


def test_an_unverified_check_records_no_keys_even_when_it_has_them() -> None:
    keys = key_set(public(ec_key()))
    assert SignatureCheck(PREFER, keys=keys).record() == {"policy": PREFER, "status": "unsigned"}
    verified = Verified(0, "k1", "ES256", "rfc8785")
    assert SignatureCheck(PREFER, verified=verified).record() == {
        "policy": PREFER,
        "status": "verified",
    }


# --- the audit's check ----------------------------------------------------------------------------


def recorded(document: dict[str, Any], key: ECKey) -> tuple[str, dict[str, Any], str]:
    keys = key_set(public(key))
    card = card_of(sign_card(document, key))
    record = apply_policy(card, SignaturePolicy(REQUIRE), keys, URL).record()
    return card.canonical_bytes().decode(), record, keys.body


def test_reverify_names_the_recorded_key_set_when_it_no_longer_reads() -> None:
    body, record, _ = recorded(CARD, ec_key())
    assert record["keys"]["url"] == KEYS_URL
    assert reverify(body, record, "not json") == (
        f"keys at {KEYS_URL}: not JSON (body is not JSON (Expecting value at line 1))"
    )
    assert reverify(body, {**record, "keys": None}, "not json") == (
        "keys at : not JSON (body is not JSON (Expecting value at line 1))"
    )


def test_reverify_reads_stored_bodies_of_any_size() -> None:
    key = ec_key()
    body, record, keys_body = recorded({**CARD, "description": "x" * 1_100_000}, key)
    padded = keys_body[:-1] + " " * 1_100_000 + keys_body[-1]
    assert reverify(body, record, padded) is None


def test_reverify_says_what_a_stored_card_is_when_it_does_not_read() -> None:
    _, record, keys_body = recorded(CARD, ec_key())
    assert reverify("[1]", record, keys_body) == "the stored card is not a JSON object"
    assert (reverify("[1", record, keys_body) or "").startswith(
        "the stored card cannot be read (JSONDecodeError: "
    )


# --- keys -----------------------------------------------------------------------------------------


def test_a_key_set_over_its_bound_is_refused_and_one_at_it_is_read() -> None:
    body = jwks(public(ec_key()))
    exact = parse_keys(body, source="url", url=KEYS_URL, card_url=URL, max_bytes=len(body))
    assert len(exact.keys) == 1
    refused = refusal(
        parse_keys, body, source="url", url=KEYS_URL, card_url=URL, max_bytes=len(body) - 1
    )
    assert refused.detail == f"keys at {KEYS_URL}: {len(body)} bytes, over {len(body) - 1}"
    padded = body[:-1] + b" " * (1_048_577 - len(body)) + body[-1:]
    assert len(padded) == 1_048_577
    default = refusal(parse_keys, padded, source="url", url=KEYS_URL, card_url=URL)
    assert default.detail == f"keys at {KEYS_URL}: 1048577 bytes, over 1048576"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"[", "not JSON (body is not JSON (Expecting value at line 1))"),
        (b"[1]", "not a JWK set (no keys list)"),
        (jwks({"kty": "oct", "k": "AAAA"}), "no public signing key (EC, RSA or OKP)"),
    ],
)
def test_a_key_set_that_is_not_one_is_refused_naming_the_card_and_the_keys(
    body: bytes, detail: str
) -> None:
    refused = refusal(parse_keys, body, source="url", url=KEYS_URL, card_url=URL)
    assert refused.detail == f"keys at {KEYS_URL}: {detail}"


def test_a_key_set_nested_past_its_depth_is_refused() -> None:
    nested: object = 1
    for _ in range(13):
        nested = [nested]
    member = public(ec_key(), ext=nested)
    assert len(key_set(member).keys) == 1
    refused = refusal(
        parse_keys, jwks(public(ec_key(), ext=[nested])), source="url", url=KEYS_URL, card_url=URL
    )
    where = "keys[0].ext" + "[0]" * 13
    assert refused.detail == f"keys at {KEYS_URL}: not JSON ({where}: nested deeper than 16 levels)"


def test_the_same_key_listed_under_two_kids_is_read_as_both() -> None:
    """Its thumbprint, which orders the set, is the same twice: nothing else is compared."""
    member = public(ec_key("a"))
    kept = key_set(member, {**member, "kid": "b"})
    assert kept.kids == ("a", "b")
    assert len({key.thumbprint() for key in kept.keys}) == 1


@pytest.mark.parametrize(
    "key",
    [
        ECKey.generate_key("P-256", parameters={"kid": "e"}),
        OKPKey.generate_key("Ed25519", parameters={"kid": "o"}),
        RSAKey.generate_key(2048, parameters={"kid": "r"}),
    ],
)
def test_a_private_jwk_is_read_as_its_public_key_only(key: Key) -> None:
    private = key.as_dict(private=True)
    if isinstance(key, RSAKey):
        private["oth"] = [{"r": "AQ", "d": "AQ", "t": "AQ"}]  # multi-prime: never kept either
    (read,) = key_set(private).keys
    assert not read.is_private
    members = set(read.as_dict(private=False)) | set(json.loads(key_set(private).body)["keys"][0])
    assert not members & {"d", "p", "q", "dp", "dq", "qi", "oth"}
    assert set(read.dict_value) & {"d", "p", "q", "dp", "dq", "qi", "oth"} == set()


def test_signing_keys_marked_for_signatures_and_ed448_keys_are_kept() -> None:
    kept = key_set(
        public(ec_key("s"), use="sig"),
        public(OKPKey.generate_key("Ed448", parameters={"kid": "o"})),
    )
    assert kept.kids == ("o", "s")


def test_a_key_file_over_its_bound_is_refused_after_one_byte_more(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    body = jwks(public(ec_key()))
    path.write_bytes(body + b" " * 100)
    refused = refusal(read_key_file, str(path), URL, len(body))
    assert refused.detail == (
        f"keys at {path.resolve().as_uri()}: {len(body) + 1} bytes, over {len(body)}"
    )
    assert len(read_key_file(str(path), URL, len(body) + 100).keys) == 1


# --- the policy -----------------------------------------------------------------------------------


def test_an_empty_keys_value_is_a_usage_error_saying_so() -> None:
    with pytest.raises(UsageError) as refused:
        SignaturePolicy(REQUIRE, keys=" ")
    assert str(refused.value) == "card signature keys: an empty path or URL"


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://agent.example:80/card", "http://agent.example"),
        ("https://agent.example:443/card", "https://agent.example"),
        ("http://agent.example:81/card", "http://agent.example:81"),
        ("http://[::1]:8080/card", "http://[::1]:8080"),
        ("HTTPS://Agent.Example/card", "https://agent.example"),
    ],
)
def test_an_origin_is_lower_case_without_its_default_port(url: str, origin: str) -> None:
    assert origin_of(url) == origin


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://agent.example/", "'ftp://agent.example/' is not an http(s) URL"),
        ("http://a:port/", "'http://a:port/' is not a URL"),
    ],
)
def test_what_is_not_an_origin_says_so(url: str, message: str) -> None:
    with pytest.raises(ValueError, match="URL") as refused:
        origin_of(url)
    assert str(refused.value) == message


def test_policies_made_in_python_name_no_file_unless_given_one() -> None:
    assert CardSignatures.of({}).source == ""
    assert CardSignatures.of({}, source="here.toml").source == "here.toml"


def test_a_policy_file_without_agents_lists_none_and_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "signatures.toml"
    path.write_text("")
    loaded = load_card_signatures(path)
    assert loaded.agents == ()
    assert loaded.source == str(path)


def test_a_policy_files_http_keys_url_is_kept_as_a_url(tmp_path: Path) -> None:
    path = tmp_path / "signatures.toml"
    path.write_text(
        '[agents."https://a.example"]\npolicy = "require"\nkeys = "http://a.example/keys.json"\n'
    )
    assert load_card_signatures(path).policy("https://a.example").keys == (
        "http://a.example/keys.json"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[agents]\n"https://a.example" = 1\n', 'agents."https://a.example"]: must be a table'),
        (
            '[agents."https://a.example"]\npolicy = "require"\nzz = 1\nyy = 2\n',
            'agents."https://a.example"]: unknown key(s) yy, zz',
        ),
        (
            '[agents."https://a.example"]\njku = true\n',
            'agents."https://a.example"]: policy is required: require, prefer, ignore',
        ),
    ],
)
def test_a_policy_files_refusals_name_the_file_and_the_agent(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "signatures.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as refused:
        load_card_signatures(path)
    assert str(refused.value) == f"card signatures {path} [{message}"


def test_a_policy_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(UsageError) as refused:
        load_card_signatures(path)
    assert str(refused.value) == (
        f"card signatures {path}: cannot be read (No such file or directory)"
    )


# --------------------------------------------------------------------------------------------------
# Signed cards, the pure part (engine/cards/keys.py, signature_policy.py, signatures.py): keys,
# entries, verification, the policy file, a2a-sdk's view of a card, and the audit's check. No
# network.


def key_set_of(*keys: Key, source: str = "file") -> CardKeys:
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
    assert checked(sign_card(CARD, key, alg=alg), key_set_of(key)) == FORM_RFC8785


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
    assert checked(signed, key_set_of(key)) == (
        "refused: signature 0 (kid 'k1', ES256) does not verify: the card was altered after it "
        "was signed, or signed with another key"
    )


def test_a_signature_by_another_key_under_a_known_kid_is_refused() -> None:
    signed = sign_card(CARD, ec_key("k1"))
    assert checked(signed, key_set_of(ec_key("k1"))).startswith(
        "refused: signature 0 (kid 'k1', ES256) does not verify"
    )


def test_a_kid_the_key_set_lacks_is_refused_naming_the_kids_it_has() -> None:
    signed = sign_card(CARD, ec_key("other"))
    assert checked(signed, key_set_of(ec_key("k1"), ec_key("k2"))) == (
        "refused: signature 0 (kid 'other', ES256): kid 'other' is not in the key set "
        "(kids: k1, k2)"
    )


def test_a_named_key_that_does_not_fit_the_algorithm_refuses_the_card() -> None:
    """No algorithm confusion: the key named is used with its own algorithm or not at all."""
    signed = sign_card(CARD, ec_key("k1"))
    p384 = ECKey.generate_key("P-384", parameters={"kid": "k1"})
    rsa = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    for wrong in (p384, rsa):
        assert checked(signed, key_set_of(wrong)) == (
            "refused: signature 0 (kid 'k1', ES256): the key 'k1' does not fit ES256"
        )
    unnamed = sign_card(CARD, ECKey.generate_key("P-256"), kid=None)
    assert checked(unnamed, key_set_of(rsa)) == (
        "refused: signature 0 (ES256): no key of the set does fit ES256"
    )


def test_while_keys_rotate_one_good_signature_is_enough_and_an_unknown_kid_is_passed_over() -> None:
    old, new = ec_key("old"), ec_key("new")
    signed = sign_card(sign_card(CARD, old), new)
    assert checked(signed, key_set_of(new)) == FORM_RFC8785
    assert checked(signed, key_set_of(old)) == FORM_RFC8785


def test_one_bad_signature_refuses_the_card_even_beside_a_good_one() -> None:
    good, forged = ec_key("good"), ec_key("forged")
    signed = sign_card(CARD, good)
    signed["signatures"].append(sign_card(CARD, forged, kid="good")["signatures"][0])
    assert checked(signed, key_set_of(good)).startswith("refused: signature 1 (kid 'good', ES256)")


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
    assert checked(forged, key_set_of(key)) == (
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
    keys = key_set_of(key)
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
    signing, rsa = (
        ec_key("sig"),
        RSAKey.generate_key(2048, parameters={"kid": "rsa"}),
    )
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
    one = key_set_of(a, b)
    other = parse_keys(
        json.dumps({"keys": [b.as_dict(private=False) | {"x5u": "https://meta"},
                             a.as_dict(private=False)]}).encode(),
        source="jku", url="elsewhere", card_url=URL,
    )  # fmt: skip
    assert one.key_set == other.key_set
    assert key_set_of(a).key_set != one.key_set
    assert key_set_of(a).key_set == key_set_of(a).key_set


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
    assert checked(served, key_set_of(key)) == FORM_A2A_SDK


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
    assert checked(served, key_set_of(key)) == (
        "refused: signature 0 (kid 'k1', ES256) covers only a2a-sdk's view of the card, which "
        "leaves out what cardfence decides on (securityRequirements, contract)"
    )


def test_a_view_that_is_no_card_covers_nothing() -> None:
    assert uncovered(parse_card(json.dumps(CARD).encode()), b"{}") == ("the whole card",)


# -- the audit's check -----------------------------------------------------------------------------


def test_reverify_holds_for_the_recorded_read_and_fails_for_an_altered_snapshot() -> None:
    key = ec_key()
    signed = sign_card(CARD, key)
    keys = key_set_of(key)
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
    assert reverify(body, record, key_set_of(ec_key()).body) is not None
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
