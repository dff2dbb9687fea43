"""Events as tests build and read them: a task's first event, and events as the store keeps them
(the ``(type, payload)`` pair a test compares with what a stream holds)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cardfence.engine.core import events as ev
from cardfence.engine.core.content import resolved_parts
from cardfence.store.event_store import EventStore

AGENT = "http://agent.example"


def submitted(key: str = "k", *, agent: str = AGENT, **fields: Any) -> ev.TaskSubmitted:
    """The first event of task ``key``, sent to ``agent``, as a creation records it; ``fields``
    replace any of its values (``card_revision`` names no stored card unless one is given)."""
    payload: dict[str, Any] = {
        "task": key, "agent": agent, "agent_url": f"{agent}/a2a",
        "card_url": f"{agent}/.well-known/agent-card.json", "skill": "echo",
        "message_id": f"m-{key}", "context_id": f"c-{key}", "text": "hi",
        "media_type": "text/plain", "card_revision": "r" * 64, "card_version": None,
        "contract_hash": "c" * 64, "skill_hash": None,
        "endpoint": {"url": f"{agent}/a2a", "binding": "JSONRPC"},
        "submitted_at": "2026-12-01T00:00:00+00:00",
    }  # fmt: skip
    return ev.TaskSubmitted.from_payload({**payload, **fields})


def stored(events: Iterable[ev.Recorded | ev.UnknownEvent]) -> list[tuple[str, dict[str, Any]]]:
    """Each event's type and payload, as its stream records them."""
    return [(event.type, event.payload()) for event in events]


def read_back(
    store: EventStore, key: str, parts: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Recorded parts (outlines) with their content read back from the task's content records,
    as they were given: without the size and digest an outline holds."""
    kept = {digest: record.data for digest, record in store.contents(f"task:{key}").items()}
    resolved, _ = resolved_parts(parts, kept)
    return [without_outline(part) for part in resolved]


def without_outline(part: Mapping[str, Any]) -> dict[str, Any]:
    """A part as given: without the size and digest its outline (or view) adds."""
    return {k: v for k, v in part.items() if k not in ("size", "sha256")}
