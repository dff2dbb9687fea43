"""Signed Agent Cards, the files: the card signatures file and the JWKS key files it names.

:func:`load_card_signatures` reads the TOML file docs/cli.md describes ("Signed cards") into the
policy of each agent origin (:class:`~cardfence.engine.cards.signature_policy.CardSignatures`);
:func:`read_key_file` reads a key set a policy names by file path
(:class:`~cardfence.engine.cards.keys.CardKeys`). The cards wing stays pure: what it is given
is read here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Final

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.signature_policy import POLICIES, CardSignatures, SignaturePolicy
from cardfence.engine.errors import CardSignatureError, UsageError

__all__ = ["load_card_signatures", "read_key_file"]

_TABLE_KEYS: Final = frozenset({"policy", "keys", "jku", "accept_key_change"})


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
        extra = sorted(set(table) - _TABLE_KEYS)
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


def read_key_file(path: str, card_url: str, max_bytes: int) -> CardKeys:
    """The key set in the JWKS file at ``path`` (at most ``max_bytes`` read)."""
    try:
        with open(path, "rb") as handle:
            body = handle.read(max_bytes + 1)
    except OSError as error:
        raise CardSignatureError(
            card_url, f"keys file {path} cannot be read ({error.strerror})"
        ) from None
    url = Path(path).resolve().as_uri()
    return parse_keys(body, source="file", url=url, card_url=card_url, max_bytes=max_bytes)
