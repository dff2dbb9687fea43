"""An agent's card for R15's unit tests: three security schemes (an API key, a bearer token,
OAuth client credentials), the requirements given, and one alternative of them by name; and a
token source that records what it was asked."""

from __future__ import annotations

from typing import Any

from cardfence.engine.auth.credentials import TokenNeeded
from cardfence.engine.cards.model import AgentCard

from .cards import agent_card, skill

AGENT = "https://agent.test"
SCHEMES: dict[str, Any] = {
    "key": {"apiKeySecurityScheme": {"location": "query", "name": "k"}},
    "bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}},
    "oauth": {
        "oauth2SecurityScheme": {
            "flows": {"clientCredentials": {"tokenUrl": "https://auth.test/token", "scopes": {}}}
        }
    },
}


def card(requirements: list[dict[str, Any]], skill_requirements: Any = None) -> AgentCard:
    """The card at ``AGENT`` with ``SCHEMES``, requiring ``requirements`` (and its one skill,
    ``work``, ``skill_requirements`` when given)."""
    extra = {} if skill_requirements is None else {"securityRequirements": skill_requirements}
    return agent_card(
        f"{AGENT}/rpc",
        skills=[skill("work", **extra)],
        securitySchemes=SCHEMES,
        securityRequirements=requirements,
    )


def alternative(**scopes: list[str]) -> dict[str, Any]:
    """One alternative of a security requirement: each scheme named with its scopes."""
    return {"schemes": {name: {"list": listed} for name, listed in scopes.items()}}


class Token:
    """A bearer token as the token source hands it out."""

    def __init__(self, value: str) -> None:
        self.value = value

    def authorization(self) -> str:
        return f"Bearer {self.value}"


class Tokens:
    """A token source that records what it was asked: ``(needed, scheme, refresh)`` each time,
    answered ``tok-1``, ``tok-2`` …"""

    def __init__(self) -> None:
        self.asked: list[tuple[TokenNeeded, str, bool]] = []

    async def token(self, needed: TokenNeeded, *, scheme: str = "", refresh: bool = False) -> Any:
        self.asked.append((needed, scheme, refresh))
        return Token(f"tok-{len(self.asked)}")
