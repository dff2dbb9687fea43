"""Events as the store keeps them: the ``(type, payload)`` pair a test compares with what a
stream holds, written out where a test asserts on a whole stored payload."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cardfence.engine.core import events as ev


def stored(events: Iterable[ev.Recorded | ev.UnknownEvent]) -> list[tuple[str, dict[str, Any]]]:
    """Each event's type and payload, as its stream records them."""
    return [(event.type, event.payload()) for event in events]
