"""Scale-out: three `cardfence serve` processes over one PostgreSQL store drive 300 tasks on the
demo agent (its own process) while the agent pushes to all three; one serve is SIGKILLed mid-run.

Every task reaches the agent's terminal state, with each transition recorded once; no event is
lost (the audit replays every stream); and no task is driven by two processes at once: every
append a driver makes records its lease (owner, epoch), and per task the epochs never go back
and each belongs to one owner. The tasks the killed process held are finished by the others."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.agent_process import demo_agent_process
from support.engine_fixtures import FAST, assert_audit_ok, events, transitions, webhook_url

from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import key_of, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.store.event_store import EventStore

TASKS = 300
SERVES = 3
LEASE_TTL = 2.0
SLOW = [("submitted", "working"), ("working", "completed")]
SKIPPED = [("submitted", "completed")]

pytestmark = pytest.mark.timeout(300)


def start_serve(db_url: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "cardfence", "serve", "--db", db_url, "--port", "0",
         "--max-poll-interval", "0.5", "--lease-ttl", str(LEASE_TTL)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    return process, webhook_url(process)


async def test_three_serves_one_killed_drive_300_tasks_each_by_one_lease_at_a_time(
    pg_url: str,
) -> None:
    with EventStore.open(pg_url):
        pass  # migrated once, before the processes open it
    serves: list[subprocess.Popen[str]] = []
    try:
        with demo_agent_process() as agent_url:
            hooks = []
            for _ in range(SERVES):
                process, hook = start_serve(pg_url)
                serves.append(process)
                hooks.append(hook)
            drains = [
                asyncio.create_task(asyncio.to_thread(p.stderr.read))  # type: ignore[union-attr]
                for p in serves
            ]
            victim = serves[0]
            victim_owner = f"{socket.gethostname()}:{victim.pid}:"
            patient = CardLimits(timeout=20, connect_timeout=10)  # 300 creations at once
            config = dataclasses.replace(FAST, card_limits=patient)
            async with Engine.connect(pg_url, config=config) as starter:
                gate = asyncio.Semaphore(32)
                created: list[str] = []

                async def start(n: int) -> str:
                    async with gate:
                        view = await starter.start_task(
                            agent_url, skill="slow", text=f"slow {3 + n % 3}"
                        )
                        hook = hooks[n % SERVES]
                        assert (await starter.register_webhook(view.task, hook)).registered
                        created.append(view.task)
                        return view.task

                async def kill_mid_run() -> list[str]:
                    """SIGKILL one serve a third of the way in, while it holds live tasks."""
                    while True:
                        await asyncio.sleep(0.05)
                        if len(created) < TASKS // 3:
                            continue
                        rows = await asyncio.to_thread(starter.store.due.rows)
                        held = [r.stream_id for r in rows
                                if (r.owner or "").startswith(victim_owner)]  # fmt: skip
                        if held:
                            victim.kill()
                            await asyncio.to_thread(victim.wait, 10)
                            return held

                killing = asyncio.create_task(kill_mid_run())
                keys = await asyncio.gather(*(start(n) for n in range(TASKS)))
                held = await asyncio.wait_for(killing, 60)

                async def completed() -> int:
                    return sum([(await starter.task(k)).state == "completed" for k in keys])

                deadline = time.monotonic() + 150
                while await completed() < TASKS and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                live = [k for k in keys if (await starter.task(k)).state != "completed"]
                rows = {row.stream_id: row for row in starter.store.due.rows()} if live else {}
                assert not live, (
                    f"{len(live)} tasks not completed, e.g. {await starter.task(live[0])}, "
                    f"due work {rows.get(task_stream_id(live[0]))}"
                )

                for process in serves[1:]:
                    process.send_signal(signal.SIGTERM)
                for process, drain in zip(serves[1:], drains[1:], strict=True):
                    await asyncio.to_thread(process.wait, 60)
                    assert process.returncode == 0, await drain

                sources: collections.Counter[str] = collections.Counter()
                drivers: set[str] = set()
                for key in keys:
                    assert transitions(starter.store, key) in (SLOW, SKIPPED), key
                    stamps = [
                        (e.data[ev.LEASE]["owner"], e.data[ev.LEASE]["epoch"])
                        for e in events(starter.store, key)
                        if ev.LEASE in e.data
                    ]
                    epochs = [epoch for _, epoch in stamps]
                    assert epochs == sorted(epochs), (key, stamps)  # never an older claim after
                    per_epoch: dict[int, set[str]] = collections.defaultdict(set)
                    for owner, epoch in stamps:
                        per_epoch[epoch].add(owner)
                    assert all(len(owners) == 1 for owners in per_epoch.values()), (key, stamps)
                    drivers |= {owner for owner, _ in stamps}
                    for e in events(starter.store, key):
                        if e.type == ev.STATE_CHANGED:
                            sources[e.data["source"]] += 1
                for stream_id in held:  # the victim's tasks, finished by the others
                    assert (await starter.task(key_of(stream_id))).state == "completed"
                assert sources["push"] > 0, sources  # pushes and polls raced
                assert sources["poll"] > 0, sources
                assert len(drivers) >= 2, drivers
                assert starter.store.due.rows() == []
                assert_audit_ok(starter.store)
    finally:
        for process in serves:
            if process.poll() is None:
                process.kill()
                process.communicate()
