"""Task updates across processes (``engine/client/updates.py``): a ``cardfence serve`` process
drives the tasks an application started, and the application reads the updates serve records
from the log, restarting its reader in the middle; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

from support import Peer
from support.engine_fixtures import FAST, webhook_url

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.updates import TaskUpdate
from cardfence.engine.core.answers import TaskState
from cardfence.engine.serve.host import serving
from cardfence.store.event_store import EventStore

TASKS = 4


@contextlib.contextmanager
def serve_process(db: str) -> Iterator[subprocess.Popen[str]]:
    """``cardfence serve`` on ``db``, its log read away as it comes; stopped afterwards."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cardfence", "serve", "--db", db, "--port", "0",
         "--max-poll-interval", "0.3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        webhook_url(process)  # it listens, and drives
        assert process.stderr is not None
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield process
    finally:
        process.terminate()
        process.wait(30)


async def read_until(
    engine: Engine, after: int, done: int | None, keys: set[str]
) -> list[TaskUpdate]:
    """The updates after ``after``: ``done`` of them, or (None) until every task in ``keys``
    has completed."""
    taken: list[TaskUpdate] = []
    completed: set[str] = set()
    async with asyncio.timeout(60), contextlib.aclosing(engine.updates(after=after)) as updates:
        async for update in updates:
            taken.append(update)
            if update.task.state is TaskState.COMPLETED:
                completed.add(update.key)
            if len(taken) == done or (done is None and completed >= keys):
                return taken
    return taken


async def test_an_application_restarted_mid_way_reads_every_update_serve_records_once(
    peer: Peer, db_url: str
) -> None:
    with EventStore.open(db_url):
        pass  # migrated before two processes open it
    with serve_process(db_url):
        async with Engine.connect(db_url, config=FAST) as app:
            keys = set()
            for _ in range(TASKS):
                view = await app.start_task(peer.base_url, skill="slow", text="slow 0.3")
                keys.add(view.key)
            # The reader, stopped after a few updates: the position it handled last is kept.
            first = await read_until(app, 0, 3, keys)
        # A new process's engine: it resumes after that position.
        async with Engine.connect(db_url, config=FAST) as restarted:
            rest = await read_until(restarted, first[-1].position, None, keys)
            for key in keys:  # serve drove them to their end; waiting says so at once
                done = await restarted.wait_for(key, "completed", timeout=30)
                assert done.state is TaskState.COMPLETED
    with EventStore.open(db_url) as store:
        logged = [e for e in store.read_all(limit=100_000) if e.stream_id.startswith("task:")]
    seen = [u.position for u in first + rest]
    assert seen == [e.position for e in logged][: len(seen)]  # none missed, none twice
    assert [u.event.type for u in first + rest] == [e.type for e in logged][: len(seen)]
    # Each task's last update read shows it as serve recorded it: completed.
    last = {u.key: u.task for u in first + rest}
    assert {key: last[key].state for key in keys} == dict.fromkeys(keys, "completed")


async def test_serving_inside_an_application_drives_the_tasks_another_process_started(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as starter:
        view = await starter.start_task(peer.base_url, skill="slow", text="slow 0.3")
        async with Engine.connect(db_url, config=FAST) as app:
            # Nothing else polls the task: the driver serving runs moves it to its end.
            async with serving(app, scan_interval=0.05):
                done = await app.wait_for(view.key, TaskState.COMPLETED, timeout=20)
            assert done.state is TaskState.COMPLETED
            # The block ended the driver, not the engine: the application goes on using it.
            assert (await app.task(view.key)).state == "completed"
        assert (await starter.task(view.key)).state == "completed"
