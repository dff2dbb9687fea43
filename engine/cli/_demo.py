"""``cardfence demo``: the incidents played against a real A2A agent started in this process,
then the audit; ``cardfence demo --agent-only``: that agent, served until interrupted
(``docs/cli.md``).

The agent comes with the ``demo`` extra (a2a-sdk, uvicorn, Starlette) and is imported only when the
command runs: without the extra, the command is a usage error that says what to install, and every
other command works as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
import typer

from cardfence.engine import errors
from cardfence.engine.cli._app import DebugOption, Globals, JsonOption, app, emit, options_of
from cardfence.engine.cli._render import audit_text, event_json, timeline
from cardfence.engine.client.audit import audit as audit_store
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core.views import TaskView
from cardfence.engine.demo import DEMO_EXTRA, DEMO_MODULES
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent

# Not a circle: the demo's modules need the demo extra, so they load when the demo runs.
if TYPE_CHECKING:
    from cardfence.engine.demo.agent import DemoAgent
    from cardfence.engine.demo.scenarios import Played, Scenario, Stage

DEFAULT_PORT = 9999
SCENARIO_COUNT = 5


@app.command()
def demo(
    ctx: typer.Context,
    scenario: Annotated[
        int | None,
        typer.Option("--scenario", metavar="N", help="Play scenario N (1-5) only."),
    ] = None,
    agent_only: Annotated[
        bool,
        typer.Option("--agent-only", help="Serve the demo agent until interrupted; play nothing."),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", metavar="PORT", help="Port for --agent-only (default 9999; 0: any free one)."
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Keep the demo's store at this URL (default: a temporary SQLite file, removed "
            "afterwards; $CARDFENCE_DB is not used).",
        ),
    ] = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Play the incidents against a real A2A agent in this process, then audit the store.

    The store is a fresh SQLite file in a temporary folder, removed afterwards, unless --db names
    one (kept). Exit 5 when the audit finds a violation.
    """
    options = options_of(ctx, db, json_, debug)
    if agent_only:
        if scenario is not None or options.db:
            raise errors.UsageError(
                "--agent-only serves the agent only: --scenario and --db do not apply"
            )
        _serve_agent(options, DEFAULT_PORT if port is None else port)
        return
    if port is not None:
        raise errors.UsageError("--port goes with --agent-only")
    if scenario is not None and not 1 <= scenario <= SCENARIO_COUNT:
        raise errors.UsageError(f"--scenario must be 1 to {SCENARIO_COUNT}, not {scenario}")
    if options.db:
        _check_store_url(options.db)
    _require_demo_extra()
    _play(options, scenario)


def _require_demo_extra() -> None:
    """Import the demo's modules now, or fail with what to install."""
    try:
        import cardfence.engine.demo.agent
        import cardfence.engine.demo.receiver
        import cardfence.engine.demo.scenarios  # noqa: F401
    except ImportError as missing:
        top = (missing.name or "").split(".")[0]
        if top not in DEMO_MODULES:
            raise
        raise errors.UsageError(
            f"cardfence demo needs the demo extra ({top} cannot be imported): {DEMO_EXTRA}"
        ) from missing


def _check_store_url(url: str) -> None:
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as bad:
        raise errors.UsageError(f"--db {url!r} is not a database URL") from bad
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise errors.UsageError(
            "the demo restarts its engine on the same store: --db must name a file or a server, "
            "not an in-memory database"
        )


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _say(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


# -- playing the incidents ---------------------------------------------------------------------


@contextlib.contextmanager
def _store_url(options: Globals) -> Iterator[tuple[str, bool]]:
    """The ``--db`` given (kept), or a SQLite file in a temporary folder removed afterwards."""
    if options.db:
        yield options.db, True
        return
    with tempfile.TemporaryDirectory(prefix="cardfence-demo-") as folder:
        yield f"sqlite:///{Path(folder) / 'demo.db'}", False


def _play(options: Globals, only: int | None) -> None:
    from cardfence.engine.demo.agent import DemoAgent
    from cardfence.engine.demo.receiver import WebhookReceiver
    from cardfence.engine.demo.scenarios import SCENARIOS, Stage

    chosen = [s for s in SCENARIOS if only is None or s.n == only]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        url, kept = stack.enter_context(_store_url(options))
        store = stack.enter_context(EventStore.open(url))
        agent = stack.enter_context(DemoAgent())
        hook = stack.enter_context(WebhookReceiver())
        where = url if kept else "a temporary SQLite file, removed afterwards (--db URL keeps one)"
        _progress(f"agent {agent.base_url} (a2a-sdk, in this process); store {where}")
        stage = Stage(agent, url, hook)
        documents = asyncio.run(_play_all(options, stage, store, chosen))
        report = audit_store(store)
    _progress(f"played {len(chosen)} scenario(s) in {time.monotonic() - started:.1f} s")
    document = {
        "agent": agent.base_url,
        "store": {"url": url, "kept": kept},
        "scenarios": documents,
        "audit": report.to_json(),
    }
    emit(options, document, f"audit: {audit_text(report)}")
    if not report.ok:
        first = report.violations[0]
        raise errors.AuditViolation(
            len(report.violations), f"{first.stream} @{first.position}: {first.kind}"
        )
    broken = [d for d in documents if not d["held"]]
    if broken:
        raise RuntimeError(f"scenario {broken[0]['n']} did not end as the rules say")


async def _play_all(
    options: Globals, stage: Stage, store: EventStore, chosen: list[Scenario]
) -> list[dict[str, Any]]:
    from cardfence.engine.demo.scenarios import play

    documents = []
    for scenario in chosen:
        _progress(
            f"[{scenario.n}/{SCENARIO_COUNT}] {scenario.title} (incident {scenario.incident}) ..."
        )
        played = await play(scenario, stage)
        documents.append(_scenario_document(scenario, played, store))
        if not options.json:
            _say(_scenario_text(scenario, played, store))
    return documents


def _task(store: EventStore, key: str) -> tuple[TaskView, list[RecordedEvent]]:
    log = TaskLog(store)
    head = log.head(key)
    return log.view(head.state, head.updated_at), store.read_stream(task_stream_id(key))


def _task_document(store: EventStore, key: str) -> dict[str, Any]:
    view, events = _task(store, key)
    return {
        "task": view.task,
        "remote_task_id": view.remote_task_id,
        "state": view.state,
        "delivery_mode": view.delivery_mode,
        "card_revision": view.card_revision,
        "contract_hash": view.contract_hash,
        "flags": list(view.flags),
        "events": [event_json(e) for e in events],
    }


def _scenario_document(scenario: Scenario, played: Played, store: EventStore) -> dict[str, Any]:
    tasks = [_task_document(store, key) for key in played.tasks]
    return {
        "n": scenario.n,
        "title": scenario.title,
        "incident": scenario.incident,
        "outcome": played.outcome,
        "held": played.held,
        **tasks[-1],
        "other_tasks": tasks[:-1],
        "facts": played.facts,
    }


def _scenario_text(scenario: Scenario, played: Played, store: EventStore) -> str:
    lines = [
        f"\n{scenario.n}. {scenario.title} (incident {scenario.incident}): {played.outcome}",
        "",
    ]
    for key in played.tasks:
        view, events = _task(store, key)
        lines.append(timeline(view, events, view.contract_hash))
    return "\n".join(lines)


# -- the agent alone -------------------------------------------------------------------------


def _serve_agent(options: Globals, port: int) -> None:
    if not 0 <= port <= 65535:
        raise errors.UsageError(f"--port must be 0 to 65535, not {port}")
    _require_demo_extra()
    from cardfence.engine.demo.agent import DemoAgent

    stop = threading.Event()
    with _stopped_by_signals(stop):
        try:
            agent = DemoAgent(port=port)
        except OSError as busy:
            raise errors.UsageError(
                f"cannot listen on 127.0.0.1:{port} ({busy.strerror or busy}): "
                "choose another --port"
            ) from busy
        with agent:
            _announce(options, agent)
            while not stop.wait(0.2):
                pass
    _progress("agent stopped")


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of interrupting (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopping(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announce(options: Globals, agent: DemoAgent) -> None:
    skills = agent.skills()
    _progress(f"demo agent (a2a-sdk, JSON-RPC and HTTP+JSON) on {agent.base_url}; Ctrl-C stops it")
    _progress(f"card: {agent.card_url}")
    for skill_id, description in skills:
        _progress(f"skill {skill_id}: {description}")
    _progress(f"try: cardfence run {agent.base_url} --skill ask --text ask")
    if options.json:
        document = {
            "agent": agent.base_url,
            "card_url": agent.card_url,
            "interfaces": {"JSONRPC": agent.jsonrpc_url, "HTTP+JSON": agent.rest_url},
            "skills": [{"id": i, "description": d} for i, d in skills],
        }
        emit(options, document, "")
