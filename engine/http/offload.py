"""Store calls, and work on large inputs, off the event loop.

The store is synchronous (SQLAlchemy). On PostgreSQL every call is a network round trip, and on a
SQLite file another process may hold the write lock for up to the busy timeout: either would
stall every task the loop drives, and the webhook app's answers with them. :class:`StoreCalls`
runs them on worker threads instead -- one for a SQLite file (its writes take one lock anyway, and
one thread keeps this process's writes from contending with each other), four for PostgreSQL
(:data:`POSTGRES_WORKERS`, within the five connections SQLAlchemy's pool keeps). Appends from
several workers share transactions (the store's group commit); more workers than these did not
apply push deliveries faster (16 on PostgreSQL, 4 on a SQLite file: ``scripts/bench.py push``),
the path being bound by the CPU. An in-memory SQLite database is one connection shared by every
caller, so its calls stay on the loop's thread, one at a time.

A call that was started finishes, even when the coroutine awaiting it is cancelled: each append is
committed or rolled back whole, and :meth:`StoreCalls.close` waits for those in
flight.

Work on a large input is moved too (:func:`sized_work`): decoding a card and its RFC 8785 hashes
and signature checks are pure Python (about 0.13 s for a 700 KB card), and an agent that serves
a large card, changed at every read, must not stall the loop that drives every other task and
answers deliveries. A small input is worked on in place: a thread hop costs more than it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from cardfence.store.event_store import EventStore

__all__ = ["POSTGRES_WORKERS", "SMALL_INPUT", "StoreCalls", "sized_work"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Worker threads for a PostgreSQL store: SQLAlchemy's default pool keeps five connections.
POSTGRES_WORKERS = 4
# The largest input worked on in place by :func:`sized_work` (a card this size parses in ~6 ms).
SMALL_INPUT = 32 * 1024


async def sized_work(
    size: int, work: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
) -> _T:
    """``work(*args, **kwargs)`` on an input of ``size`` bytes: in place when the input is
    small, on a worker thread (the loop's default executor) when it is larger than
    :data:`SMALL_INPUT`, so the loop goes on meanwhile. ``work`` must be safe on any thread."""
    if size <= SMALL_INPUT:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


class StoreCalls:
    """Runs synchronous store calls for coroutines: ``await calls.run(store.stream, sid)``."""

    def __init__(self, store: EventStore, *, workers: int | None = None) -> None:
        dialect = store.engine.dialect.name
        memory = dialect == "sqlite" and store.engine.url.database in (None, "", ":memory:")
        if workers is None:
            workers = 0 if memory else POSTGRES_WORKERS if dialect == "postgresql" else 1
        self.workers = workers
        self._pool = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cardfence-store")
            if workers
            else None
        )

    async def run(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(*args, **kwargs)`` on a worker thread (with this context's variables)."""
        if self._pool is None:
            return fn(*args, **kwargs)
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Wait for the calls in flight, then stop the workers."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
