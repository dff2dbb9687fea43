"""Signed Agent Cards, the policy: whose card signatures are checked, and how strictly.

Signed cards serve R14 (a signature covers exactly the bytes a card's revision hashes); the
policy says, per agent origin, what a card read does with them (docs/rules.md, R14, "Signed
cards"). What is here:

- :class:`SignaturePolicy`: ``require``, ``prefer`` or ``ignore``, where the agent's keys are (a
  JWKS file or an http(s) URL), whether the protected header's ``jku`` may name them, and whether
  a key set other than the pinned one is accepted;
- :class:`CardSignatures`: the policy of each agent origin
  (:func:`~cardfence.engine.cards.urls.origin_of`), given to the card reads as
  ``CardLimits(signatures=...)``; from Python (:meth:`CardSignatures.of`), or from the TOML file
  docs/cli.md describes (:func:`~cardfence.engine.discovery.signature_files.load_card_signatures`).

Pure: the files are read in :mod:`cardfence.engine.discovery.signature_files`. The keys a policy
names are parsed by :mod:`.keys`; the signatures are checked by :mod:`.signatures`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from cardfence.engine.cards.urls import origin_of
from cardfence.engine.errors import UsageError

__all__ = [
    "IGNORE",
    "IGNORED",
    "POLICIES",
    "PREFER",
    "REQUIRE",
    "CardSignatures",
    "SignaturePolicy",
]

REQUIRE: Final = "require"
PREFER: Final = "prefer"
IGNORE: Final = "ignore"
POLICIES: Final = (REQUIRE, PREFER, IGNORE)


@dataclass(frozen=True, slots=True)
class SignaturePolicy:
    """How one agent's card signatures are treated.

    ``policy``: ``require`` (an unsigned card, or one whose signatures do not verify, is refused),
    ``prefer`` (an unsigned card is used and recorded as unsigned; a signed one must verify) or
    ``ignore`` (nothing is checked or recorded). ``keys``: a JWKS file path or an http(s) URL
    (read within the card's bounds and stored like a card). ``jku``: without ``keys``, the key set
    the signature's protected header names by ``jku`` may be used, on the agent's own origin only.
    ``accept_key_change``: a key set other than the pinned one (or an unsigned card after one was
    pinned) is accepted and pinned instead of refused.
    """

    policy: str = IGNORE
    keys: str | None = None
    jku: bool = False
    accept_key_change: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise UsageError(
                f"card signature policy {self.policy!r}: expected one of {', '.join(POLICIES)}"
            )
        if self.keys is not None and not self.keys.strip():
            raise UsageError("card signature keys: an empty path or URL")

    @property
    def active(self) -> bool:
        return self.policy != IGNORE

    @property
    def keys_url(self) -> bool:
        """Whether ``keys`` is a URL (else a file path)."""
        return self.keys is not None and self.keys.lower().startswith(("https://", "http://"))


IGNORED: Final = SignaturePolicy()


@dataclass(frozen=True, slots=True)
class CardSignatures:
    """The signature policy of each agent origin; agents not listed are ``ignore``.

    Build it with :meth:`of` (``{origin: SignaturePolicy or policy name}``) or read it from a
    file (:func:`~cardfence.engine.discovery.signature_files.load_card_signatures`); give it to
    the card reads as ``CardLimits(signatures=...)``.
    """

    agents: tuple[tuple[str, SignaturePolicy], ...] = ()
    source: str = ""

    @classmethod
    def of(
        cls, policies: Mapping[str, SignaturePolicy | str], *, source: str = ""
    ) -> CardSignatures:
        found: dict[str, SignaturePolicy] = {}
        for written, policy in policies.items():
            try:
                origin = origin_of(written)
            except ValueError:
                raise UsageError(
                    f"card signatures: {written!r} is not an agent origin (https://host[:port])"
                ) from None
            if origin in found:
                raise UsageError(f"card signatures: origin {origin} is written twice")
            found[origin] = (
                policy if isinstance(policy, SignaturePolicy) else SignaturePolicy(policy)
            )
        return cls(tuple(sorted(found.items())), source)

    def policy(self, origin: str) -> SignaturePolicy:
        """The policy for the agent whose card is served from ``origin``."""
        for listed, policy in self.agents:
            if listed == origin:
                return policy
        return IGNORED
