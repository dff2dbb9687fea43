"""Cards for the unit tests of signed cards and of the agent stream: a small valid 1.0 card
document, and the ``CardFetched`` payload a read of a parsed card records."""

from __future__ import annotations

import copy
from typing import Any

from cardfence.engine.cards.model import AgentCard

ORIGIN = "https://agent.example"

_DOCUMENT: dict[str, Any] = {
    "name": "agent",
    "description": "An agent.",
    "version": "1.0.0",
    "supportedInterfaces": [
        {"url": f"{ORIGIN}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    ],
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "echo", "name": "Echo", "description": "Echoes.", "tags": ["t"]}],
}


def card_document() -> dict[str, Any]:
    """A fresh copy of the card document (one skill, JSON-RPC 1.0 at ``ORIGIN``)."""
    return copy.deepcopy(_DOCUMENT)


def fetched(
    card: AgentCard, url: str, fetched_at: str = "2026-12-01T00:00:00+00:00", /, **extra: Any
) -> dict[str, Any]:
    """The ``CardFetched`` payload of a 200 read of ``card`` at ``url`` (docs/events.md)."""
    return {
        "url": url,
        "status": 200,
        "revision": card.revision,
        "version": card.version,
        "etag": None,
        "last_modified": None,
        "contract_hash": card.contract_hash,
        "push_notifications": card.push_notifications,
        "fetched_at": fetched_at,
        **extra,
    }
