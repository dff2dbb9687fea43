"""Transports to agents that are httpx handlers (``httpx.MockTransport``): for answers no real
agent gives on request, compared whole without a server.

``mocked_agents()`` yields ``make(handler, binding=JSONRPC, version="1.0", **transport_options)``:
an :class:`A2ATransport` to the interface at :data:`RPC` (JSON-RPC) or :data:`REST` (HTTP+JSON),
each on a client of its own, all closed when the block ends (the wire tests' ``agent`` fixture).

:class:`ScriptedAgent` is the one mock agent of the engine's tests:
``engine_on(store, ScriptedAgent(...).transport())`` is an :class:`Engine` whose requests go to
the agent of ``support.cards``: its card, a new task ``r-1`` for every send, the answers the test
scripts for the rest, and every request kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.event_store import EventStore
from support.cards import card_document
from support.hostile import sse

RPC = "http://agent.test/a2a/jsonrpc"
REST = "http://agent.test/a2a/rest"

Handler = Callable[[httpx.Request], Any]  # an answer, or an awaitable of one
Answer = Callable[[dict[str, Any]], httpx.Response]  # an answer to a decoded JSON-RPC call
Make = Callable[..., A2ATransport]


@contextlib.asynccontextmanager
async def mocked_agents() -> AsyncIterator[Make]:
    clients: list[httpx.AsyncClient] = []

    def make(
        handler: Handler, binding: str = JSONRPC, version: str = "1.0", **options: Any
    ) -> A2ATransport:
        clients.append(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        url = RPC if binding == JSONRPC else REST
        return A2ATransport(clients[-1], Interface(url, binding, version), **options)

    try:
        yield make
    finally:
        for client in clients:
            await client.aclose()


def rpc_answer(request: httpx.Request, status: int = 200, **envelope: Any) -> httpx.Response:
    """A JSON-RPC 2.0 answer to ``request``, with its id and ``envelope``'s members."""
    request_id = json.loads(request.content)["id"]
    return httpx.Response(status, json={"jsonrpc": "2.0", "id": request_id, **envelope})


@contextlib.asynccontextmanager
async def engine_on(
    store: EventStore,
    agent: httpx.AsyncBaseTransport | None = None,
    config: EngineConfig | None = None,
) -> AsyncIterator[Engine]:
    """An engine on ``store`` whose requests ``agent`` answers (none: no request expected)."""
    async with (
        httpx.AsyncClient(transport=agent) as client,
        Engine(store, client, config or EngineConfig()) as engine,
    ):
        yield engine


def rpc_result(call: Mapping[str, Any], result: Any) -> httpx.Response:
    """A JSON-RPC 2.0 answer to the decoded ``call``: its id and ``result``."""
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": call["id"], "result": result})


def rpc_error(call: Mapping[str, Any], code: int, message: str) -> httpx.Response:
    """A JSON-RPC 2.0 error answer to the decoded ``call`` (an A2A error)."""
    error = {"code": code, "message": message}
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": call["id"], "error": error})


def submitted_task(call: Mapping[str, Any]) -> httpx.Response:
    """SendMessage answered with a new task ``r-1`` (context ``c-1``), submitted, in the A2A
    version the call speaks."""
    if call["method"] == "message/send":  # A2A 0.3
        task = {"kind": "task", "id": "r-1", "contextId": "c-1", "status": {"state": "submitted"}}
        return rpc_result(call, task)
    status = {"state": "TASK_STATE_SUBMITTED", "timestamp": "2026-01-01T00:00:00Z"}
    return rpc_result(call, {"task": {"id": "r-1", "contextId": "c-1", "status": status}})


class Body(httpx.AsyncByteStream):
    """A streamed body (httpx reads a body given as bytes whole before anyone streams it)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def stored_as_asked(call: Mapping[str, Any]) -> httpx.Response:
    """A push config answered as the agent stored it: the config asked for, echoed."""
    return rpc_result(call, call["params"])


def events_streamed(*events: dict[str, Any]) -> Answer:
    """A subscription answered with ``events`` (each a ``StreamResponse``) as server-sent
    events, then the end of the stream."""

    def answer(call: dict[str, Any]) -> httpx.Response:
        frames = [
            sse(json.dumps({"jsonrpc": "2.0", "id": call["id"], "result": e})) for e in events
        ]
        return httpx.Response(
            200, stream=Body(*frames), headers={"content-type": "text/event-stream"}
        )

    return answer


def task_answer(state: str, stamp: str = "2026-01-01T00:00:01Z") -> dict[str, Any]:
    """Task ``r-1`` (context ``c-1``) in ``state``, as of ``stamp``."""
    status = {"state": f"TASK_STATE_{state.upper().replace('-', '_')}", "timestamp": stamp}
    return {"id": "r-1", "contextId": "c-1", "status": status}


def answering(*states: str) -> Answer:
    """GetTask answered with ``states`` in turn, the last one for ever after."""
    left = list(states)

    def answer(call: dict[str, Any]) -> httpx.Response:
        state = left.pop(0) if len(left) > 1 else left[0]
        return rpc_result(call, task_answer(state, f"2026-01-01T00:00:{10 - len(left):02d}Z"))

    return answer


class ScriptedAgent:
    """The one mock agent: its card (a document, or a status for every read), SendMessage
    (``message/send`` in A2A 0.3) answered by ``send``, a push config by ``push`` (stored as
    asked), SubscribeToTask by ``subscribe``, any method named in ``answers`` by its answer,
    every other call by ``get``. Every request is
    counted by method (:attr:`asked`, ``"card"`` for a card read), with the loop's time it came
    at (:attr:`at`); every call is kept as it came (:attr:`requests`)."""

    def __init__(
        self,
        get: Answer | None = None,
        *,
        card: dict[str, Any] | int | None = None,
        subscribe: Answer | None = None,
        send: Answer | None = None,
        push: Answer = stored_as_asked,
        answers: Mapping[str, Answer] | None = None,
    ) -> None:
        self.send, self.push = send, push
        self.get, self.subscribe = get or answering("working"), subscribe
        self.answers = dict(answers or {})
        self.card: dict[str, Any] | int = card_document() if card is None else card
        self.asked: list[str] = []
        self.at: list[tuple[str, float]] = []
        self.requests: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            method = "card" if request.method == "GET" else json.loads(request.content)["method"]
            self.asked.append(method)
            self.at.append((method, asyncio.get_running_loop().time()))
            if method == "card":
                if isinstance(self.card, int):
                    return httpx.Response(self.card)
                return httpx.Response(200, json=self.card)
            self.requests.append(request)
            call = json.loads(request.content)
            if method in self.answers:
                return self.answers[method](call)
            if method in ("SendMessage", "message/send"):
                return (self.send or submitted_task)(call)
            if method in ("CreateTaskPushNotificationConfig", "tasks/pushNotificationConfig/set"):
                return self.push(call)
            if method == "SubscribeToTask" and self.subscribe is not None:
                return self.subscribe(call)
            return self.get(call)

        return httpx.MockTransport(handler)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every call, decoded, in the order it came."""
        return [json.loads(request.content) for request in self.requests]

    def methods(self) -> list[str]:
        """The method of every call (card reads left out), in the order they came."""
        return [call["method"] for call in self.calls]

    def count(self, method: str) -> int:
        return self.asked.count(method)

    def times(self, method: str) -> list[float]:
        """When each ``method`` request came, by the loop's clock."""
        return [when for asked, when in self.at if asked == method]


class RestAgent:
    """A mock agent over HTTP+JSON with an authenticated extended card: ``card`` is its public
    card (answered with the status :attr:`public`), ``extended`` what its GetExtendedAgentCard
    (``GET …/extendedAgentCard``, under a tenant's path too) answers, a card document or an HTTP
    status; every send creates ``r-1``. What it is asked is counted (``card``, ``extended``,
    ``send``: :attr:`asked`), each request kept as ``"VERB /path"`` (:attr:`paths`)."""

    def __init__(self, card: dict[str, Any], extended: dict[str, Any] | int) -> None:
        self.card, self.extended = card, extended
        self.public = 200
        self.asked: list[str] = []
        self.paths: list[str] = []

    def count(self, what: str) -> int:
        return self.asked.count(what)

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            self.paths.append(f"{request.method} {request.url.path}")
            if request.url.path.endswith("/extendedAgentCard"):
                self.asked.append("extended")
                if isinstance(self.extended, int):
                    return httpx.Response(self.extended, json={"error": "refused"})
                return httpx.Response(200, json=self.extended)
            if request.method == "GET":
                self.asked.append("card")
                return httpx.Response(self.public, json=self.card)
            self.asked.append("send")
            return httpx.Response(
                200, json={"task": task_answer("submitted", "2026-01-01T00:00:00Z")}
            )

        return httpx.MockTransport(handler)


def task_card_as(engine: Engine, card: Any, failure: Any, unread: Any) -> list[bool]:
    """From now on, ``engine``'s reads of a task's card (``_task_card``) give ``(card, failure,
    unread)``, as when the extended card could not be read again and the public one stands in.
    Returns the ``fresh`` asked for by each read, as they come."""
    fresh_asked: list[bool] = []

    async def read(_state: Any, *, fresh: bool, share: bool = False) -> tuple[Any, Any, Any]:
        fresh_asked.append(fresh)
        return card, failure, unread

    engine.connections.task_card = read  # type: ignore[method-assign]
    return fresh_asked
