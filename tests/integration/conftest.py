"""Integration fixtures: a real a2a-sdk agent on 127.0.0.1 (``tests/support/peer.py``), and the
same agent behind real authentication middleware (``tests/support/auth_peer.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fixtures import restored
from support import AuthPeer, Peer

from cardfence.store import EventStore


@pytest.fixture(scope="module")
def shared_peer() -> Iterator[Peer]:
    """One agent per module: starting one costs a quarter of a second."""
    with Peer() as running:
        yield running


@pytest.fixture
def peer(shared_peer: Peer) -> Iterator[Peer]:
    """The module's agent in normal service, counters zeroed, its card restored afterwards."""
    with restored(shared_peer) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def shared_auth_peer() -> Iterator[AuthPeer]:
    with AuthPeer() as running:
        yield running


@pytest.fixture
def auth_peer(shared_auth_peer: AuthPeer) -> Iterator[AuthPeer]:
    """The module's authenticating agent: counters and auth log cleared, enforcement back to
    its card's, the card restored afterwards."""
    with restored(shared_auth_peer):
        yield shared_auth_peer


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(f"sqlite:///{tmp_path / 'cardfence.db'}") as store:
        yield store
