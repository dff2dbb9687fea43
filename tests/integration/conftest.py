"""Integration fixtures: a real a2a-sdk agent on 127.0.0.1 (``tests/support/peer.py``), and the
same agent behind real authentication middleware (``tests/support/auth_peer.py``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support import AuthPeer, Peer, Peer03, Venv03Unavailable
from support.engine_fixtures import assert_audit_ok, audited_engine, restored

from cardfence.engine.client.engine import Engine
from cardfence.store.event_store import EventStore


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


# The agents `agent` runs a test against: the a2a-sdk 1.3 agent (JSON-RPC, the first interface
# of its card), and the official a2a-sdk 0.3 agent over each of its bindings, its card preferring
# JSON-RPC or HTTP+JSON (the engine takes the card's preference when none is configured).
AGENTS = {
    "1.3": "shared_peer",
    "0.3-jsonrpc": "shared_peer03",
    "0.3-http+json": "shared_peer03_rest",
}


@pytest.fixture(scope="module", params=list(AGENTS))
def shared_agent(request: pytest.FixtureRequest) -> Peer | Peer03:
    """The module's agent of each generation and 0.3 binding: the a2a-sdk 1.3 one (the module's
    `shared_peer`) and the official a2a-sdk 0.3 one (`Peer03`, a subprocess: about a second to
    start), one preferring JSON-RPC and one preferring HTTP+JSON."""
    agent: Peer | Peer03 = request.getfixturevalue(AGENTS[request.param])
    return agent


def _peer03(**options: str) -> Iterator[Peer03]:
    """A running a2a-sdk 0.3 agent; without its venv, a failure under CI and a skip elsewhere."""
    try:
        running = Peer03(**options).start()
    except Venv03Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the a2a-sdk 0.3 venv is needed under CI: {exc}")
        pytest.skip(f"no a2a-sdk 0.3 venv: {exc}")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def shared_peer03() -> Iterator[Peer03]:
    """One a2a-sdk 0.3 agent for the module, its card preferring JSON-RPC (a subprocess: about a
    second to start)."""
    yield from _peer03()


@pytest.fixture(scope="module")
def shared_peer03_rest() -> Iterator[Peer03]:
    """One a2a-sdk 0.3 agent for the module whose card prefers HTTP+JSON."""
    yield from _peer03(preferred_transport="HTTP+JSON")


@pytest.fixture
def peer03(shared_peer03: Peer03) -> Iterator[Peer03]:
    """The module's 0.3 agent in normal service, logs cleared, its card restored afterwards."""
    with restored(shared_peer03) as fresh:
        yield fresh


@pytest.fixture
def agent(shared_agent: Peer | Peer03) -> Iterator[Peer | Peer03]:
    """`peer`, for tests that hold on both generations: in normal service, its card restored."""
    with restored(shared_agent) as fresh:
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


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    """An engine on a fresh SQLite store, audited clean once the test's background work settles
    (a module may define its own)."""
    async with audited_engine(f"sqlite:///{tmp_path / 'engine.db'}") as running:
        yield running


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    """A SQLite store for the commands; audited in-process once the test is done (R13)."""
    url = f"sqlite:///{tmp_path / 'cardfence.db'}"
    yield url
    if (tmp_path / "cardfence.db").exists():
        with EventStore.open(url) as store:
            assert_audit_ok(store)
