"""The engine's ground floor: its configuration, what it holds, and the plumbing every part
shares -- store calls off the event loop, transports per endpoint and grant, the card a task is
compared with (R7, R9, R15), background checks that never take a task down with them (R1).

The engine is one class made of layers, each a module of this package: this one;
``observing`` (the one path every remote report takes, R10, R12, and the push ingress);
``creation`` (R2, R3, R4: what card state may gate); ``following`` (polls, drives and streams:
continuation, which card state never gates); and the package itself (replies, cancels, resume).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self, TypeVar

import httpx

from cardfence.engine.auth.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.auth.config import CredentialsProvider
from cardfence.engine.auth.tokens import TokenSource
from cardfence.engine.cards.canonical import loads
from cardfence.engine.cards.model import AgentCard, Interface, parse_card
from cardfence.engine.client.tasklog import AsOf, TaskLog, key_of
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.events import TaskEvent as Event
from cardfence.engine.core.observations import DEFAULT_MAX_CLOCK_SKEW
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.reads import CardRead, Discovery
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CardInvalidError,
    CardSignatureError,
    CredentialsConfigError,
    CredentialsMissingError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    ThrottledError,
)
from cardfence.engine.http.deadline import left as time_left
from cardfence.engine.http.offload import StoreCalls
from cardfence.engine.http.pool import RequestSlots, engine_client, tls_context
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.errors import LeaseLostError
from cardfence.store.event_store import EventStore

_CARDS_KEPT = 64  # parsed card revisions kept in memory
# R5: a request the agent answered 429 (or a send answered 503) waits at least this long before
# it goes again, doubling each time: an agent naming no wait is not asked again at once.
ASK_AGAIN_AFTER = 1.0
# Seconds a request asked again is given at least, before the deadline, to be answered in.
_ASK_AGAIN_ROOM = 1.0
_T = TypeVar("_T")
# Closing GetTasks in flight at once, the others waiting their turn: many at once grew httpx's
# pool past its 20 kept-alive connections, and its bookkeeping scans every one per request.
_CLOSING_READS = 8
# Background failures kept for settle() (every one is logged): the first this many, so an outage
# that fails every re-check does not hold each failure, traceback and all, in memory.
_ERRORS_KEPT = 100
# Streams drive() follows at once, the other tasks polled only until a slot frees: each stream
# holds a pooled connection of its own, and 200 at once left polls queued behind them.
_STREAMS = 32
# What ends a stream early (a drop is an EndpointUnreachableError); polling goes on regardless.
_STREAM_FAILURES = (EndpointUnreachableError, RemoteRefusedError, InvalidAgentResponseError)
_log = logging.getLogger("cardfence.engine")
# Why an authenticated extended card could not be read (R15): the public card decides then.
_EXTENDED_FAILURES = (
    EndpointUnreachableError,  # AuthorizationFailedError (401/403, no token) included
    RemoteRefusedError,  # -32007 ExtendedAgentCardNotConfigured, -32004, ...
    InvalidAgentResponseError,
    CardInvalidError,
    CredentialsMissingError,
    CredentialsConfigError,
)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Bounds the engine works within (CLI: ``--max-poll-interval``, ``--max-card-age``, …)."""

    max_poll_interval: float = 30.0
    # R5: the longest wait an agent's Retry-After (a 429, or a 503 with it) is honoured for.
    max_retry_after: float = 300.0
    first_poll_interval: float = 0.1
    max_card_age: float = 120.0
    card_limits: CardLimits = CardLimits()
    request_timeout: float = 30.0
    prefer_bindings: tuple[str, ...] = ()
    # R12: a status timestamp more than this many seconds ahead of its receipt orders nothing.
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW
    # Follow a task's event stream (SubscribeToTask) beside the safety polls when the card the
    # task last saw advertises streaming; a silent stream is dropped after this many seconds.
    follow_streams: bool = True
    stream_idle_timeout: float = 60.0
    # R15: ``(agent origin, security scheme name) -> secret`` (a CredentialsConfig from the
    # credentials file, or a host's own secret store); None sends no credentials, so a contract
    # that requires some is refused before sending.
    credentials: CredentialsProvider | None = None
    # Keys the fingerprints the log keeps of each secret (>= 16 bytes; random per process when
    # not given: fingerprints then tell secrets apart within one process only).
    fingerprint_key: bytes | None = dataclasses.field(default=None, repr=False)
    # CA bundle trusted for agents' TLS when the engine makes its own clients (its default one,
    # and one per client certificate for mutual TLS); None: the system's (and SSL_CERT_FILE).
    ca_file: str | None = None
    # Requests (streams aside) in flight at once to any one agent origin, and in all: the others
    # wait their turn inside the engine, each within its own timeout (engine.pool.RequestSlots).
    requests_per_agent: int = 8
    requests_in_flight: int = 32


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


class EngineBase:
    """What every layer of the engine stands on (see the module docstring)."""

    def __init__(
        self,
        store: EventStore,
        client: httpx.AsyncClient,
        config: EngineConfig = EngineConfig(),
        *,
        owns_client: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.client = client
        self.config = config
        self.log = TaskLog(store)
        self._request_slots = RequestSlots(config.requests_in_flight, config.requests_per_agent)
        self.discovery = Discovery(
            store, client, limits=config.card_limits, max_card_age=config.max_card_age,
            clock=clock, slots=self._request_slots,
        )  # fmt: skip
        self._owns_client = owns_client
        self._calls = StoreCalls(store)
        self.discovery._calls = self._calls
        self._clock = clock
        self._transports: dict[tuple[str, str, str, str, tuple[str, ...], int], A2ATransport] = {}
        # A drive's wake-up on a push or stream event, for as long as a drive follows the task.
        self._pushed: dict[str, asyncio.Event] = {}
        self._driving: Counter[str] = Counter()  # key -> drives following it now
        self._background: set[asyncio.Task[None]] = set()
        self._closing: dict[str, asyncio.Task[None]] = {}  # key -> its closing read
        self._closing_slots = asyncio.Semaphore(_CLOSING_READS)
        self._stream_slots = asyncio.Semaphore(_STREAMS)
        self._cards: dict[str, AgentCard] = {}  # revision -> its card, parsed
        self._cards_lock = threading.Lock()
        self.background_errors: list[Exception] = []
        self._oidc: dict[str, dict[str, Any]] = {}  # discovery URL -> what its document said
        self.tokens = TokenSource(
            timeout=config.request_timeout,
            allow_insecure=config.card_limits.allow_insecure,
            verify=config.ca_file or True,  # a context is made only when a token is fetched
            on_discovery=self._oidc_discovered,
        )
        self.authorizer = Authorizer(config.credentials, self.tokens, key=config.fingerprint_key)
        self._grants: dict[tuple[str, str], Grant] = {}  # (revision, recorded grant) -> grant
        self._tls_clients: dict[tuple[str, str], httpx.AsyncClient] = {}  # mutual TLS

    @classmethod
    def open(
        cls,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        config: EngineConfig = EngineConfig(),
    ) -> Self:
        """An engine on the store at ``url`` (migrated to head), with its own client if none."""
        store = EventStore.open(url)
        own = client is None
        if client is None:
            client = engine_client(tls_context(config.ca_file))
        return cls(store, client, config, owns_client=own)

    async def aclose(self) -> None:
        # Closing reads fetch what a terminal task ended with: let them finish (bounded). Those
        # still waiting their turn then are stopped with the background jobs, before the client
        # and the store they need are closed.
        closing = list(self._closing.values())
        if closing:
            await asyncio.wait(closing, timeout=self.config.request_timeout)
        jobs = [*self._background, *self._closing.values()]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        if self._owns_client:
            await self.client.aclose()
        for tls_client in self._tls_clients.values():
            await tls_client.aclose()
        await self.tokens.aclose()
        self._calls.close()  # appends in flight finish first
        self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # -- reading -------------------------------------------------------------------------------

    def task(self, ref: str, *, as_of: AsOf | None = None) -> TaskView:
        """The task ``ref`` names (key, remote id, or a prefix of either); with ``as_of``, as
        it stood at that point of the log, by replaying its events up to there."""
        key = self.log.find(ref)
        head = self.log.head(key) if as_of is None else self.log.as_of(key, as_of)[0]
        return TaskView.of(head.state, head.updated_at)

    def tasks(self, state: str | None = None, *, as_of: AsOf | None = None) -> list[TaskView]:
        """Every task (only those in ``state`` if given); with ``as_of``, as they stood then."""
        heads = self.log.all(status=state) if as_of is None else self.log.all_as_of(as_of, state)
        return [TaskView.of(h.state, h.updated_at) for h in heads]

    # -- credentials (R15) ---------------------------------------------------------------------

    async def _oidc_discovered(self, url: str, body: bytes) -> None:
        """R15: an OpenID Connect discovery document was read (bounded, by the token source);
        the tasks it serves record its URL, digest and token endpoint."""
        document = loads(body)  # the token source read it as I-JSON already (R16)
        assert isinstance(document, dict)
        self._oidc[url] = {
            "url": url,
            "sha256": hashlib.sha256(body).hexdigest(),
            "token_endpoint": document.get("token_endpoint"),
        }

    # -- the card a task is compared with (R7, R9, R15) ----------------------------------------

    async def _task_card(
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
                transport = await self._task_transport(state)
                read = await self.discovery.read_extended(
                    str(state["agent_url"]), transport, memo=marker, fresh=fresh,
                    public_revision=state.get("public_revision"),
                )  # fmt: skip
            except (*_EXTENDED_FAILURES, CardSignatureError) as error:  # as any failed read
                url = getattr(error, "url", "") or str(endpoint["url"])
                unread = DiscoveryError(url, "extended_card", f"{type(error).__name__}: {error}")
                card, failure = await self._read(state["agent_url"], fresh=fresh, share=share)
                return card, failure, unread
            return read.card, None, None
        card, failure = await self._read(state["agent_url"], fresh=fresh, share=share)
        return card, failure, None

    async def _read(
        self, agent_url: str, *, fresh: bool, share: bool
    ) -> tuple[AgentCard | None, DiscoveryError | None]:
        try:
            read: CardRead = await self.discovery.read(agent_url, fresh=fresh, share=share)
        except DiscoveryError as failure:
            return None, failure
        return read.card, None

    def _card(self, revision: str | None) -> AgentCard | None:
        """The card stored under ``revision`` (parsed once: a revision never changes)."""
        if not revision:
            return None
        card = self._cards.get(revision)
        if card is None:
            snapshot = self.store.get_snapshot(revision)
            if snapshot is None:
                return None
            body = snapshot.body.encode()
            card = parse_card(body, url=snapshot.source_url, max_bytes=1 << 30)
            with self._cards_lock:  # store workers call this concurrently
                if len(self._cards) >= _CARDS_KEPT:
                    self._cards.pop(next(iter(self._cards)))
                self._cards[revision] = card
        return card

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def _allow_insecure(self) -> bool:
        """Plain http to hosts other than loopback, for cards, interfaces and webhooks (R16)."""
        return self.config.card_limits.allow_insecure

    def _transport(
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
        transport = self._transports.get(place)
        if transport is None:
            cert = credentials.client_cert() if credentials is not None else None
            transport = A2ATransport(
                self._client_for(cert), Interface(url, binding, version, tenant=tenant),
                timeout=self.config.request_timeout, credentials=credentials,
                slots=self._request_slots, extensions=extensions,
            )  # fmt: skip
            if keep:
                self._transports[place] = transport
        return transport

    async def _task_transport(self, state: State) -> A2ATransport:
        """The transport for a request of the task ``state`` describes: to its recorded
        endpoint, with the credentials its frozen contract grants -- none when that endpoint
        is no longer at the origin the task was created at (R15: never leak); naming the
        extensions the task activated at its creation (frozen: never a later card's)."""
        extensions = tuple(state.get("extensions") or ())
        recorded = state.get("authorization")
        if not recorded or not recorded.get("schemes"):
            return self._transport(state["endpoint"], extensions=extensions)
        revision = str(state["card_revision"])
        marker = (revision, repr(sorted(recorded.items())))
        grant = self._grants.get(marker)
        if grant is None:
            card = await self._calls.run(self._card, revision)
            if card is None:  # the frozen card is gone from the store: send nothing rather
                raise CredentialsMissingError(  # than credentials chosen anew
                    str(state.get("agent")), str(state["skill"]),
                    f"the frozen card {revision[:12]} is not in the store",
                )  # fmt: skip
            grant = self._grants[marker] = Authorizer.regrant(card, recorded)
        credentials = self.authorizer.for_task(grant, str(state["endpoint"]["url"]))
        return self._transport(state["endpoint"], credentials, extensions=extensions)

    def _client_for(self, cert: tuple[str, str] | None) -> httpx.AsyncClient:
        """The engine's client, or for mutual TLS one that presents the client certificate."""
        if cert is None:
            return self.client
        client = self._tls_clients.get(cert)
        if client is None:
            context = tls_context(self.config.ca_file)
            try:
                context.load_cert_chain(*cert)
            except (OSError, ssl.SSLError) as error:
                raise CredentialsConfigError(
                    "mtls", f"client certificate {cert[0]} cannot be loaded ({error})"
                ) from None
            client = engine_client(context)
            self._tls_clients[cert] = client
        return client

    async def _find(self, ref: str) -> str:
        return await self._calls.run(self.log.find, ref)

    async def _state(self, key: str) -> State:
        """The task's state as the store has it now (other writers included)."""
        return (await self._calls.run(self.log.head, key)).state

    async def _known_state(self, key: str) -> State:
        """The task's state as this engine last wrote or read it, read from the store only when
        it is not kept: for what follow-up work needs of a task that was just written (its
        agent, remote id, endpoint and contract), without a store call."""
        kept = self.log.kept(key)
        return kept if kept is not None else await self._state(key)

    async def _decide(self, key: str, decide: Callable[[State], Sequence[Event]]) -> None:
        """Append what ``decide`` makes of the task's current state."""
        await self._calls.run(self.log.record, key, decide)

    def _throttle_wait(self, throttled: ThrottledError) -> float:
        """R5: the seconds before the next request to an endpoint that asked for time: what it
        asked, capped by ``max_retry_after`` and by the time left before the deadline."""
        asked = throttled.retry_after or 0.0
        return max(min(asked, self.config.max_retry_after, time_left()), 0.0)

    async def _wait_asked(
        self,
        key: str,
        throttled: ThrottledError,
        during: str,
        pause: float,
        waited: float,
        outcome: str,
    ) -> float:
        """R5: wait as the agent asked before a request it answered with ``throttled`` goes
        again: its ``Retry-After`` capped by ``max_retry_after``, ``pause`` at least (the caller
        doubles it); ``Throttled`` recorded (once per task). Returns the seconds waited. Raises
        :class:`DeadlineExceeded` (saying ``outcome``) when the wait leaves no second to ask
        again before the deadline, and ``throttled`` once the waits, ``waited`` so far, would
        add up to more than ``max_retry_after``: nothing is asked again then."""
        config = self.config
        wait = max(min(throttled.retry_after or 0.0, config.max_retry_after), pause)
        left = time_left()
        late = wait + min(_ASK_AGAIN_ROOM, config.request_timeout) > left
        spent = not late and waited + wait > config.max_retry_after
        await self._record_throttled(key, throttled, during, None if late or spent else wait)
        if late:
            state = str((await self._state(key))["state"])
            reason = (
                f"the agent answered HTTP {throttled.status} to the {during} and asked to wait; "
                f"waiting {wait:.3g}s leaves no time to ask again within the "
                f"{max(left, 0.0):.3g}s left; {outcome}"
            )
            raise DeadlineExceeded(key, state, max(left, 0.0), reason=reason) from None
        if spent:
            raise throttled
        await asyncio.sleep(wait)
        return wait

    async def _asked_again(
        self, key: str, during: str, request: Callable[[], Awaitable[_T]], outcome: str
    ) -> _T:
        """``request()``, made again after the wait the agent asked for while it answers 429:
        a request answered so was not taken (R5). A 503's outcome is unknown: raised."""
        pause, waited = ASK_AGAIN_AFTER, 0.0
        while True:
            try:
                return await request()
            except ThrottledError as throttled:
                if throttled.status != 429:
                    raise
                waited += await self._wait_asked(key, throttled, during, pause, waited, outcome)
            pause = min(pause * 2, self.config.max_retry_after)

    async def _record_throttled(
        self, key: str, throttled: ThrottledError, during: str, wait: float | None
    ) -> None:
        """``Throttled`` on the task, unless it was recorded already (R5: once per task);
        ``wait``: the seconds waited before the next request (None: none is made)."""
        asked, url, status = throttled.retry_after, throttled.url, throttled.status
        await self._decide(key, lambda s: guards.throttled(s, url, status, asked, wait, during))

    async def _record(self, key: str, events: Sequence[Event]) -> None:
        if events:
            await self._decide(key, lambda _state: events)

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.ensure_future(self._contained(job))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _contained(self, job: Awaitable[None]) -> None:
        """A re-check or re-validation never takes the task down with it: a failure there is a
        bug to report (logged, kept for :meth:`settle`), not an input to the task (R1)."""
        try:
            await job
        except asyncio.CancelledError:
            raise
        except LeaseLostError as lost:
            # Decided under a lease since lost: the task ended, or another process drives it
            # now and makes its own checks. Nothing was written; nothing is wrong.
            _log.info(
                "background decision not recorded: the lease was lost",
                extra={"task": key_of(lost.stream_id), "event": "LeaseLost", "reason": str(lost)},
            )
        except Exception as error:
            _log.exception("background card check failed")
            if len(self.background_errors) < _ERRORS_KEPT:  # each logged; the first kept
                self.background_errors.append(error)

    async def settle(self) -> None:
        """Wait for background re-checks, re-validations and closing reads; raise the first error
        one of them hit (tests, shutdown). Closing reads included."""
        while self._background or self._closing:
            jobs = [*self._background, *self._closing.values()]
            await asyncio.gather(*jobs, return_exceptions=True)
        if self.background_errors:
            raise self.background_errors.pop(0)


def _authorization_failed(refused: AuthorizationFailedError, during: str) -> Event:
    """R15: a 401/403 (or no token to be had) is an annotation, never a transition (R1)."""
    return ev.AuthorizationFailed(
        url=refused.url,
        status=refused.status,
        schemes=list(refused.schemes),
        detail=str(refused),
        during=during,
        at=_now_iso(),
    )


def _unreachable(failure: Exception, during: str) -> ev.EndpointUnreachable:
    return ev.EndpointUnreachable(
        url=getattr(failure, "url", ""), detail=str(failure), during=during
    )
