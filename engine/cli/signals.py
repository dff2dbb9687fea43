"""SIGINT and SIGTERM on the command line: exit 130 with the step in hand finished.

While a command drives tasks (its coroutine is registered with :func:`cancellable`), a signal
cancels that coroutine at its next ``await``. Store appends are synchronous calls between two
awaits, so the one in flight always commits or rolls back whole before the cancellation lands.
The command then raises :class:`~cardfence.engine.cli.app.Interrupted`, saying what it left.
Outside such a coroutine (opening the store, reading it, printing) the signal raises
``KeyboardInterrupt`` at once: those steps only read, or write in one transaction that rolls back.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    received: str | None = None
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None


def received() -> str | None:
    """The name of the first signal received by this command (``SIGINT``, ``SIGTERM``), if any."""
    return _State.received


@contextmanager
def handled() -> Iterator[None]:
    """Handle SIGINT and SIGTERM for the run of one command (only in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _State.received = None
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _State.loop = _State.task = None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _State.received is None:
        _State.received = signal.Signals(signum).name
    task, loop = _State.task, _State.loop
    if task is not None and loop is not None and not task.done():
        loop.call_soon_threadsafe(task.cancel)  # lands at the next await: no append is cut
        return
    raise KeyboardInterrupt


@contextmanager
def cancellable() -> Iterator[None]:
    """Inside a coroutine: a signal cancels the current task at its next await."""
    _State.task, _State.loop = asyncio.current_task(), asyncio.get_running_loop()
    try:
        yield
    finally:
        _State.task = _State.loop = None


def interrupted_by_us(error: BaseException) -> bool:
    """Whether ``error`` (a cancellation) came from a signal this module handled."""
    return isinstance(error, asyncio.CancelledError | KeyboardInterrupt) and (
        _State.received is not None
    )
