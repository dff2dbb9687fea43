"""The revisions of an agent's card a store has seen (``engine/discovery/history.py``, behind
``cardfence cards``), read from a SQLite store: each revision once as it came into force, its
fields, its changes from the one before, and the extended card's history apart. No network."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from support.cards import agent_card

from cardfence.engine.cards.model import AgentCard
from cardfence.engine.core import events as ev
from cardfence.engine.discovery._agent_stream import append_agent_events
from cardfence.engine.discovery.history import revision_history, stored_card
from cardfence.store.event_store import EventStore
from cardfence.store.records import CardSnapshot, NewEvent

ORIGIN = "https://agent.test"
CARD_URL = f"{ORIGIN}/.well-known/agent-card.json"
AT = datetime(2026, 12, 6, tzinfo=UTC)


def card(**fields: Any) -> AgentCard:
    plain = {"version": "1", "capabilities": {}, "skills": [{"id": "echo"}]}
    return agent_card(f"{ORIGIN}/rpc", url=CARD_URL, **{**plain, **fields})


def read(store: EventStore, seen: AgentCard, *, snapshot: bool = True, **data: Any) -> None:
    """Record a read of ``seen`` in the agent's stream, with its snapshot unless told not."""
    body = seen.canonical_bytes().decode()
    stored = CardSnapshot(seen.revision, body, CARD_URL, None, 200, AT)
    fetched = {"url": CARD_URL, "revision": seen.revision, "version": "1", **data}
    append_agent_events(
        store,
        ORIGIN,
        lambda _state: [NewEvent(ev.CARD_FETCHED, fetched)],
        [stored] if snapshot else [],
    )


def test_each_revision_is_listed_once_as_it_came_into_force_with_its_fields(
    store: EventStore,
) -> None:
    first, second = card(), card(version="2")
    read(store, first, etag='"a"', fetched_at="2026-12-06T00:00:00+00:00")
    read(store, first, etag='"a"', fetched_at="2026-12-06T00:01:00+00:00")  # the same again
    read(store, second, version="2", etag='"b"', fetched_at="2026-12-06T00:02:00+00:00")
    read(store, first, etag='"a"', fetched_at="2026-12-06T00:03:00+00:00")  # back to the first
    history = [entry.to_json() for entry in revision_history(store, ORIGIN)]
    assert history == [
        {
            "revision": first.revision,
            "version": "1",
            "first_seen": "2026-12-06T00:00:00+00:00",
            "etag": '"a"',
            "changes": {},
        },
        {
            "revision": second.revision,
            "version": "2",
            "first_seen": "2026-12-06T00:02:00+00:00",
            "etag": '"b"',
            "changes": {"version": {"old": "1", "new": "2"}},
        },
        {
            "revision": first.revision,
            "version": "1",
            "first_seen": "2026-12-06T00:03:00+00:00",
            "etag": '"a"',
            "changes": {"version": {"old": "2", "new": "1"}},
        },
    ]


def test_an_undated_read_is_dated_as_recorded_and_one_not_stored_shows_no_changes(
    store: EventStore,
) -> None:
    first, second = card(), card(capabilities={"streaming": True})
    read(store, first)
    read(store, second, snapshot=False)
    older, newer = revision_history(store, ORIGIN)
    recorded = [e.recorded_at for e in store.read_stream(ev.agent_stream_id(ORIGIN))]
    assert (older.first_seen, newer.first_seen) == tuple(t.isoformat() for t in recorded)
    assert (older.etag, newer.changes) == (None, {})


def test_the_extended_card_has_a_history_of_its_own(store: EventStore) -> None:
    public, extended = card(), card(skills=[{"id": "echo"}, {"id": "admin"}])
    read(store, public, fetched_at="2026-12-06T00:00:00+00:00")
    read(store, extended, extended=True, fetched_at="2026-12-06T00:01:00+00:00")
    read(store, public, extended=True, fetched_at="2026-12-06T00:02:00+00:00")
    assert [e.revision for e in revision_history(store, ORIGIN)] == [public.revision]
    entries = revision_history(store, ORIGIN, extended=True)
    assert [(e.revision, e.changes) for e in entries] == [
        (extended.revision, {}),
        (public.revision, {"skills": {"removed": ["admin"]}}),
    ]


def test_a_stored_card_is_read_back_by_its_revision(store: EventStore) -> None:
    seen = card(description="kept")
    read(store, seen)
    again = stored_card(store, seen.revision)
    assert again is not None
    assert (again.revision, again.description, again.source_url) == (
        seen.revision,
        "kept",
        CARD_URL,
    )
    assert stored_card(store, "0" * 64) is None
    assert revision_history(store, "https://other.test") == []


def test_a_stored_card_over_the_default_read_limit_is_read_back_whole(store: EventStore) -> None:
    """A card read under a raised size limit is stored whole: its history reads it whatever
    the limit of the day (1 MiB by default)."""
    large = card(description="x" * 1_100_000)
    read(store, large)
    read(store, card())
    again = stored_card(store, large.revision)
    assert again is not None
    assert len(again.description) == 1_100_000
    assert revision_history(store, ORIGIN)[1].changes == {}  # only the description moved
