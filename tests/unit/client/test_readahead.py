"""Reading a stream ahead of the one recording it (engine.readahead.ready_batches): what came
while the last batch was handled is handed over at once, in order, at most ``most`` at a time;
an error the source ends with comes after the items before it; closing stops the reader, so
the source can be closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import pytest

from cardfence.engine.client._readahead import ready_batches


async def _settle() -> None:
    """Let the reader take whatever the source has ready (no I/O: a few loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_what_came_while_the_last_batch_was_handled_is_one_batch_in_order() -> None:
    gate = asyncio.Event()

    async def source() -> AsyncIterator[int]:
        yield 1
        await gate.wait()
        for n in (2, 3, 4):
            yield n

    batches = []
    async with aclosing(ready_batches(source())) as reading:
        async for batch in reading:
            batches.append(batch)
            if batch == [1]:
                gate.set()
                await _settle()  # recording the first: 2, 3 and 4 arrive meanwhile
    assert batches == [[1], [2, 3, 4]]


async def test_a_handler_that_keeps_up_gets_each_item_as_it_comes() -> None:
    async def source() -> AsyncIterator[int]:
        for n in range(3):
            await asyncio.sleep(0.01)
            yield n

    async with aclosing(ready_batches(source())) as reading:
        assert [batch async for batch in reading] == [[0], [1], [2]]


async def test_a_batch_holds_at_most_most_and_the_reader_waits_for_the_handler() -> None:
    read: list[int] = []

    async def source() -> AsyncIterator[int]:
        for n in range(10):
            read.append(n)
            yield n

    batches = []
    async with aclosing(ready_batches(source(), most=3)) as reading:
        async for batch in reading:
            await _settle()
            # The reader is at most `most` ahead of what was handed over (plus the one it holds).
            assert len(read) <= sum(map(len, batches)) + len(batch) + 3 + 1
            batches.append(batch)
    assert all(1 <= len(batch) <= 3 for batch in batches)
    assert [n for batch in batches for n in batch] == list(range(10))


async def test_an_error_the_source_ends_with_comes_after_the_items_before_it() -> None:
    async def source() -> AsyncIterator[int]:
        yield 1
        yield 2
        raise ConnectionResetError("the stream was cut")

    got: list[int] = []

    async def read_all() -> None:
        async with aclosing(ready_batches(source())) as reading:
            async for batch in reading:
                got.extend(batch)

    with pytest.raises(ConnectionResetError, match="cut"):
        await read_all()
    assert got == [1, 2]


async def test_closing_stops_the_reader_so_the_source_can_be_closed() -> None:
    closed = asyncio.Event()

    async def waiting() -> AsyncIterator[int]:
        try:
            yield 0
            await asyncio.Event().wait()  # the reader waits in here for the next item
            yield 1
        finally:
            closed.set()

    source = waiting()
    async with aclosing(ready_batches(source)) as reading:
        async for batch in reading:
            assert batch == [0]
            break
    assert closed.is_set()  # the reader was cancelled where it waited, and waited for
    await source.aclose()  # nobody is iterating it: no "already running"


async def test_the_reader_holds_back_past_the_bytes_read_ahead() -> None:
    read: list[int] = []

    async def source() -> AsyncIterator[int]:
        for n in range(6):
            read.append(n)
            yield n

    batches: list[list[int]] = []
    async with aclosing(ready_batches(source(), weigh=lambda _: 400, most_bytes=1000)) as reading:
        async for batch in reading:
            batches.append(batch)
            await _settle()  # handling it: the reader goes on as far as it may
            # Two queued (800 bytes: a third would pass 1000) and one read, in hand.
            assert len(read) <= sum(map(len, batches)) + 3
    assert [n for batch in batches for n in batch] == list(range(6))
    assert max(map(len, batches)) == 2  # never more than 1000 bytes handed over at once


async def test_an_item_heavier_than_the_bound_is_let_through_alone() -> None:
    async def source() -> AsyncIterator[int]:
        for n in range(3):
            yield n

    async with aclosing(ready_batches(source(), weigh=lambda _: 5000, most_bytes=1000)) as reading:
        got = [n async for batch in reading for n in batch]
    assert got == [0, 1, 2]


async def _batches_after_a_gate(
    later: list[bytes], *, weigh: Callable[[bytes], int] | None = None, most_bytes: int
) -> list[list[bytes]]:
    """The batches of a source that yields ``b"a"``, then -- once the first batch is in hand --
    every item of ``later`` at once."""
    gate = asyncio.Event()

    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        await gate.wait()
        for item in later:
            yield item

    batches: list[list[bytes]] = []
    async with aclosing(ready_batches(source(), weigh=weigh, most_bytes=most_bytes)) as reading:
        async for batch in reading:
            batches.append(batch)
            gate.set()
            await _settle()
    return batches


async def test_items_weighing_exactly_the_bytes_bound_go_together_and_no_more() -> None:
    half = b"x" * 500
    batches = await _batches_after_a_gate([half, half, half], weigh=len, most_bytes=1000)
    assert [[len(item) for item in batch] for batch in batches] == [[1], [500, 500], [500]]


async def test_without_weigh_only_the_count_bounds_what_is_read_ahead() -> None:
    batches = await _batches_after_a_gate([b"b", b"c", b"d"], most_bytes=1)
    assert batches == [[b"a"], [b"b", b"c", b"d"]]
