"""An event loop on a virtual clock, for timing read exactly: its time stands still while there is
work to do, and jumps to the next timer when there is none.

``asyncio.sleep``, ``asyncio.timeout`` and ``call_later`` all schedule by the loop's ``time()``;
here that is a number that moves only when the loop would otherwise wait. So a test of pacing sees
the seconds the code asked for (a poll at 0, 1, 3, 7, ... seconds), with none of them waited out
and nothing left to a loaded machine's scheduling.

What runs on it must do no real waiting of its own: its I/O answered at once (``httpx``'s
``MockTransport``) and its store in memory (an in-memory SQLite store's calls run inline on the
loop, :class:`~cardfence.engine.http.offload.StoreCalls`). A thread's work would take no virtual
time
at all, and a socket read the loop waits on with a timer due would be cut short by the jump.
The deadline every request ends by (:mod:`cardfence.engine.http.deadline`) reads the same clock
while
:func:`virtual_deadlines` is in force.

:class:`Clock` is the simpler kind, for code that is handed a clock: it reads what the test set.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import types
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.http import deadline
from cardfence.store.event_store import EventStore

_T = TypeVar("_T")


class Clock:
    """A monotonic clock the test moves by hand: it reads :attr:`now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Jumping:
    """The loop's selector: answers at once; with nothing ready, moves the clock by the timeout
    instead of waiting it out."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._inner = inner
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._inner.select(None)  # no timer at all: only real I/O can come
        # To the first timer's own time, not now + timeout: the sum may round to a hair before
        # it, and a wait cut in two by a wake-up must end where the whole one would.
        loop, timers = self._loop, self._loop._scheduled
        loop.now = max(loop.now, timers[0].when()) if timers else loop.now + timeout
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is :attr:`now`, which starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self._selector = _Jumping(self._selector, self)

    def time(self) -> float:
        return self.now


def run_virtual(job: Awaitable[_T]) -> _T:
    """Run ``job`` to its end on a fresh :class:`VirtualTimeLoop`; its result."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(job)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@contextlib.asynccontextmanager
async def virtual_engine(
    agent: httpx.AsyncBaseTransport, config: EngineConfig
) -> AsyncIterator[Engine]:
    """An engine on an in-memory store (its calls inline: no thread takes real time),
    scheduling by the running loop's clock, its requests answered by ``agent``."""
    clock = asyncio.get_running_loop().time
    with EventStore.open("sqlite://") as store:
        async with (
            httpx.AsyncClient(transport=agent) as client,
            Engine(store, client, config, clock=clock) as engine,
        ):
            yield engine


@contextlib.contextmanager
def virtual_deadlines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Deadlines read the running loop's clock (on a :class:`VirtualTimeLoop`, the virtual one)
    instead of ``time.monotonic``."""

    def monotonic() -> float:
        return asyncio.get_running_loop().time()

    with monkeypatch.context() as patch:
        patch.setattr(deadline, "time", types.SimpleNamespace(monotonic=monotonic))
        yield
