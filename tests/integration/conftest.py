"""Integration fixtures: a real a2a-sdk agent on 127.0.0.1 (``tests/support/peer.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Peer

from cardfence.store import EventStore


@pytest.fixture
def peer() -> Iterator[Peer]:
    with Peer() as running:
        yield running


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(f"sqlite:///{tmp_path / 'cardfence.db'}") as store:
        yield store
