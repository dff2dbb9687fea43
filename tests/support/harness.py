"""The harness of the engine's property tests (P4-P8): engines on real stores, no sockets.

- :func:`open_engine` — an :class:`Engine` on a real store (unless given, a fresh in-memory
  SQLite one, copied from a migrated template by :func:`fresh_store`; unless given,
  :data:`CONFIG`) whose client is a :class:`~fake_agent.FakeAgent`'s, with a clock that jumps
  ``max_card_age`` at every reading (so the engine's memoised reads always go to the wire, unless
  a planted bug trusts the memo).
- :func:`hunt` — the settings of a ``find()`` hunt for a planted bug.
- Reading what was recorded: :func:`agent_events`, :func:`task_events`, :func:`audit_problems`
  (``store_marks.write_marks``, shared with the integration tests, proves nothing was written).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

from hypothesis import Phase, settings

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.client.audit import audit
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent
from support.fake_agent import AGENT_URL, MAX_CARD_BYTES, ORIGIN, FakeAgent

CONFIG = EngineConfig(
    max_poll_interval=0.05,
    first_poll_interval=0.01,
    max_card_age=60.0,
    # Plain http to agent.test: nothing leaves the process (MockTransport), so allow it.
    card_limits=CardLimits(
        timeout=5.0, connect_timeout=1.0, max_bytes=MAX_CARD_BYTES, allow_insecure=True
    ),
    request_timeout=5.0,
    # R15: the rotated contract (fake_agent.ROTATED) requires a bearer token; without one
    # configured a creation on it would be refused before sending (CredentialsMissing).
    credentials=CredentialsConfig.of({AGENT_URL: {"bearer": Bearer("fake-agent-token")}}),
)


def hunt(max_examples: int) -> settings:
    """Settings for a ``find()`` hunt for a planted bug: a budget of its own (the profile's, small
    under ``dev``, is for the property), and no shrinking — the hunt only has to show one failing
    example, and shrinking would replay whole engine runs by the hundred. Derandomised: the
    same hunt on every run, so a planted bug caught once is caught always."""
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
    )


# -- engines --------------------------------------------------------------------------------------


def jumping_clock(step: float = CONFIG.max_card_age) -> Any:
    """A clock that moves ``step`` seconds at every reading: no memo is ever young enough."""
    ticks = itertools.count()
    return lambda: next(ticks) * step


@functools.cache
def _migrated() -> EventStore:
    return EventStore.open("sqlite://")


def clone(source: EventStore) -> EventStore:
    """A new in-memory SQLite store holding a copy of ``source`` (an in-memory SQLite store).

    A copy of a migrated database costs a tenth of a migration: examples start from a fresh
    store without paying for alembic every time.
    """
    target = EventStore.open("sqlite://", migrate=False)
    with _driver(source) as origin, _driver(target) as copy:
        origin.backup(copy)
    return target


def fresh_store() -> EventStore:
    """An empty, migrated in-memory SQLite store of its own."""
    return clone(_migrated())


@contextlib.contextmanager
def _driver(store: EventStore) -> Iterator[Any]:
    proxy = store.engine.raw_connection()  # in memory: the one connection (StaticPool)
    try:
        yield proxy.driver_connection
    finally:
        proxy.close()


@contextlib.asynccontextmanager
async def open_engine(
    agent: FakeAgent, store: EventStore | None = None, config: EngineConfig = CONFIG
) -> AsyncIterator[Engine]:
    """An engine on a real store (a fresh in-memory one unless given), talking to ``agent``;
    closing it closes the store."""
    opened = store if store is not None else fresh_store()
    engine = Engine(opened, agent.client(), config, owns_client=True, clock=jumping_clock())
    async with engine:
        yield engine


# -- what was recorded ----------------------------------------------------------------------------


def agent_events(store: EventStore, since: int = 0) -> list[RecordedEvent]:
    """The fake agent's stream, from version ``since + 1``."""
    return store.read_stream(ev.agent_stream_id(ORIGIN), from_version=since + 1)


def agent_version(store: EventStore) -> int:
    head = store.stream(ev.agent_stream_id(ORIGIN))
    return 0 if head is None else head.version


def task_events(store: EventStore, key: str, since: int = 0) -> list[RecordedEvent]:
    return store.read_stream(task_stream_id(key), from_version=since + 1)


def task_version(store: EventStore, key: str) -> int:
    head = store.stream(task_stream_id(key))
    return 0 if head is None else head.version


def task_streams(store: EventStore) -> list[str]:
    return [s.stream_id for s in store.streams(category=ev.TASK_CATEGORY)]


def audit_problems(store: EventStore) -> str | None:
    """What the audit (R13, R14) found, or None."""
    report = audit(store)
    if report.ok:
        return None
    return "; ".join(f"{v.stream}@{v.position} {v.kind}: {v.detail}" for v in report.violations)
