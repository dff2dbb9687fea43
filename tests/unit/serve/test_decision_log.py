"""``serve``'s decision log (engine/serve/decision_log.py): one JSON line per decision, written by
a thread of
its own, so a log nobody reads (a pipe whose buffer is full) never holds up the thread that
decided; what found no room is counted and said, never silently lost."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from cardfence.engine.serve.decision_log import DecisionLog


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


def test_a_failure_of_a_task_group_is_logged_as_the_errors_it_holds(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    try:
        raise ExceptionGroup("unhandled errors in a TaskGroup", [OverflowError("port 0-65535")])
    except ExceptionGroup:
        logger.exception("step failed", extra={"task": "t-1", "event": "StepFailed"})
    assert decisions.stop()

    [written] = lines(stream.getvalue())
    assert written["error"] == (
        "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception) "
        "[OverflowError: port 0-65535]"
    )  # not the group's last traceback line, "+------------------------------------"


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


# -- each line whole, the writer's batches, stop's bounds ------------------------------------------


class Unserialisable:
    def __str__(self) -> str:
        return "a value JSON cannot hold"


def test_a_line_holds_its_utc_time_level_logger_message_and_fields_written_as_text(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    logger.warning("kept %s", "as text", extra={"task": "t-1", "reason": Unserialisable()})
    assert decisions.stop()

    (written,) = lines(stream.getvalue())
    time_ = written.pop("time")
    assert written == {
        "level": "warning",
        "logger": "cardfence.test-decisions",
        "message": "kept as text",
        "task": "t-1",
        "reason": "a value JSON cannot hold",
    }
    assert time_.endswith("+00:00")  # UTC, whatever the machine's zone
    assert abs(datetime.fromisoformat(time_).timestamp() - time.time()) < 60


def test_the_writer_is_a_daemon_thread_named_for_the_log() -> None:
    decisions = DecisionLog(io.StringIO())
    decisions.start()
    try:
        (writer,) = [t for t in threading.enumerate() if t.name == "cardfence-log"]
        assert writer.daemon  # a writer stuck on a stream nobody reads never keeps us alive
    finally:
        assert decisions.stop()


def test_ten_thousand_lines_wait_by_default_and_the_next_is_dropped(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    for n in range(10_001):  # the writer not started yet
        logger.info("applied", extra={"task": f"t-{n}"})
    assert decisions.handler.dropped == 1  # type: ignore[attr-defined]
    decisions.start()
    assert decisions.stop()
    written = lines(stream.getvalue())
    assert len(written) == 10_001
    assert written[-1]["message"].startswith("1 log lines dropped")
    assert decisions.handler.dropped == 0  # type: ignore[attr-defined]  # said, so reset


def test_at_most_a_thousand_lines_are_written_at_once(logger: logging.Logger) -> None:
    class Texts(io.StringIO):
        texts: list[str]

        def write(self, text: str) -> int:
            self.texts.append(text)
            return super().write(text)

    stream = Texts()
    stream.texts = []
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    for n in range(2_500):
        logger.info("applied", extra={"task": f"t-{n}"})
    decisions.start()
    assert decisions.stop()
    assert [text.count("\n") for text in stream.texts] == [1_000, 1_000, 500]


def test_stop_says_whether_the_writer_ended() -> None:
    never_started = DecisionLog(io.StringIO())
    assert never_started.stop() is False
    stopped = DecisionLog(io.StringIO())
    stopped.start()
    assert stopped.stop() is True
    assert stopped.stop() is True  # ended already


@contextlib.contextmanager
def stuck_writer(capacity: int) -> Iterator[tuple[DecisionLog, logging.Logger]]:
    """A log whose writer waits on a full pipe, holding one line; nothing in its queue yet."""
    reading, writing = full_pipe()
    stream = os.fdopen(writing, "w", buffering=1)
    decisions = DecisionLog(stream, capacity=capacity)
    log = logging.getLogger("cardfence.test-stuck")
    saved = (log.handlers[:], log.level, log.propagate)
    log.handlers[:], log.propagate = [decisions.handler], False
    log.setLevel(logging.INFO)
    decisions.start()
    log.info("taken by the writer", extra={"reason": "x" * 8192})
    deadline = time.monotonic() + 10
    while decisions._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the writer is in its write, on the pipe nobody reads
    try:
        yield decisions, log
    finally:
        os.close(reading)  # the write fails: the writer goes on and ends
        assert decisions.stop(timeout=10)
        log.handlers[:], log.level, log.propagate = saved
        with contextlib.suppress(BrokenPipeError):
            stream.close()


def _stop_in_time(decisions: DecisionLog, timeout: float) -> tuple[bool | None, float]:
    """``decisions.stop(timeout)`` on a thread of its own (so a stop that never returns fails
    the test instead of hanging it): what it returned (None: still running after 5 s), and
    how long it took."""
    outcome: list[bool] = []
    started = time.monotonic()
    stopper = threading.Thread(target=lambda: outcome.append(decisions.stop(timeout)))
    stopper.start()
    stopper.join(5)
    return (outcome[0] if outcome else None), time.monotonic() - started


def test_stop_gives_up_within_its_timeout_when_the_queue_stays_full(
    logger: logging.Logger,
) -> None:
    with stuck_writer(capacity=1) as (decisions, log):
        log.info("waits in the queue")
        returned, took = _stop_in_time(decisions, 0.2)
        assert (returned, took < 0.8) == (False, True)


def test_stop_gives_up_within_its_timeout_when_the_writer_never_ends(
    logger: logging.Logger,
) -> None:
    with stuck_writer(capacity=5) as (decisions, _):  # room for the end mark, no end to it
        returned, took = _stop_in_time(decisions, 0.2)
        assert (returned, took < 0.8) == (False, True)


def test_lines_dropped_that_stop_could_not_say_are_kept_to_say_with_those_dropped_meanwhile(
    logger: logging.Logger,
) -> None:
    with stuck_writer(capacity=1) as (decisions, log):
        log.info("waits in the queue")
        log.info("dropped: no room")
        later = threading.Timer(0.1, lambda: log.info("dropped while stop waits"))
        later.start()
        returned, took = _stop_in_time(decisions, 0.3)
        later.join()
        assert (returned, took < 0.9) == (False, True)
        assert decisions.handler.dropped == 2  # type: ignore[attr-defined]


def test_a_stream_that_fails_and_a_report_that_fails_stop_no_later_line(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FailsOnce(io.StringIO):
        failed = False

        def write(self, text: str) -> int:
            if not self.failed:
                self.failed = True
                raise OSError("disk full")
            return super().write(text)

    class Unwritable:
        def write(self, text: str) -> int:
            raise OSError("stderr is closed")

        def flush(self) -> None:
            raise OSError("stderr is closed")

    monkeypatch.setattr(sys, "stderr", Unwritable())
    stream = FailsOnce()
    decisions = DecisionLog(stream)
    logger.handlers[:] = [decisions.handler]
    decisions.start()
    logger.info("lost with the failed write")
    deadline = time.monotonic() + 10
    while not stream.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    logger.info("written after it")
    assert decisions.stop()
    assert [w["message"] for w in lines(stream.getvalue())] == ["written after it"]


def test_a_message_that_does_not_format_is_reported_as_logging_reports_it(
    logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    decisions = DecisionLog(io.StringIO())
    logger.handlers[:] = [decisions.handler]
    logger.info("%d tasks", "many")  # the caller goes on
    report = capsys.readouterr().err
    assert "--- Logging error ---" in report
    assert "Message: '%d tasks'\nArguments: ('many',)" in report
    assert decisions.handler.dropped == 0  # type: ignore[attr-defined]


def test_a_line_saying_lines_were_dropped_comes_from_the_log_itself(
    logger: logging.Logger,
) -> None:
    stream = io.StringIO()
    decisions = DecisionLog(stream, capacity=1)
    logger.handlers[:] = [decisions.handler]
    logger.info("waits")
    logger.info("dropped")
    decisions.start()
    assert decisions.stop()
    said = lines(stream.getvalue())[-1]
    assert (said["logger"], said["level"]) == ("cardfence.engine.serve.decision_log", "warning")
    assert said["message"] == (
        "1 log lines dropped: the log was not read as fast as it was written"
    )
