"""The README's application that embeds the engine ("Inside your own application"), run as it is
written there: served by uvicorn, it asks the real a2a-sdk agent, takes the agent's pushes at its
mounted webhook, keeps the task moving with ``serving`` and follows every update."""

from __future__ import annotations

import asyncio
import contextlib
import re
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from support import Peer
from support.engine_fixtures import wait_until

from cardfence.engine.core import events as ev
from cardfence.engine.demo.server import bind
from cardfence.store.event_store import EventStore

README = Path(__file__).parents[2] / "README.md"


def readme_app() -> types.ModuleType:
    """The Python block under the README's "Inside your own application", as a module."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Inside your own application", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the README shows no application"
    module = types.ModuleType("readme_app")
    exec(compile(block.group(1), str(README), "exec"), module.__dict__)
    return module


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on 127.0.0.1 (its lifespan run), on this loop; its base URL."""
    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or running.done(), 10, "the app to start")
        if running.done():
            running.result()  # it failed to start: say why
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await running
        sock.close()


async def test_the_readme_application_asks_an_agent_and_follows_its_updates(
    peer: Peer, tmp_path: Path
) -> None:
    module = readme_app()
    db = f"sqlite:///{tmp_path / 'app.db'}"
    module.DB, module.AGENT, module.SKILL = db, peer.base_url, "slow"
    seen: list[Any] = []

    async def handle(update: Any) -> None:
        seen.append(update)

    async with served(module.app) as base:
        module.PUBLIC = base
        engine = module.app.state.engine
        following = asyncio.create_task(module.follow(engine, 0, handle))
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.post(f"{base}/ask", content=b"slow 0.5")
            assert answer.status_code == 200, answer.text
            done = answer.json()
            assert done["state"] == "completed"
            key = done["task"]
            await wait_until(
                lambda: any(u.key == key and u.task.state == "completed" for u in seen),
                10,
                "the update that completed the task",
            )
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following

    with EventStore.open(db) as store:
        logged = store.read_stream(f"task:{key}")
    assert [u.position for u in seen if u.key == key] == [e.position for e in logged][: len(seen)]
    types_ = [e.type for e in logged]
    assert ev.WEBHOOK_REGISTERED in types_
    assert ev.WEBHOOK_CONFIRMED in types_  # the agent's pushes reached the mounted webhook
