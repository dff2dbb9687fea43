"""Which of an Agent Card's interfaces cardfence talks to. Pure: no I/O.

:func:`select_interface` chooses, among a card's interfaces, one that cardfence speaks
(:mod:`.spoken`) and may use (:mod:`.urls`). The card and its parsing are :mod:`.model`.
"""

from __future__ import annotations

from collections.abc import Sequence

from cardfence.engine.cards.model import AgentCard, Interface
from cardfence.engine.cards.spoken import BINDING_ALIASES, SPOKEN_BINDINGS, V10
from cardfence.engine.cards.urls import url_refusal
from cardfence.engine.errors import CardInvalidError, ProtocolUnsupportedError

__all__ = ["select_interface"]


def select_interface(
    card: AgentCard, prefer: Sequence[str] = (), *, allow_insecure: bool = False
) -> Interface:
    """Choose the endpoint to talk to.

    Among interfaces we speak (JSON-RPC or HTTP+JSON over http(s), A2A 1.x, 0.3 or 0.2:
    :func:`spoken_version`) and may use (:func:`url_refusal`: plain ``http`` only to loopback
    unless ``allow_insecure``), 1.x protocol versions come first (we send ``A2A-Version: 1.0``),
    then an interface that declares none (1.0 is meant), then 0.3 and 0.2; within each, the
    caller's ``prefer`` order of bindings (a preference: unlisted bindings still qualify after
    the listed ones), then the card's order, which is the agent's preference.

    Raises:
        ValueError: ``prefer`` names a binding we do not speak.
        CardInvalidError: no interface is speakable (field ``supportedInterfaces``), or none of
            them may be used (kind ``insecure``).
        ProtocolUnsupportedError: (a :class:`CardInvalidError`, kind ``unsupported_protocol``)
            some interface has a binding we speak, but none an A2A version we speak.
    """
    rank: dict[str, int] = {}
    for name in prefer:
        binding = BINDING_ALIASES.get(name.upper())
        if binding is None:
            raise ValueError(f"cannot prefer binding {name!r}: we speak {SPOKEN_BINDINGS}")
        rank.setdefault(binding, len(rank))
    bound = [
        (n, i)
        for n, i in enumerate(card.interfaces)
        if i.binding in SPOKEN_BINDINGS and i.url.lower().startswith(("http://", "https://"))
    ]
    speakable = [
        (_version_rank(i), rank.get(i.binding, len(rank)), n, i) for n, i in bound if i.speaks
    ]
    if bound and not speakable:
        versions = tuple(dict.fromkeys(i.protocol_version for _, i in bound))
        raise ProtocolUnsupportedError(card.source_url, versions)
    if not speakable:
        offered = ", ".join(f"{i.binding or '?'} {i.url}" for i in card.interfaces)
        raise CardInvalidError(
            card.source_url,
            f"invalid Agent Card: supportedInterfaces: none we speak ({offered})",
            field="supportedInterfaces",
        )
    refused = [(i, url_refusal(i.url, allow_insecure=allow_insecure)) for *_, i in speakable]
    usable = [entry for entry, (_, why) in zip(speakable, refused, strict=True) if why is None]
    if not usable:
        named = "; ".join(f"{i.binding} {i.url}: {why}" for i, why in refused[:3])
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise CardInvalidError(
            card.source_url,
            f"no interface may be used: {named}{more}",
            field="supportedInterfaces",
            kind="insecure",
        )
    return min(usable, key=lambda entry: entry[:3])[3]


def _version_rank(interface: Interface) -> int:
    """1.x first, then an interface that declares no version (1.0 is meant), then 0.x."""
    if interface.speaks == V10:
        return 0 if interface.protocol_version.strip() else 1
    return 2
