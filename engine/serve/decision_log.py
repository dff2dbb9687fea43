"""The decision log of ``cardfence serve``: one JSON line per decision, written by a thread of
its own.

A process that writes its log on the event loop stops when the log's reader does: stderr is a
pipe to a collector (journald, a container runtime, a shell), and once the pipe's buffer (64 KiB
on Linux) is full, every write waits -- every delivery, poll and append with it. So the
threads that decide (the event loop, the store workers) only hand each record over
(:class:`DecisionLog`), never waiting: at most ``capacity`` lines wait their turn, a line that
finds no room is counted and dropped, and once there is room again (at the latest when the log
stops) a line says how many were.
Each record is made its line where it is logged; the writer thread writes the lines in order,
those waiting together (one write and one flush for many lines).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["DecisionLog", "JsonLines"]

_FIELDS = ("task", "event", "reason", "status", "outcome", "tasks", "source", "error")
_BATCH = 1_000  # lines written at once, at most
_LINGER = 0.005  # seconds the writer waits after a write for the next lines to gather


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
        if record.exc_info and record.exc_info[1] is not None:
            line["error"] = _error_line(record.exc_info[1])
        return json.dumps(line, default=str)


def _error_line(error: BaseException) -> str:
    """``Type: message`` on one line; a group's (a task group that failed) with its members',
    which say what went wrong (the traceback's last line of a group is only its frame)."""
    line = " ".join("".join(traceback.format_exception_only(error)).split())
    if isinstance(error, BaseExceptionGroup):
        line += " [" + "; ".join(map(_error_line, error.exceptions)) + "]"
    return line


class DecisionLog:
    """Records handed to a writer thread that writes them to ``stream`` as :class:`JsonLines`;
    :attr:`handler` is the handler to log through. :meth:`start` it, :meth:`stop` it.

    A record is made its line where it is logged (formatting is CPU either thread pays for, and
    a line holds no reference to the frames of an exception); the writer writes the lines that
    are waiting together, one write and one flush for all of them, then lingers a moment so
    that the next ones gather: one wake-up for many lines, not one a line.
    """

    def __init__(self, stream: IO[str], *, capacity: int = 10_000) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue(capacity)
        self.handler = _Handover(self._queue)
        self.handler.setFormatter(JsonLines())
        self._stream = stream
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
            self._queue.put(self.handler.format(_dropped(count)), timeout=timeout)
        except queue.Full:
            with self.handler.lock:  # type: ignore[union-attr]
                self.handler.dropped += count  # still to be said
            raise

    def _write(self) -> None:
        while True:
            lines = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(lines) < _BATCH:
                    lines.append(self._queue.get_nowait())
            ended = None in lines
            if ended:
                lines = lines[: lines.index(None)]
            if lines:
                self._put("".join(f"{line}\n" for line in lines))
            if ended:
                return
            time.sleep(_LINGER)

    def _put(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except Exception:  # a stream that broke: reported as logging reports its own failures
            if logging.raiseExceptions:
                with contextlib.suppress(Exception):
                    traceback.print_exc(file=sys.stderr)


class _Handover(logging.Handler):
    """Makes each record its line and hands it to the writer without waiting; counts those that
    found no room."""

    def __init__(self, waiting: queue.Queue[str | None]) -> None:
        super().__init__()
        self._queue = waiting
        self.dropped = 0  # changed under the handler's lock (Handler.handle holds it)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.dropped and self._offer(self.format(_dropped(self.dropped))):
                self.dropped = 0
            if not self._offer(self.format(record)):
                self.dropped += 1
        except Exception:  # a message whose arguments do not format, as logging reports it
            self.handleError(record)

    def _offer(self, line: str) -> bool:
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            return False
        return True


def _dropped(count: int) -> logging.LogRecord:
    message = f"{count} log lines dropped: the log was not read as fast as it was written"
    return logging.LogRecord(__name__, logging.WARNING, __file__, 0, message, None, None)
