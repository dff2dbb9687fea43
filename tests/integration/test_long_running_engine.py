"""An engine that lives for days (an orchestrator's, ``serve``'s) holds nothing for a task no
drive follows any more: the wake-up a drive waits on for pushes and stream events is let go by
the last drive of its task (the official a2a-sdk 1.3 agent runs the tasks)."""

from __future__ import annotations

import asyncio

import pytest
from support import Peer

from cardfence.engine.client.engine import Engine
from cardfence.engine.errors import DeadlineExceeded


async def test_driving_tasks_to_their_end_leaves_no_wake_up_behind(
    peer: Peer, engine: Engine
) -> None:
    for n in range(3):
        view = await engine.start_task(peer.base_url, skill="echo", text=f"echo {n}")
        assert (await engine.drive(view.task, until="terminal", timeout=10)).state == "completed"

    assert engine.observing.pushed == {}
    assert not engine.following.driving


async def test_the_wake_up_stays_while_another_drive_still_follows_the_task(
    peer: Peer, engine: Engine
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 1.0")
    patient = asyncio.ensure_future(engine.drive(view.task, until="terminal", timeout=10))
    with pytest.raises(DeadlineExceeded):
        await engine.drive(view.task, until="terminal", timeout=0.3)

    assert view.task in engine.observing.pushed  # the patient drive still waits on it
    assert (await patient).state == "completed"
    assert engine.observing.pushed == {}
    assert not engine.following.driving
