"""The deadline every request must end by (R16: a command's ``--timeout`` bounds every request
it makes; no fixed per-request timeout outlives it).

A caller sets a deadline around what it runs (:func:`within`, :func:`until`); each request then
takes :func:`left` of it as its timeout: the smaller of its own fixed timeout and the time that
remains. Deadlines nest, the earlier one wins, and they follow the code into the tasks it starts
(a context variable), so card reads, A2A requests and background card checks all end by the
command's deadline. The time is ``time.monotonic``: deadlines bound real requests, whatever clock
an engine schedules its polls by.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["current", "left", "until", "within"]

_DEADLINE: ContextVar[float | None] = ContextVar("cardfence_deadline", default=None)


def current() -> float | None:
    """The deadline in force (a ``time.monotonic`` value), or None when there is none."""
    return _DEADLINE.get()


def left(default: float = float("inf")) -> float:
    """The timeout of a request starting now: ``default``, cut to the time left before the
    deadline (zero or less once it has passed)."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return default
    return min(default, deadline - time.monotonic())


@contextmanager
def until(deadline: float | None) -> Iterator[float | None]:
    """Run the block under ``deadline`` (a ``time.monotonic`` value; None: no new deadline), or
    under the deadline already in force if that one is earlier. Yields the deadline in force."""
    outer = _DEADLINE.get()
    effective = deadline if outer is None else outer if deadline is None else min(outer, deadline)
    token = _DEADLINE.set(effective)
    try:
        yield effective
    finally:
        _DEADLINE.reset(token)


@contextmanager
def within(seconds: float | None) -> Iterator[float | None]:
    """Run the block with ``seconds`` from now as its deadline (see :func:`until`)."""
    with until(None if seconds is None else time.monotonic() + seconds) as deadline:
        yield deadline
