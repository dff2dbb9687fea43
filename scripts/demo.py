"""Three incidents from the seeds, played against a real a2a-sdk agent on 127.0.0.1.

1. The card answers 503 while a task runs (seed 000): the task finishes; no cancel is ever sent.
2. The card drops the task's skill mid-task (seed 004): flagged for review, never cancelled.
3. The agent's security contract rotates before a send (seed 004): nothing is sent.

Then the audit replays every stream against its projection and checks every hash chain.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import Peer

from cardfence.engine.audit import audit
from cardfence.engine.cards.discovery import CardLimits
from cardfence.engine.cli.render import audit_text, timeline
from cardfence.engine.engine import Engine, EngineConfig
from cardfence.engine.errors import ContractChangedError
from cardfence.engine.tasklog import task_stream_id
from cardfence.store import EventStore

CONFIG = EngineConfig(
    max_poll_interval=0.2, first_poll_interval=0.05, max_card_age=0.3,
    card_limits=CardLimits(timeout=1.0),
)  # fmt: skip


def show(engine: Engine, key: str, title: str) -> None:
    view = engine.task(key)
    events = engine.store.read_stream(task_stream_id(key))
    print(f"\n== {title}\n")
    print(timeline(view, events, view.contract_hash))


def rotate_security(card: dict[str, Any]) -> None:
    card["securitySchemes"] = {"mtls": {"mtlsSecurityScheme": {}}}
    card["securityRequirements"] = [{"schemes": {"mtls": {"list": []}}}]


async def incidents(peer: Peer, engine: Engine) -> None:
    # 1. Seed 000 #2: a card 503 during a redeploy must not cancel a task that is 90% done.
    task = await engine.start_task(peer.base_url, skill="slow", text="slow 1.2")
    peer.set_card_fault("503")
    done = await engine.drive(task.task, until="terminal", timeout=10)
    await engine.settle()
    peer.set_card_fault(None)
    cancels = [call for call in peer.calls if call[1] == "CancelTask"]
    show(engine, done.task, f"card 503 mid-task -> {done.state}; CancelTask sent: {len(cancels)}")

    # 2. Seed 004 #2: the skill leaves the top-level card (moved to a sub-agent) mid-task.
    task = await engine.start_task(peer.base_url, skill="slow", text="slow 1.2")
    peer.mutate_card(lambda card: card.update(skills=[s for s in card["skills"]
                                                      if s["id"] != "slow"]))  # fmt: skip
    done = await engine.drive(task.task, until="terminal", timeout=10)
    await engine.settle()
    show(engine, done.task, f"skill dropped mid-task -> {done.state}; flags {list(done.flags)}")

    # 3. Seed 004 #1: the contract rotates between the pinned read and the next send.
    peer.mutate_card(rotate_security)
    sends = sum(1 for call in peer.calls if call[1] == "SendMessage")
    try:
        await engine.start_task(peer.base_url, skill="echo", text="echo hi")
    except ContractChangedError as refused:
        after = sum(1 for call in peer.calls if call[1] == "SendMessage")
        print(f"\n== contract rotated before send\n\n  ContractChangedError: {refused}")
        print(f"  SendMessage calls before/after: {sends}/{after}")


async def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="cardfence-demo-"))
    url = f"sqlite:///{folder / 'demo.db'}"
    print(f"store: {url}")
    with Peer() as peer:
        print(f"agent: {peer.base_url} (a2a-sdk, in this process)")
        async with httpx.AsyncClient() as client:
            engine = Engine(EventStore.open(url), client, CONFIG)
            async with engine:
                await incidents(peer, engine)
                report = audit(engine.store)
    print(f"\n== audit\n\n  {audit_text(report)}")
    return 0 if report.ok else 5


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
