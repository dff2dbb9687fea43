"""The engine's part that reaches agents: its HTTP clients (one more per client certificate,
for mutual TLS), a transport per endpoint and grant, and the card reads a task is compared with
(R7, R9, R15).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import httpx

from cardfence.engine.auth.authorization import TaskCredentials
from cardfence.engine.cards.model import AgentCard, Interface
from cardfence.engine.client._access import Access
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import guards
from cardfence.engine.core.replay import State
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import (
    CardInvalidError,
    CardSignatureError,
    CredentialsConfigError,
    CredentialsMissingError,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
)
from cardfence.engine.http.pool import RequestSlots, engine_client, tls_context
from cardfence.engine.wire.transport import A2ATransport

# Why an authenticated extended card could not be read (R15): the public card decides then.
EXTENDED_FAILURES = (
    EndpointUnreachableError,  # AuthorizationFailedError (401/403, no token) included
    RemoteRefusedError,  # -32007 ExtendedAgentCardNotConfigured, -32004, ...
    InvalidAgentResponseError,
    CardInvalidError,
    CredentialsMissingError,
    CredentialsConfigError,
)


class Connections:
    """Transports to agents' endpoints, carrying a task's credentials, and card reads."""

    def __init__(
        self,
        config: EngineConfig,
        client: httpx.AsyncClient,
        discovery: Discovery,
        access: Access,
        *,
        owns_client: bool,
        slots: RequestSlots,
    ) -> None:
        self.config = config
        self.client = client
        self.discovery = discovery
        self.access = access
        self.owns_client = owns_client
        self.request_slots = slots
        self.transports: dict[tuple[str, str, str, str, tuple[str, ...], int], A2ATransport] = {}
        self.tls_clients: dict[tuple[str, str], httpx.AsyncClient] = {}  # mutual TLS

    @property
    def allow_insecure(self) -> bool:
        """Plain http to hosts other than loopback, for cards, interfaces and webhooks (R16)."""
        return self.config.card_limits.allow_insecure

    # -- transports ----------------------------------------------------------------------------

    def transport(
        self,
        endpoint: Mapping[str, Any],
        credentials: TaskCredentials | None = None,
        *,
        keep: bool = True,
        extensions: tuple[str, ...] = (),
    ) -> A2ATransport:
        """The transport to ``endpoint``, carrying ``credentials`` (one per grant and place;
        ``keep`` False: a transport for one request, not kept), in the A2A version the endpoint
        was recorded with (1.0 for tasks recorded before it was kept)."""
        url, binding = str(endpoint["url"]), str(endpoint["binding"])
        version, tenant = guards.endpoint_version(endpoint), str(endpoint.get("tenant") or "")
        grant = id(credentials.grant) if credentials else 0
        place = (url, binding, version, tenant, extensions, grant)
        transport = self.transports.get(place)
        if transport is None:
            cert = credentials.client_cert() if credentials is not None else None
            transport = A2ATransport(
                self.client_for(cert), Interface(url, binding, version, tenant=tenant),
                timeout=self.config.request_timeout, credentials=credentials,
                slots=self.request_slots, extensions=extensions,
            )  # fmt: skip
            if keep:
                self.transports[place] = transport
        return transport

    async def task_transport(self, state: State) -> A2ATransport:
        """The transport for a request of the task ``state`` describes: to its recorded
        endpoint, with the credentials its frozen contract grants -- none when that endpoint
        is no longer at the origin the task was created at (R15: never leak); naming the
        extensions the task activated at its creation (frozen: never a later card's)."""
        extensions = tuple(state.get("extensions") or ())
        credentials = await self.access.task_credentials(state)
        return self.transport(state["endpoint"], credentials, extensions=extensions)

    def client_for(self, cert: tuple[str, str] | None) -> httpx.AsyncClient:
        """The engine's client, or for mutual TLS one that presents the client certificate."""
        if cert is None:
            return self.client
        client = self.tls_clients.get(cert)
        if client is None:
            context = tls_context(self.config.ca_file)
            try:
                context.load_cert_chain(*cert)
            except (OSError, ssl.SSLError) as error:
                raise CredentialsConfigError(
                    "mtls", f"client certificate {cert[0]} cannot be loaded ({error})"
                ) from None
            client = engine_client(context)
            self.tls_clients[cert] = client
        return client

    # -- the card a task is compared with (R7, R9, R15) ----------------------------------------

    async def task_card(
        self, state: State, *, fresh: bool, share: bool = False
    ) -> tuple[AgentCard | None, DiscoveryError | None, DiscoveryError | None]:
        """The card R7 and R9 compare a task with: the public card, or for a task created under
        the authenticated extended card that card, read again with the task's own credentials
        (R15). ``(card, failure, unread)``: when the extended read fails, ``unread`` says why
        (kind ``extended_card``) and the public card (or its failure) stands in."""
        if state.get("extended"):
            endpoint = state["endpoint"]
            marker = (
                endpoint["url"],
                endpoint["binding"],
                guards.endpoint_version(endpoint),
                endpoint.get("tenant") or "",
                repr(state.get("authorization")),
            )
            try:
                transport = await self.task_transport(state)
                read = await self.discovery.read_extended(
                    str(state["agent_url"]), transport, memo=marker, fresh=fresh,
                    public_revision=state.get("public_revision"),
                )  # fmt: skip
            except (*EXTENDED_FAILURES, CardSignatureError) as error:  # as any failed read
                url = getattr(error, "url", "") or str(endpoint["url"])
                unread = DiscoveryError(url, "extended_card", f"{type(error).__name__}: {error}")
                card, failure = await self.read(state["agent_url"], fresh=fresh, share=share)
                return card, failure, unread
            return read.card, None, None
        card, failure = await self.read(state["agent_url"], fresh=fresh, share=share)
        return card, failure, None

    async def read(
        self, agent_url: str, *, fresh: bool, share: bool
    ) -> tuple[AgentCard | None, DiscoveryError | None]:
        try:
            read: CardRead = await self.discovery.read(agent_url, fresh=fresh, share=share)
        except DiscoveryError as failure:
            return None, failure
        return read.card, None

    async def aclose(self) -> None:
        """The engine's own client, then the mutual-TLS ones."""
        if self.owns_client:
            await self.client.aclose()
        for tls_client in self.tls_clients.values():
            await tls_client.aclose()
