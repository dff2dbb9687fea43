"""The hashes a store keeps of a card stay the same from one release to the next.

A task records the revision, contract hash and skill compatibility hash of the card it was
created under (R3, R9, R14), and every later card read is compared with them: on resume, at
each re-validation, by the audit. A release that hashed the same card otherwise would see every
stored task's contract diverge and its skill change on the first read after the upgrade. So the
hashes of two fixed cards, one of each A2A generation, are written out here: a change to any of
them is a change to stored data, which needs a migration and a CHANGELOG entry, not a new
expected value."""

from __future__ import annotations

import json
from typing import Any

from cardfence.engine.cards.model import AgentCard, parse_card

V10_CARD: dict[str, Any] = {
    "name": "Invoices",
    "description": "Reconciles invoices",
    "version": "2.1.0",
    "supportedInterfaces": [
        {"url": "https://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {
            "url": "https://a.test/rest",
            "protocolBinding": "HTTP+JSON",
            "protocolVersion": "1.0",
            "tenant": "acme",
        },
        {"url": "https://a.test/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ],
    "capabilities": {"streaming": True, "pushNotifications": True},
    "securitySchemes": {
        "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "JWT"}},
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}},
    },
    "securityRequirements": [
        {"schemes": {"bearer": {"list": ["write", "read"]}}},
        {"schemes": {"key": {}}},
    ],
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["application/json"],
    "skills": [
        {
            "id": "reconcile",
            "name": "Reconcile",
            "description": "Matches",
            "tags": ["finance"],
            "examples": ["reconcile March"],
            "inputModes": ["text/plain", "application/json"],
            "inputSchema": {"type": "object"},
            "securityRequirements": [{"schemes": {"bearer": {"list": ["admin"]}}}],
        },
        {"id": "echo", "name": "Echo", "description": "Echoes", "tags": []},
    ],
    "signatures": [{"protected": "e30", "signature": "AA"}],
}

# The same contract as published by a 0.3 agent: flattened schemes, "security", bare-word modes.
V03_CARD: dict[str, Any] = {
    "name": "Invoices",
    "version": "2.1.0",
    "url": "https://a.test/v03",
    "protocolVersion": "0.3.0",
    "additionalInterfaces": [{"url": "https://a.test/rest", "transport": "REST"}],
    "securitySchemes": {
        "bearer": {"type": "http", "scheme": "Bearer", "bearerFormat": "JWT"},
        "key": {"type": "apiKey", "in": "header", "name": "X-Key"},
    },
    "security": [{"bearer": ["write", "read"]}, {"key": []}],
    "defaultInputModes": ["text"],
    "defaultOutputModes": ["data"],
    "skills": [
        {
            "id": "reconcile",
            "name": "Reconcile",
            "description": "Matches",
            "tags": [],
            "security": [{"bearer": ["admin"]}],
        }
    ],
}

SCHEMES = "1add32001b58f9b61fd31e87f5247a6c81a63fe1fc8129ba3bb84a453c684b8c"
REQUIREMENTS = "5b8ae811a97c79d02abb2018338fc29c1df15576fb47a5dde83ea4b5ffe25d40"


def hashes(card: AgentCard) -> dict[str, Any]:
    return {
        "revision": card.revision,
        "contract": card.contract_hash,
        "schemes": card.contract.security_schemes_hash,
        "requirements": card.contract.security_requirements_hash,
        "skills": {s.id: (s.compatibility_hash, s.content_hash) for s in card.skills},
    }


def test_a_1_0_card_keeps_the_hashes_stores_already_hold() -> None:
    assert hashes(parse_card(json.dumps(V10_CARD).encode())) == {
        "revision": "216489213d7e8db2c9bd5ad31687f13b5a36c02cae15e8d39c8454c1ef5c3913",
        "contract": "36af1ab5858d08426d5d4e1441fd4e5df269618b7b5a0546d5bf4a1624d92b48",
        "schemes": SCHEMES,
        "requirements": REQUIREMENTS,
        "skills": {
            "reconcile": (
                "71c769724a9096ea51ec8265b1157d140e805470e5b415f99e175951e1b7d048",
                "1498e73e2246566f5bb11dc39adfcb8c1f8c9eb1d224ef39a2d7118c79371494",
            ),
            "echo": (
                "9e785a1b8a21fd20887cfbb228ce883d62eb0e7591bea622254e01330725cf05",
                "cef95cc6fbcb81beaaf57617c67b77994ea3c3ee76b0d68e3dbe3686f0b16aa8",
            ),
        },
    }


def test_a_0_3_card_keeps_the_hashes_stores_already_hold() -> None:
    assert hashes(parse_card(json.dumps(V03_CARD).encode())) == {
        "revision": "b1e7da75d8b74675810d61e040a78e9de9bcc4be5bfccdd065b900e4f5cbcdb5",
        "contract": "ba676331e61924c1105a80886aa69abcd3f53bc4eff45f12a81eec83992a10ab",
        "schemes": SCHEMES,
        "requirements": REQUIREMENTS,
        "skills": {
            "reconcile": (
                "afd3a795b54a479c5b7e849421c4665e80e338da2f7b1653aa4a8e7fc1ffb859",
                "6da00daa104b3830c6f5f98f736377b3950fcbd9e013a54c757cf876af1a4151",
            ),
        },
    }
