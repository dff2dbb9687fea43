"""The incidents, played against the demo agent by an Engine on a real store.

Each scenario stages one incident (``docs/rules.md``) while a task is certainly live -- the agent
holds its ``slow`` tasks until the engine has seen the staged change -- so the outcome does not
depend on the machine's speed. It returns what happened (`Played`): a one-line outcome, the tasks
to show (the headline last), facts for machines, and whether the rule held.

1. Push withdrawn after registration (incident 001): deliveries dropped; a safety poll ends it.
2. The card answers 503 mid-task (incident 000): an annotation; no CancelTask; the task completes.
3. The task's skill reorganised away mid-task (incident 004): flagged for review, never cancelled.
4. A restart after the card moved the endpoint (incident 002): with the skill retired, resume
   refuses (``TaskOrphanedError``, state untouched); with the skill kept, it follows the new
   endpoint.
5. The contract rotated between read and send (incident 004): nothing sent unless accepted, and
   then with the credentials the new contract requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.views import TaskView
from cardfence.engine.demo.agent import DemoAgent
from cardfence.engine.demo.receiver import WebhookReceiver
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.errors import ContractChangedError, TaskOrphanedError
from cardfence.store.records import RecordedEvent

__all__ = ["DEMO_CONFIG", "SCENARIOS", "Played", "Scenario", "Stage", "play"]

# Short intervals keep each scenario to a second or two; they bound how long the engine takes to
# notice what the agent does, not what it decides (R1).
DEMO_CONFIG = EngineConfig(
    max_poll_interval=0.2,
    first_poll_interval=0.05,
    max_card_age=0.3,
    card_limits=CardLimits(timeout=5.0, connect_timeout=2.0),
    request_timeout=10.0,
    # The incidents are about pushes and polls: a stream would bring every change first.
    follow_streams=False,
)
NOTICE_SECONDS = 20.0  # how long the demo waits for the engine to see a staged change
DRIVE_SECONDS = 30.0  # the deadline of each drive; held tasks are released well before


@dataclass
class Stage:
    """What every scenario plays on: the agent, the store, the webhook, the engine's bounds."""

    agent: DemoAgent
    store_url: str
    receiver: WebhookReceiver
    config: EngineConfig = DEMO_CONFIG


@dataclass(frozen=True)
class Played:
    """What a scenario did. ``tasks``: the task keys to show, the headline one last."""

    outcome: str
    held: bool
    tasks: tuple[str, ...]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    n: int
    title: str
    incident: str
    run: Callable[[Stage], Awaitable[Played]]


async def play(scenario: Scenario, stage: Stage) -> Played:
    """Play one scenario on an agent in normal service; its card is restored afterwards."""
    original = copy.deepcopy(stage.agent.card)
    stage.agent.reset()
    try:
        return await scenario.run(stage)
    finally:
        stage.agent.reset()
        stage.agent.card = original


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _engine(stage: Stage, config: EngineConfig | None = None) -> AsyncIterator[Engine]:
    """An engine on the demo's store -- one process's lifetime; leaving the block is a stop."""
    async with Engine.connect(stage.store_url, config=config or stage.config) as engine:
        yield engine
        await engine.settle()


def _events(engine: Engine, key: str) -> list[RecordedEvent]:
    return engine.store.read_stream(task_stream_id(key))


def _types(engine: Engine, key: str) -> list[str]:
    return [e.type for e in _events(engine, key)]


def _transitions(engine: Engine, key: str) -> list[list[str]]:
    return [
        [str(e.data["from"]), str(e.data["to"])]
        for e in _events(engine, key)
        if e.type == ev.STATE_CHANGED
    ]


def _count(n: int, thing: str) -> str:
    plural = thing[:-1] + "ies" if thing.endswith("y") else thing + "s"
    return f"{n} {thing if n == 1 else plural}"


def _calls(agent: DemoAgent, method: str) -> int:
    return sum(1 for _, name in agent.calls if name == method)


async def _noticed(predicate: Callable[[], bool]) -> bool:
    """Wait until ``predicate()`` holds, at most `NOTICE_SECONDS`."""
    deadline = time.monotonic() + NOTICE_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _drive_when(engine: Engine, stage: Stage, key: str, seen: str) -> TaskView:
    """Drive the held task to its end; release it once the engine has recorded ``seen`` (or the
    drive ended, or `NOTICE_SECONDS` passed: the caller checks what was recorded)."""
    driving = asyncio.ensure_future(engine.drive(key, until="terminal", timeout=DRIVE_SECONDS))
    try:
        await _noticed(lambda: driving.done() or seen in _types(engine, key))
    except BaseException:
        driving.cancel()
        raise
    finally:
        stage.agent.release()
    try:
        await driving
    finally:
        await engine.settle()  # the re-validations spawned on the way
    return await engine.task(key)


async def _working(engine: Engine, key: str) -> TaskView:
    """Poll until the agent reports the task working (it is held, so it stays there)."""
    view = await engine.task(key)
    deadline = time.monotonic() + NOTICE_SECONDS
    while view.state == "submitted" and time.monotonic() < deadline:
        view = await engine.poll(key)
        if view.state == "submitted":
            await asyncio.sleep(0.02)
    return view


# -- card edits --------------------------------------------------------------------------------


def _drop_skill(skill_id: str, version: str) -> Callable[[dict[str, Any]], None]:
    def edit(card: dict[str, Any]) -> None:
        card["skills"] = [s for s in card["skills"] if s["id"] != skill_id]
        card["version"] = version

    return edit


def _move_off_jsonrpc(card: dict[str, Any]) -> None:
    """The JSON-RPC endpoint is retired: only the HTTP+JSON one is left (same contract)."""
    card["supportedInterfaces"] = [
        i for i in card["supportedInterfaces"] if i["protocolBinding"] != "JSONRPC"
    ]
    card["version"] = "1.2.0"


def _rotate_contract(card: dict[str, Any]) -> None:
    """Seed 004 #1: the agent starts requiring a bearer token between two reads."""
    card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    card["version"] = "2.0.0"


# The token the demo's operator was given for the agent's new contract (R15).
_DEMO_TOKEN = "demo-bearer-token"


# -- the scenarios -----------------------------------------------------------------------------


async def push_withdrawn_after_registration(stage: Stage) -> Played:
    agent, hook = stage.agent, stage.receiver
    async with _engine(stage) as engine:
        hook.forward_to(engine)
        try:
            agent.hold()
            view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.3")
            registration = await engine.register_webhook(view.task, hook.url)
            agent.set_push_dropped(True)  # registrations accepted, deliveries silently dropped
            agent.release()
            done = await engine.drive(view.task, until="terminal", timeout=DRIVE_SECONDS)
            await engine.settle()
        finally:
            hook.stop_forwarding()
        changes = [e for e in _events(engine, view.task) if e.type == ev.STATE_CHANGED]
        last = changes[-1].data if changes else {}
        remote_at = last.get("remote_timestamp")
        gap = (
            (changes[-1].recorded_at - datetime.fromisoformat(str(remote_at))).total_seconds()
            if changes and remote_at
            else None
        )
        webhook = engine.log.head(view.task).state.get("webhook") or {}
        recorded = _types(engine, view.task)
    drops = agent.pushes_dropped
    facts = {
        "registered": registration.registered,
        "pushes_dropped": drops,
        "deliveries_received": len(hook.deliveries),
        "completed_by": last.get("source"),
        "noticed_after_seconds": None if gap is None else round(gap, 3),
        "max_poll_interval": stage.config.max_poll_interval,
        "webhook": webhook.get("status"),
    }
    held = (
        done.state == "completed"
        and registration.registered
        and last.get("source") == "poll"
        and webhook.get("status") == "provisional"
        and ev.WEBHOOK_CONFIRMED not in recorded
        and drops >= 1
    )
    noticed = "" if gap is None else f" {gap:.2f} s after the agent finished"
    outcome = (
        f"the agent accepted the webhook, then silently dropped {_count(drops, 'push delivery')}; "
        f"a safety poll saw the task {done.state}{noticed} "
        f"(max_poll_interval {stage.config.max_poll_interval:g} s); "
        f"the webhook is still {webhook.get('status')}"
    )
    return Played(outcome, held, (view.task,), facts)


async def card_503_mid_task(stage: Stage) -> Played:
    agent = stage.agent
    async with _engine(stage) as engine:
        agent.hold()
        view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.3")
        agent.set_card_fault("503")  # a redeploy: the card is gone for a while
        done = await _drive_when(engine, stage, view.task, ev.DISCOVERY_UNAVAILABLE)
        agent.set_card_fault(None)
        annotations = _types(engine, view.task).count(ev.DISCOVERY_UNAVAILABLE)
        transitions = _transitions(engine, view.task)
    cancels = _calls(agent, "CancelTask")
    failed_reads = sum(1 for hit in agent.card_log if hit.fault == "503")
    facts = {
        "card_reads_503": failed_reads,
        "discovery_unavailable": annotations,
        "cancel_requests": cancels,
        "transitions": transitions,
    }
    held = done.state == "completed" and cancels == 0 and annotations >= 1
    outcome = (
        f"the card answered 503 to {_count(failed_reads, 'read')} while the task worked, "
        f"recorded as DiscoveryUnavailable; CancelTask sent: {cancels}; the task {done.state}"
    )
    return Played(outcome, held, (view.task,), facts)


async def skill_reorganised_mid_task(stage: Stage) -> Played:
    agent = stage.agent
    async with _engine(stage) as engine:
        agent.hold()
        view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.3")
        # Seed 004 #2: the skill moved to a sub-agent; the top-level card no longer lists it.
        agent.mutate_card(_drop_skill("slow", "1.1.0"))
        done = await _drive_when(engine, stage, view.task, ev.FLAGGED_FOR_REVIEW)
        reasons = [
            e.data.get("reason")
            for e in _events(engine, view.task)
            if e.type == ev.FLAGGED_FOR_REVIEW
        ]
        transitions = _transitions(engine, view.task)
    cancels = _calls(agent, "CancelTask")
    facts = {
        "flags": list(done.flags),
        "review_reasons": reasons,
        "cancel_requests": cancels,
        "transitions": transitions,
    }
    held = done.state == "completed" and cancels == 0 and "skill_withdrawn" in reasons
    outcome = (
        f"the card dropped skill 'slow' while the task worked: FlaggedForReview "
        f"({', '.join(str(r) for r in reasons) or 'none'}); CancelTask sent: {cancels}; "
        f"the task {done.state}"
    )
    return Played(outcome, held, (view.task,), facts)


async def _live_task_then_stop(stage: Stage) -> TaskView:
    """A held ``slow`` task seen working, then the engine's process stops."""
    stage.agent.hold()
    async with _engine(stage) as engine:
        view = await engine.start_task(stage.agent.base_url, skill="slow", text="slow 0.3")
        return await _working(engine, view.task)


async def restart_after_endpoint_moved(stage: Stage) -> Played:
    agent = stage.agent
    original = copy.deepcopy(agent.card)

    # The endpoint moves and the skill is retired while the process is down.
    before = await _live_task_then_stop(stage)
    agent.mutate_card(_move_off_jsonrpc)
    agent.mutate_card(_drop_skill("slow", "2.0.0"))
    agent.set_endpoint_gone(True, "JSONRPC")
    async with _engine(stage) as engine:  # the restart: a new engine on the same store
        requests_before = len(agent.calls)
        orphaned: TaskOrphanedError | None = None
        try:
            await engine.resume(before.task)
        except TaskOrphanedError as refused:
            orphaned = refused
        after = await engine.task(before.task)
        endpoint_requests = len(agent.calls) - requests_before

    # The same move with the skill kept.
    agent.card = copy.deepcopy(original)
    agent.set_endpoint_gone(False, "JSONRPC")
    moving = await _live_task_then_stop(stage)
    agent.mutate_card(_move_off_jsonrpc)
    agent.set_endpoint_gone(True, "JSONRPC")
    async with _engine(stage) as engine:
        resumed = await engine.resume(moving.task)
        agent.release()
        done = await engine.drive(resumed.task, until="terminal", timeout=DRIVE_SECONDS)
        moved = [e.data for e in _events(engine, moving.task) if e.type == ev.ENDPOINT_MOVED]
    agent.release()

    new_endpoint = moved[0]["new"] if moved else None
    facts = {
        "orphaned": {
            "task": before.task,
            "raised": type(orphaned).__name__ if orphaned else None,
            "state_before": before.state,
            "state_after": after.state,
            "endpoint_requests": endpoint_requests,
        },
        "endpoint_moved": moved[0] if moved else None,
    }
    held = (
        orphaned is not None
        and after.state == before.state
        and endpoint_requests == 0
        and new_endpoint is not None
        and done.state == "completed"
    )
    where = new_endpoint["url"] if new_endpoint else "no new endpoint"
    outcome = (
        f"while the engine was down the card moved its endpoint to HTTP+JSON; with the skill "
        f"retired too, resume raised {type(orphaned).__name__ if orphaned else 'nothing'} and "
        f"left the task {after.state}, sending nothing; with the skill kept, it resumed at "
        f"{where} (EndpointMoved) and the task {done.state}"
    )
    return Played(outcome, held, (before.task, moving.task), facts)


async def contract_rotated_before_send(stage: Stage) -> Played:
    agent = stage.agent
    token = CredentialsConfig.of({agent.base_url: {"bearer": Bearer(_DEMO_TOKEN)}})
    async with _engine(stage, dataclasses.replace(stage.config, credentials=token)) as engine:
        pin = await engine.start_task(agent.base_url, skill="echo", text="echo pinned")
        await engine.drive(pin.task, until="terminal", timeout=DRIVE_SECONDS)
        agent.mutate_card(_rotate_contract)  # between the pinning read and the next send
        sends_before = _calls(agent, "SendMessage")
        refused: ContractChangedError | None = None
        try:
            await engine.start_task(agent.base_url, skill="echo", text="echo rotated")
        except ContractChangedError as refusal:
            refused = refusal
        sends_after = _calls(agent, "SendMessage")
        accepted = await engine.start_task(
            agent.base_url, skill="echo", text="echo accepted", accept_contract=True
        )
        done = await engine.drive(accepted.task, until="terminal", timeout=DRIVE_SECONDS)
        agent_stream = engine.store.read_stream(ev.agent_stream_id(card_urls(agent.base_url)[0]))
    contract_events = [e.type for e in agent_stream if e.type.startswith("Contract")]
    facts = {
        "pinning_task": pin.task,
        "refused": type(refused).__name__ if refused else None,
        "send_message_before": sends_before,
        "send_message_after": sends_after,
        "pinned_contract": pin.contract_hash,
        "accepted_contract": accepted.contract_hash,
        "contract_events": contract_events,
    }
    held = (
        refused is not None
        and sends_after == sends_before
        and ev.CONTRACT_ACCEPTED in contract_events
        and done.state == "completed"
    )
    outcome = (
        f"the card rotated to require a bearer token after the contract was pinned: "
        f"{type(refused).__name__ if refused else 'no refusal'}, SendMessage calls "
        f"{sends_before} -> {sends_after} (nothing sent); accepted explicitly "
        f"(ContractAccepted), the task sent with the token and {done.state}"
    )
    return Played(outcome, held, (accepted.task,), facts)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(1, "Push withdrawn after registration", "001", push_withdrawn_after_registration),
    Scenario(2, "The card answers 503 mid-task", "000", card_503_mid_task),
    Scenario(3, "The task's skill reorganised away mid-task", "004", skill_reorganised_mid_task),
    Scenario(4, "A restart after the card moved the endpoint", "002", restart_after_endpoint_moved),
    Scenario(5, "The contract rotated between read and send", "004", contract_rotated_before_send),
)
