"""Write ``store_before_content_out_of_line.sqlite``: a store as the engine kept content inline.

Run once, on 2026-12-07, with the code of commit c677f25 (before message and artifact content
was stored out of line), from the repository's root::

    PYTHONPATH=tests python tests/support/data/write_store_before_content_out_of_line.py \\
        tests/support/data/store_before_content_out_of_line.sqlite

It drives the engine (no row is written by hand): first ``cardfence demo --db`` plays the five
scenarios on the store, then an Engine on the same store drives tasks against the real
in-process a2a-sdk 1.3 agent of ``support.contents``, whose events carry every kind of content
that engine records: artifacts with text, a file by its bytes (``raw``), a file by URL and data
parts, with names; status messages with text and non-text parts; an artifact and a message too
large to keep whole (``payload_truncated``); artifacts sent in chunks and followed on the
stream (text ones, and one of a text, a file and a data part); replies; a failure. The store
is audited before the script ends.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from support.contents import ContentAgent

from cardfence.engine.client.audit import audit
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core.views import TaskView
from cardfence.store.event_store import EventStore

CONFIG = EngineConfig(max_poll_interval=0.05)


async def _subscribed(agent: ContentAgent, before: int) -> None:
    for _ in range(500):
        if any("ubscribe" in call for _, call in agent.calls[before:]):
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"no subscription reached the agent: {agent.calls[before:]}")


async def _followed(engine: Engine, agent: ContentAgent, skill: str, text: str) -> TaskView:
    """A task whose agent stops after its first chunk (held) while the engine subscribes, then
    sends the rest: every chunk recorded as the stream brings it."""
    agent.hold()
    view = await engine.start_task(agent.base_url, skill=skill, text=text)
    await asyncio.sleep(0.3)  # the first chunk sent, the agent held
    before = len(agent.calls)
    following = asyncio.create_task(engine.follow_stream(view.task))
    await _subscribed(agent, before)
    agent.release()
    await following
    await engine.settle()
    return engine.task(view.task)


async def _drive(engine: Engine, agent: ContentAgent) -> list[TaskView]:
    url = agent.base_url
    done: list[TaskView] = []

    async def run(skill: str, text: str, reply: str | None = None) -> None:
        view = await engine.start_task(url, skill=skill, text=text)
        view = await engine.drive(view.task, timeout=30)
        if reply is not None:
            assert view.state in ("input-required", "auth-required"), view
            await engine.reply(view.task, reply)
            view = await engine.drive(view.task, timeout=30)
        done.append(view)

    await run("echo", "parts")
    await run("echo", "question", reply="the first")
    await run("ask", "ask form", reply="yes")
    await run("authorize", "authorize", reply="signed in")
    await run("echo", "big-artifact")
    await run("echo", "big-question", reply="read")
    await run("fail", "fail")
    done.append(await _followed(engine, agent, "write", "write alpha beta gamma delta epsilon"))
    done.append(await _followed(engine, agent, "echo", "bundle"))
    await engine.settle()
    return done


async def _main(url: str) -> None:
    with ContentAgent() as agent:
        async with Engine.open(url, config=CONFIG) as engine:
            for view in await _drive(engine, agent):
                print(view.task, view.state, view.flags, len(view.artifacts))


def main(path: str) -> None:
    target = Path(path)
    if target.exists():
        raise SystemExit(f"{target} exists: remove it first")
    url = f"sqlite:///{target.resolve()}"
    demo = [sys.executable, "-m", "cardfence", "demo", "--db", url]
    subprocess.run(demo, check=True, env={**os.environ, "CARDFENCE_DB": ""})
    asyncio.run(_main(url))
    with EventStore.open(url) as store:
        report = audit(store)
    if not report.ok:
        raise SystemExit(f"the store does not audit clean: {report.violations}")
    print(f"{target}: {report.streams_checked} streams, {report.events_checked} events, clean")


if __name__ == "__main__":
    main(sys.argv[1])
