"""Signed cards in a card read: which key set verifies a card, and which key set is pinned for
the agent (R14, "Signed cards"; pinned on first use as the contract is, R3).

:class:`SignedReads` is the layer of :class:`.discovery.Discovery` that applies an agent's
``require`` or ``prefer`` policy (:mod:`.signature_policy`) to a card just read, before anything
sees it. The card's signatures are checked (:mod:`.signatures`) with the key set the policy names:
a JWKS file (:mod:`.keys`), a URL, or the ``jku`` the signatures name when the policy allows it,
on the agent's origin only; a key set on the network is read as a card is (:mod:`.fetch`: R16's
bounds, https, same-origin redirects) and kept for ``max_card_age``. The key set a read was
verified with is then compared with the one pinned for the agent, the public card's and the
authenticated extended card's apart: first use pins, a change is refused unless the policy
accepts it.

I/O: key sets are read over HTTP or from a file; the pinned key set is read from the agent's
stream (in a store worker). The state is :class:`.discovery.Discovery`'s, set by its constructor.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import httpx

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import AgentCard
from cardfence.engine.cards.signature_policy import IGNORED, SignaturePolicy
from cardfence.engine.cards.signatures import SignatureCheck, apply_policy, entries
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import CardLimits, card_urls, fetch_card
from cardfence.engine.discovery.signature_files import read_key_file
from cardfence.engine.errors import CardSignatureError, DiscoveryError, UsageError
from cardfence.engine.http.offload import sized_work
from cardfence.engine.http.pool import RequestSlots
from cardfence.store.event_store import EventStore


class SignedReads:
    """The signed-card layer of card reads: key sets found, read and pinned per agent."""

    # Set by the constructor of :class:`.discovery.Discovery`.
    store: EventStore
    client: httpx.AsyncClient
    limits: CardLimits
    max_card_age: float
    slots: RequestSlots | None
    _clock: Callable[[], float]
    _key_sets: dict[str, tuple[CardKeys, float]]
    _pins: dict[tuple[str, bool], tuple[int, str | None]]
    _pins_lock: threading.Lock

    def signature_policy(self, origin: str) -> SignaturePolicy:
        """The signature policy for the agent at ``origin`` (``ignore`` unless configured)."""
        config = self.limits.signatures
        return IGNORED if config is None else config.policy(origin)

    async def _check_signatures(
        self, origin: str, policy: SignaturePolicy, card: AgentCard, url: str
    ) -> SignatureCheck | None:
        """The card's signatures under ``policy``, before the card is used or stored; None when
        the policy is ``ignore``. Raises :class:`CardSignatureError`."""
        if not policy.active:
            return None
        found = entries(card, url)
        keys = (
            await self._keys(origin, policy, {e.jku for e in found if e.jku}, url)
            if found
            else None
        )
        size = len(card.canonical_bytes())  # what is hashed, decoded and verified
        return await sized_work(size, apply_policy, card, policy, keys, url)

    async def _keys(
        self, origin: str, policy: SignaturePolicy, named: set[str], card_url: str
    ) -> CardKeys:
        """The key set the policy says to verify with: its ``keys`` (a file or a URL), else the
        one the signatures name by ``jku`` when the policy allows it, on the agent's origin."""
        if policy.keys is not None and not policy.keys_url:
            return read_key_file(policy.keys, card_url, self.limits.max_bytes)
        if policy.keys is not None:
            return await self._fetch_keys(policy.keys, "url", card_url)
        if not named:
            raise CardSignatureError(
                card_url, f"no keys to verify the card's signatures with: none are configured "
                f"for {origin}, and the signatures name no jku",
            )  # fmt: skip
        jku = min(named)
        if not policy.jku:
            raise CardSignatureError(
                card_url, f"the signature names its keys by jku {jku}, and jku is not allowed "
                f"for {origin}: configure keys, or allow jku",
            )  # fmt: skip
        if len(named) > 1:
            raise CardSignatureError(card_url, f"the signatures name {len(named)} jku URLs")
        try:
            jku_origin = card_urls(jku)[0]
        except (DiscoveryError, UsageError):  # no URL a request could use: on no origin
            jku_origin = ""
        if jku_origin != origin:
            raise CardSignatureError(
                card_url, f"jku {jku} is not on the agent's origin {origin}: refused"
            )
        return await self._fetch_keys(jku, "jku", card_url)

    async def _fetch_keys(self, url: str, source: str, card_url: str) -> CardKeys:
        """The JWKS at ``url``, read as a card is (R16 bounds, https, same-origin redirects),
        kept for ``max_card_age``."""
        kept = self._key_sets.get(url)
        if kept is not None and self._clock() - kept[1] < self.max_card_age:
            return dataclasses.replace(kept[0], source=source)
        try:
            response = await fetch_card(self.client, [url], limits=self.limits, slots=self.slots)
        except DiscoveryError as failure:
            raise CardSignatureError(
                card_url, f"keys at {url} could not be read: {failure.detail}"
            ) from None
        keys = parse_keys(
            response.body, source=source, url=url, card_url=card_url,
            max_bytes=self.limits.max_bytes,
        )  # fmt: skip
        self._key_sets[url] = (keys, self._clock())
        return keys

    def _pinned_key_set(self, origin: str, extended: bool = False) -> str | None:
        """The key set pinned for the agent's public card (``extended``: for its authenticated
        extended card): that of the last such ``CardFetched`` whose signature check pinned,
        matched or accepted one (None: none, or an unsigned card was accepted). Read from the
        agent's stream, from where the last call left off (in a store worker)."""
        place = (origin, extended)
        with self._pins_lock:
            version, pinned = self._pins.get(place, (0, None))
        for event in self.store.read_stream(ev.agent_stream_id(origin), version + 1):
            version = event.version
            if event.type != ev.CARD_FETCHED or '"pin"' not in event.payload:
                continue
            data = event.data
            signature = data.get("signature")
            if bool(data.get("extended")) != extended:
                continue
            if not isinstance(signature, dict) or "pin" not in signature:
                continue
            keys = signature.get("keys")
            pinned = keys.get("key_set") if isinstance(keys, dict) else None
        with self._pins_lock:
            if version >= self._pins.get(place, (0, None))[0]:
                self._pins[place] = (version, pinned)
        return pinned

    def _pin(
        self, read: CardRead, signed: SignatureCheck, extended: bool = False
    ) -> dict[str, Any]:
        """The ``signature`` record of a read, its key set compared with the pinned one (R3's
        way: first use pins, a change is refused unless the policy accepts it); ``extended``:
        the authenticated extended card's, compared with the key set pinned for that card."""
        record = signed.record()
        policy = self.signature_policy(read.agent)
        pinned = self._pinned_key_set(read.agent, extended)
        fresh = signed.keys.key_set if signed.keys is not None else None
        if fresh is None and pinned is None:
            return record  # unsigned under prefer, nothing pinned: nothing to keep
        if fresh == pinned:
            record["pin"] = "matched"
        elif pinned is None:
            record["pin"] = "pinned"
        elif policy.accept_key_change:
            record.update(pin="accepted", previous=pinned)
        elif fresh is None:
            raise CardSignatureError(
                read.url, f"the card is unsigned, and key set {pinned[:12]} is pinned for "
                f"{read.agent}: refused as a downgrade (accept_key_change accepts it)",
            )  # fmt: skip
        else:
            kids = ", ".join(signed.keys.kids) if signed.keys is not None else ""
            raise CardSignatureError(
                read.url, f"key set changed from {pinned[:12]} to {fresh[:12]} (kids: "
                f"{kids or 'none'}) since it was pinned: refused (accept_key_change accepts it)",
            )  # fmt: skip
        return record
