"""Signed Agent Cards, the policy: whose card signatures are checked, and how strictly.

Signed cards serve R14 (a signature covers exactly the bytes a card's revision hashes); the
policy says, per agent origin, what a card read does with them (docs/rules.md, R14, "Signed
cards"). What is here:

- :class:`SignaturePolicy`: ``require``, ``prefer`` or ``ignore``, where the agent's keys are (a
  JWKS file or an http(s) URL), whether the protected header's ``jku`` may name them, and whether
  a key set other than the pinned one is accepted;
- :class:`CardSignatures`: the policy of each agent origin (:func:`origin_of`), given to the card
  reads as ``CardLimits(signatures=...)``; from Python (:meth:`CardSignatures.of`), or from the
  TOML file docs/cli.md describes (:func:`load_card_signatures`).

Pure but for :func:`load_card_signatures`, which reads the file. The keys a policy names are read
and parsed by :mod:`.keys`; the signatures are checked by :mod:`.signatures`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from cardfence.engine.errors import UsageError

__all__ = [
    "IGNORE",
    "IGNORED",
    "POLICIES",
    "PREFER",
    "REQUIRE",
    "CardSignatures",
    "SignaturePolicy",
    "load_card_signatures",
    "origin_of",
]

REQUIRE: Final = "require"
PREFER: Final = "prefer"
IGNORE: Final = "ignore"
POLICIES: Final = (REQUIRE, PREFER, IGNORE)

_POLICY_KEYS: Final = frozenset({"policy", "keys", "jku", "accept_key_change"})


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


def origin_of(url: str) -> str:
    """``scheme://host[:port]``, lower-case, the default port left out (as cards are keyed).

    Raises ``ValueError`` when ``url`` is not an http(s) URL with a host.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ValueError(f"{url!r} is not a URL") from error
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http(s) URL")
    default = {"http": 80, "https": 443}[parsed.scheme]
    port = parsed.port or default
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{parsed.scheme}://{host}" + ("" if port == default else f":{port}")


@dataclass(frozen=True, slots=True)
class CardSignatures:
    """The signature policy of each agent origin; agents not listed are ``ignore``.

    Build it with :meth:`of` (``{origin: SignaturePolicy or policy name}``) or
    :func:`load_card_signatures`; give it to the card reads as ``CardLimits(signatures=...)``.
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


def load_card_signatures(path: Path) -> CardSignatures:
    """Read the card signatures file (docs/cli.md, "Signed cards"): TOML, one table per agent
    origin, ``[agents."ORIGIN"]`` with ``policy`` and optional ``keys``, ``jku``,
    ``accept_key_change``. A relative ``keys`` path is taken from the file's folder. Anything
    malformed is a :class:`UsageError` naming the origin and the key."""
    where = str(path)
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise UsageError(f"card signatures {where}: cannot be read ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"card signatures {where}: not valid TOML: {error}") from None
    unknown = sorted(set(document) - {"agents"})
    agents = document.get("agents", {})
    if unknown or not isinstance(agents, dict):
        raise UsageError(f'card signatures {where}: expected only [agents."ORIGIN"] tables')
    policies: dict[str, SignaturePolicy] = {}
    for origin, table in agents.items():
        entry = f'card signatures {where} [agents."{origin}"]'
        if not isinstance(table, dict):
            raise UsageError(f"{entry}: must be a table")
        extra = sorted(set(table) - _POLICY_KEYS)
        if extra:
            raise UsageError(f"{entry}: unknown key(s) {', '.join(extra)}")
        policy, keys = table.get("policy"), table.get("keys")
        jku, accept = table.get("jku", False), table.get("accept_key_change", False)
        if not isinstance(policy, str):
            raise UsageError(f"{entry}: policy is required: {', '.join(POLICIES)}")
        if keys is not None and not isinstance(keys, str):
            raise UsageError(f"{entry}: keys must be a file path or an http(s) URL")
        if not isinstance(jku, bool) or not isinstance(accept, bool):
            raise UsageError(f"{entry}: jku and accept_key_change must be true or false")
        if keys is not None and not keys.lower().startswith(("https://", "http://")):
            keys = str((path.parent / keys).resolve())
        try:
            policies[origin] = SignaturePolicy(policy, keys, jku, accept)
        except UsageError as error:
            raise UsageError(f"{entry}: {error}") from None
    return CardSignatures.of(policies, source=where)
