"""Drive tasks with the engine until killed: the child of ``tests/integration/test_crash.py``.

Usage::

    python tests/support/crash_driver.py STORE_URL AGENT_URL N SEED [--scripts S,..] [--hold ...]

Opens an :class:`~engine.client.engine.Engine` on ``STORE_URL`` and starts ``N`` tasks on the agent
at
``AGENT_URL`` (the test's :class:`support.Peer`), a seeded mix of ``slow 0.3``, ``ask`` (then a
reply) and ``echo``. Some tasks are left in flight while the next one starts, so a kill finds
several tasks at different points. Short poll intervals and a short ``max_card_age``, so the
background card re-validation writes while tasks are driven too.

Every line on stdout is one *probe*: its first word names the point the process is at, and the
process pauses :data:`PAUSE` seconds right after printing it (a blocking sleep: nothing else runs),
so a parent that kills on seeing a line lands at that point. The probes:

``boot`` / ``open``            process started / engine open (store migrated)
``in-migration``               inside the migration's transaction: every table made, not committed
``start I SCRIPT``             about to start task I (discovery comes next)
``card-read URL``              a card read begins (``Discovery.read``)
``card-fetched URL``           inside discovery: the card, or a signed card's key set, is on hand,
                               not yet recorded
``card-recorded URL``          the read is recorded (``CardFetched`` committed)
``submitted KEY``              ``TaskSubmitted`` committed, nothing sent yet
``send CONTEXT``               a task's first ``SendMessage`` is about to leave
``answered ID``                the agent has answered it; the answer is not recorded yet
``reply-send`` / ``reply-answered``  the same for the ``SendMessage`` of a reply
``poll ID`` / ``polled ID``    a ``GetTask`` is about to leave / answered, not yet recorded
``in-append STREAM VERSION``   inside an append's transaction: the head row moved and the events
                               are inserted, not committed (a kill here must leave no trace)
``started KEY STATE``, ``driven KEY STATE``, ``replied KEY STATE``, ``done KEY STATE``
                               the loop's own steps
``finished``                   all N tasks done (the parent normally kills long before)

``--hold PROBE [--hold-prefix TEXT] [--hold-at K]`` makes the process stand still for good at the
K-th (default first) line whose first word is PROBE and whose second starts with TEXT (e.g.
``--hold in-append --hold-prefix task:`` holds inside the first task-stream append), so a
deterministic test kills it exactly there. ``--scripts`` restricts the mix (e.g. ``ask``).
Exit status 0 when all tasks are done; any error is a traceback and 1.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import cardfence.migrations as migrations
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import TaskLog
from cardfence.engine.core.lifecycle import TERMINAL
from cardfence.engine.discovery import _signed_reads as signed_reads_module
from cardfence.engine.discovery import reads as discovery_module
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.event_store import EventStore

PAUSE = 0.003  # seconds the process stands still after each probe line
HOLD_SECONDS = 120.0  # "for good": the parent kills long before
SCRIPTS = ("slow", "ask", "echo")

CONFIG = EngineConfig(
    max_poll_interval=0.05,
    first_poll_interval=0.01,
    max_card_age=0.15,
    card_limits=CardLimits(timeout=2.0, connect_timeout=1.0),
    request_timeout=10.0,
)


class Probes:
    """Prints one line per probe, pauses, and holds forever at the requested one."""

    def __init__(self, hold: str | None = None, prefix: str = "", at: int = 1) -> None:
        self.hold, self.prefix, self.at = hold, prefix, at
        self.seen = 0

    def __call__(self, *words: object) -> None:
        line = " ".join(str(w) for w in words)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if self._holds(words):
            time.sleep(HOLD_SECONDS)
        time.sleep(PAUSE)

    def _holds(self, words: Sequence[object]) -> bool:
        if self.hold is None or str(words[0]) != self.hold:
            return False
        if self.prefix and not (len(words) > 1 and str(words[1]).startswith(self.prefix)):
            return False
        self.seen += 1
        return self.seen == self.at


def instrument(probe: Probes) -> None:
    """Wrap the engine's and store's steps so each prints its probe (this process only)."""
    original_read = Discovery.read
    original_fetch = discovery_module.fetch_card
    original_create = TaskLog.create
    original_send = A2ATransport.send_message
    original_get = A2ATransport.get_task
    original_insert = EventStore._insert_events
    original_upgrade = migrations.upgrade

    async def read(self: Discovery, agent_url: str, *, fresh: bool = True) -> Any:
        probe("card-read", agent_url, "fresh" if fresh else "memo")
        result = await original_read(self, agent_url, fresh=fresh)
        probe("card-recorded", agent_url)
        return result

    async def fetch_card(*args: Any, **kwargs: Any) -> Any:
        response = await original_fetch(*args, **kwargs)
        probe("card-fetched", response.url, response.status)
        return response

    def create(self: TaskLog, key: str, events: Any) -> Any:
        state = original_create(self, key, events)
        probe("submitted", key)
        return state

    async def send_message(self: A2ATransport, **kwargs: Any) -> Any:
        reply = kwargs.get("task_id") is not None
        probe("reply-send" if reply else "send", kwargs.get("context_id"))
        answer = await original_send(self, **kwargs)
        probe("reply-answered" if reply else "answered", getattr(answer, "id", "-"))
        return answer

    async def get_task(self: A2ATransport, task_id: str, **kwargs: Any) -> Any:
        probe("poll", task_id)
        task = await original_get(self, task_id, **kwargs)
        probe("polled", task_id, task.state)
        return task

    def insert_events(self: EventStore, cursor: Any, rows: list[dict[str, Any]]) -> list[int]:
        positions = original_insert(self, cursor, rows)
        probe("in-append", rows[0]["stream_id"], rows[0]["version"])
        return positions

    def upgrade(connection: Any, revision: str = "head") -> None:
        original_upgrade(connection, revision)
        probe("in-migration", revision)

    migrations.upgrade = upgrade
    Discovery.read = read  # type: ignore[method-assign]
    # Card reads and the key-set reads of signed cards alike (each module imported fetch_card).
    discovery_module.fetch_card = fetch_card
    signed_reads_module.fetch_card = fetch_card
    TaskLog.create = create  # type: ignore[method-assign]
    A2ATransport.send_message = send_message  # type: ignore[method-assign]
    A2ATransport.get_task = get_task  # type: ignore[method-assign]
    EventStore._insert_events = insert_events  # type: ignore[method-assign]


TEXTS = {"slow": "slow 0.3", "ask": "ask", "echo": "echo {seed}-{i}"}


async def finish(engine: Engine, probe: Probes, key: str) -> None:
    """Drive one task to its end, answering the question of an ``ask``."""
    view = await engine.drive(key, until="interrupted", timeout=30)
    probe("driven", key, view.state)
    if view.state not in TERMINAL:
        view = await engine.reply(key, "42")
        probe("replied", key, view.state)
        view = await engine.drive(key, until="terminal", timeout=30)
    probe("done", key, view.state)


async def run(
    store_url: str, agent_url: str, n: int, seed: int, scripts: Sequence[str], probe: Probes
) -> None:
    rng = random.Random(seed)
    async with Engine.connect(store_url, config=CONFIG) as engine:
        probe("open")
        in_flight: list[str] = []
        for i in range(n):
            script = rng.choice(scripts)
            probe("start", i, script)
            text = TEXTS[script].format(seed=seed, i=i)
            view = await engine.start_task(agent_url, skill=script, text=text)
            probe("started", view.task, view.state)
            in_flight.append(view.task)
            if i < n - 1 and rng.random() < 0.4:
                continue  # leave it in flight: the next task starts first
            while in_flight:
                await finish(engine, probe, in_flight.pop(rng.randrange(len(in_flight))))
        await engine.settle()
    probe("finished")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store_url")
    parser.add_argument("agent_url")
    parser.add_argument("n", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("--scripts", default=",".join(SCRIPTS))
    parser.add_argument("--hold", default=None, metavar="PROBE")
    parser.add_argument("--hold-prefix", default="", metavar="TEXT")
    parser.add_argument("--hold-at", type=int, default=1, metavar="K")
    args = parser.parse_args(argv)
    scripts = tuple(s for s in args.scripts.split(",") if s)
    unknown = set(scripts) - set(SCRIPTS)
    if unknown or not scripts:
        parser.error(f"--scripts: choose among {', '.join(SCRIPTS)}")
    probe = Probes(args.hold, args.hold_prefix, args.hold_at)
    probe("boot")
    instrument(probe)
    asyncio.run(run(args.store_url, args.agent_url, args.n, args.seed, scripts, probe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
