"""``serve``'s decision log (engine/logs.py): one JSON line per decision, written by a thread of
its own, so a log nobody reads (a pipe whose buffer is full) never holds up the thread that
decided; what found no room is counted and said, never silently lost."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cardfence.engine.logs import DecisionLog


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("cardfence.test-decisions")
    saved = (log.handlers[:], log.level, log.propagate)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log
    log.handlers[:], log.level, log.propagate = saved


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is already full (of blank lines): a write to it waits for a read."""
    reading, writing = os.pipe()
    os.set_blocking(writing, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(writing, b"\n" * 4096)
    os.set_blocking(writing, True)
    return reading, writing


def test_each_decision_is_one_json_line_with_its_fields_in_order(logger: logging.Logger) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    for n in range(3):
        logger.info("applied %s", n, extra={"task": f"t-{n}", "event": "StateChanged"})
    try:
        raise ValueError("broken body")
    except ValueError:
        logger.exception("delivery refused", extra={"task": "t-3", "status": 400})
    assert decisions.stop()

    written = lines(stream.getvalue())
    assert [(w["message"], w["task"]) for w in written] == [
        ("applied 0", "t-0"), ("applied 1", "t-1"), ("applied 2", "t-2"),
        ("delivery refused", "t-3"),
    ]  # fmt: skip
    assert written[0]["event"] == "StateChanged"
    assert written[0]["level"] == "info"
    assert written[3]["error"] == "ValueError: broken body"  # the last line, not the traceback
    assert written[3]["status"] == 400


class Writes(io.StringIO):
    """A stream that counts the writes and flushes made to it."""

    writes = flushes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1


def test_the_lines_waiting_are_written_together_in_one_write_and_one_flush(
    logger: logging.Logger,
) -> None:
    stream = Writes()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    for n in range(100):  # the writer not started yet: all of them wait
        logger.info("applied", extra={"task": f"t-{n:03d}"})
    decisions.start()
    assert decisions.stop()

    assert [w["task"] for w in lines(stream.getvalue())] == [f"t-{n:03d}" for n in range(100)]
    assert (stream.writes, stream.flushes) == (1, 1)


def test_a_log_nobody_reads_never_holds_up_the_thread_that_decided(
    logger: logging.Logger,
) -> None:
    reading, writing = full_pipe()
    os.set_blocking(reading, False)
    stream = os.fdopen(writing, "w", buffering=1)
    decisions = DecisionLog(stream, capacity=50)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    sent = 5_000  # about 600 KB of lines: ten times what the pipe holds

    def decide() -> None:
        for n in range(sent):
            logger.info("applied", extra={"task": f"t-{n:05d}", "reason": "x" * 40})

    decider = threading.Thread(target=decide)
    decider.start()
    decider.join(30)
    assert not decider.is_alive()  # it never waited on the pipe
    assert decisions.handler.dropped > 0  # type: ignore[attr-defined]

    received = b""
    while True:  # the reader catches up: the writer thread finishes what was waiting
        try:
            chunk = os.read(reading, 1 << 16)
        except BlockingIOError:
            if decisions.stop(timeout=1.0):
                break
            continue
        received += chunk
    while True:
        try:
            received += os.read(reading, 1 << 16)
        except BlockingIOError:
            break
    stream.close()
    os.close(reading)

    written = lines(received.decode())
    tasks = [line["task"] for line in written if "task" in line]
    said = [int(line["message"].split()[0]) for line in written if "task" not in line]
    assert said  # the drops were said, at the latest when the log stopped
    assert tasks == sorted(tasks)  # in the order decided, a gap where lines were dropped
    assert len(tasks) + sum(said) == sent  # every line written or counted in one that was


def test_the_lines_dropped_are_counted_in_a_line_once_there_is_room(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream, capacity=2)
    logger.handlers[:] = [decisions.handler]
    for n in range(5):  # the writer not started yet: two wait, three find no room
        logger.info("applied", extra={"task": f"t-{n}"})
    decisions.start()
    deadline = time.monotonic() + 10
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the two waiting are written: there is room again
    logger.info("applied", extra={"task": "t-5"})
    assert decisions.stop()

    written = lines(stream.getvalue())
    assert [w.get("task") for w in written] == ["t-0", "t-1", None, "t-5"]
    assert written[2]["message"].startswith("3 log lines dropped")
    assert written[2]["level"] == "warning"


def test_the_lines_dropped_are_said_when_the_log_stops_with_no_line_after_them(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream, capacity=2)
    logger.handlers[:] = [decisions.handler]
    for n in range(5):  # two wait, three find no room, and nothing is logged after them
        logger.info("applied", extra={"task": f"t-{n}"})
    decisions.start()
    assert decisions.stop()

    written = lines(stream.getvalue())
    assert [w.get("task") for w in written] == ["t-0", "t-1", None]
    assert written[2]["message"].startswith("3 log lines dropped")


def test_stop_gives_up_on_a_stream_that_takes_nothing_more(logger: logging.Logger) -> None:
    reading, writing = full_pipe()
    stream = os.fdopen(writing, "w", buffering=1)
    decisions = DecisionLog(stream, capacity=10)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    for n in range(100):  # the writer waits on the pipe, the queue fills
        logger.info("applied", extra={"task": f"t-{n}", "reason": "x" * 100})

    assert decisions.stop(timeout=0.5) is False  # and the caller goes on
    os.close(reading)  # the writer's wait ends: a broken pipe, each line reported by logging
    assert decisions.stop(timeout=10)
    with contextlib.suppress(BrokenPipeError):
        stream.close()
