"""SIGINT and SIGTERM on the command line: exit 130 with the step in hand finished.

While a command drives tasks (its coroutine is registered with :func:`cancellable`), a signal
cancels that coroutine at its next ``await``. Store appends are synchronous calls between two
awaits, so the one in flight always commits or rolls back whole before the cancellation lands.
The command then raises :class:`~cardfence.engine.cli._app.Interrupted`, saying what it left.
Outside such a coroutine (opening the store, reading it, printing) the signal raises
``KeyboardInterrupt`` at once: those steps only read, or write in one transaction that rolls back.

The console script and ``python -m cardfence`` set these handlers first (:func:`from_start`),
before the command line's own imports: a signal at any moment of the process then ends with the
same ``Interrupted`` line (and ``--json`` document) and exit 130. This module imports nothing
heavy for that reason. While modules load (the command line, or what a command imports later) a
signal is only recorded, and raised once they are in: a ``KeyboardInterrupt`` raised inside an
import can land in a callback of the import machinery, where Python prints it as ignored and goes
on, or in an extension module's initialisation, after which Python ends the process by SIGINT
instead of with its exit code.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

# Not a circle: for start-up time, asyncio loads after the signal handlers are set.
if TYPE_CHECKING:
    import asyncio

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How soon a signal that came inside an import is looked at again.
_RETRY_SECONDS = 0.01


class _State:
    received: str | None = None
    # Outside a coroutine: raise KeyboardInterrupt at once (True; inside an import, shortly
    # after it), or only record the signal (False: ``pending``), for :func:`handled` to raise.
    raising = True
    pending = False
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None


def received() -> str | None:
    """The name of the first signal received by this command (``SIGINT``, ``SIGTERM``), if any."""
    return _State.received


def from_start() -> None:
    """Handle SIGINT and SIGTERM for the whole process, from its first line on: the console
    script's and ``python -m cardfence``'s first step, before anything heavy is imported. Until
    the command line is loaded and its handlers set (:func:`handled`), a signal is only recorded:
    :func:`handled` raises it then, and the command ends as it would have later (exit 130)."""
    _State.received = None
    _State.raising, _State.pending = False, False
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)


@contextmanager
def handled() -> Iterator[None]:
    """Handle SIGINT and SIGTERM for the run of one command (only in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    if previous[signal.SIGINT] is not _on_signal:  # else set from the start: keep what came
        _State.received, _State.pending = None, False
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    raising, _State.raising = _State.raising, True
    try:
        if _State.pending:  # came while the command line loaded: it ends the command here
            _State.pending = False
            raise KeyboardInterrupt
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _State.loop = _State.task = None
        _State.raising = raising
        if previous[signal.SIGINT] is not _on_signal:  # the caller's handlers are back
            _State.pending = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _State.received is None:
        _State.received = signal.Signals(signum).name
    task, loop = _State.task, _State.loop
    if task is not None and loop is not None and not task.done():
        loop.call_soon_threadsafe(task.cancel)  # lands at the next await: no append is cut
        return
    if not _State.raising:
        _State.pending = True
        return
    if _importing(frame):
        _State.pending = True
        _again_soon(signum)
        return
    _State.pending = False
    raise KeyboardInterrupt


def _importing(frame: FrameType | None) -> bool:
    """Whether the main thread is inside the import machinery (see the module docstring)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """Send the signal again to the main thread shortly (a real one, so a wait it is blocked in
    ends too), unless the one recorded was raised meanwhile; to whichever handler is set then
    (serve's, once it is serving), not to the default action of a process ending."""
    main = threading.get_ident()  # the handler runs on the main thread

    def again() -> None:
        if _State.pending and callable(signal.getsignal(signum)):
            signal.pthread_kill(main, signum)

    timer = threading.Timer(_RETRY_SECONDS, again)
    timer.daemon = True
    timer.start()


def after_command() -> None:
    """The command has ended and said so: a signal now changes nothing it did or printed. The
    first is let go (the process exits with the command's code); a second ends the process, in
    case its exit hangs."""

    def let_go(signum: int, _frame: FrameType | None) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    for sig in SIGNALS:
        signal.signal(sig, let_go)


def detail() -> str:
    """What the ``Interrupted`` line says of a command stopped outside its coroutine."""
    name = _State.received or "SIGINT"
    return f"{name} received; nothing was left half-written (the store writes whole transactions)"


@contextmanager
def cancellable() -> Iterator[None]:
    """Inside a coroutine: a signal cancels the current task at its next await."""
    import asyncio

    _State.task, _State.loop = asyncio.current_task(), asyncio.get_running_loop()
    try:
        yield
    finally:
        _State.task = _State.loop = None


def interrupted_by_us(error: BaseException) -> bool:
    """Whether ``error`` (a cancellation) came from a signal this module handled."""
    import asyncio

    return isinstance(error, asyncio.CancelledError | KeyboardInterrupt) and (
        _State.received is not None
    )
