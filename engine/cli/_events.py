"""``cardfence events``: the global log in order, one JSON line per event (``docs/cli.md``).

A feed for an audit sink or a message bus without dual writes: each line is one event as
stored (position, stream, version, type, recorded_at, data), in global position order.
``--follow`` keeps tailing; the store's ordering guarantee (no commit ever lands below a
position a reader has seen: ``store/event_store.py``) is what makes "never skips a late commit"
hold, so the tail only has to ask for what comes after the last position it printed. SIGINT and
SIGTERM stop a follow cleanly between two reads, exit 0: it is how a follow ends.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Annotated, Any

import typer

from cardfence.engine.cli._app import (
    DbOption,
    DebugOption,
    JsonOption,
    OutputError,
    app,
    check_seconds,
    open_store,
    options_of,
    silence_stdout,
)
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent

__all__ = ["event_line", "events_command"]

_PAGE = 1000  # events read per query
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def event_line(event: RecordedEvent) -> dict[str, Any]:
    """One event as ``events`` prints it."""
    return {
        "position": event.position,
        "stream": event.stream_id,
        "version": event.version,
        "type": event.type,
        "recorded_at": event.recorded_at.isoformat(),
        "data": event.data,
    }


@app.command("events")
def events_command(
    ctx: typer.Context,
    after: Annotated[
        int, typer.Option("--after", min=0, help="Start after this global position.")
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep tailing; SIGINT or SIGTERM stops it.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between reads while following.")
    ] = 0.2,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Print the global log in order, one JSON line per event; --follow keeps tailing."""
    options = options_of(ctx, db, json_, debug)
    check_seconds("--interval", interval)
    store = open_store(options, existing=True)
    with store, _stoppable() as stopped:
        position = after
        while True:
            position = _print_after(store, position)
            if not follow or stopped.wait(interval):
                return


def _print_after(store: EventStore, position: int) -> int:
    """Print every event after ``position``; returns the last position printed."""
    while True:
        page = store.read_all(after=position, limit=_PAGE)
        for event in page:
            _write(json.dumps(event_line(event), separators=(",", ":")))
            position = event.position
        if len(page) < _PAGE:
            _flush()
            return position


def _write(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
    except OSError as failure:
        silence_stdout()
        raise OutputError(f"cannot write stdout: {failure}") from None


def _flush() -> None:
    try:
        sys.stdout.flush()
    except OSError as failure:
        silence_stdout()
        raise OutputError(f"cannot write stdout: {failure}") from None


@contextmanager
def _stoppable() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM (in the main thread): the follow ends at its next
    wait, after the page in hand is printed whole."""
    stopped = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopped.set()

    for sig in _SIGNALS:
        signal.signal(sig, stop)
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
