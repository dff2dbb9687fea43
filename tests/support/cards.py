"""The one card factory of the tests: a valid 1.0 card document (one skill, one JSON-RPC 1.0
interface), what a test changes in it given by name, the parsed card, and the ``CardFetched``
payload a read of a parsed card records."""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import urlsplit

from cardfence.engine.cards.model import AgentCard, parse_card

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


def skill(id: str = "echo", **fields: Any) -> dict[str, Any]:
    """One skill ``id``, named after it, ``fields`` added or replaced."""
    return {"id": id, "name": id.title(), "description": f"{id.title()}s.", "tags": ["t"], **fields}


def interface(
    url: str, binding: str = "JSONRPC", version: str = "1.0", **fields: Any
) -> dict[str, Any]:
    """One entry of ``supportedInterfaces``."""
    return {"url": url, "protocolBinding": binding, "protocolVersion": version, **fields}


def card_document(rpc: str | None = None, /, **fields: Any) -> dict[str, Any]:
    """A fresh copy of the card document (one skill, JSON-RPC 1.0 at ``ORIGIN``): its one
    interface at ``rpc`` when given, and each top-level field of ``fields`` replaced."""
    document = copy.deepcopy(_DOCUMENT)
    if rpc is not None:
        document["supportedInterfaces"] = [interface(rpc)]
    document.update(copy.deepcopy(fields))
    return document


def card_url_of(rpc: str) -> str:
    """The well-known card URL at the origin of ``rpc``."""
    parts = urlsplit(rpc)
    return f"{parts.scheme}://{parts.netloc}/.well-known/agent-card.json"


def agent_card(rpc: str | None = None, /, *, url: str | None = None, **fields: Any) -> AgentCard:
    """:func:`card_document` parsed, read at ``url`` (by default the well-known URL at the
    origin of its first interface)."""
    document = card_document(rpc, **fields)
    read_at = url or card_url_of(document["supportedInterfaces"][0]["url"])
    return parse_card(json.dumps(document).encode(), url=read_at, max_bytes=1 << 24)


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
