"""P6: appends at one expected version from concurrent writers — exactly one wins, nothing is lost
or duplicated (SQLite and PostgreSQL).

Hypothesis draws the writers (2-5), the rounds (1-6) and each writer's batch in each round (1-3
events). Every writer is a thread with an :class:`EventStore` of its own on the same database; in
each round they all append at the same expected version, released together by a barrier. Exactly
one must win each round (the others get ``ConcurrencyError``); afterwards the stream's versions
are 1..n with no gap or duplicate, its hash chain verifies, its head is at n, and what it logs —
in the global log too — is exactly the winners' batches, in round order. Each example races on a
stream of its own (fixtures are per test function, not per example).

A process-based variant (spawned processes, a seeded plan) shows the same across processes. The
property is one function, :func:`violation`, checked against the store and, to show it has teeth,
against a caller that "handles" a conflict by re-appending at the new head.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from support.harness import hunt

from cardfence.store.errors import ConcurrencyError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent

MAX_WRITERS = 5
Plan = tuple[tuple[int, ...], ...]  # per round, each writer's batch size

# --- strategies ----------------------------------------------------------------------------------

plans: st.SearchStrategy[Plan] = st.integers(2, MAX_WRITERS).flatmap(
    lambda writers: st.lists(
        st.lists(st.integers(1, 3), min_size=writers, max_size=writers).map(tuple),
        min_size=1,
        max_size=6,
    ).map(tuple)
)

# --- the property --------------------------------------------------------------------------------


def batch(round_: int, writer: int, size: int) -> list[NewEvent]:
    return [
        NewEvent("Appended", {"round": round_, "writer": writer, "i": i, "of": size})
        for i in range(size)
    ]


class Writers:
    """One store per writer on one database, and the threads that race them.

    Both are kept for a whole test, not made per example: a SQLite store keeps one connection per
    thread that uses it, so fresh threads every round would pile up open connections.
    """

    def __init__(self, url: str) -> None:
        self.stores = [EventStore.open(url)]  # the first one migrates
        self.stores += [EventStore.open(url, migrate=False) for _ in range(MAX_WRITERS - 1)]
        self._pool = ThreadPoolExecutor(MAX_WRITERS, thread_name_prefix="p6-writer")

    def race(self, stream: str, version: int, round_: int, sizes: tuple[int, ...]) -> list[str]:
        """Every writer appends its batch at ``version`` at once; each one's outcome."""
        barrier = threading.Barrier(len(sizes))

        def write(writer: int) -> str:
            events = batch(round_, writer, sizes[writer])
            barrier.wait(timeout=30)  # as many threads as writers: all of them get here
            try:
                self.stores[writer].append(stream, version, events)
            except ConcurrencyError:
                return "conflict"
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return "won"

        futures = [self._pool.submit(write, w) for w in range(len(sizes))]
        return [future.result(timeout=60) for future in futures]

    def close(self) -> None:
        self._pool.shutdown()
        for store in self.stores:
            store.close()


def logged_as_expected(
    store: EventStore, stream: str, winners: list[tuple[int, int, int]], after: int
) -> str | None:
    """Whether the stream holds exactly the winners' batches; ``after`` is the global position
    before the race."""
    expected = [e.data for r, w, size in winners for e in batch(r, w, size)]
    logged = store.read_stream(stream)
    if [e.version for e in logged] != list(range(1, len(expected) + 1)):
        return f"versions {[e.version for e in logged]}, not 1..{len(expected)}"
    if [e.data for e in logged] != expected:
        return f"logged {[e.data for e in logged]}, not the winners' batches {expected}"
    head = store.stream(stream)
    if head is None or head.version != len(expected):
        return f"head at {None if head is None else head.version}, not {len(expected)}"
    broken = store.verify_stream(stream)
    if broken is not None:
        return f"hash chain broken: {broken}"
    everywhere = [e for e in store.read_all(after=after, limit=10_000) if e.stream_id == stream]
    if [e.position for e in everywhere] != [e.position for e in logged]:
        return "the global log does not hold the stream's events exactly once, in order"
    return None


def violation(writers: Writers, plan: Plan) -> str | None:
    """What is wrong with the store's answer to the race ``plan``, or None."""
    stream = f"p6-{uuid.uuid4().hex}"
    after = writers.stores[0].last_position()
    version = 0
    winners: list[tuple[int, int, int]] = []
    for round_, sizes in enumerate(plan):
        outcomes = writers.race(stream, version, round_, sizes)
        won = [w for w, outcome in enumerate(outcomes) if outcome == "won"]
        if any(o not in ("won", "conflict") for o in outcomes) or len(won) != 1:
            return f"round {round_} at version {version}: {len(won)} won, outcomes {outcomes}"
        winners.append((round_, won[0], sizes[won[0]]))
        version += sizes[won[0]]
    return logged_as_expected(writers.stores[0], stream, winners, after)


@pytest.fixture
def writers(db_url: str) -> Iterator[Writers]:
    racing = Writers(db_url)
    try:
        yield racing
    finally:
        racing.close()


@settings(
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ]
)
@given(plan=plans)
def test_concurrent_appends_at_one_expected_version_one_wins_nothing_lost_or_duplicated(
    writers: Writers, plan: Plan
) -> None:
    assert violation(writers, plan) is None


# --- across processes ----------------------------------------------------------------------------

PROCESS_SEED = 20260601
PROCESS_WRITERS, PROCESS_ROUNDS = 3, 4


def _process_writer(
    url: str, stream: str, writer: int, sizes: list[int], barrier: Any, results: Any
) -> None:
    store = EventStore.open(url, migrate=False)
    try:
        for round_, size in enumerate(sizes):
            barrier.wait(60)  # everyone is done with the previous round
            head = store.stream(stream)
            version = 0 if head is None else head.version
            barrier.wait(60)  # everyone has read the same head: now race
            try:
                store.append(stream, version, batch(round_, writer, size))
                results.put((round_, writer, version, "won"))
            except ConcurrencyError:
                results.put((round_, writer, version, "conflict"))
    finally:
        store.close()


def test_concurrent_appends_from_processes_one_wins_nothing_lost_or_duplicated(
    db_url: str,
) -> None:
    rng = random.Random(PROCESS_SEED)
    plan = [[rng.randint(1, 3) for _ in range(PROCESS_ROUNDS)] for _ in range(PROCESS_WRITERS)]
    stream = f"p6-{uuid.uuid4().hex}"
    with EventStore.open(db_url) as store:
        after = store.last_position()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESS_WRITERS), ctx.Queue()
    processes = [
        ctx.Process(target=_process_writer, args=(db_url, stream, w, plan[w], barrier, results))
        for w in range(PROCESS_WRITERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in range(PROCESS_WRITERS * PROCESS_ROUNDS)]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    winners = []
    for round_ in range(PROCESS_ROUNDS):
        this_round = [o for o in outcomes if o[0] == round_]
        assert len({version for _, _, version, _ in this_round}) == 1, this_round
        won = [writer for _, writer, _, outcome in this_round if outcome == "won"]
        assert len(won) == 1, f"seed {PROCESS_SEED}, round {round_}: {this_round}"
        winners.append((round_, won[0], plan[won[0]][round_]))
    with EventStore.open(db_url, migrate=False) as store:
        assert logged_as_expected(store, stream, winners, after) is None


# --- teeth: the same property catches a planted bug ----------------------------------------------


def naive_retry(append: Callable[..., list[int]]) -> Callable[..., list[int]]:
    """The planted bug: a caller that 'handles' a conflict by appending again at the new head."""

    def retrying(
        self: EventStore, stream_id: str, expected_version: int, new_events: Any, **kw: Any
    ) -> list[int]:
        for _ in range(20):
            try:
                return append(self, stream_id, expected_version, new_events, **kw)
            except ConcurrencyError as conflict:
                expected_version = conflict.actual_version or expected_version
        return append(self, stream_id, expected_version, new_events, **kw)

    return retrying


def test_property_catches_a_caller_that_retries_a_conflict_at_the_new_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    racing = Writers(f"sqlite:///{tmp_path / 'p6.db'}")
    monkeypatch.setattr(EventStore, "append", naive_retry(EventStore.append))
    try:
        plan = find(plans, lambda plan: violation(racing, plan) is not None, settings=hunt(50))
        problem = violation(racing, plan)
        assert problem is not None
        assert "won" in problem
    finally:
        racing.close()
