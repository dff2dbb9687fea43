"""Transports to agents that are httpx handlers (``httpx.MockTransport``): for answers no real
agent gives on request, compared whole without a server.

    @pytest.fixture
    async def agent() -> AsyncIterator[Make]:
        async with mocked_agents() as make:
            yield make

``make(handler, binding=JSONRPC, version="1.0", **transport_options)`` is an
:class:`A2ATransport` to the interface at :data:`RPC` (JSON-RPC) or :data:`REST` (HTTP+JSON),
each on a client of its own, all closed when the block ends.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from cardfence.engine.cards.interfaces import JSONRPC
from cardfence.engine.cards.model import Interface
from cardfence.engine.transport import A2ATransport

RPC = "http://agent.test/a2a/jsonrpc"
REST = "http://agent.test/a2a/rest"

Handler = Callable[[httpx.Request], Any]  # an answer, or an awaitable of one
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
