"""The ``push``, ``serve-memory`` and ``serve-e2e`` benchmark sections: ``cardfence serve``'s costs.

Every process this starts is its own (``sys.executable`` and this file, or ``python -m cardfence``)
and is stopped by its id when the section ends. Helper processes:

- the **responder** (``python scripts/bench_serve.py responder PORT STATE``): a minimal A2A v1.0
  JSON-RPC agent (Starlette under uvicorn). It serves an Agent Card (push notifications, no
  streaming, one skill ``work``; with an ETag, answered 304 when it matches, as a2a-sdk 1.3 serves
  its card), answers SendMessage with a new task in ``STATE``, and every GetTask with a task of
  the requested id in ``STATE`` at a fixed status timestamp (the one the bench's own deliveries
  and bindings use, so a poll reads back what is recorded: a duplicate, nothing written).
  ``GET /stats`` counts what it answered.
- the **sender** (``python scripts/bench_serve.py sender``): posts push deliveries from its own
  process, over raw keep-alive HTTP/1.1 connections on asyncio streams (no HTTP client library: the
  sender must not be what is measured). It reads one job per line on stdin and answers one JSON
  line: statuses, outcomes, seconds.

Sections:

1. ``push``: deliveries applied per second by ``webhook_app(engine)`` served by uvicorn on
   127.0.0.1 (a thread of this process, its own event loop, as ``cardfence serve`` runs it), with
   the sender posting over ``CONNECTIONS`` connections at once. The tasks (``Sizes.push_tasks`` a
   run) are in the store before the clock starts: each is a clone of one task made by a real
   ``Engine.start_task`` against the responder (its ``TaskSubmitted``, with a fresh key, message
   and context ids), bound to a remote task in ``submitted`` and with a webhook registered
   (``WebhookRegistered`` as ``Engine.register_webhook`` records it: a token and a Bearer secret of
   its own, kept as SHA-256 digests). Each task gets two deliveries on one connection, in order:
   a status update to ``working``, then to ``completed`` (a2a-sdk's push shape, with the task's
   token and ``Authorization``). Every one must be answered 200 ``applied``. The run's clock also
   covers what those deliveries set off in the engine -- R6's boundary re-check (a fresh card GET)
   after ``working``, the closing GetTask after ``completed`` -- waited for before the run ends.
   Decisions are logged as ``cardfence serve`` logs them (one JSON line each, here to
   ``/dev/null``). Baseline: the same uvicorn server setup with a Starlette app whose ``POST
   /webhook`` reads the body and answers 200 without applying anything, fed the same requests.
   Target >= 0.5 x. Two untargeted figures place it: the **floor**, the same server setup with
   an app that decodes each body and appends it whole as one event (one transaction on a store
   worker thread) before answering 200 -- what any delivery answered only once durable costs --
   against the 200-only app, and ours against the floor. On SQLite, and on PostgreSQL when a
   URL is given, where store calls on worker threads (``StoreCalls``' default) are also compared
   with store calls made inline on the event loop (``StoreCalls(store, workers=0)``, on a second
   engine of its own).
2. ``serve-memory``: resident memory (``VmRSS`` in ``/proc/PID/status``) of one ``cardfence serve``
   process (``--max-poll-interval 3600``), idle on an empty store, against the same holding
   ``Sizes.memory_tasks`` live tasks (``working``, bound to a remote task id, cloned as above)
   whose agent (the responder, own process) answers every GetTask with ``working`` at once. The
   loaded figure is read once the responder has answered as many GetTasks as there are tasks (the
   driver has loaded and polled every one), and a second later. Each ``serve`` is then stopped
   with SIGTERM and must exit 0; one still running ``STOP_SECONDS`` later is killed and counted in
   a note. Medians of ``Sizes.memory_runs`` idle/loaded pairs. Budget <= 100 MB over the idle
   process: like bench_engine's card-request counts, a budget and not a rate, so ``ratio`` is null
   and the verdict is a note.
3. ``serve-e2e``: the demo agent in its own process (``python -m cardfence demo --agent-only``),
   ``Sizes.e2e_tasks`` tasks at once (``slow 0.1``: 0.1 s of work each) through one
   :class:`~engine.client.engine.Engine` on SQLite (``start_task`` then ``drive(until="terminal")``
   each,
   all gathered), against a bare a2a-sdk 1.3 client (JSON-RPC, no streaming, nothing persisted)
   sending the same messages at the same concurrency (SendMessage with returnImmediately, then
   GetTask with ``Engine.drive``'s backoff until terminal). Target >= 0.8 x the bare tasks/s.
   The engine's polls, like the bare client's, are never more than 0.05 s apart, so it follows
   no task stream beside them (a stream is followed only once polls are a second apart). The
   engine runs on the client it makes for itself (:func:`~engine.http.pool.engine_client`: at most 8
   requests in flight to one agent, a pool per origin); the bare client on httpx's defaults, but
   for idle connections kept 2 s (not 5: the agent's uvicorn closes them at 5 s).

``--quick`` runs every part at smoke-test sizes (and says so in the figure names).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)
from a2a.types import Task as A2ATask
from bench import BenchContext, Figure, Workload, median_rates, register
from bench_engine import _state, engine_config
from bench_store import postgres_database, runs_of, sqlite_database
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from support.agent_process import demo_agent_process
from support.hostile import status_update

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import reached
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import TaskEvent as Event
from cardfence.engine.core.observations import Observation, apply_observation
from cardfence.engine.core.replay import fold_task
from cardfence.engine.demo.server import ServerThread
from cardfence.engine.http.offload import StoreCalls
from cardfence.engine.http.pool import engine_client
from cardfence.engine.serve.decision_log import DecisionLog
from cardfence.engine.serve.ingress import webhook_app
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

PUSH_TARGET = 0.5
MEMORY_BUDGET_MB = 100.0
E2E_TARGET = 0.8
CONNECTIONS = 32  # the sender's connections, each posting one delivery at a time
CONTEXT_ID = "c-bench-serve"
SUBMITTED_AT = "2026-01-01T00:00:00+00:00"
# The status timestamp of each state, the responder's and the bench's alike.
STAMPS = {
    "submitted": SUBMITTED_AT,
    "working": "2026-01-01T00:00:01+00:00",
    "completed": "2026-01-01T00:00:02+00:00",
}
SKILL = "work"
FIRST_POLL = 0.005  # serve-e2e: Engine.drive's backoff, and the bare client's (as bench_engine)
MAX_POLL = 0.05
SLOW_SECONDS = "0.1"
STOP_SECONDS = 10.0  # serve-memory: how long a serve is given to exit after SIGTERM

_T = TypeVar("_T")


# -- helper process: the responder -----------------------------------------------------------------


def _wire(state: str) -> str:
    return "TASK_STATE_" + state.upper().replace("-", "_")


def responder_main(port: int, state: str) -> None:
    """A minimal JSON-RPC A2A agent answering every task in ``state`` (see the module)."""
    import uvicorn
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
    from starlette.applications import Starlette

    from cardfence.engine.demo.agent import card_etag
    from cardfence.engine.demo.server import bind

    base = f"http://127.0.0.1:{port}"
    card = agent_card_to_dict(
        AgentCard(
            name="bench-responder",
            description="Answers every task in one state (cardfence benchmarks).",
            version="1.0.0",
            supported_interfaces=[
                AgentInterface(
                    url=f"{base}/a2a/jsonrpc", protocol_binding="JSONRPC", protocol_version="1.0"
                )
            ],
            capabilities=AgentCapabilities(streaming=False, push_notifications=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[
                AgentSkill(
                    id=SKILL,
                    name="Work",
                    description="Works.",
                    tags=["bench"],
                    input_modes=["text/plain"],
                    output_modes=["text/plain"],
                )
            ],
        )
    )
    stats: Counter[str] = Counter()
    status = {"state": _wire(state), "timestamp": STAMPS[state]}

    # As a2a-sdk 1.3 serves its card (and the demo agent): an ETag, 304 when it matches.
    headers = {"ETag": card_etag(card), "Cache-Control": "max-age=60"}

    async def card_endpoint(request: Request) -> Response:
        stats["card"] += 1
        if request.headers.get("if-none-match") == headers["ETag"]:
            stats["card 304"] += 1
            return Response(status_code=304, headers=headers)
        return JSONResponse(card, headers=headers)

    async def rpc(request: Request) -> Response:
        envelope = json.loads(await request.body())
        method, params = envelope.get("method"), envelope.get("params") or {}
        stats[str(method)] += 1
        if method == "GetTask":
            result: dict[str, Any] = {"id": params["id"], "contextId": CONTEXT_ID, "status": status}
        elif method == "SendMessage":
            task = {"id": f"r-{uuid.uuid4().hex}", "contextId": CONTEXT_ID, "status": status}
            result = {"task": task}
        else:
            error = {"code": -32601, "message": f"{method} is not offered here"}
            return JSONResponse({"jsonrpc": "2.0", "id": envelope.get("id"), "error": error})
        return JSONResponse({"jsonrpc": "2.0", "id": envelope.get("id"), "result": result})

    async def stats_endpoint(_request: Request) -> Response:
        return JSONResponse(dict(stats))

    app = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card_endpoint, methods=["GET"]),
            Route("/a2a/jsonrpc", rpc, methods=["POST"]),
            Route("/stats", stats_endpoint, methods=["GET"]),
        ]
    )
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[bind("127.0.0.1", port)])


# -- helper process: the sender --------------------------------------------------------------------


def _request_bytes(port: int, headers: dict[str, str], body: str) -> bytes:
    raw = body.encode()
    head = ["POST /webhook HTTP/1.1", f"host: 127.0.0.1:{port}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head.append(f"content-length: {len(raw)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


async def _post_all(port: int, connections: list[list[bytes]]) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    bodies: list[bytes] = []

    async def one(requests: list[bytes]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for raw in requests:
                writer.write(raw)
                head = await reader.readuntil(b"\r\n\r\n")
                statuses[int(head[9:12])] += 1
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                bodies.append(await reader.readexactly(length))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    started = time.perf_counter()
    await asyncio.gather(*(one(requests) for requests in connections if requests))
    elapsed = time.perf_counter() - started
    outcomes = Counter(str(json.loads(body).get("outcome")) for body in bodies)
    return {
        "sent": sum(statuses.values()),
        "statuses": {str(k): v for k, v in statuses.items()},
        "outcomes": dict(outcomes),
        "seconds": elapsed,
    }


def sender_main() -> None:
    """One job a line on stdin (``{"port": P, "file": F}``), one JSON result a line on stdout."""
    for line in sys.stdin:
        job = json.loads(line)
        port = int(job["port"])
        plan = json.loads(Path(job["file"]).read_text())
        connections = [
            [_request_bytes(port, r["headers"], r["body"]) for r in requests] for requests in plan
        ]
        result = asyncio.run(_post_all(port, connections))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class Sizes:
    push_tasks: int  # tasks per timed push run (two deliveries each)
    memory_tasks: int  # live tasks the loaded serve holds
    memory_runs: int  # idle/loaded pairs of serve processes
    e2e_tasks: int  # tasks in flight at once, per timed run

    @classmethod
    def for_context(cls, ctx: BenchContext) -> Sizes:
        if ctx.quick:
            return cls(push_tasks=40, memory_tasks=1_000, memory_runs=1, e2e_tasks=20)
        return cls(push_tasks=500, memory_tasks=10_000, memory_runs=3, e2e_tasks=200)


def _tagged(name: str, ctx: BenchContext) -> str:
    return f"{name} (--quick)" if ctx.quick else name


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _process(args: list[str], log: Path, **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """A child process (stderr to ``log``), stopped by its pid (SIGTERM, then SIGKILL)."""
    with log.open("w") as err:
        child = subprocess.Popen(args, cwd=ROOT, stderr=err, text=True, **popen)
        try:
            yield child
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


@contextlib.contextmanager
def responder(folder: Path, state: str) -> Iterator[str]:
    """The responder in its own process; its base URL."""
    port = _free_port()
    args = [sys.executable, str(HERE), "responder", str(port), state]
    with _process(args, folder / f"responder-{state}.log", stdin=subprocess.DEVNULL):
        base = f"http://127.0.0.1:{port}"
        _wait_for(lambda: _answers(f"{base}/stats"), "the responder")
        yield base


def responder_stats(base: str) -> Counter[str]:
    return Counter(httpx.get(f"{base}/stats", timeout=5.0).json())


# -- tasks written to the store ahead of the clock -------------------------------------------------


def template_submitted(url: Any, agent_url: str) -> dict[str, Any]:
    """The ``TaskSubmitted`` of one task a real ``Engine.start_task`` created on the responder
    (its card read, contract pinned and snapshot recorded in the store on the way)."""

    async def create() -> dict[str, Any]:
        store = EventStore.open(url)
        async with httpx.AsyncClient() as client, Engine(store, client) as engine:
            view = await engine.start_task(agent_url, skill=SKILL, text="work")
            return dict(store.read_stream(task_stream_id(view.task))[0].data)

    return asyncio.run(create())


@dataclass(frozen=True, slots=True)
class PushTask:
    key: str
    remote_task_id: str
    headers: dict[str, str]  # what a genuine delivery for its webhook presents


def clone_events(
    template: dict[str, Any], bound_as: str, *, webhook_url: str | None = None
) -> tuple[str, str, list[Event], dict[str, str]]:
    """A task like the template, bound to a fresh remote id in ``bound_as`` (and with a webhook
    registered on ``webhook_url``): (key, remote id, its events, its delivery headers)."""
    key = uuid.uuid4().hex
    remote = f"r-{uuid.uuid4().hex}"
    submitted = dict(template)
    submitted.update(
        task=key, message_id=f"m-{uuid.uuid4().hex}", context_id=f"c-{uuid.uuid4().hex}"
    )
    events: list[Event] = [ev.TaskSubmitted.from_payload(submitted)]
    binding = Observation(
        source="send",
        state=bound_as,
        remote_timestamp=datetime.fromisoformat(STAMPS[bound_as]),
        remote_task_id=remote,
        remote_context_id=CONTEXT_ID,
        received_at=datetime.now(UTC),
    )
    events += apply_observation(fold_task(key, events), binding)
    headers: dict[str, str] = {}
    if webhook_url is not None:
        token, secret = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        auth = f"Bearer {secret}"
        registered = {
            "config_id": f"cf-{uuid.uuid4().hex[:16]}",
            "url": webhook_url,
            "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
            "auth_sha256": hashlib.sha256(auth.encode()).hexdigest(),
            "status": "provisional",
            "card_revision": template["card_revision"],
        }
        events.append(ev.WebhookRegistered.from_payload(registered))
        headers = {
            "content-type": "application/json",
            "x-a2a-notification-token": token,
            "authorization": auth,
        }
    return key, remote, events, headers


def push_tasks(
    store: EventStore, template: dict[str, Any], count: int, webhook_url: str
) -> list[PushTask]:
    log = TaskLog(store)
    out = []
    for _ in range(count):
        key, remote, events, headers = clone_events(template, "submitted", webhook_url=webhook_url)
        log.create(key, events)
        out.append(PushTask(key, remote, headers))
    return out


def status_body(remote_task_id: str, state: str) -> str:
    """A 1.0 ``StreamResponse`` status update, as a2a-sdk's push sender posts it."""
    return json.dumps(status_update(remote_task_id, state, STAMPS[state], CONTEXT_ID))


def push_plan(tasks: list[PushTask], folder: Path) -> Path:
    """A job file: per connection, each of its tasks' ``working`` then ``completed`` delivery."""
    connections: list[list[dict[str, Any]]] = [[] for _ in range(CONNECTIONS)]
    for i, task in enumerate(tasks):
        for state in ("working", "completed"):
            body = status_body(task.remote_task_id, state)
            connections[i % CONNECTIONS].append({"headers": task.headers, "body": body})
    path = folder / f"push-{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(connections))
    return path


# -- part 1: push ----------------------------------------------------------------------------------


class Sender:
    """The sender process: ``run(port, job)`` posts a job's deliveries; its result."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.child = child

    def run(self, port: int, job: Path) -> dict[str, Any]:
        stdin, stdout = self.child.stdin, self.child.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps({"port": port, "file": str(job)}) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError("the sender process ended")
        result: dict[str, Any] = json.loads(line)
        return result


@contextlib.contextmanager
def sender(folder: Path) -> Iterator[Sender]:
    args = [sys.executable, str(HERE), "sender"]
    popen: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    with _process(args, folder / "sender.log", **popen) as child:
        try:
            yield Sender(child)
        finally:
            if child.stdin is not None:
                child.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)


def baseline_app() -> Starlette:
    """``POST /webhook``: read the body, answer 200 like an applied delivery; nothing else."""

    async def deliveries(request: Request) -> Response:
        await request.body()
        return JSONResponse({"outcome": "applied", "detail": ""})

    return Starlette(routes=[Route("/webhook", deliveries, methods=["POST"])])


def floor_app(store: EventStore, calls: StoreCalls) -> Starlette:
    """``POST /webhook``: read the body, decode it, append it whole as one event to a stream of
    the task it names (one transaction, on a store worker thread like the engine's), then answer
    200: the least a delivery answered only once it is durable can cost. No lookup, no
    credentials, no lifecycle, no follow-up read."""
    versions: dict[str, int] = {}

    def append(stream_id: str, document: dict[str, Any]) -> None:
        version = versions.get(stream_id, 0)
        store.append(stream_id, version, [NewEvent("DeliveryReceived", document)])
        versions[stream_id] = version + 1

    async def deliveries(request: Request) -> Response:
        document = json.loads(await request.body())
        stream_id = f"floor-{document['statusUpdate']['taskId']}"
        await calls.run(append, stream_id, document)
        return JSONResponse({"outcome": "applied", "detail": ""})

    return Starlette(routes=[Route("/webhook", deliveries, methods=["POST"])])


class Served:
    """An ASGI app under uvicorn in a thread of this process (``ServerThread``), its own loop."""

    def __init__(self, app: Any, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
        self.server = ServerThread(app)
        if on_stop is not None:
            self.server.on_stop(on_stop)
        self.server.start()
        self.port = self.server.port

    def call(self, job: Awaitable[_T]) -> _T:
        """Run ``job`` on the server's loop and wait for it."""
        loop = self.server._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(_awaited(job), loop).result()

    def stop(self) -> None:
        self.server.stop()


async def _awaited(job: Awaitable[_T]) -> _T:
    return await job


async def drained(engine: Engine) -> None:
    """Wait for what deliveries set off in the engine: closing reads, boundary re-checks."""
    await engine.settle()


@contextlib.contextmanager
def decisions_logged() -> Iterator[None]:
    """Log every decision as ``cardfence serve`` does (JSON lines at INFO, written by a thread
    of their own), to /dev/null."""
    root = logging.getLogger("cardfence")
    saved = (root.handlers[:], root.level, root.propagate)
    with open(os.devnull, "w") as sink:
        decisions = DecisionLog(sink)
        root.handlers[:] = [decisions.handler]
        root.setLevel(logging.INFO)
        root.propagate = False
        decisions.start()
        try:
            yield
        finally:
            root.handlers[:], root.level, root.propagate = saved
            decisions.stop()


@dataclass(slots=True)
class PushSide:
    """One engine served by the webhook app, with its tasks (a list per timed run)."""

    name: str
    engine: Engine
    served: Served
    jobs: list[Path]
    results: list[dict[str, Any]]


def _push_side(
    name: str, url: Any, template: dict[str, Any], folder: Path, runs: int, count: int,
    *, inline: bool,
) -> PushSide:  # fmt: skip
    store = EventStore.open(url)
    calls = StoreCalls(store, workers=0) if inline else None
    engine = Engine(store, engine_client(), EngineConfig(), calls=calls)  # as `serve` makes it
    served = Served(webhook_app(engine), on_stop=engine.aclose)
    hook = f"http://127.0.0.1:{served.port}/webhook"
    jobs = [push_plan(push_tasks(store, template, count, hook), folder) for _ in range(runs + 1)]
    return PushSide(name, engine, served, jobs, [])


def _sent(side: PushSide, sender: Sender, job: Path) -> int:
    mark = side.engine.store.last_position()
    result = sender.run(side.served.port, job)
    side.served.call(drained(side.engine))
    result["events"] = side.engine.store.last_position() - mark
    side.results.append(result)
    return int(result["sent"])


def push_on(
    ctx: BenchContext, label: str, url: Any, agent_url: str, folder: Path, sizes: Sizes
) -> list[Figure]:
    runs, count = ctx.runs, sizes.push_tasks
    ctx.progress(f"push on {label}: creating {count} tasks per run")
    template = template_submitted(url, agent_url)
    sides = [_push_side("ours", url, template, folder, runs, count, inline=False)]
    if label == "postgresql":
        sides.append(_push_side("inline", url, template, folder, runs, count, inline=True))
    base = Served(baseline_app())
    floor_store = EventStore.open(url)
    floor_calls = StoreCalls(floor_store)
    floor = Served(floor_app(floor_store, floor_calls))
    base_jobs = [push_plan(push_tasks_shape(count), folder) for _ in range(runs + 1)]
    floor_jobs = [push_plan(push_tasks_shape(count), folder) for _ in range(runs + 1)]
    base_results: list[dict[str, Any]] = []
    try:
        with sender(folder) as send, decisions_logged():

            def answered(served: Served, job: Path) -> int:
                result = send.run(served.port, job)
                base_results.append(result)
                return int(result["sent"])

            # Warm up every side once: connections, imports, the card memo, caches.
            for side in sides:
                _sent(side, send, side.jobs[0])
            answered(base, base_jobs[0])
            answered(floor, floor_jobs[0])
            workloads: dict[str, Workload] = {
                "baseline": runs_of(base_jobs[1:], functools.partial(answered, base)),
                "floor": runs_of(floor_jobs[1:], functools.partial(answered, floor)),
            }
            for side in sides:
                workloads[side.name] = runs_of(side.jobs[1:], functools.partial(_sent, side, send))
            ctx.progress(f"push on {label}: {2 * count} deliveries a run")
            rates = median_rates(workloads, runs)
    finally:
        base.stop()
        floor.stop()
        floor_calls.close()
        floor_store.close()
        for side in sides:
            side.served.stop()
    for side in sides:
        _check_applied(side.name, side.results, 2 * count)
    for result in base_results:
        if result["statuses"] != {"200": result["sent"]}:
            raise AssertionError(f"push baseline: statuses {result['statuses']}")
    per = f"{count} tasks x (working, completed) a run over {CONNECTIONS} connections"
    ours = sides[0]
    events = sum(r["events"] for r in ours.results) / sum(r["sent"] for r in ours.results)
    tasks = len(sides) * len(ours.jobs) * count + 1  # and the template task
    ctx.note(
        f"push {label}: {per}; ours {1e3 / rates['ours']:.2f} ms per delivery (its boundary "
        f"re-check and closing read included; {events:.2f} events appended per delivery; "
        f"{tasks} tasks in the store), baseline {1e3 / rates['baseline']:.2f} ms, floor "
        f"{1e3 / rates['floor']:.2f} ms"
    )
    figures = [
        Figure.compared(
            _tagged(f"{label} push deliveries applied through the webhook app (vs 200-only)", ctx),
            rates["ours"],
            rates["baseline"],
            "deliveries/s",
            PUSH_TARGET,
        ),
        Figure.compared(
            _tagged(f"{label} push floor: decode + one append each (vs 200-only)", ctx),
            rates["floor"],
            rates["baseline"],
            "deliveries/s",
            None,
        ),
        Figure.compared(
            _tagged(f"{label} push deliveries applied (vs the floor)", ctx),
            rates["ours"],
            rates["floor"],
            "deliveries/s",
            None,
        ),
    ]
    if "inline" in rates:
        figures.append(
            Figure.compared(
                _tagged(
                    f"{label} push, store calls on worker threads (vs inline on the loop)", ctx
                ),
                rates["ours"],
                rates["inline"],
                "deliveries/s",
                None,
            )
        )
        ctx.note(
            f"push {label}: store calls inline on the loop {rates['inline']:,.0f} deliveries/s"
        )
    return figures


def push_tasks_shape(count: int) -> list[PushTask]:
    """Tasks for the baseline: the same requests' shape, credentials and ids (never stored)."""
    out = []
    for _ in range(count):
        token = secrets.token_urlsafe(32)
        headers = {
            "content-type": "application/json",
            "x-a2a-notification-token": token,
            "authorization": f"Bearer {secrets.token_urlsafe(32)}",
        }
        out.append(PushTask(uuid.uuid4().hex, f"r-{uuid.uuid4().hex}", headers))
    return out


def _check_applied(name: str, results: list[dict[str, Any]], per_run: int) -> None:
    for result in results:
        if result["sent"] != per_run or result["outcomes"] != {"applied": per_run}:
            raise AssertionError(
                f"push {name}: {result['sent']} sent, statuses {result['statuses']}, "
                f"outcomes {result['outcomes']} (every delivery must be applied)"
            )


@register("push")
def push_section(ctx: BenchContext) -> list[Figure]:
    """Deliveries applied per second through the webhook app, beside a 200-only app."""
    sizes = Sizes.for_context(ctx)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="cardfence-bench-push-") as name:
        folder = Path(name)
        with responder(folder, "completed") as agent_url:
            with sqlite_database() as db:
                figures += push_on(ctx, "sqlite", db.url, agent_url, folder, sizes)
            if ctx.pg_url:
                with postgres_database(ctx.pg_url) as db:
                    figures += push_on(ctx, "postgresql", db.url, agent_url, folder, sizes)
            stats = responder_stats(agent_url)
        ctx.note(
            f"push: the agent answered {stats['card']} card GETs ({stats['card 304']} of them "
            f"304: boundary re-checks after 'working', and creation), {stats['GetTask']} "
            "GetTasks (closing reads)"
        )
    return figures


# -- part 2: serve-memory --------------------------------------------------------------------------


def _serve_args(db_url: str) -> list[str]:
    return [
        sys.executable, "-m", "cardfence", "serve", "--db", db_url, "--host", "127.0.0.1",
        "--port", "0", "--max-poll-interval", "3600",
    ]  # fmt: skip


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _listening(log: Path) -> bool:
    return "cardfence serve: webhook at" in log.read_text(errors="replace")


@dataclass(frozen=True, slots=True)
class Resident:
    rss_mb: float
    peak_mb: float
    seconds: float  # from start to the reading's trigger (up, or every task polled)
    stopped: bool  # whether SIGTERM ended it (exit 0) within STOP_SECONDS


def serve_resident(
    db_url: str, folder: Path, *, polled: Callable[[], bool] | None = None
) -> Resident:
    """Start ``cardfence serve`` on ``db_url``, wait until it listens (and ``polled()``), then
    a second; its RSS and peak RSS. It is stopped with SIGTERM and must exit 0."""
    log = folder / f"serve-{uuid.uuid4().hex[:8]}.log"
    started = time.monotonic()
    with _process(_serve_args(db_url), log, stdin=subprocess.DEVNULL,
                  stdout=subprocess.DEVNULL) as child:  # fmt: skip
        _wait_for(lambda: _listening(log) or child.poll() is not None, "serve", 120)
        if child.poll() is not None:
            raise RuntimeError(f"serve ended: {log.read_text()[-2000:]}")
        if polled is not None:
            _wait_for(polled, "every task to be polled once", 900)
        seconds = time.monotonic() - started
        time.sleep(1.0)
        rss, peak = _status_kb(child.pid, "VmRSS"), _status_kb(child.pid, "VmHWM")
        child.send_signal(signal.SIGTERM)
        try:
            code: int | None = child.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            code = None  # reported by the section
            child.kill()
            child.wait()
    if code not in (0, None):
        raise RuntimeError(f"serve exited {code} on SIGTERM: {log.read_text()[-2000:]}")
    return Resident(rss / 1024, peak / 1024, seconds, code == 0)


def live_tasks(url: str, template: dict[str, Any], count: int) -> None:
    """``count`` tasks in ``working``, bound to remote ids, written to the store at ``url``."""
    store = EventStore.open(url)
    try:
        log = TaskLog(store)
        for _ in range(count):
            key, _, events, _ = clone_events(template, "working")
            log.create(key, events)
    finally:
        store.close()


@register("serve-memory")
def serve_memory_section(ctx: BenchContext) -> list[Figure]:
    """RSS of one ``cardfence serve`` holding many live tasks, over the same one idle."""
    sizes = Sizes.for_context(ctx)
    count = sizes.memory_tasks
    if ctx.pg_url:
        ctx.note("serve-memory runs on SQLite only: --pg-url is not used")
    with tempfile.TemporaryDirectory(prefix="cardfence-bench-mem-") as name:
        folder = Path(name)
        empty, loaded = f"sqlite:///{folder / 'empty.db'}", f"sqlite:///{folder / 'loaded.db'}"
        EventStore.open(empty).close()
        with responder(folder, "working") as agent_url:
            ctx.progress(f"serve-memory: writing {count} live tasks")
            template = template_submitted(loaded, agent_url)
            live_tasks(loaded, template, count - 1)  # the template's own task is the last
            idle: list[Resident] = []
            held: list[Resident] = []
            for run in range(sizes.memory_runs):
                ctx.progress(f"serve-memory: run {run + 1} of {sizes.memory_runs}")
                mark = responder_stats(agent_url)["GetTask"]

                def polled(mark: int = mark) -> bool:
                    return responder_stats(agent_url)["GetTask"] >= mark + count

                pair: list[Callable[[], None]] = [
                    lambda: idle.append(serve_resident(empty, folder)),
                    lambda: held.append(serve_resident(loaded, folder, polled=polled)),
                ]
                for step in pair if run % 2 == 0 else pair[::-1]:
                    step()
    idle_mb = sorted(r.rss_mb for r in idle)[len(idle) // 2]
    held_mb = sorted(r.rss_mb for r in held)[len(held) // 2]
    over = held_mb - idle_mb
    first_round = sorted(r.seconds for r in held)[len(held) // 2]
    verdict = "ok" if over <= MEMORY_BUDGET_MB else "OVER"
    ctx.note(
        f"serve-memory: idle serve {idle_mb:.1f} MB RSS; with {count:,} live tasks "
        f"{held_mb:.1f} MB "
        f"(peak {max(r.peak_mb for r in held):.1f} MB), read 1 s after every task was polled once "
        f"({first_round:.1f} s from start); {over:.1f} MB over idle, "
        f"{over * 1024 / count:.1f} KB a task: budget {MEMORY_BUDGET_MB:g} MB {verdict}"
    )
    hung = sum(1 for r in held if not r.stopped), sum(1 for r in idle if not r.stopped)
    if any(hung):
        ctx.note(
            f"serve-memory: SIGTERM did not end serve within {STOP_SECONDS:g} s in {hung[0]} of "
            f"{len(held)} loaded runs and {hung[1]} of {len(idle)} idle runs (killed)"
        )
    return [
        Figure(
            _tagged(f"serve RSS holding {count:,} live tasks, over an idle serve", ctx),
            over,
            "MB",
            None,
            None,
            MEMORY_BUDGET_MB,
        )
    ]


# -- part 3: serve-e2e -----------------------------------------------------------------------------


class EngineAtOnce:
    """``count`` tasks started and driven to terminal by one engine, all at once."""

    def __init__(self, engine: Engine, agent_url: str) -> None:
        self.engine = engine
        self.agent_url = agent_url

    async def one(self) -> None:
        view = await self.engine.start_task(self.agent_url, skill="slow", text=SLOW_SECONDS)
        done = await self.engine.drive(view.task, until="terminal")
        if done.state != "completed":
            raise AssertionError(f"engine: task {view.task} ended {done.state}")

    async def run(self, count: int) -> int:
        await asyncio.gather(*(self.one() for _ in range(count)))
        return count


class BareAtOnce:
    """The same with the a2a-sdk 1.3 client: SendMessage (returnImmediately), then GetTask with
    ``Engine.drive``'s backoff (at once, then ``first_poll`` doubling to ``max_poll``) until
    terminal. ``at_once`` bounds the sends in flight (None: all at once)."""

    def __init__(
        self,
        client: Client,
        *,
        text: str = SLOW_SECONDS,
        first_poll: float = FIRST_POLL,
        max_poll: float = MAX_POLL,
        at_once: int | None = None,
    ) -> None:
        self.client = client
        self.text = text
        self.first_poll = first_poll
        self.max_poll = max_poll
        self._gate = asyncio.Semaphore(at_once) if at_once else contextlib.nullcontext()

    async def one(self) -> None:
        message = Message(
            message_id=f"m-{uuid.uuid4().hex}",
            role=Role.ROLE_USER,
            parts=[Part(text=self.text, media_type="text/plain")],
            context_id=f"c-{uuid.uuid4().hex}",
        )
        message.metadata.update({"skillId": "slow"})
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        task: A2ATask | None = None
        async with self._gate:
            async for response in self.client.send_message(request):
                if response.HasField("task"):
                    task = response.task
        if task is None:
            raise AssertionError("bare: SendMessage answered without a task")
        delay = self.first_poll
        while not reached(_state(task), "terminal"):
            task = await self.client.get_task(GetTaskRequest(id=task.id, history_length=0))
            if reached(_state(task), "terminal"):
                break
            await asyncio.sleep(min(delay, self.max_poll))
            delay = min(delay * 2, self.max_poll)
        if _state(task) != "completed":
            raise AssertionError(f"bare: task {task.id} ended {_state(task)}")

    async def run(self, count: int) -> int:
        await asyncio.gather(*(self.one() for _ in range(count)))
        return count


@register("serve-e2e")
def serve_e2e_section(ctx: BenchContext) -> list[Figure]:
    """Tasks in flight at once through one engine vs a bare a2a-sdk client, agent in its own
    process."""
    sizes = Sizes.for_context(ctx)
    count = sizes.e2e_tasks
    if ctx.pg_url:
        ctx.note("serve-e2e runs on SQLite only: --pg-url is not used")
    with (
        tempfile.TemporaryDirectory(prefix="cardfence-bench-e2e-") as name,
        demo_agent_process(Path(name) / "agent.log") as agent_url,
        asyncio.Runner() as runner,
        contextlib.ExitStack() as stack,
    ):

        def engine_on(db: str, config: EngineConfig) -> Engine:
            """An engine as ``Engine.connect`` makes one (its own client), on SQLite."""
            http = engine_client()
            engine = Engine(EventStore.open(f"sqlite:///{Path(name) / db}"), http, config)
            stack.callback(lambda: runner.run(http.aclose()))
            stack.callback(lambda: runner.run(engine.aclose()))
            return engine

        engine = engine_on("e2e.db", engine_config())
        # httpx keeps an idle connection 5 s, exactly as long as uvicorn (the agent) keeps it
        # open: a request sent on it as the agent closes it fails. Kept shorter, it never meets
        # the close; nothing else of httpx's defaults changes.
        bare_http = httpx.AsyncClient(
            headers={"A2A-Version": "1.0"},
            limits=httpx.Limits(
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=2
            ),
        )
        stack.callback(lambda: runner.run(bare_http.aclose()))
        card = runner.run(A2ACardResolver(bare_http, agent_url).get_agent_card())
        config = ClientConfig(streaming=False, polling=True, httpx_client=bare_http)
        drivers: dict[str, EngineAtOnce | BareAtOnce] = {
            "bare": BareAtOnce(ClientFactory(config).create(card)),
            "ours": EngineAtOnce(engine, agent_url),
        }
        for driver in drivers.values():  # warm up: connections, card memo, caches
            runner.run(driver.run(min(count, 20)))
        ctx.progress(f"serve-e2e: {count} tasks at once: engine, bare client")

        def workload(driver: EngineAtOnce | BareAtOnce) -> Workload:
            return lambda: runner.run(driver.run(count))

        rates = median_rates({k: workload(d) for k, d in drivers.items()}, ctx.runs)
        runner.run(engine.settle())
    seconds = {k: count / rate for k, rate in rates.items()}
    ctx.note(
        f"serve-e2e: {count} 'slow {SLOW_SECONDS}' tasks at once a run; engine "
        f"{seconds['ours']:.2f} s a run, bare client {seconds['bare']:.2f} s"
    )
    name = f"end to end, {count} tasks in flight at once, one engine"
    return [
        Figure.compared(
            _tagged(f"{name} (vs a2a-sdk client)", ctx),
            rates["ours"],
            rates["bare"],
            "tasks/s",
            E2E_TARGET,
        )
    ]


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("responder", "sender"):
    if sys.argv[1] == "responder":
        responder_main(int(sys.argv[2]), sys.argv[3])
    else:
        sender_main()
    sys.exit(0)
