"""Reading Agent Cards safely, and recording every read (R2, R3, R4, R14).

The card is published state, not configuration (incidents 000, 002, 004). Every read is bounded
(:mod:`.fetch`, R16: a total timeout, never past the deadline in force; a size cap on the decoded
body, enforced while streaming; same-origin redirects only; https except on loopback),
conditional when a validator is stored (``If-None-Match`` / ``If-Modified-Since``; a 304 confirms
the stored snapshot), and recorded in the agent's stream: ``CardFetched`` with the revision, or
``DiscoveryFailed`` with its kind. Each new revision is stored once, content-addressed. What is
recorded, and the append that decides on the stream as it stands, are :mod:`._agent_stream`;
what a read gives, :mod:`.card_read`.

Two kinds of read: ``fresh`` (creation and webhook registration: always on the wire) and memoised
(diagnostic re-validation off the critical path: at most every ``max_card_age`` seconds).

When a card says ``capabilities.extendedAgentCard``, the authenticated extended card is read over
an interface of the agent with the credentials the caller chose (:meth:`Discovery.read_extended`,
R15): recorded as a ``CardFetched`` with ``extended: true`` and stored as its own snapshot, beside
the public card, which it never replaces in the agent's projection.

Signed cards (the cards wing's ``signature_policy``, ``keys``, ``signatures``; the key sets a read
finds, reads and pins are :mod:`._signed_reads`, a layer of :class:`Discovery`): under an agent's
``require`` or ``prefer`` policy (``CardLimits.signatures``), a card read on the wire is verified
before anything else sees it, against a key set read within the same bounds; its key set is pinned
on first use like the contract. A card that fails is recorded as ``DiscoveryFailed`` (kind
``signature``), raised as :class:`CardSignatureError`, and neither stored, memoised nor returned. A
verified read's ``CardFetched`` carries ``signature``: the raw signatures, the key set's stored
revision, the pin. The authenticated extended card is checked the same way under the same policy,
its key set pinned apart from the public card's (from the extended reads alone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from cardfence.engine.cards.keys import CardKeys
from cardfence.engine.cards.model import AgentCard, Interface, parse_card
from cardfence.engine.cards.signatures import SignatureCheck
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import State
from cardfence.engine.discovery._agent_stream import (
    agent_head,
    append_agent_events,
    card_snapshot,
    fetched_payload,
    key_snapshots,
)
from cardfence.engine.discovery._signed_reads import SignedReads
from cardfence.engine.discovery.card_read import CardRead, ContractCheck
from cardfence.engine.discovery.fetch import CardLimits, card_urls, extended_card_url, fetch_card
from cardfence.engine.errors import CardSignatureError, ContractChangedError, DiscoveryError
from cardfence.engine.http import deadline
from cardfence.engine.http.offload import StoreCalls, sized_work
from cardfence.engine.http.pool import RequestSlots
from cardfence.store.errors import CorruptRecordError
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot


class ExtendedCardSource(Protocol):
    """What reads an agent's authenticated extended card: one of its interfaces, with the
    credentials the caller chose (``A2ATransport`` is one; discovery never makes its own)."""

    interface: Interface

    async def get_extended_card(self) -> bytes: ...


_EXTENDED_KEPT = 64  # extended card reads kept in the memo (one per agent, interface, grant)


def _now() -> datetime:
    return datetime.now(UTC)


class Discovery(SignedReads):
    """Card reads for the engine: bounded, conditional, memoised where allowed, all recorded;
    signed cards checked on the way (:class:`.signed_reads.SignedReads`)."""

    def __init__(
        self,
        store: EventStore,
        client: httpx.AsyncClient,
        *,
        limits: CardLimits = CardLimits(),
        max_card_age: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        calls: StoreCalls | None = None,
        slots: RequestSlots | None = None,
    ) -> None:
        self.store = store
        self.slots = slots  # held for each GET: the engine's bound on requests in flight
        # Store calls go through the engine's runner (off the event loop); alone, inline.
        self._calls = calls or StoreCalls(store, workers=0)
        self.client = client
        self.limits = limits
        self.max_card_age = max_card_age
        self._clock = clock
        self._memo: dict[str, tuple[CardRead, float]] = {}
        self._parsed: OrderedDict[tuple[str, bytes], AgentCard] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future[CardRead]] = {}  # origin -> its wire read
        # (origin, the caller's memo key) -> the last extended card read there, and when
        self._extended: OrderedDict[tuple[str, Hashable], tuple[CardRead, float]] = OrderedDict()
        # Signed cards: key sets by where they are read (and when); per origin, the agent
        # stream's version scanned for the pinned key set, and that key set.
        self._key_sets: dict[str, tuple[CardKeys, float]] = {}
        self._pins: dict[tuple[str, bool], tuple[int, str | None]] = {}  # (origin, extended)
        self._pins_lock = threading.Lock()
        # Appends to each agent's stream made by this process: started so far, and in flight;
        # and a lock per agent, so that they never race each other (only other processes').
        self._appended: dict[str, int] = {}
        self._appending: dict[str, int] = {}
        self._append_locks: dict[str, threading.Lock] = {}

    # -- reading -------------------------------------------------------------------------------

    async def read(self, agent_url: str, *, fresh: bool = True, share: bool = False) -> CardRead:
        """The agent's card: from the wire (``fresh``, or the memo is older than
        ``max_card_age``), else from the memo. Records every wire read; raises
        :class:`DiscoveryError` (after recording it) when the read fails.

        ``share``: a wire read of the same agent already in flight is awaited instead of
        starting another (its result or its failure). For re-checks and re-validations, which
        many tasks of one agent make at once; never for creation or registration (R2, R4),
        whose read must be their own.
        """
        origin = card_urls(agent_url)[0]
        running = self._in_flight.get(origin)
        if share and running is not None:
            return await asyncio.shield(running)
        if running is not None or (not fresh and self._memo_fresh(origin)):
            return await self._read(agent_url, fresh=fresh)
        job = asyncio.ensure_future(self._read(agent_url, fresh=fresh))
        self._in_flight[origin] = job

        def done(finished: asyncio.Future[CardRead]) -> None:
            if self._in_flight.get(origin) is finished:
                del self._in_flight[origin]
            if not finished.cancelled():
                finished.exception()  # retrieved here: a sharer may have gone meanwhile

        job.add_done_callback(done)
        return await asyncio.shield(job)

    def _memo_fresh(self, origin: str) -> bool:
        memo = self._memo.get(origin)
        return memo is not None and self._clock() - memo[1] < self.max_card_age

    async def _read(self, agent_url: str, *, fresh: bool) -> CardRead:
        try:
            return await self._read_recorded(agent_url, fresh=fresh)
        except CorruptRecordError as corrupt:
            # The agent's record altered in the store: like a card that cannot be read (R8),
            # mid-task an annotation, never a halt. Not recorded on the agent's stream: it is
            # what cannot be read (and an append to it is whole or nothing).
            raise DiscoveryError(
                card_urls(agent_url)[1][0], "record",
                f"the agent's record in the store cannot be read: {corrupt}",
            ) from corrupt  # fmt: skip

    async def _read_recorded(self, agent_url: str, *, fresh: bool) -> CardRead:
        origin, urls = card_urls(agent_url)
        if not fresh:
            memo = self._memo.get(origin)
            if memo is not None and self._clock() - memo[1] < self.max_card_age:
                read = memo[0]
                return CardRead(
                    read.agent,
                    read.card,
                    read.url,
                    0,
                    read.etag,
                    read.last_modified,
                    read.fetched_at,
                )
        # The head read now is used for the record only if no append of this process to the
        # stream started since (many reads of one agent at once would each find it stale).
        mark = None if self._appending.get(origin) else self._appended.get(origin, 0)
        head = await self._calls.run(self._agent_head, origin)
        state = head[1]
        policy = self.signature_policy(origin)
        validators: dict[str, tuple[str | None, str | None]] = {}
        if (
            state["card_url"] in urls
            and (state["etag"] or state["last_modified"])
            and (not policy.active or self._memo_holds(origin, state["revision"]))
        ):
            # A signed card is confirmed by a 304 only while its signatures are in memory.
            validators[state["card_url"]] = (state["etag"], state["last_modified"])
        try:
            with deadline.within(self.limits.timeout):  # one read, all in: re-read, keys too
                response = await fetch_card(
                    self.client, urls, validators=validators, limits=self.limits, slots=self.slots
                )
                stored = None if response.status != 304 else await self._stored_card(origin, state)
                if response.status == 304 and stored is None:
                    # The validator names a revision we do not hold: read it whole.
                    response = await fetch_card(
                        self.client, urls, limits=self.limits, slots=self.slots
                    )
                card = stored or await self._parse(response.body, response.url)
                signed = await self._check_signatures(origin, policy, card, response.url)
        except DiscoveryError as failure:
            await self._record_failure(origin, failure)
            raise
        read = CardRead(
            origin,
            card,
            response.url,
            response.status,
            response.etag or (state["etag"] if response.status == 304 else None),
            response.last_modified or (state["last_modified"] if response.status == 304 else None),
            _now(),
        )
        known = head if mark is not None and self._appended.get(origin, 0) == mark else None
        try:
            await self._record_read(read, known, signed)
        except CardSignatureError as refused:  # the key set is not the pinned one
            await self._record_failure(origin, refused)
            raise
        self._memo[origin] = (read, self._clock())
        return read

    def _memo_holds(self, origin: str, revision: str | None) -> bool:
        memo = self._memo.get(origin)
        return memo is not None and revision is not None and memo[0].card.revision == revision

    async def _parse(self, body: bytes, url: str) -> AgentCard:
        """Parse a card body; the same bytes from the same URL parse to the same card, so the
        last few are kept (an agent without validators sends the whole card every time)."""
        key = (url, body)
        card = self._parsed.get(key)
        if card is None:
            card = await sized_work(
                len(body), parse_card, body, url=url, max_bytes=self.limits.max_bytes
            )
            self._parsed[key] = card
            if len(self._parsed) > 16:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(key)
        return card

    async def _stored_card(self, origin: str, state: Mapping[str, Any]) -> AgentCard | None:
        revision = state["revision"]
        if revision is None:
            return None
        memo = self._memo.get(origin)
        if memo is not None and memo[0].card.revision == revision:
            return memo[0].card
        snapshot = await self._calls.run(self.store.get_snapshot, revision)
        if snapshot is None:
            return None
        body = snapshot.body.encode()
        return await sized_work(
            len(body), parse_card, body, url=snapshot.source_url, max_bytes=1 << 30
        )

    # -- the authenticated extended card (R15) --------------------------------------------------

    async def read_extended(
        self,
        agent_url: str,
        transport: ExtendedCardSource,
        *,
        public_revision: str | None = None,
        memo: Hashable | None = None,
        fresh: bool = True,
    ) -> CardRead:
        """The agent's authenticated extended card (``GetExtendedAgentCard``) over
        ``transport``: an interface of the agent, carrying the credentials the caller chose.

        Every wire read is recorded in the agent's stream as ``CardFetched`` with ``extended:
        true`` (``public_revision``: the public card that offered it), its card stored as a
        snapshot of its own; the public card's fields of the agent's projection are left alone.
        With ``memo`` (what tells the credentials apart), a read not ``fresh`` is served from the
        last read under that key while it is younger than ``max_card_age`` (``status`` 0).

        Under the agent's signature policy (``require``, ``prefer``) the card's signatures are
        checked as the public card's are, and its key set pinned apart from the public card's:
        a card that fails is recorded as ``DiscoveryFailed`` (kind ``signature``) and raised as
        :class:`CardSignatureError`, neither stored, memoised nor returned. A verified read's
        ``CardFetched`` carries ``signature`` (the raw signatures, for the audit).

        Raises what the transport raises (:class:`RemoteRefusedError` for -32007,
        :class:`AuthorizationFailedError`, :class:`EndpointUnreachableError`,
        :class:`InvalidAgentResponseError`), and :class:`CardInvalidError` for an answer that
        is not a valid card; nothing is recorded then (the public card is unaffected).
        """
        origin = card_urls(agent_url)[0]
        place = (origin, memo)
        if memo is not None and not fresh:
            kept = self._extended.get(place)
            if kept is not None and self._clock() - kept[1] < self.max_card_age:
                self._extended.move_to_end(place)
                return dataclasses.replace(kept[0], status=0)
        url = extended_card_url(transport.interface)
        body = await transport.get_extended_card()
        card = await self._parse(body, url)
        read = CardRead(origin, card, url, 200, None, None, _now())
        try:
            # Its signatures under the agent's policy, before anything uses or stores it.
            with deadline.within(self.limits.timeout):
                signed = await self._check_signatures(
                    origin, self.signature_policy(origin), card, url
                )
            await self._record_extended(read, transport.interface.binding, public_revision, signed)
        except CardSignatureError as refused:  # also: the key set is not the pinned one
            await self._record_failure(origin, refused)
            raise
        if memo is not None:
            self._extended[place] = (read, self._clock())
            self._extended.move_to_end(place)
            if len(self._extended) > _EXTENDED_KEPT:
                self._extended.popitem(last=False)
        return read

    # -- contract pinning (R3) -----------------------------------------------------------------

    async def check_contract(self, read: CardRead, *, accept: bool = False) -> ContractCheck:
        """Compare the card's contract with the one pinned for the agent, like an SSH host key.

        First use pins it (``ContractPinned``). A different contract raises
        :class:`ContractChangedError` unless ``accept`` (recorded as ``ContractAccepted``).
        Safe when two first uses race: the loser re-reads the pin and decides again.
        """
        fresh = read.card.contract_hash
        outcome: dict[str, ContractCheck] = {}

        def decide(state: State) -> list[ev.AgentEvent]:
            pinned = state["pinned_contract"]
            outcome.clear()
            if pinned is None:
                outcome["v"] = ContractCheck("pinned", fresh, None)
                return [ev.ContractPinned(contract_hash=fresh, revision=read.revision)]
            if pinned == fresh:
                outcome["v"] = ContractCheck("matched", fresh, pinned)
                return []
            if not accept:
                raise ContractChangedError(
                    read.agent, pinned, fresh, self._contract_changes(state, read.card)
                )
            outcome["v"] = ContractCheck("accepted", fresh, pinned)
            return [
                ev.ContractAccepted(previous=pinned, contract_hash=fresh, revision=read.revision)
            ]

        await self._append(read.agent, decide)
        return outcome["v"]

    def _contract_changes(self, state: Mapping[str, Any], card: AgentCard) -> str:
        revision = state.get("pinned_revision")
        snapshot = self.store.get_snapshot(revision) if revision else None
        if snapshot is None:
            return "contract hash differs"
        pinned_card = parse_card(snapshot.body.encode(), max_bytes=1 << 30)
        parts = pinned_card.contract.changed_parts(card.contract)
        return ", ".join(parts) or "contract hash differs"

    # -- recording -----------------------------------------------------------------------------

    async def agent_state(self, agent_url: str) -> State:
        """The agent stream's projection (its initial state if nothing was recorded yet)."""
        return await self._agent_state(card_urls(agent_url)[0])

    async def _agent_state(self, origin: str) -> State:
        return (await self._calls.run(self._agent_head, origin))[1]

    def _agent_head(self, origin: str) -> tuple[int, State]:
        return agent_head(self.store, origin)

    async def _record_read(
        self,
        read: CardRead,
        known: tuple[int, State] | None = None,
        signed: SignatureCheck | None = None,
    ) -> None:
        data = fetched_payload(read)
        snapshots = [card_snapshot(read)] if read.status == 200 else []
        snapshots.extend(key_snapshots(read, signed))

        def decide(_: State) -> list[ev.AgentEvent]:
            if signed is None:
                return [data]
            # Decided on the stream as it stands at the append: two first uses cannot both pin.
            return [dataclasses.replace(data, signature=self._pin(read, signed))]

        await self._append(read.agent, decide, snapshots, known)

    async def _record_extended(
        self,
        read: CardRead,
        binding: str,
        public_revision: str | None,
        signed: SignatureCheck | None = None,
    ) -> None:
        data = dataclasses.replace(
            fetched_payload(read),  # a read of its own: no validators (etag, last_modified: None)
            extended=True,
            binding=binding,
            public_revision=public_revision,
        )
        snapshots = [card_snapshot(read), *key_snapshots(read, signed)]

        def decide(_: State) -> list[ev.AgentEvent]:
            if signed is None:
                return [data]
            # Pinned on the stream as it stands at the append, like the public card's.
            record = self._pin(read, signed, extended=True)
            return [dataclasses.replace(data, signature=record)]

        await self._append(read.agent, decide, snapshots)

    async def _record_failure(self, origin: str, failure: DiscoveryError) -> None:
        data = ev.DiscoveryFailed(
            url=failure.url, kind=failure.kind, detail=failure.detail, at=_now().isoformat()
        )
        await self._append(origin, lambda _: [data])

    async def record_refusal(
        self, agent_url: str, refusal: ev.TaskCreationRefused | ev.CredentialsMissing
    ) -> None:
        """Record a creation refusal in the agent's stream: ``TaskCreationRefused`` (R2, R3),
        or ``CredentialsMissing`` (R15)."""
        origin = card_urls(agent_url)[0]
        await self._append(origin, lambda _: [refusal])

    async def _append(
        self,
        origin: str,
        decide: Callable[[State], list[ev.AgentEvent]],
        snapshots: Sequence[CardSnapshot] = (),
        known: tuple[int, State] | None = None,
    ) -> None:
        lock = self._append_locks.get(origin) or self._append_locks.setdefault(
            origin, threading.Lock()
        )
        self._appended[origin] = self._appended.get(origin, 0) + 1
        self._appending[origin] = self._appending.get(origin, 0) + 1
        try:
            await self._calls.run(
                append_agent_events, self.store, origin, decide, snapshots, known, lock
            )
        finally:
            self._appending[origin] -= 1
