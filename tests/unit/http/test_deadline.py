"""The deadline every request ends by (engine/http/deadline.py, R16): nested, the earlier wins, and
it
follows the code into the tasks it starts."""

from __future__ import annotations

import asyncio
import math
import time

from cardfence.engine.http import deadline


def test_without_a_deadline_a_request_takes_its_own_timeout() -> None:
    assert deadline.current() is None
    assert deadline.left() == math.inf
    assert deadline.left(7.0) == 7.0


def test_within_sets_a_deadline_that_many_seconds_from_now_and_ends_with_the_block() -> None:
    before = time.monotonic()
    with deadline.within(10.0) as set_:
        after = time.monotonic()
        assert set_ == deadline.current()
        assert set_ is not None
        assert before + 10.0 <= set_ <= after + 10.0
        assert 9.0 < deadline.left() <= 10.0
        assert deadline.left(2.0) == 2.0  # the request's own timeout, when it is shorter
    assert deadline.current() is None


def test_the_time_left_goes_to_zero_and_below_once_the_deadline_passed() -> None:
    with deadline.until(time.monotonic() - 1.0):
        assert deadline.left(5.0) < -0.9


def test_deadlines_nest_and_the_earlier_one_wins() -> None:
    now = time.monotonic()
    with deadline.until(now + 10) as outer:
        with deadline.until(now + 20) as later:
            assert (later, deadline.current()) == (outer, now + 10)
        with deadline.until(now + 5) as earlier:
            assert earlier == deadline.current() == now + 5
        with deadline.until(None) as unchanged:
            assert unchanged == deadline.current() == now + 10
        with deadline.within(None) as unchanged:
            assert unchanged == now + 10
        assert deadline.current() == now + 10
    with deadline.until(None) as none:
        assert none is None
        assert deadline.current() is None


async def test_a_deadline_follows_the_code_into_the_tasks_it_starts() -> None:
    async def seen() -> float | None:
        return deadline.current()

    with deadline.within(30.0) as set_:
        assert await asyncio.create_task(seen()) == set_
    assert await asyncio.create_task(seen()) is None


def test_a_deadline_is_put_back_when_its_block_raises() -> None:
    try:
        with deadline.within(1.0):
            raise ValueError("boom")
    except ValueError:
        pass
    assert deadline.current() is None
