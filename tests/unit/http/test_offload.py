"""Store calls and work on large inputs off the event loop (engine/http/offload.py): which thread a
call runs on, what it sees, and that a call started always finishes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cardfence.engine.http.offload import POSTGRES_WORKERS, SMALL_INPUT, StoreCalls, sized_work

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def store_like(dialect: str, database: str | None) -> Any:
    """What StoreCalls reads of a store: its dialect and database."""
    url = SimpleNamespace(database=database)
    return SimpleNamespace(engine=SimpleNamespace(dialect=SimpleNamespace(name=dialect), url=url))


@pytest.mark.parametrize(
    ("dialect", "database", "workers"),
    [
        ("sqlite", None, 0),
        ("sqlite", "", 0),
        ("sqlite", ":memory:", 0),
        ("sqlite", "/var/lib/cardfence/store.db", 1),
        ("postgresql", "cardfence", 4),
    ],
)
def test_workers_are_none_for_memory_one_for_a_sqlite_file_four_for_postgresql(
    dialect: str, database: str | None, workers: int
) -> None:
    calls = StoreCalls(store_like(dialect, database))
    try:
        assert calls.workers == workers
    finally:
        calls.close()
    assert POSTGRES_WORKERS == 4


async def test_a_call_runs_on_a_named_store_thread_with_the_callers_context() -> None:
    calls = StoreCalls(store_like("sqlite", "/tmp/x.db"))
    SEEN.set("the caller's")
    try:
        name, seen = await calls.run(lambda: (threading.current_thread().name, SEEN.get()))
    finally:
        calls.close()
    assert name.startswith("cardfence-store")
    assert name != threading.current_thread().name
    assert seen == "the caller's"


async def test_a_call_passes_its_arguments_and_returns_its_result() -> None:
    calls = StoreCalls(store_like("postgresql", "db"))
    try:
        assert await calls.run(lambda a, *, b: (a, b), 1, b=2) == (1, 2)
    finally:
        calls.close()


async def test_without_workers_a_call_runs_in_place() -> None:
    calls = StoreCalls(store_like("sqlite", ":memory:"))
    here = threading.current_thread().name
    assert await calls.run(lambda a, *, b: (threading.current_thread().name, a, b), 1, b=2) == (
        here,
        1,
        2,
    )
    calls.close()  # nothing to stop


async def test_more_workers_than_the_default_when_asked() -> None:
    calls = StoreCalls(store_like("sqlite", ":memory:"), workers=3)
    names: set[str] = set()
    barrier = threading.Barrier(3, timeout=5)

    def meet() -> None:
        names.add(threading.current_thread().name)
        barrier.wait()  # three calls at once: three threads

    try:
        await asyncio.gather(*(calls.run(meet) for _ in range(3)))
    finally:
        calls.close()
    assert calls.workers == 3
    assert len(names) == 3


async def test_a_call_started_finishes_when_its_awaiter_is_cancelled_and_close_waits_for_it() -> (
    None
):
    calls = StoreCalls(store_like("sqlite", "/tmp/x.db"))
    started, done = threading.Event(), threading.Event()

    def commit() -> None:
        started.set()
        time.sleep(0.2)
        done.set()

    waiting = asyncio.ensure_future(calls.run(commit))
    while not started.is_set():
        await asyncio.sleep(0.005)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not done.is_set()
    calls.close()
    assert done.is_set()


@pytest.mark.parametrize(
    ("size", "moved"), [(0, False), (SMALL_INPUT, False), (SMALL_INPUT + 1, True)]
)
async def test_work_on_an_input_over_32_kib_moves_to_a_thread(size: int, moved: bool) -> None:
    assert SMALL_INPUT == 32 * 1024
    here = threading.current_thread()
    thread, value = await sized_work(
        size, lambda a, *, b: (threading.current_thread(), (a, b)), "a", b="b"
    )
    assert (thread is not here, value) == (moved, ("a", "b"))
