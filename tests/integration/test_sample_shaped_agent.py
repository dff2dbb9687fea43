"""An agent built the way the A2A project's own hello-world sample builds one, on a2a-sdk 1.3.

The sample is what most agents start from, and it differs from the demo agent in ways a client
can trip on: its only interface is JSON-RPC at the origin's root (``http://host:port``, no path)
and declares no ``protocolVersion``; its card offers streaming and an extended card (served to
anyone, no security declared) whose extra skill the public card lacks; it offers no push; and its
executor reports a status message with ``working`` and with ``completed``, and its answer as an
artifact in between. The agent here is served by a2a-sdk's own request handler and routes
(``create_agent_card_routes``, ``create_jsonrpc_routes`` at ``/``), with an executor of ours that
reports what the sample's does, in the same order. The sample's earlier edition (A2A 0.3)
answered with one message and created no task: a second agent does that. Every engine block
ends with the audit.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_message
from a2a.helpers import new_text_part as text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send
from support import ServerThread
from support.engine_fixtures import FAST, audited_engine, data_of, transitions, types

from cardfence.engine.cli.main import run as cli
from cardfence.engine.core import events as ev
from cardfence.engine.demo.agent import _jsonrpc_call, _read_body, _replay

PUBLIC_SKILL = "echo_bot"
EXTENDED_SKILL = "echo_bot_super_mode"  # only the extended card lists it


class HelloExecutor(AgentExecutor):
    """Reports what the sample's executor reports: the task, ``working`` with a message, the
    answer as an artifact, ``completed`` with a message."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue=event_queue, task_id=task.id, context_id=task.context_id)
        await updater.update_status(
            state=TaskState.TASK_STATE_WORKING, message=new_text_message("Processing request...")
        )
        answer = f"Hello, World! I have received your request ({get_message_text(context.message)})"
        await updater.add_artifact(parts=[text_part(text=answer, media_type="text/plain")])
        await updater.update_status(
            state=TaskState.TASK_STATE_COMPLETED, message=new_text_message("Request is completed!")
        )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("cancel is not offered")


class MessageExecutor(AgentExecutor):
    """Answers with one message and creates no task."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message("Hello World"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("cancel is not offered")


def _skill(skill_id: str) -> AgentSkill:
    return AgentSkill(
        id=skill_id,
        name=skill_id.replace("_", " "),
        description="Acknowledges the request with a hello.",
        input_modes=["text/plain"],
        output_modes=["text/plain"],
        tags=["a2a", "echo-example"],
    )


def _card(base_url: str, version: str, skills: list[str]) -> AgentCard:
    return AgentCard(
        name="Hello World Agent",
        description="Just a hello world agent",
        version=version,
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        capabilities=AgentCapabilities(streaming=True, extended_agent_card=True),
        # The root of the origin, and no protocolVersion: as the sample declares it.
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", url=base_url)],
        skills=[_skill(s) for s in skills],
    )


class MethodLog:
    """ASGI middleware recording the JSON-RPC method of every POST, then passing it on whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.methods: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, extra = await _read_body(receive)
        self.methods.append(_jsonrpc_call(body)[0])
        await self.app(scope, _replay(body, extra, receive), send)


@contextlib.contextmanager
def _served(executor: AgentExecutor) -> Iterator[tuple[str, MethodLog]]:
    """The sample's server around ``executor``: its base URL and the methods it was sent."""
    server = ServerThread()
    base = f"http://127.0.0.1:{server.port}"
    public = _card(base, "0.0.1", [PUBLIC_SKILL])
    extended = _card(base, "0.0.2", [PUBLIC_SKILL, EXTENDED_SKILL])
    handler = DefaultRequestHandler(
        agent_executor=executor,
        task_store=InMemoryTaskStore(),
        agent_card=public,
        extended_agent_card=extended,
    )
    routes = [*create_agent_card_routes(public), *create_jsonrpc_routes(handler, "/")]
    log = MethodLog(Starlette(routes=routes))
    server.app = log
    server.start()
    try:
        yield base, log
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hello() -> Iterator[tuple[str, MethodLog]]:
    with _served(HelloExecutor()) as served:
        yield served


@pytest.fixture(scope="module")
def replier() -> Iterator[tuple[str, MethodLog]]:
    """As the sample's earlier (A2A 0.3) edition answered: one message, no task."""
    with _served(MessageExecutor()) as served:
        yield served


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


async def test_a_task_on_a_sample_built_agent_completes_with_its_answer_at_the_root_endpoint(
    hello: tuple[str, MethodLog], db: str
) -> None:
    base, log = hello
    async with audited_engine(db, FAST) as engine:
        view = await engine.start_task(base, skill=PUBLIC_SKILL, text="hi there")
        done = await engine.drive(view.task, until="terminal", timeout=10)
        moves = transitions(engine.store, view.task)
        (submitted,) = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    assert done.state == "completed"
    (artifact,) = done.artifacts
    assert artifact["parts"][0]["text"] == "Hello, World! I have received your request (hi there)"
    assert done.last_message == "Request is completed!"
    assert moves[-1][1] == "completed", moves
    # The root, as declared; no version declared, so the one spoken (1.0) is recorded.
    assert submitted["endpoint"] == {"url": base, "binding": "JSONRPC", "protocol_version": "1.0"}
    assert "SendMessage" in log.methods


async def test_a_skill_only_the_open_extended_card_lists_is_created_under_that_card(
    hello: tuple[str, MethodLog], db: str
) -> None:
    base, log = hello
    async with audited_engine(db, FAST) as engine:
        view = await engine.start_task(base, skill=EXTENDED_SKILL, text="super hi")
        done = await engine.drive(view.task, until="terminal", timeout=10)
        (submitted,) = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    assert done.state == "completed"
    assert submitted["card_version"] == "0.0.2"  # frozen under the extended card
    assert "GetExtendedAgentCard" in log.methods


async def test_an_agent_offering_no_push_is_never_asked_to_register_a_webhook(
    hello: tuple[str, MethodLog], db: str
) -> None:
    base, log = hello
    async with audited_engine(db, FAST) as engine:
        view = await engine.start_task(base, skill=PUBLIC_SKILL, text="push me")
        outcome = await engine.register_webhook(view.task, "http://127.0.0.1:9/webhook")
        done = await engine.drive(view.task, until="terminal", timeout=10)
        recorded = types(engine.store, view.task)
    assert (outcome.registered, outcome.reason) == (False, "push_not_advertised"), outcome
    assert ev.DELIVERY_DOWNGRADED in recorded
    assert done.state == "completed"  # by polling
    assert "delivery_downgraded" in done.flags
    assert not [m for m in log.methods if "PushNotification" in m], log.methods


def test_an_answer_given_as_a_message_completes_the_task_and_run_prints_it(
    replier: tuple[str, MethodLog], db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _log = replier
    code = cli(["run", base, "--skill", PUBLIC_SKILL, "--text", "hi", "--json", "--db", db])
    out, err = capsys.readouterr()
    assert code == 0, err
    task = json.loads(out)
    assert (task["state"], task["remote_task_id"]) == ("completed", None)
    assert task["last_message"] == "Hello World"
    assert task["artifacts"] == []
    assert cli(["audit", "--db", db]) == 0, capsys.readouterr().out
