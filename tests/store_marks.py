"""What a store has written so far, for tests that prove a refusal wrote nothing.

A plain module on ``sys.path`` (``tests/conftest.py`` puts ``tests/`` there) so the integration
fixtures and the property harness share it without importing ``support`` (which starts with the
a2a-sdk agents)."""

from __future__ import annotations

from cardfence.store import EventStore

__all__ = ["write_marks"]


def write_marks(store: EventStore) -> tuple[int, dict[str, int]]:
    """The global position and every stream's version: unchanged means nothing was written."""
    versions = {}
    for stream_id in store.stream_ids():
        head = store.stream(stream_id)
        versions[stream_id] = head.version if head else 0
    return store.last_position(), versions
