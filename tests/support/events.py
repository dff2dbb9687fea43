"""Events as tests build and read them: a task's first event, and events as the store keeps them
(the ``(type, payload)`` pair a test compares with what a stream holds)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cardfence.engine.core import events as ev

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
