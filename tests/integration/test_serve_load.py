"""Load: 200 tasks in flight through one `cardfence serve` process while the a2a-sdk agent pushes
every update to it, its driver polls and follows streams, all racing. Every task reaches the
agent's terminal state with each transition recorded exactly once; the audit is clean. SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from support import Peer
from support.engine_fixtures import (
    FAST,
    assert_audit_ok,
    data_of,
    restored,
    transitions,
    webhook_url,
)

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.store.event_store import EventStore

TASKS = 200
SLOW = [("submitted", "working"), ("working", "completed")]
SKIPPED = [("submitted", "completed")]


@pytest.fixture
def peer() -> Iterator[Peer]:
    with Peer() as running, restored(running) as fresh:
        yield fresh


async def test_200_tasks_through_serve_with_pushes_polls_and_streams_racing_lose_nothing(
    peer: Peer, db_url: str
) -> None:
    with EventStore.open(db_url):
        pass  # migrated before two processes open it
    process = subprocess.Popen(
        [sys.executable, "-m", "cardfence", "serve", "--db", db_url, "--port", "0",
         "--max-poll-interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        hook = webhook_url(process)
        assert process.stderr is not None
        drain = asyncio.create_task(asyncio.to_thread(process.stderr.read))
        # Patient card reads: 200 creations at once queue at one agent in this process.
        config = dataclasses.replace(FAST, card_limits=CardLimits(timeout=20, connect_timeout=10))
        async with Engine.connect(db_url, config=config) as run:
            gate = asyncio.Semaphore(32)

            async def start(n: int) -> str:
                async with gate:
                    text = f"slow {1 + n % 3}"
                    view = await run.start_task(peer.base_url, skill="slow", text=text)
                    assert (await run.register_webhook(view.task, hook)).registered
                    return view.task

            keys = await asyncio.gather(*(start(n) for n in range(TASKS)))

            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                live = [k for k in keys if (await run.task(k)).state != "completed"]
                if not live:
                    break
                await asyncio.sleep(0.5)
            assert not live, f"{len(live)} tasks not completed, e.g. {await run.task(live[0])}"

            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.wait, 60)
            assert process.returncode == 0, await drain

            sources: collections.Counter[str] = collections.Counter()
            for key in keys:
                # None twice, none made up; `working` is missing only when the agent left it
                # before anyone looked (its push went out before the webhook was registered).
                assert transitions(run.store, key) in (SLOW, SKIPPED), key
                assert len(data_of(run.store, key, ev.ARTIFACT_RECEIVED)) == 1, key
                sources.update(d["source"] for d in data_of(run.store, key, ev.STATE_CHANGED))
            assert sources["push"] > 0, sources  # the racing really happened
            assert_audit_ok(run.store)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
