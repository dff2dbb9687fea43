"""Signed Agent Cards: the JWS signatures of a card, checked before the card is used or stored.

A card's ``signatures`` member holds JWS entries ``{"protected", "signature"[, "header"]}`` with
detached content (RFC 7515 appendix F): the payload is the RFC 8785 canonical JSON of the card
without ``signatures``, which is exactly :meth:`AgentCard.canonical_bytes`, the bytes the card's
revision hashes (R14). So a verified signature covers everything the revision covers, and a card's
revision is the same signed or not.

What is here (pure: the policy per agent origin is :mod:`.signature_policy`, the key sets and the
key file :mod:`.keys`):

- :func:`entries` and :func:`verify`: each signature's protected header read and checked
  (``none`` and HMAC algorithms are refused: a shared secret says nothing about who signed),
  then verified with :mod:`joserfc`;
- :func:`sdk_form`: a2a-sdk 1.3's signer signs the canonical JSON of its protobuf view of the
  card (defaults and empty values dropped, fields its schema lacks dropped), which differs from
  the served JSON for some cards. A signature that verifies only over that view is accepted only
  when the card read from the view decides everything as the served card does
  (:func:`uncovered` is empty), so the signature still covers what cardfence decides on;
- :func:`apply_policy`: an agent's ``require`` or ``prefer`` applied to a card read, and
  :class:`SignatureCheck`, what its ``CardFetched`` records;
- :func:`sign_card`, which signs a card the way :func:`verify` checks it, and
  :func:`reverify` (the audit's check of a recorded read).
"""

from __future__ import annotations

import base64
import binascii
import copy
import importlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from joserfc.errors import JoseError
from joserfc.jwk import Key
from joserfc.jws import JWSRegistry

from cardfence.engine.cards.canonical import canonical, loads
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.cards.signature_policy import (
    REQUIRE,
    SignaturePolicy,
)
from cardfence.engine.errors import CardInvalidError, CardSignatureError

__all__ = [
    "ALGORITHMS",
    "FORM_A2A_SDK",
    "FORM_RFC8785",
    "Entry",
    "SignatureCheck",
    "Verified",
    "apply_policy",
    "entries",
    "reverify",
    "sdk_form",
    "sign_card",
    "uncovered",
    "verify",
]

# Asymmetric algorithms only: whoever verifies an HMAC holds the key that makes it.
ALGORITHMS: Final = frozenset(
    {
        "ES256", "ES384", "ES512",
        "RS256", "RS384", "RS512",
        "PS256", "PS384", "PS512",
        "EdDSA", "Ed25519",
    }
)  # fmt: skip
# The key each algorithm verifies with: its type and, for EC and OKP, the curves.
_KEY_FOR: Final[Mapping[str, tuple[str, frozenset[str]]]] = {
    **{f"ES{n}": ("EC", frozenset({f"P-{521 if n == 512 else n}"})) for n in (256, 384, 512)},
    **{f"{kind}{n}": ("RSA", frozenset()) for kind in ("RS", "PS") for n in (256, 384, 512)},
    "EdDSA": ("OKP", frozenset({"Ed25519", "Ed448"})),
    "Ed25519": ("OKP", frozenset({"Ed25519"})),
}
FORM_RFC8785: Final = "rfc8785"  # the served card's canonical JSON: what the revision hashes
FORM_A2A_SDK: Final = "a2a-sdk"  # a2a-sdk's protobuf view of it (see sdk_form)

_MAX_SIGNATURES: Final = 16
_MAX_PROTECTED: Final = 4096  # characters of one base64url protected header
_MAX_SIGNATURE: Final = 2048  # characters of one base64url signature (RSA 8192 is 1366)
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


# --- the signatures -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of ``signatures``, its protected header read and its algorithm accepted."""

    index: int
    protected: str  # base64url, as written: it is signed as written
    signature: bytes
    alg: str
    kid: str | None
    jku: str | None  # from the protected header only: an unprotected one could be anyone's

    @property
    def name(self) -> str:
        kid = f"kid {self.kid!r}, " if self.kid is not None else ""
        return f"signature {self.index} ({kid}{self.alg})"


def entries(card: AgentCard, card_url: str) -> tuple[Entry, ...]:
    """The card's signatures; ``()`` when it has none. Raises :class:`CardSignatureError` for
    a malformed entry, an algorithm refused (``none``, HMAC, one not in :data:`ALGORITHMS`) or
    a ``crit`` header (none is understood here)."""
    raw = card.to_json().get("signatures")
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise CardSignatureError(card_url, "signatures: must be a list of JWS objects")
    if len(raw) > _MAX_SIGNATURES:
        raise CardSignatureError(card_url, f"signatures: more than {_MAX_SIGNATURES} entries")
    return tuple(_entry(index, item, card_url) for index, item in enumerate(raw))


def _entry(index: int, item: object, card_url: str) -> Entry:
    at = f"signature {index}"
    if not isinstance(item, dict):
        raise CardSignatureError(card_url, f"{at}: must be an object")
    protected, signature = item.get("protected"), item.get("signature")
    unprotected = item.get("header", {})
    if not isinstance(protected, str) or not protected or len(protected) > _MAX_PROTECTED:
        raise CardSignatureError(card_url, f"{at}: protected must be a base64url header")
    if not isinstance(signature, str) or not signature or len(signature) > _MAX_SIGNATURE:
        raise CardSignatureError(card_url, f"{at}: signature must be a base64url string")
    if not isinstance(unprotected, dict | None):
        raise CardSignatureError(card_url, f"{at}: header must be an object")
    try:
        header = loads(_b64decode(protected))  # RFC 7515 §4: a repeated header name is refused
        signed = _b64decode(signature)
    except FieldError as exc:
        raise CardSignatureError(card_url, f"{at}: protected header: {exc}") from None
    except ValueError:
        raise CardSignatureError(card_url, f"{at}: not base64url JSON") from None
    if not isinstance(header, dict):
        raise CardSignatureError(card_url, f"{at}: the protected header is not a JSON object")
    alg = header.get("alg")
    if not isinstance(alg, str) or not alg:
        raise CardSignatureError(card_url, f"{at}: the protected header names no alg")
    if alg.lower() == "none":
        raise CardSignatureError(card_url, f"{at}: alg none (an unsigned JWS) is refused")
    if alg.upper().startswith("HS"):
        raise CardSignatureError(
            card_url, f"{at}: alg {alg} (HMAC) is refused: a shared secret proves no signer"
        )
    if alg not in ALGORITHMS or alg not in JWSRegistry.algorithms:
        raise CardSignatureError(
            card_url, f"{at}: alg {alg} is not accepted ({', '.join(sorted(ALGORITHMS))})"
        )
    if "crit" in header:
        raise CardSignatureError(card_url, f"{at}: crit header parameters are not supported")
    kid = header.get("kid", (unprotected or {}).get("kid"))
    jku = header.get("jku")
    if kid is not None and not isinstance(kid, str):
        raise CardSignatureError(card_url, f"{at}: kid must be a string")
    if jku is not None and not isinstance(jku, str):
        raise CardSignatureError(card_url, f"{at}: jku must be a URL")
    return Entry(index, protected, signed, alg, kid, jku or None)


def _b64decode(text: str) -> bytes:
    if not _B64URL.fullmatch(text):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as error:
        raise ValueError(str(error)) from None


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class _Algorithm(Protocol):
    """What is used of a joserfc JWS algorithm (its model class moved between versions)."""

    def sign(self, msg: bytes, key: Any) -> bytes: ...

    def verify(self, msg: bytes, sig: bytes, key: Any) -> bool: ...


def _algorithm(name: str) -> _Algorithm:
    # The registry's table itself: ``get_alg`` warns on EdDSA (RFC 9864 names it Ed25519 now).
    found: _Algorithm | None = JWSRegistry.algorithms.get(name)
    if found is None:
        raise ValueError(f"alg {name} is not supported by the installed joserfc")
    return found


def _fits(key: Key, alg: str) -> bool:
    """Whether ``key`` may verify ``alg``: its type and curve, and the JWK's own ``use`` and
    ``alg`` when it states them."""
    kty, curves = _KEY_FOR[alg]
    if key.key_type != kty or key.get("use") not in (None, "sig"):
        return False
    if key.get("alg") not in (None, alg):
        return False
    return not curves or str(key.get("crv")) in curves


def _candidates(keys: CardKeys, entry: Entry) -> list[Key]:
    return [
        key
        for key in keys.keys
        if (entry.kid is None or key.kid == entry.kid) and _fits(key, entry.alg)
    ]


def _verifies(entry: Entry, payload: bytes, key: Key) -> bool:
    signing_input = f"{entry.protected}.{_b64encode(payload)}".encode("ascii")
    try:
        return bool(_algorithm(entry.alg).verify(signing_input, entry.signature, key))
    except (JoseError, ValueError, TypeError):
        return False


@dataclass(frozen=True, slots=True)
class Verified:
    """The signature that verified: its place, key id, algorithm, and the form it covers."""

    index: int
    kid: str | None
    alg: str
    form: str


def verify(card: AgentCard, found: Sequence[Entry], keys: CardKeys, card_url: str) -> Verified:
    """Check ``found`` (the card's :func:`entries`, not empty) against ``keys``.

    The card verifies when one signature verifies and none is bad: a signature whose key is
    in the set but which does not verify refuses the card (it was altered, or signed by someone
    else), while one whose ``kid`` the set lacks is passed over (a key being rotated in or out).
    A signature over a2a-sdk's view of the card counts only as :func:`uncovered` allows.
    Raises :class:`CardSignatureError` with the first reason.
    """
    verified: Verified | None = None
    unknown: list[str] = []
    bad: list[Entry] = []
    payload = card.canonical_bytes()
    for entry in found:
        if entry.kid is not None and all(key.kid != entry.kid for key in keys.keys):
            unknown.append(f"{entry.name}: kid {entry.kid!r} is not in the key set {_kids(keys)}")
            continue
        candidates = _candidates(keys, entry)
        if not candidates:  # named, but not a key for this algorithm: never tried with another
            named = f"the key {entry.kid!r} does not" if entry.kid else "no key of the set does"
            raise CardSignatureError(card_url, f"{entry.name}: {named} fit {entry.alg}")
        if any(_verifies(entry, payload, key) for key in candidates):
            verified = verified or Verified(entry.index, entry.kid, entry.alg, FORM_RFC8785)
        else:
            bad.append(entry)
    if bad:
        sdk = _sdk_verified(card, bad, keys, card_url)
        verified = verified or sdk
    if verified is not None:
        return verified
    raise CardSignatureError(card_url, unknown[0] if unknown else "the card is not signed")


def _sdk_verified(card: AgentCard, bad: Sequence[Entry], keys: CardKeys, card_url: str) -> Verified:
    """Each of ``bad`` (not empty) verified over a2a-sdk's view of the card, or the card is
    refused."""
    view = sdk_form(card.to_json())
    for entry in bad:
        if view is None or not any(_verifies(entry, view, k) for k in _candidates(keys, entry)):
            raise CardSignatureError(
                card_url,
                f"{entry.name} does not verify: the card was altered after it was signed, or "
                "signed with another key",
            )
    first = bad[0]
    assert view is not None
    missing = uncovered(card, view)
    if missing:
        raise CardSignatureError(
            card_url,
            f"{first.name} covers only a2a-sdk's view of the card, which leaves out what "
            f"cardfence decides on ({', '.join(missing)})",
        )
    return Verified(first.index, first.kid, first.alg, FORM_A2A_SDK)


def _kids(keys: CardKeys) -> str:
    return "(kids: " + (", ".join(keys.kids) or "none") + ")"


# --- a2a-sdk's view of a card ---------------------------------------------------------------------


def sdk_form(document: Mapping[str, Any]) -> bytes | None:
    """The bytes a2a-sdk 1.3 signs and verifies for the served card ``document``: its client's
    reading of the JSON into the protobuf ``AgentCard`` (0.3 fields mapped, fields the schema
    lacks dropped), ``MessageToDict``, ``signatures`` removed, empty strings, lists and objects
    removed, RFC 8785. None when a2a-sdk is not installed or cannot read the card."""
    try:  # optional: a2a-sdk comes with the demo and dev extras, not with cardfence itself
        resolver = importlib.import_module("a2a.client.card_resolver")
        json_format = importlib.import_module("google.protobuf.json_format")
    except ImportError:
        return None
    try:
        message = resolver.parse_agent_card(copy.deepcopy(dict(document)))
        view = json_format.MessageToDict(message)
        view.pop("signatures", None)
        return canonical(_without_empty(view) or {}, "")
    except Exception:  # a foreign parser on untrusted JSON: any failure means "no view"
        return None


def _without_empty(value: Any) -> Any:
    """a2a-sdk's ``_clean_empty``: None for "", [] and {} (after cleaning), recursively."""
    if isinstance(value, dict):
        kept = {k: c for k, v in value.items() if (c := _without_empty(v)) is not None}
        return kept or None
    if isinstance(value, list):
        items = [c for v in value if (c := _without_empty(v)) is not None]
        return items or None
    if isinstance(value, str) and not value:
        return None
    return value


def _decisions(card: AgentCard) -> dict[str, Any]:
    """What cardfence decides on from a card (R2-R4, R9, R15): descriptive fields left out."""
    return {
        "supportedInterfaces": card.interfaces,
        "capabilities": card.capabilities,
        "defaultModes": (card.default_input_modes, card.default_output_modes),
        "securityRequirements": card.security_requirements,
        "securitySchemes": card.security_schemes(),
        "contract": card.contract,
        "skills": tuple(
            (s.id, s.input_modes, s.output_modes, s.security_requirements, s.compatibility_hash)
            for s in card.skills
        ),
    }


def uncovered(card: AgentCard, view: bytes) -> tuple[str, ...]:
    """The parts of ``card`` that cardfence decides on and the card read from ``view`` (the
    bytes a signature covers) does not say alike: the parts the signature does not cover.
    Empty when the view decides everything as the card does."""
    try:
        covered = parse_card(view, max_bytes=1 << 30)
    except CardInvalidError:  # the view is no card: nothing is covered
        return ("the whole card",)
    served, signed = _decisions(card), _decisions(covered)
    return tuple(name for name in served if served[name] != signed[name])


# --- recording ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What a card read's signature check found, recorded in its ``CardFetched`` (``signature``)."""

    policy: str
    signatures: tuple[Any, ...] = ()  # the raw entries, as received
    verified: Verified | None = None
    keys: CardKeys | None = None

    @property
    def status(self) -> str:
        return "verified" if self.verified is not None else "unsigned"

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"policy": self.policy, "status": self.status}
        if self.verified is not None and self.keys is not None:
            record.update(
                form=self.verified.form,
                alg=self.verified.alg,
                kid=self.verified.kid,
                index=self.verified.index,
                signatures=list(self.signatures),
                keys=self.keys.record(),
            )
        return record


def apply_policy(
    card: AgentCard, policy: SignaturePolicy, keys: CardKeys | None, card_url: str
) -> SignatureCheck:
    """``policy`` (``require`` or ``prefer``) applied to ``card``, its signatures checked
    against ``keys`` (None when it has none, or none could be found). Raises
    :class:`CardSignatureError`."""
    found = entries(card, card_url)
    if not found:
        if policy.policy == REQUIRE:
            raise CardSignatureError(card_url, "the card is not signed, and its agent's policy "
                                     "requires a signature")  # fmt: skip
        return SignatureCheck(policy.policy)
    if keys is None:
        raise CardSignatureError(card_url, "no keys to verify the card's signatures with")
    verified = verify(card, found, keys, card_url)
    raw = card.to_json()["signatures"]
    return SignatureCheck(policy.policy, tuple(raw), verified, keys)


def reverify(card_body: str, record: Mapping[str, Any], keys_body: str) -> str | None:
    """Why the recorded signature check ``record`` (a ``CardFetched``'s ``signature``) does not
    hold over the stored card ``card_body`` and key set ``keys_body`` any more; None when it
    does. The audit's check: no network."""
    try:
        document = json.loads(card_body)
        if not isinstance(document, dict):
            return "the stored card is not a JSON object"
        document["signatures"] = record.get("signatures")
        card = parse_card(json.dumps(document).encode(), max_bytes=1 << 30)
        keys_url = str((record.get("keys") or {}).get("url", ""))
        keys = parse_keys(
            keys_body.encode(), source="stored", url=keys_url, card_url="", max_bytes=1 << 30
        )
        found = entries(card, "")
        if not found:
            return "the recorded signatures are missing"
        verify(card, found, keys, "")
    except CardSignatureError as refused:
        return refused.detail
    except Exception as error:  # a stored body that no longer parses is the finding
        return f"the stored card cannot be read ({type(error).__name__}: {error})"
    return None


# --- signing --------------------------------------------------------------------------------------


def sign_card(
    document: Mapping[str, Any],
    key: Key,
    *,
    alg: str = "ES256",
    kid: str | None = None,
    jku: str | None = None,
    header: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A copy of the card ``document`` with one more signature: a JWS with detached content over
    the RFC 8785 JSON of the card without ``signatures`` (what :func:`verify` checks, and what
    a2a-sdk's verifier checks for a card it reads unchanged). ``key`` is a private
    :mod:`joserfc` key; ``kid`` defaults to the key's own."""
    if alg not in ALGORITHMS:
        raise ValueError(f"alg {alg} is not accepted for cards ({', '.join(sorted(ALGORITHMS))})")
    algorithm = _algorithm(alg)
    if not _fits(key, alg) or not key.is_private:
        raise ValueError(f"alg {alg} needs a private {_KEY_FOR[alg][0]} key that fits it")
    signed = copy.deepcopy(dict(document))
    present = signed.pop("signatures", None) or []
    card = parse_card(json.dumps(signed).encode(), max_bytes=1 << 30)
    protected: dict[str, Any] = {"alg": alg, "typ": "JOSE"}
    if kid or key.kid:
        protected["kid"] = kid or key.kid
    if jku:
        protected["jku"] = jku
    head = _b64encode(json.dumps(protected, separators=(",", ":")).encode())
    signing_input = f"{head}.{_b64encode(card.canonical_bytes())}".encode("ascii")
    entry: dict[str, Any] = {
        "protected": head,
        "signature": _b64encode(algorithm.sign(signing_input, key)),
    }
    if header:
        entry["header"] = dict(header)
    signed["signatures"] = [*present, entry]
    return signed
