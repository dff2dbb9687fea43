"""Signed Agent Cards, the keys: a JWKS read into the public keys a card's signatures are checked
with.

A card's key set is stored like a card and pinned on first use like the contract (R14, "Signed
cards"; R3), so what is kept of it is fixed here: :func:`parse_keys` keeps only the public keys
that can sign a card (EC, RSA of 2048 bits or more, Ed25519 and Ed448; never ``oct``, a ``use``
other than ``sig``, or a private member), and :class:`CardKeys` holds them with their canonical
JSON (what is stored, under its revision) and the hash that is pinned (the sorted RFC 7638
thumbprints of its keys).

Pure: a key file is read by :mod:`cardfence.engine.discovery.signature_files`, a key set on the
network through the card reads (:mod:`cardfence.engine.discovery._signed_reads`). The signatures
are checked by :mod:`.signatures`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from joserfc.errors import JoseError
from joserfc.jwk import ECKey, JWKRegistry, Key, OKPKey, RSAKey

from cardfence.engine.cards.canonical import canonical, decode
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.errors import CardSignatureError

__all__ = ["CardKeys", "parse_keys"]

_MAX_KEYS: Final = 64
_MIN_RSA_BITS: Final = 2048


@dataclass(frozen=True, slots=True)
class CardKeys:
    """A key set, as used to verify: its usable public keys, the canonical JSON of them (what is
    stored, under :attr:`revision`), and :attr:`key_set`, the hash that is pinned."""

    keys: tuple[Key, ...]
    body: str
    source: str  # "file", "url" or "jku"
    url: str
    key_set: str
    kids: tuple[str, ...]

    @property
    def revision(self) -> str:
        return hashlib.sha256(self.body.encode()).hexdigest()

    def record(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "url": self.url,
            "revision": self.revision,
            "key_set": self.key_set,
            "kids": list(self.kids),
        }


def parse_keys(
    body: bytes, *, source: str, url: str, card_url: str, max_bytes: int = 1_048_576
) -> CardKeys:
    """The public signing keys of a JWKS (``{"keys": [...]}``, or a single JWK).

    Keys that cannot sign a card are left out (``oct``, ``use`` other than ``sig``, RSA under
    2048 bits, unknown types); private members are never kept. Raises
    :class:`CardSignatureError` when the body is not a JWKS or holds no usable key.
    """
    where = f"keys at {url}"
    if len(body) > max_bytes:
        raise CardSignatureError(card_url, f"{where}: {len(body)} bytes, over {max_bytes}")
    try:
        document = decode(body, 16)
    except FieldError as error:
        raise CardSignatureError(card_url, f"{where}: not JSON ({error})") from None
    listed = document.get("keys") if isinstance(document, dict) else None
    if isinstance(document, dict) and "kty" in document:
        listed = [document]
    if not isinstance(listed, list):
        raise CardSignatureError(card_url, f"{where}: not a JWK set (no keys list)")
    usable: list[tuple[str, dict[str, Any], Key]] = []
    for jwk in listed[:_MAX_KEYS]:
        key = _public_key(jwk)
        if key is not None:
            public = dict(key.as_dict(private=False))
            usable.append((key.thumbprint(), public, key))
    if not usable:
        raise CardSignatureError(card_url, f"{where}: no public signing key (EC, RSA or OKP)")
    usable.sort(key=lambda item: item[0])
    thumbprints = [thumbprint for thumbprint, _, _ in usable]
    stored = canonical({"keys": [public for _, public, _ in usable]}, "keys").decode()
    return CardKeys(
        keys=tuple(key for _, _, key in usable),
        body=stored,
        source=source,
        url=url,
        key_set=hashlib.sha256(canonical(thumbprints, "keys")).hexdigest(),
        kids=tuple(sorted({key.kid for _, _, key in usable if key.kid})),
    )


def _public_key(jwk: object) -> Key | None:
    if not isinstance(jwk, dict) or jwk.get("kty") not in ("EC", "RSA", "OKP"):
        return None
    if jwk.get("use") not in (None, "sig"):
        return None
    public = {k: v for k, v in jwk.items() if k not in ("d", "p", "q", "dp", "dq", "qi", "oth")}
    try:
        key = JWKRegistry.import_key(public)
        if isinstance(key, RSAKey) and key.get_op_key("verify").key_size < _MIN_RSA_BITS:
            return None
        if isinstance(key, OKPKey) and key.get("crv") not in ("Ed25519", "Ed448"):
            return None  # X25519 and X448 agree on keys, they do not sign
    except (JoseError, ValueError, TypeError, KeyError):
        return None
    return key if isinstance(key, ECKey | RSAKey | OKPKey) else None
