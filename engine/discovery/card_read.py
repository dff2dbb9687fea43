"""What a card read gives: the card in force with where and when it was read
(:class:`CardRead`), and the outcome of checking its contract against the pinned one
(:class:`ContractCheck`, R3). Pure data: the reads themselves are :mod:`.reads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cardfence.engine.cards.model import AgentCard

__all__ = ["CardRead", "ContractCheck"]


@dataclass(frozen=True, slots=True)
class CardRead:
    """A card in force, with where and when it was read. ``status`` 0 means from the memo."""

    agent: str
    card: AgentCard
    url: str
    status: int
    etag: str | None
    last_modified: str | None
    fetched_at: datetime

    @property
    def revision(self) -> str:
        return self.card.revision

    @property
    def from_memo(self) -> bool:
        return self.status == 0


@dataclass(frozen=True, slots=True)
class ContractCheck:
    """The outcome of comparing a fresh card's contract with the pinned one (R3)."""

    outcome: str  # "pinned" (first use), "matched", "accepted"
    contract_hash: str
    previous: str | None
