"""What a store has written so far, for tests that prove a refusal wrote nothing.

A plain module on ``sys.path`` (``tests/conftest.py`` puts ``tests/`` there) so the integration
fixtures and the property harness share it without importing ``support`` (which starts with the
a2a-sdk agents)."""

from __future__ import annotations

from cardfence.store.event_store import EventStore

__all__ = ["write_marks"]


def write_marks(store: EventStore) -> tuple[int, dict[str, int]]:
    """The global position and every stream's version: unchanged means nothing was written."""
    versions = dict.fromkeys(store.stream_ids(), 0)  # a stream with events and no head: 0
    # Leniently: a head whose projection was altered in the store still has its version.
    versions.update((head.stream_id, head.version) for head in store.streams(lenient=True))
    return store.last_position(), versions
