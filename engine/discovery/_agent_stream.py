"""The agent's stream as card reads write it: what a read records there, and the one way to
append to it (R2, R3, R14).

What a read records is built here: the ``CardFetched`` payload (docs/events.md), the
content-addressed snapshot of the card a 200 read brought (R14), and that of the key set a signed
card was verified with. :func:`append_agent_events` appends what a decision makes of the agent's
current state, folding the projection, and decides again on a conflict with another process, so
that no decision (a contract or key-set pin) is made on a stale state. What to record, and when,
:mod:`.reads` decides.

The payloads are pure; the append is store I/O that blocks (run in a store worker).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from cardfence.engine.cards.signatures import SignatureCheck
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import (
    AGENT_FIELDS,
    State,
    apply_agent_event,
    initial_agent_state,
    lacking,
)
from cardfence.engine.discovery.card_read import CardRead
from cardfence.store.errors import ConcurrencyError, CorruptRecordError
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot, NewEvent, Projection

_APPEND_RETRIES = 20
_MAX_BACKOFF = 0.1  # seconds, at most, between two attempts of one agent-stream append


def fetched_payload(read: CardRead) -> ev.CardFetched:
    """The ``CardFetched`` of a read (docs/events.md)."""
    card = read.card
    return ev.CardFetched(
        url=read.url,
        status=read.status,
        revision=card.revision,
        version=card.version,
        etag=read.etag,
        last_modified=read.last_modified,
        contract_hash=card.contract_hash,
        push_notifications=card.push_notifications,
        fetched_at=read.fetched_at.isoformat(),
    )


def _new(event: ev.AgentEvent | NewEvent) -> NewEvent:
    """An event as the store appends it."""
    return event if isinstance(event, NewEvent) else NewEvent(event.TYPE, event.payload())


def card_snapshot(read: CardRead) -> CardSnapshot:
    """The content-addressed snapshot of the card a 200 read brought (R14)."""
    return CardSnapshot(
        revision=read.card.revision,
        body=read.card.canonical_bytes().decode(),
        source_url=read.url,
        etag=read.etag,
        http_status=read.status,
        fetched_at=read.fetched_at,
    )


def key_snapshots(read: CardRead, signed: SignatureCheck | None) -> list[CardSnapshot]:
    """The key set a read was verified with, stored like a card so the audit can verify again."""
    if signed is None or signed.keys is None:
        return []
    keys = signed.keys
    return [CardSnapshot(keys.revision, keys.body, keys.url, None, 200, read.fetched_at)]


def agent_head(store: EventStore, origin: str) -> tuple[int, State]:
    """The agent stream's version and projection (version 0 and the initial state when nothing
    was recorded yet); :class:`CorruptRecordError` when the projection was altered in the
    store. Blocks: run in a store worker."""
    head = store.stream(ev.agent_stream_id(origin))
    if head is None:
        return 0, initial_agent_state(origin)
    missing = lacking(head.state, AGENT_FIELDS)
    if missing is not None:
        raise CorruptRecordError.in_projection(head.stream_id, f"the stored agent {missing}")
    return head.version, head.state


def append_agent_events(
    store: EventStore,
    origin: str,
    decide: Callable[[State], Sequence[ev.AgentEvent | NewEvent]],
    snapshots: Sequence[CardSnapshot] = (),
    known: tuple[int, State] | None = None,
    lock: threading.Lock | None = None,
) -> None:
    """Append what ``decide`` makes of the agent's current state, folding the projection.

    ``known`` is a (version, state) just read, tried first. ``lock`` is held throughout: the
    caller's lock for this agent, so that appends of one process never race each other. Another
    process may append to the same agent stream at the same time: on a conflict the state is read
    again and ``decide`` asked again, so decisions (like pinning) are never made on a stale state.
    Every card read of an agent lands in its one stream, so many processes creating tasks at once
    contend for it: a conflict on a state read here backs off for a random while (doubling)
    before reading again, so the writers spread out; one on ``known`` is retried at once.
    """
    stream_id = ev.agent_stream_id(origin)
    read_here = False  # whether the last attempt decided on a state read here
    conflict: ConcurrencyError | None = None  # the last race lost
    with lock or nullcontext():
        for attempt in range(_APPEND_RETRIES):
            if known is None:
                if read_here:
                    time.sleep(random.uniform(0, min(_MAX_BACKOFF, 0.001 * 2**attempt)))
                known = agent_head(store, origin)
                read_here = True
            version, state = known
            known = None
            new_events = [_new(event) for event in decide(state)]
            if not new_events:
                return
            for event in new_events:
                state = apply_agent_event(state, event.type, event.data)
            try:
                store.append(
                    stream_id,
                    version,
                    new_events,
                    projection=Projection(state, category=ev.AGENT_CATEGORY, alias=origin),
                    snapshots=snapshots,
                )
                return
            except ConcurrencyError as lost:
                conflict = lost
    assert conflict is not None  # every attempt that did not return lost a race
    raise conflict
