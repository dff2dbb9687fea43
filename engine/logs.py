"""The decision log of ``cardfence serve``: one JSON line per decision, written by a thread of
its own.

A process that writes its log on the event loop stops when the log's reader does: stderr is a
pipe to a collector (journald, a container runtime, a shell), and once the pipe's buffer (64 KiB
on Linux) is full, every write waits -- every delivery, poll and append with it. So the
threads that decide (the event loop, the store workers) only hand each record over
(:class:`DecisionLog`), never waiting: at most ``capacity`` records wait their turn, a record that
finds no room is counted and dropped, and once there is room again (at the latest when the log
stops) a line says how many were.
The writer thread formats and writes them in order.
"""

from __future__ import annotations

import copy
import json
import logging
import queue
import threading
import time
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["DecisionLog", "JsonLines"]

_FIELDS = ("task", "event", "reason", "status", "outcome", "tasks", "source", "error")


class JsonLines(logging.Formatter):
    """One JSON object per log line: time, level, logger, message, and the decision's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(line, default=str)


class DecisionLog:
    """Records handed to a writer thread that writes them to ``stream`` as :class:`JsonLines`;
    :attr:`handler` is the handler to log through. :meth:`start` it, :meth:`stop` it."""

    def __init__(self, stream: IO[str], *, capacity: int = 10_000) -> None:
        self._queue: queue.Queue[logging.LogRecord | None] = queue.Queue(capacity)
        self.handler = _Handover(self._queue)
        self._writer = logging.StreamHandler(stream)
        self._writer.setFormatter(JsonLines())
        # A daemon: a writer stuck on a stream nobody reads never keeps the process alive.
        self._thread = threading.Thread(target=self._write, name="cardfence-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Write what is waiting, then end the writer; ``False`` when ``stream`` took no more
        within ``timeout`` seconds (what still waits is lost with the process)."""
        if not self._thread.is_alive():
            return self._thread.ident is not None  # ended already, or never started
        deadline = time.monotonic() + timeout  # one budget for the whole stop
        try:
            self._say_dropped(timeout)  # no record may come after them to say them
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _say_dropped(self, timeout: float) -> None:
        with self.handler.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            count, self.handler.dropped = self.handler.dropped, 0
        if not count:
            return
        try:
            self._queue.put(_dropped(count), timeout=timeout)
        except queue.Full:
            with self.handler.lock:  # type: ignore[union-attr]
                self.handler.dropped += count  # still to be said
            raise

    def _write(self) -> None:
        while (record := self._queue.get()) is not None:
            self._writer.handle(record)


class _Handover(logging.Handler):
    """Hands each record to the writer without waiting; counts those that found no room."""

    def __init__(self, waiting: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__()
        self._queue = waiting
        self.dropped = 0  # changed under the handler's lock (Handler.handle holds it)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.dropped and self._offer(_dropped(self.dropped)):
                self.dropped = 0
            if not self._offer(_ready(record)):
                self.dropped += 1
        except Exception:  # a message whose arguments do not format, as logging reports it
            self.handleError(record)

    def _offer(self, record: logging.LogRecord) -> bool:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            return False
        return True


def _ready(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` as the writer needs it, made here: its message with its arguments, and the
    last line of its exception (the traceback, and the frames it holds, are let go)."""
    ready = copy.copy(record)
    ready.msg, ready.args = record.getMessage(), None
    if record.exc_info:
        ready.error = logging.Formatter().formatException(record.exc_info).splitlines()[-1]
        ready.exc_info = ready.exc_text = None
    return ready


def _dropped(count: int) -> logging.LogRecord:
    message = f"{count} log lines dropped: the log was not read as fast as it was written"
    return logging.LogRecord(__name__, logging.WARNING, __file__, 0, message, None, None)
