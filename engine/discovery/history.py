"""The revisions of an agent's card this store has seen, and what changed between them.

The data behind ``cardfence cards``: read from the agent stream's ``CardFetched`` events and the
content-addressed snapshots (R14). No network. The authenticated extended card (``CardFetched``
with ``extended: true``, R15) has a history of its own beside the public card's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cardfence.engine.cards.diff import diff
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.core import events as ev
from cardfence.store.event_store import EventStore


@dataclass(frozen=True, slots=True)
class RevisionEntry:
    """A revision as it came into force (a revision seen again after another is listed again)."""

    revision: str
    version: str | None
    first_seen: str
    etag: str | None
    changes: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "version": self.version,
            "first_seen": self.first_seen,
            "etag": self.etag,
            "changes": self.changes,
        }


def revision_history(
    store: EventStore, origin: str, *, extended: bool = False
) -> list[RevisionEntry]:
    """The agent's card revisions, oldest first, each with its changes from the one before:
    the public card's, or with ``extended`` the authenticated extended card's (R15)."""
    entries: list[RevisionEntry] = []
    cards: dict[str, AgentCard | None] = {}
    previous: str | None = None
    for event in store.read_stream(ev.agent_stream_id(origin)):
        if event.type != ev.CARD_FETCHED or bool(event.data.get("extended")) != extended:
            continue
        data = event.data
        revision = data["revision"]
        if revision == previous:
            continue
        changes: dict[str, Any] = {}
        if previous is not None:
            old, new = _card(store, cards, previous), _card(store, cards, revision)
            if old is not None and new is not None:
                changes = diff(old, new).to_json()
        entries.append(
            RevisionEntry(
                revision=revision,
                version=data.get("version"),
                first_seen=data.get("fetched_at") or event.recorded_at.isoformat(),
                etag=data.get("etag"),
                changes=changes,
            )
        )
        previous = revision
    return entries


def stored_card(store: EventStore, revision: str) -> AgentCard | None:
    """The card stored under ``revision``, or None when the store does not hold it."""
    return _card(store, {}, revision)


def _card(store: EventStore, cache: dict[str, AgentCard | None], revision: str) -> AgentCard | None:
    if revision not in cache:
        snapshot = store.get_snapshot(revision)
        cache[revision] = (
            None
            if snapshot is None
            else parse_card(snapshot.body.encode(), url=snapshot.source_url, max_bytes=1 << 30)
        )
    return cache[revision]
