"""A test agent with an authenticated extended Agent Card (R15): `ExtendedPeer`.

`Peer` (the demo agent: a2a-sdk 1.3's own ``DefaultRequestHandler`` on 127.0.0.1) with its
handler rebuilt the way a2a-sdk serves an extended card: ``extended_agent_card=`` given, and
``capabilities.extended_agent_card`` set in the card the handler and the card route serve. The
public card lists every demo skill but :data:`EXTENDED_ONLY` (``slow``); the extended card
(``GetExtendedAgentCard``: JSON-RPC, and ``GET {rest}/extendedAgentCard``) lists them all.

- ``configured=False``: the card still says ``extendedAgentCard: true`` but the handler has no
  extended card, so the read is refused with -32007 ``ExtendedAgentCardNotConfigured``.
- ``bearer=True`` (the default): both cards declare an HTTP bearer scheme ``bearer`` and require it
  at card level. The agent does not check it; `extended_authorizations` records the
  ``Authorization`` header every ``GetExtendedAgentCard`` came with.

`DemoAgent` itself is unchanged: this rebuilds its handler and routes before the server starts.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCard,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cardfence.engine.demo.agent import JSONRPC_PATH, REST_PREFIX, CallLog
from cardfence.engine.demo.executor import ScriptedExecutor

from .peer import Peer

__all__ = ["EXTENDED_ONLY", "ExtendedPeer"]

EXTENDED_ONLY = "slow"  # the skill only the extended card lists


class ExtendedPeer(Peer):
    """`Peer` serving an authenticated extended card; use as ``with ExtendedPeer() as peer:``.

    Attributes beyond `Peer`'s:
        extended_card: the protobuf card ``GetExtendedAgentCard`` answers (None when not
            ``configured``).
        extended_authorizations: the ``Authorization`` header (or None) of every
            ``GetExtendedAgentCard`` received, in order.
    """

    def __init__(self, *, configured: bool = True, bearer: bool = True) -> None:
        super().__init__(name="cardfence-extended-peer")
        self.extended_authorizations: list[str | None] = []
        extended = AgentCard()
        extended.CopyFrom(self.agent_card)
        extended.capabilities.extended_agent_card = True
        if bearer:
            extended.security_schemes["bearer"].CopyFrom(
                SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))
            )
            extended.security_requirements.append(
                SecurityRequirement(schemes={"bearer": StringList()})
            )
        public = AgentCard()
        public.CopyFrom(extended)
        kept = [skill for skill in public.skills if skill.id != EXTENDED_ONLY]
        del public.skills[:]
        public.skills.extend(kept)
        self.agent_card = public
        self.extended_card: AgentCard | None = extended if configured else None
        self._card = agent_card_to_dict(public)

        # The handler a2a-sdk serves an extended card with; the push store and sender are the
        # demo agent's (its switches keep working).
        self.handler = DefaultRequestHandler(
            agent_executor=ScriptedExecutor(self.holding),
            task_store=InMemoryTaskStore(),
            agent_card=public,
            push_config_store=self._push_sender.store,
            push_sender=self._push_sender,
            extended_agent_card=self.extended_card,
        )
        routes: list[BaseRoute] = [
            Route(path, self._card_endpoint, methods=["GET"]) for path in self.card_paths
        ]
        routes.extend(create_jsonrpc_routes(self.handler, rpc_url=JSONRPC_PATH))
        routes.extend(create_rest_routes(self.handler, path_prefix=REST_PREFIX))
        logged = CallLog(Starlette(routes=routes), self)  # the demo agent's call log
        self._server.app = _ExtendedCardAuthorization(logged, self)

    def reset(self) -> None:
        super().reset()
        self.extended_authorizations.clear()


class _ExtendedCardAuthorization:
    """Records the ``Authorization`` header of every ``GetExtendedAgentCard`` request."""

    def __init__(self, app: ASGIApp, peer: ExtendedPeer) -> None:
        self._app = app
        self._peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if path.endswith(REST_PREFIX + "/extendedAgentCard"):
            self._peer.extended_authorizations.append(headers.get("authorization"))
        elif path == JSONRPC_PATH:
            body, receive = await _buffered(receive)
            if _jsonrpc_method(body) == "GetExtendedAgentCard":
                self._peer.extended_authorizations.append(headers.get("authorization"))
        await self._app(scope, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body, and a ``receive`` that gives it again."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return body, again


def _jsonrpc_method(body: bytes) -> Any:
    try:
        return json.loads(body).get("method")
    except (ValueError, AttributeError):
        return None
