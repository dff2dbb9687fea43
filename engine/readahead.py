"""Reading an async source ahead of the one handling its items, in batches of what is ready.

A stream's events arrive while the last one is being recorded (a store call, a round trip on
PostgreSQL): an agent streaming a model's answer sends tokens faster than one append each can
keep up with. :func:`ready_batches` keeps reading meanwhile and hands over, each time, every
item that has arrived -- one when the handler keeps up, a burst when it does not -- so a burst
can be recorded at once (:func:`engine.observations.coalesced`). Items keep their order; an
error the source ends with is raised after the items that came before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final, Generic, TypeVar

__all__ = ["MOST_READ_AHEAD", "ready_batches"]

_T = TypeVar("_T")

MOST_READ_AHEAD: Final = 256
"""Items read ahead at most (and in one batch): the reader waits when the handler is this far
behind, so a fast source is held back by the handler, not buffered without bound."""


class _Item(Generic[_T]):
    __slots__ = ("value",)

    def __init__(self, value: _T) -> None:
        self.value = value


class _End:
    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        self.error = error


async def ready_batches(
    source: AsyncIterator[_T], most: int = MOST_READ_AHEAD
) -> AsyncGenerator[list[_T], None]:
    """``source``'s items in order, in lists of those that came while the previous list was
    being handled (at most ``most`` in a list, never empty). Close it (``aclosing``) to stop
    reading: the reader is cancelled and waited for, so ``source`` may then be closed."""
    queue: asyncio.Queue[_Item[_T] | _End] = asyncio.Queue(maxsize=most)

    async def read() -> None:
        try:
            async for value in source:
                await queue.put(_Item(value))
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
                if len(batch) == most or queue.empty():
                    break
                entry = queue.get_nowait()
            if batch:
                yield batch
            if isinstance(entry, _End):
                if entry.error is not None:
                    raise entry.error
                return
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
