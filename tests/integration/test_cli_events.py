"""``cardfence events``: the global log in order, one JSON line per event; ``--follow`` tails it
while other writers append, never skipping one, and stops on SIGTERM or SIGINT with exit 0. On
SQLite and PostgreSQL (the same suite, ``db_url``)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import CARDFENCE

from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent
from cardfence.store.schema import events

WRITERS = 4
PER_WRITER = 40


def cardfence(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CARDFENCE, *args], capture_output=True, text=True, timeout=60)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def seeded(url: str, streams: int = 3) -> EventStore:
    store = EventStore.open(url)
    for n in range(streams):
        store.append(f"s{n}", 0, [NewEvent("A", {"n": n}), NewEvent("B", {"n": n})])
    return store


def test_events_prints_the_whole_log_in_order_and_after_a_position(db_url: str) -> None:
    with seeded(db_url) as store:
        stored = store.read_all()

    every = cardfence("events", "--db", db_url)
    later = cardfence("events", "--db", db_url, "--after", str(stored[2].position))

    assert every.returncode == 0, every.stderr
    printed = lines(every.stdout)
    assert [p["position"] for p in printed] == [e.position for e in stored]
    assert printed[0] == {
        "position": stored[0].position,
        "stream": "s0",
        "version": 1,
        "type": "A",
        "recorded_at": stored[0].recorded_at.isoformat(),
        "data": {"n": 0},
    }
    assert [p["position"] for p in lines(later.stdout)] == [e.position for e in stored[3:]]


def test_an_event_altered_in_the_store_stops_the_feed_before_it_and_after_goes_past_it(
    db_url: str,
) -> None:
    with seeded(db_url) as store:
        stored = store.read_all()
        altered = stored[3].position
        with store.engine.begin() as conn:
            conn.execute(events.update().where(events.c.position == altered).values(payload="[1]"))

    stopped = cardfence("events", "--db", db_url)
    past = cardfence("events", "--db", db_url, "--after", str(altered))

    assert stopped.returncode == 10
    assert [p["position"] for p in lines(stopped.stdout)] == [e.position for e in stored[:3]]
    assert (
        stopped.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"CorruptRecordError: stream 's1', event 2 (position {altered}, B): its payload is an "
            "array, not a JSON object"
        )
    )
    assert past.returncode == 0, past.stderr
    assert [p["position"] for p in lines(past.stdout)] == [e.position for e in stored[4:]]


def test_follow_tails_concurrent_writers_without_skipping_and_stops_on_sigterm(
    db_url: str,
) -> None:
    seeded(db_url, streams=1).close()
    follower = subprocess.Popen(
        [CARDFENCE, "events", "--db", db_url, "--follow", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # following: the log so far is printed
        with EventStore.open(db_url) as store:

            def write(writer: int) -> None:
                for n in range(PER_WRITER):  # each its own transaction, racing the others
                    store.append(f"w{writer}-{n}", 0, [NewEvent("W", {"w": writer, "n": n})])

            threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            stored = [e.position for e in store.read_all(limit=10_000)]
        time.sleep(0.5)  # a few follow intervals: everything committed is printed by then
        follower.send_signal(signal.SIGTERM)
        out = follower.stdout.read()  # the same buffered reader as `first`: nothing is lost
        follower.wait(timeout=20)
        err = follower.stderr.read() if follower.stderr else ""
    finally:
        if follower.poll() is None:
            follower.kill()

    assert follower.returncode == 0, err
    printed = [p["position"] for p in lines(first + out)]
    assert printed == stored  # every event once, in order: none skipped, none twice
    assert len(printed) == 2 + WRITERS * PER_WRITER


def test_events_of_a_store_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}"

    result = cardfence("events", "--db", missing)

    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("UsageError: no store at")
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_follow_of_an_idle_log_stops_cleanly_on_either_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    url = f"sqlite:///{tmp_path / 'cardfence.db'}"
    seeded(url, streams=1).close()
    follower = subprocess.Popen(
        [CARDFENCE, "events", "--db", url, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the log so far is printed before the wait
    assert json.loads(first)["type"] == "A"
    follower.send_signal(sig)
    try:
        follower.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if follower.poll() is None:
            follower.kill()

    assert follower.returncode == 0
