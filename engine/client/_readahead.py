"""Reading an async source ahead of the one handling its items, in batches of what is ready.

A stream's events arrive while the last one is being recorded (a store call, a round trip on
PostgreSQL): an agent streaming a model's answer sends tokens faster than one append each can
keep up with. :func:`ready_batches` keeps reading meanwhile and hands over, each time, every
item that has arrived -- one when the handler keeps up, a burst when it does not -- so a burst
can be recorded at once (:func:`engine.core.observations.coalesced`). Items keep their order; an
error the source ends with is raised after the items that came before it.

What is read ahead is bounded in count and in bytes (R16): the reader waits while the handler
is behind by :data:`MOST_READ_AHEAD` items or :data:`MOST_READ_AHEAD_BYTES` bytes (one item is
always let through, however large), so a fast or hostile agent is held back by the handler,
not buffered without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Final, Generic, TypeVar

__all__ = ["MOST_READ_AHEAD", "MOST_READ_AHEAD_BYTES", "ready_batches"]

_T = TypeVar("_T")

MOST_READ_AHEAD: Final = 256
"""Items read ahead at most (and in one batch)."""

MOST_READ_AHEAD_BYTES: Final = 1024 * 1024
"""Bytes read ahead at most (as ``weigh`` counts them), beyond the one item always let through."""


class _Item(Generic[_T]):
    __slots__ = ("value", "weight")

    def __init__(self, value: _T, weight: int) -> None:
        self.value = value
        self.weight = weight


class _End:
    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        self.error = error


async def ready_batches(
    source: AsyncIterator[_T],
    most: int = MOST_READ_AHEAD,
    *,
    weigh: Callable[[_T], int] | None = None,
    most_bytes: int = MOST_READ_AHEAD_BYTES,
) -> AsyncGenerator[list[_T], None]:
    """``source``'s items in order, in lists of those that came while the previous list was
    being handled (never empty; at most ``most`` items, and past ``most_bytes`` as ``weigh``
    counts them only by one item). Close it (``aclosing``) to stop reading: the reader is
    cancelled and waited for, so ``source`` may then be closed."""
    queue: asyncio.Queue[_Item[_T] | _End] = asyncio.Queue(maxsize=most)
    held = 0  # the bytes in the queue
    taken = asyncio.Event()  # the handler took items since the reader last looked

    async def read() -> None:
        nonlocal held
        try:
            async for value in source:
                weight = weigh(value) if weigh is not None else 0
                while held and held + weight > most_bytes:
                    taken.clear()
                    await taken.wait()
                held += weight
                await queue.put(_Item(value, weight))
        except Exception as error:  # handed over in its place; a cancellation is not
            await queue.put(_End(error))
        else:
            await queue.put(_End(None))

    reader = asyncio.ensure_future(read())
    try:
        while True:
            entry = await queue.get()
            batch: list[_T] = []
            while isinstance(entry, _Item):
                batch.append(entry.value)
                held -= entry.weight
                if len(batch) == most or queue.empty():
                    break
                entry = queue.get_nowait()
            taken.set()
            if batch:
                yield batch
            if isinstance(entry, _End):
                if entry.error is not None:
                    raise entry.error
                return
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
