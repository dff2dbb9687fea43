"""The Engine: start, follow, reply to, cancel and resume A2A tasks, recording everything.

Card state may gate task creation (:meth:`Engine.start_task`, R2, R3) and webhook registration
(:meth:`Engine.register_webhook`, R4). It never gates continuation: every remote report goes
through :func:`engine.observations.apply_observation`, which takes no card. Card re-checks (R6)
and re-validation (R7, R8) run beside the polling, and only ever add diagnostics, flags or a switch
to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from cardfence.engine import events as ev
from cardfence.engine import guards, webhook
from cardfence.engine.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.cards.discovery import CardLimits, CardRead, Discovery
from cardfence.engine.cards.model import (
    V03,
    AgentCard,
    Interface,
    parse_card,
    select_interface,
    url_refusal,
)
from cardfence.engine.credentials import CredentialsProvider, normalise_origin
from cardfence.engine.deadline import left as time_left
from cardfence.engine.deadline import within as deadline_within
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CardInvalidError,
    CardSignatureError,
    ContractChangedError,
    CreationRefusedError,
    CredentialsConfigError,
    CredentialsMissingError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    SkillUnavailableError,
    TaskOrphanedError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.lifecycle import INTERRUPTED, TERMINAL
from cardfence.engine.observations import (
    DEFAULT_MAX_CLOCK_SKEW,
    FLAG_PAYLOAD_TRUNCATED,
    Event,
    Observation,
    apply_observation,
    from_message,
    from_task,
)
from cardfence.engine.observations import from_update as observation_from_update
from cardfence.engine.offload import StoreCalls
from cardfence.engine.pool import RequestSlots, engine_client, tls_context
from cardfence.engine.remote import PushConfig, RemoteTask
from cardfence.engine.replay import State
from cardfence.engine.tasklog import AsOf, TaskLog, key_of, task_stream_id
from cardfence.engine.tokens import TokenSource
from cardfence.engine.transport import A2ATransport
from cardfence.engine.views import TaskView
from cardfence.store import EventStore, LeaseLostError, PayloadError

UNTIL = ("interrupted", "terminal")
_STREAMED = frozenset({"submitted", "working"})
_CARDS_KEPT = 64  # parsed card revisions kept in memory
# Closing GetTasks in flight at once, the others waiting their turn: many at once grew httpx's
# pool past its 20 kept-alive connections, and its bookkeeping scans every one per request.
_CLOSING_READS = 8
# Streams drive() follows at once, the other tasks polled only until a slot frees: each stream
# holds a pooled connection of its own, and 200 at once left polls queued behind them.
_STREAMS = 32
# A task's stream is followed once its polls are this many seconds apart (never, when
# max_poll_interval keeps them closer): polls that close together already bring the news within
# that time, and a stream beside them only doubles the work, the agent's and ours.
_STREAM_AFTER = 1.0
# What ends a stream early (a drop is an EndpointUnreachableError); polling goes on regardless.
_STREAM_FAILURES = (EndpointUnreachableError, RemoteRefusedError, InvalidAgentResponseError)
# Seconds a poll is given at least (a quarter of a shorter timeout): no poll but the first
# starts closer to the deadline than that (R16).
_LAST_POLL = 1.0
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
    first_poll_interval: float = 0.1
    max_card_age: float = 120.0
    card_limits: CardLimits = CardLimits()  # noqa: RUF009 - frozen, so sharing it is safe
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


@dataclass(frozen=True, slots=True)
class WebhookOutcome:
    """What :meth:`Engine.register_webhook` did: registered, or why the task stays on polling."""

    registered: bool
    reason: str
    detail: str = ""
    config_id: str | None = None
    # What a delivery must present (secrets: kept out of repr and out of the log).
    token: str | None = dataclasses.field(default=None, repr=False)
    authorization: str | None = dataclasses.field(default=None, repr=False)


@dataclass(slots=True)
class Pace:
    """Where one followed task stands between polls: the backoff (R5: never beyond
    ``max_poll_interval``), when R7's re-validation and R9's endpoint check are next due, and
    the last poll's failure to reach the agent."""

    delay: float
    next_revalidation: float
    next_endpoint_check: float
    unreachable: EndpointUnreachableError | None = None

    @classmethod
    def start(cls, config: EngineConfig, now: float) -> Pace:
        return cls(config.first_poll_interval, now + config.max_card_age, now)

    def backoff(self, max_poll_interval: float) -> float:
        """The wait before the next poll; the one after it doubles, up to the bound."""
        wait = min(self.delay, max_poll_interval)
        self.delay = min(self.delay * 2, max_poll_interval)
        return wait


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def reached(state: str, until: str) -> bool:
    """Whether a task in ``state`` is at the point ``until`` asks for."""
    if state in TERMINAL:
        return True
    return until == "interrupted" and state in INTERRUPTED


class Engine:
    """An asyncio engine over an event store. Use :meth:`open`, then ``async with``."""

    def __init__(
        self,
        store: EventStore,
        client: httpx.AsyncClient,
        config: EngineConfig = EngineConfig(),
        *,
        owns_client: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        self._sleep = sleep
        self._transports: dict[tuple[str, str, str, int], A2ATransport] = {}
        self._pushed: dict[str, asyncio.Event] = {}
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
    ) -> Engine:
        """An engine on the store at ``url`` (migrated to head), with its own client if none."""
        store = EventStore.open(url)
        own = client is None
        if client is None:
            client = engine_client(tls_context(config.ca_file))
        return cls(store, client, config, owns_client=own)

    async def aclose(self) -> None:
        # Closing reads fetch what a terminal task ended with: let them finish (bounded).
        closing = list(self._closing.values())
        if closing:
            await asyncio.wait(closing, timeout=self.config.request_timeout)
        for job in list(self._background):
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._owns_client:
            await self.client.aclose()
        for tls_client in self._tls_clients.values():
            await tls_client.aclose()
        await self.tokens.aclose()
        self._calls.close()  # appends in flight finish first
        self.store.close()

    async def __aenter__(self) -> Engine:
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

    # -- creation (R2, R3) ---------------------------------------------------------------------

    async def start_task(
        self,
        agent_url: str,
        *,
        skill: str,
        text: str,
        media_type: str = "text/plain",
        accept_contract: bool = False,
        key: str | None = None,
    ) -> TaskView:
        """Create a task: fresh card read, skill and media-type check, contract check, freeze,
        record, send. Nothing is sent on any refusal (``DiscoveryError``, ``CardInvalidError``,
        ``SkillUnavailableError``, ``ContractChangedError``), and the refusal is recorded."""
        try:
            read = await self.discovery.read(agent_url, fresh=True)
        except DiscoveryError as failure:
            failure.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(failure), skill)
            raise
        # R15: when the card offers an authenticated extended card, its skills count too (R2),
        # and the task is frozen under it. Unreadable, the public card alone decides; read but
        # refused by its agent's signature policy, nothing is created.
        try:
            extended, unread = await self._extended_at_creation(read, accept_contract)
        except CardSignatureError as refused:
            refused.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(refused), skill)
            raise
        card = read.card if extended is None else extended.card
        decision = guards.creation_check(card, skill, media_type)
        if not decision.allowed:
            detail = decision.detail
            if unread:
                detail += f"; the extended card could not be read ({unread})"
            await self._refuse(agent_url, decision.reason, detail, skill)
            raise SkillUnavailableError(read.agent, skill, detail)
        try:
            check = await self.discovery.check_contract(read, accept=accept_contract)
            interface = select_interface(
                read.card, self.config.prefer_bindings, allow_insecure=self._allow_insecure
            )
        except (ContractChangedError, CardInvalidError) as refusal:
            if isinstance(refusal, CardInvalidError):
                refusal.consequence = "nothing was sent"
            await self._refuse(agent_url, type(refusal).__name__, str(refusal), skill)
            raise
        grant = await self._creation_grant(agent_url, card, skill, interface.url)
        key = key or uuid.uuid4().hex
        message_id, context_id = f"m-{uuid.uuid4().hex}", f"c-{uuid.uuid4().hex}"
        endpoint = guards.endpoint_of(interface)
        submitted = _submitted(key, agent_url, read, check.contract_hash, skill, endpoint,
                               message_id, context_id, text, media_type)  # fmt: skip
        if extended is not None:
            # Frozen under the extended card: its revision, contract and skill (R3, R9, R15);
            # the public card it was offered by, and the contract pinned from it, beside them.
            submitted[1].update(
                card_revision=card.revision,
                card_version=card.version,
                contract_hash=card.contract_hash,
                skill_hash=card.compatibility_hash(skill),
                extended=True,
                public_revision=read.revision,
                public_contract_hash=check.contract_hash,
            )
        elif unread:
            submitted[1]["extended_unread"] = unread
        submitted[1]["authorization"] = self._grant_record(grant)
        await self._calls.run(self.log.create, key, [submitted])
        transport = self._transport(endpoint, self.authorizer.for_task(grant, interface.url))
        return TaskView.of(
            await self._send_creation(key, transport, text, message_id, context_id, skill,
                                      media_type)
        )  # fmt: skip

    async def _extended_at_creation(
        self, read: CardRead, accept_contract: bool
    ) -> tuple[CardRead | None, str]:
        """R15 at creation: the authenticated extended card, when the fresh public card offers
        one, read over the interface the task would use with credentials granted for the card's
        own requirements (a skill the card lacks gets them). ``(read, "")``, or ``(None, why)``
        when it could not be read (``why`` empty when none is offered). Credentials go only under
        a contract that will pass R3: a changed one not accepted gets no extended read. Raises
        :class:`CardSignatureError` when the card read fails its agent's signature policy."""
        card = read.card
        if not card.capabilities.extended_agent_card:
            return None, ""
        pinned = (await self.discovery.agent_state(read.agent)).get("pinned_contract")
        if pinned not in (None, card.contract_hash) and not accept_contract:
            return None, "the contract changed and is not accepted: no credentials were sent"
        try:
            interface = select_interface(
                card, self.config.prefer_bindings, allow_insecure=self._allow_insecure
            )
            credentials = self.authorizer.for_task(
                self.authorizer.grant(card, "", interface.url), interface.url
            )
            transport = self._transport(guards.endpoint_of(interface), credentials, keep=False)
            extended = await self.discovery.read_extended(
                read.agent, transport, public_revision=read.revision
            )
        except _EXTENDED_FAILURES as failure:
            return None, f"{type(failure).__name__}: {failure}"
        return extended, ""

    async def _creation_grant(
        self, agent_url: str, card: AgentCard, skill: str, endpoint_url: str
    ) -> Grant:
        """R15 at creation: the alternative the task's requests will carry, its credentials
        tried (an OAuth token fetched) before anything is recorded or sent. A contract whose
        requirements no configured credential covers is refused (``CredentialsMissing``)."""
        try:
            grant = self.authorizer.grant(card, skill, endpoint_url)
            credentials = self.authorizer.for_task(grant, endpoint_url)
            if credentials is not None:
                await credentials.prepare()
        except CredentialsMissingError as missing:
            await self._refuse(
                agent_url, "credentials_missing", str(missing), skill, type_=ev.CREDENTIALS_MISSING
            )
            raise
        except (AuthorizationFailedError, CredentialsConfigError) as failure:
            await self._refuse(agent_url, "credentials_unusable", str(failure), skill)
            raise
        return grant

    def _grant_record(self, grant: Grant) -> dict[str, Any]:
        """What ``TaskSubmitted`` keeps of the grant: names, scopes, fingerprints, and for an
        OpenID Connect scheme what its discovery document said (never a secret)."""
        record = grant.record(self.authorizer.fingerprints(grant))
        discovered = {}
        for name, definition in grant.definitions.items():
            body = definition.get("openIdConnectSecurityScheme") or {}
            seen = self._oidc.get(str(body.get("openIdConnectUrl", "")))
            if seen is not None:
                discovered[name] = seen
        if discovered:
            record["discovery"] = discovered
        return record

    async def _oidc_discovered(self, url: str, body: bytes) -> None:
        """R15: an OpenID Connect discovery document was read (bounded, by the token source);
        the tasks it serves record its URL, digest and token endpoint."""
        document = json.loads(body)
        self._oidc[url] = {
            "url": url,
            "sha256": hashlib.sha256(body).hexdigest(),
            "token_endpoint": document.get("token_endpoint"),
        }

    async def _send_creation(
        self,
        key: str,
        transport: A2ATransport,
        text: str,
        message_id: str,
        context_id: str,
        skill: str,
        media_type: str,
    ) -> State:
        """Send a creation that passed its gates (R2, R3) and record what came of it. An A2A
        error is final: the task is closed as never created (:class:`CreationRefusedError`). A
        network error, a timeout, a 5xx without an A2A error or an unusable answer leaves the
        outcome unknown: ``resume`` looks for the task by its context before sending again."""
        try:
            answer = await transport.send_message(
                text=text,
                message_id=message_id,
                context_id=context_id,
                metadata={"skillId": skill},
                return_immediately=True,
                media_type=media_type,
            )
        except AuthorizationFailedError as refused:
            await self._record(key, [_authorization_failed(refused, "send")])
            raise
        except (EndpointUnreachableError, InvalidAgentResponseError) as failure:
            await self._record(key, [(ev.ENDPOINT_UNREACHABLE, _unreachable(failure, "send"))])
            raise
        except RemoteRefusedError as refusal:
            await self._record(
                key, [guards.refused_creation(refusal.code, refusal.detail, refusal.url)]
            )
            state = await self._state(key)
            await self._refuse(str(state["agent_url"]), "remote_refused", str(refusal), skill)
            raise CreationRefusedError(
                refusal.url, refusal.code, refusal.detail, task=key
            ) from refusal
        observation = (
            from_task(answer, "send")
            if isinstance(answer, RemoteTask)
            else from_message(answer, "send")
        )
        return await self._observe_state(key, observation)

    async def _refuse(
        self,
        agent_url: str,
        reason: str,
        detail: str,
        skill: str,
        task: str | None = None,
        *,
        type_: str = ev.TASK_CREATION_REFUSED,
    ) -> None:
        refusal = {"reason": reason, "detail": detail, "skill": skill, "at": _now_iso()}
        if task is not None:
            refusal["task"] = task
        with contextlib.suppress(DiscoveryError):
            await self.discovery.record_refusal(agent_url, refusal, type_)

    # -- webhooks (R4, R5) ---------------------------------------------------------------------

    async def register_webhook(
        self,
        ref: str,
        url: str,
        *,
        token: str | None = None,
        auth_scheme: str | None = None,
        auth_credentials: str | None = None,
    ) -> WebhookOutcome:
        """Ask for push delivery, gated by a read made for this registration (R4).

        The configuration carries a notification ``token`` and an ``authentication`` block
        (scheme ``Bearer`` and a per-config secret unless ``auth_scheme``/``auth_credentials``
        are given; none by default for a task at an A2A 0.3 endpoint, whose agents push the
        token alone); a delivery must present both (:meth:`deliver`).

        When the read fails or says no push, or ``url`` is plain http to a host other than
        loopback (R16), nothing is registered, ``DeliveryDowngraded`` is recorded and the task
        goes on by polling; the outcome says why. The state is untouched.
        """
        key = await self._find(ref)
        state = await self._state(key)
        if not state.get("remote_task_id"):
            raise UsageError(f"task {key} has no remote task id yet: nothing to register for")
        refusal = url_refusal(url, allow_insecure=self._allow_insecure)
        if refusal is not None:  # R16: the agent would push the task's updates in clear text
            detail = f"webhook URL {url}: {refusal}; nothing was registered"
            await self._record(key, [guards.downgrade("insecure_url", detail)])
            return WebhookOutcome(False, "insecure_url", detail)
        card: AgentCard | None = None
        failure: DiscoveryError | None = None
        try:
            card = (await self.discovery.read(state["agent_url"], fresh=True)).card
        except DiscoveryError as error:
            failure = error
        decision = guards.registration_check(card, failure)
        if not decision.allowed:
            await self._record(key, [guards.downgrade(decision.reason, decision.detail)])
            return WebhookOutcome(False, decision.reason, decision.detail)
        config_id = f"cf-{uuid.uuid4().hex[:16]}"  # always ours: a2a-sdk would reuse the task id
        token = token or secrets.token_urlsafe(32)
        legacy = guards.endpoint_dialect(state["endpoint"]) == V03
        if auth_scheme is None and auth_credentials is None and not legacy:
            # R15: the agent is also told how to authenticate to the webhook, with a secret of
            # this config's own; the webhook app checks both (kept as digests only). Not a 0.3
            # agent: a2a-sdk 0.3 pushes the token alone, and every delivery would be refused.
            auth_scheme, auth_credentials = "Bearer", secrets.token_urlsafe(32)
        config = PushConfig(config_id, url, token, auth_scheme, auth_credentials)
        try:
            transport = await self._task_transport(state)
            await transport.create_push_config(state["remote_task_id"], config)
        except AuthorizationFailedError as refused:
            detail = f"{refused}; the task goes on by polling"
            await self._record(
                key,
                [_authorization_failed(refused, "register"),
                 guards.downgrade("credentials_rejected", detail)],
            )  # fmt: skip
            return WebhookOutcome(False, "credentials_rejected", detail)
        except RemoteRefusedError as refusal:
            detail = str(refusal)
            await self._record(key, [guards.downgrade("push_refused", detail)])
            return WebhookOutcome(False, "push_refused", detail)
        auth = f"{auth_scheme} {auth_credentials}" if auth_scheme and auth_credentials else None
        registered = {
            "config_id": config_id,
            "url": url,
            "token_sha256": webhook.digest(token),
            "auth_sha256": webhook.digest(auth) if auth else None,
            "status": "provisional",
            "card_revision": card.revision if card else None,
        }
        await self._record(key, [(ev.WEBHOOK_REGISTERED, registered)])
        return WebhookOutcome(True, "registered", "", config_id, token, auth)

    # -- continuation (R1, R5-R12) -------------------------------------------------------------

    async def poll(self, ref: str) -> TaskView:
        """One continuation step: GetTask on the task's recorded endpoint, applied. No discovery."""
        key = await self._find(ref)
        return TaskView.of(await self._poll(key, await self._state(key)))

    async def _poll(self, key: str, state: State) -> State:
        remote = state.get("remote_task_id")
        if not remote:
            raise UsageError(f"task {key} has no remote task id: run `resume` to find it")
        try:
            task = await (await self._task_transport(state)).get_task(remote)
        except AuthorizationFailedError as refused:
            await self._record(key, [_authorization_failed(refused, "poll")])
            raise
        except EndpointUnreachableError as failure:
            await self._record(key, [(ev.ENDPOINT_UNREACHABLE, _unreachable(failure, "poll"))])
            raise
        except WrongTaskAnswerError as wrong:
            await self._record_wrong_task(key, wrong, "poll")
            raise
        if time_left() <= 0:
            # R16: the answer came after the command's deadline. It is not applied (the next
            # poll reads it again), so applying an answer never starts past the deadline.
            return state
        return await self._observe_state(key, from_task(task, "poll"))

    async def _record_wrong_task(self, key: str, wrong: WrongTaskAnswerError, source: str) -> None:
        """R12: an answer about another task than the one asked about, to GetTask, SendMessage
        or CancelTask: nothing of it is applied; the first is recorded and flagged."""
        asked, answered, said = wrong.asked, wrong.answered, wrong.answered_state
        await self._decide(key, lambda s: guards.wrong_task(s, asked, answered, said, source))

    async def drive(
        self, ref: str, *, until: str = "interrupted", timeout: float = 300.0
    ) -> TaskView:
        """Follow the task until ``until`` or the deadline, polling with backoff bounded by
        ``max_poll_interval`` (R5). Every poll and card check ends by the deadline (R16): a task
        not yet ended is polled at least once (given a second if ``timeout`` is shorter) unless
        a deadline already in force has passed; later polls start only with a second left (a
        quarter of ``timeout`` if less), and the time after the last one is waited out for
        pushes. The deadline never ends the task (R10): it records ``DeadlineExceeded`` after a
        last poll and raises :class:`DeadlineExceeded`."""
        with deadline_within(max(timeout, _LAST_POLL)):
            return await self._drive(ref, until, timeout)

    async def _drive(self, ref: str, until: str, timeout: float) -> TaskView:
        if until not in UNTIL:
            raise UsageError(f"--until must be one of {', '.join(UNTIL)}, not {until!r}")
        key = await self._find(ref)
        # The task's stream, when its card offers one, is followed beside the polls (R12: one
        # observation path); the polls never wait on it.
        streamer = asyncio.ensure_future(self._stream_later(key))
        try:
            return await self._follow_until(key, until, timeout)
        finally:
            streamer.cancel()
            await asyncio.gather(streamer, return_exceptions=True)

    async def _follow_until(self, key: str, until: str, timeout: float) -> TaskView:
        started = self._clock()
        deadline = started + timeout
        pace = Pace.start(self.config, started)
        pushed = self._pushed.setdefault(key, asyncio.Event())
        asked = False
        # A poll after the first starts only with this much time left to answer in (R16).
        last_poll = min(_LAST_POLL, self.config.request_timeout, timeout / 4)
        next_poll = started  # the first poll at once
        while True:
            # Read from the store: another process (`serve`) may have applied a push.
            state = await self._state(key)
            if guards.never_created(state):
                return TaskView.of(state)  # R3: the agent refused its creation; nothing to follow
            # The log may be stale (a reply answered after a crash): unless the task has ended,
            # ask the agent once before believing it is already where it was asked to stop.
            if state["state"] in TERMINAL or (asked and reached(state["state"], until)):
                return await self._closed(key, state)
            # A push or stream event woke us before the poll was due: it was applied, and is all
            # the news there is; the poll stays where it was scheduled.
            # R16: a poll starts only with time left to answer (the first: any time at all).
            polled = False
            if self._clock() >= next_poll and time_left() > (last_poll / 2 if asked else 0.0):
                asked = polled = True
                state = await self.follow_step(key, state, pace)
                if reached(state["state"], until):
                    return TaskView.of(state)
            else:
                self._revalidate_when_due(key, pace)
            now = self._clock()
            room = time_left()
            if now >= deadline or room <= 0:
                await self._record(
                    key,
                    [(ev.DEADLINE_EXCEEDED, {"state": state["state"], "seconds": timeout,
                                             "until": until})],
                )  # fmt: skip
                if pace.unreachable is not None:
                    raise pace.unreachable  # the cause the caller can act on (CLI exit 9)
                raise DeadlineExceeded(key, state["state"], timeout)
            if polled:
                wait = min(pace.backoff(self.config.max_poll_interval), deadline - now)
                # The next poll starts while it still has `last_poll` seconds; after the last
                # one, the rest of the time is waited out for pushes.
                room_to_poll = room > last_poll
                next_poll = now + min(wait, room - last_poll) if room_to_poll else math.inf
            elif now >= next_poll:
                next_poll = math.inf  # too little time left to ask again: wait for pushes
            wait = min(next_poll - now, deadline - now, room)
            pushed.clear()
            with contextlib.suppress(TimeoutError):
                # A push applied in this process wakes us; the safety poll never waits longer.
                async with asyncio.timeout(max(wait, 0.0)):
                    await pushed.wait()

    async def follow_step(self, key: str, state: State, pace: Pace) -> State:
        """One step of following a live task (``drive``, and ``serve`` for every task): a poll
        on its recorded endpoint, applied; a bare 404 prompts R9's endpoint check (R11, once per
        ``max_card_age``); R7's re-validation is started off the critical path when due. Returns
        the state after the poll. Raises :class:`TaskOrphanedError` from the endpoint check."""
        try:
            state = await self._poll(key, state)
            pace.unreachable = None
        except EndpointUnreachableError as failure:
            pace.unreachable = failure
            if failure.status == 404 and self._clock() >= pace.next_endpoint_check:
                pace.next_endpoint_check = self._clock() + self.config.max_card_age
                await self._reconcile_endpoint(key)
        except InvalidAgentResponseError:
            pass  # a malformed answer changes nothing; the next poll may be better
        self._revalidate_when_due(key, pace)
        return state

    def _revalidate_when_due(self, key: str, pace: Pace) -> None:
        now = self._clock()
        if now >= pace.next_revalidation:
            pace.next_revalidation = now + self.config.max_card_age
            self._spawn(self._revalidate(key))  # R7: off the critical path

    # -- streams (R7, R12) -----------------------------------------------------------------------

    async def stream_offered(self, key: str, state: State | None = None) -> bool:
        """Whether to follow the task's event stream now: streams are followed, polls may grow
        :attr:`stream_after` apart, the card the task last saw advertises them (a card
        withdrawing them changes only the delivery path, R7), and the task is submitted or
        working (a stream ends at an interrupted state)."""
        if not self.config.follow_streams or self.config.max_poll_interval < _STREAM_AFTER:
            return False
        if state is None:
            state = await self._state(key)
        if state["state"] not in _STREAMED or not state.get("remote_task_id"):
            return False
        card = await self._calls.run(self._card, state.get("latest_card_revision"))
        return card is not None and card.streaming

    async def follow_stream(self, key: str) -> State:
        """Follow the task's event stream on its recorded endpoint: every update is applied as
        an observation (source ``stream``) like any other report (R12), and wakes :meth:`drive`.
        Returns the state once the stream ended at a final or interrupted state; raises
        :class:`StreamDroppedError` when it ended early, the errors of opening it otherwise."""
        state = await self._state(key)
        transport = await self._task_transport(state)
        idle = self.config.stream_idle_timeout
        try:
            async with transport.subscribe(state["remote_task_id"], idle_timeout=idle) as updates:
                async for update in updates:
                    observation = observation_from_update(update, "stream")
                    if observation is not None:
                        state = await self._observe_state(key, observation)
                        self._wake(key)
        except AuthorizationFailedError as refused:
            await self._record(key, [_authorization_failed(refused, "subscribe")])
            raise
        except WrongTaskAnswerError as wrong:
            await self._record_wrong_task(key, wrong, "stream")
            raise
        return state

    async def keep_streaming(
        self,
        key: str,
        *,
        retry_limit: float | None = None,
        after_each: Callable[[], None] | None = None,
    ) -> None:
        """Follow the task's stream while it is offered, subscribing again after a drop with
        backoff (1 s doubling to ``retry_limit``, default ``max_poll_interval``). Never decides
        anything: polls go on beside it, and every failure here only ends or delays the stream.
        ``after_each`` is called whenever a stream ended or could not be opened (the driver
        polls then: the stream may have missed the end). Returns when the stream is no longer
        offered (the task ended or was interrupted), or when the agent refused the subscription
        with an A2A error (a task already ended, or no streams for it): the polls carry on."""
        limit = self.config.max_poll_interval if retry_limit is None else retry_limit
        wait = min(1.0, limit)
        while await self.stream_offered(key):
            try:
                await self.follow_stream(key)
                wait = min(1.0, limit)
                continue  # ended at a final or interrupted state: offered no more
            except RemoteRefusedError as refused:
                _log.info(
                    "stream refused; polling goes on",
                    extra={"task": key, "event": "StreamRefused", "reason": str(refused)},
                )
                return
            except _STREAM_FAILURES as failure:
                reason = getattr(failure, "reason", None) or type(failure).__name__
                _log.info(
                    "stream ended early; polling goes on",
                    extra={"task": key, "event": "StreamDropped", "reason": str(reason)},
                )
            finally:
                if after_each is not None:
                    after_each()
            await asyncio.sleep(wait)
            wait = min(wait * 2, limit)

    @property
    def stream_after(self) -> float:
        """How far apart a task's polls are before its stream is followed too: a task that ends
        within its first few polls never costs the agent a subscription, and with
        ``max_poll_interval`` below this no stream is followed at all (:meth:`stream_offered`)."""
        return _STREAM_AFTER

    async def _stream_later(self, key: str) -> None:
        await asyncio.sleep(self.stream_after)
        async with self._stream_slots:
            await self.keep_streaming(key)

    def _wake(self, key: str) -> None:
        """A report was applied outside the poll loop: a drive waiting on this task looks."""
        if key in self._pushed:
            self._pushed[key].set()

    async def _observe(self, key: str, observation: Observation) -> TaskView:
        return TaskView.of(await self._observe_state(key, observation))

    async def _observe_state(
        self,
        key: str,
        observation: Observation,
        recorded: list[Event] | None = None,
        *,
        whole: bool = False,
    ) -> State:
        """Apply one remote report (R10, R12), whatever its source, then schedule what the
        transition calls for. ``recorded`` receives the events written; ``whole``: the report
        was the whole task (every artifact), not one event of it."""
        before, after = await self._calls.run(self._apply, key, observation, recorded)
        self._observed(key, observation, before, after, whole=whole)
        return after

    def _observed(
        self, key: str, observation: Observation, before: State, after: State, *, whole: bool
    ) -> None:
        """Schedule what an applied report's transition calls for (``whole``: see above)."""
        if guards.boundary_recheck_due(after, before["state"], after["state"]):
            self._spawn(self._boundary_recheck(key))  # R6, after the transition is recorded
        if (
            observation.source == "push"
            and not whole
            and after["state"] in TERMINAL
            and before["state"] not in TERMINAL
            and key not in self._closing
        ):
            # A push of one event: the task may have ended with artifacts whose own pushes were
            # lost (the agent tries each once). Nobody polls an ended task, so read it once now.
            # A push of the whole task (0.3 agents send nothing else) already holds them all.
            job = asyncio.ensure_future(self._contained(self._closing_read(key)))
            self._closing[key] = job
            job.add_done_callback(lambda _: self._closing.pop(key, None))

    def _ingest(
        self,
        remote_id: str,
        headers: Mapping[str, str],
        observation: Observation | None,
        recorded: list[Event],
    ) -> tuple[str, tuple[State, State] | None]:
        """The store's half of :meth:`deliver` (on a store worker, one call): the task the
        delivery authenticates as, then its observation applied. :class:`webhook.Refused` when
        it is refused, with nothing written.

        R16: a remote task id is unique per agent only; the webhook configuration the delivery
        authenticates as names the task. The credentials are checked again against the head the
        append is decided on, so a webhook replaced since the lookup (by another process) is
        refused, never applied under the configuration it replaced."""
        heads = self.log.by_remote_id(remote_id)
        candidates = [(head.key, head.state.get("webhook")) for head in heads]
        key = webhook.match_task(remote_id, candidates, headers)
        if observation is None:
            return key, None

        def still_authenticates(state: State) -> None:
            webhook.check_credentials(state.get("webhook") or {}, headers)

        try:
            return key, self._apply(key, observation, recorded, still_authenticates)
        except PayloadError as too_large:  # R16: never raised at the agent
            raise webhook.Refused(413, str(too_large), key) from None

    async def _closing_read(self, key: str) -> None:
        async with self._closing_slots:
            await self._closing_read_now(key)

    async def _closing_read_now(self, key: str) -> None:
        state = await self._known_state(key)  # its remote id, endpoint and contract
        try:
            transport = await self._task_transport(state)
            task = await transport.get_task(state["remote_task_id"])
        except AuthorizationFailedError as refused:  # R15: an annotation, the task has ended
            await self._record(key, [_authorization_failed(refused, "poll")])
            return
        except _STREAM_FAILURES as failure:  # the task has ended all the same (R10)
            _log.info(
                "closing read failed",
                extra={"task": key, "event": "ClosingReadFailed", "reason": str(failure)},
            )
            return
        await self._observe_state(key, from_task(task, "poll"))

    async def _closed(self, key: str, state: State) -> TaskView:
        """The view of an ended task, once its closing read (if one is running) is done."""
        job = self._closing.get(key)
        if job is not None:
            await asyncio.wait({job}, timeout=time_left())
            state = await self._state(key)
        return TaskView.of(state)

    def _apply(
        self,
        key: str,
        observation: Observation,
        recorded: list[Event] | None,
        check: Callable[[State], None] | None = None,
    ) -> tuple[State, State]:
        """The store's half of :meth:`_observe_state` (on a store worker thread). ``check``
        sees each state the append is decided on, and may refuse it by raising."""
        agent_revision: list[str | None] = []
        if observation.received_at is None:
            observation = dataclasses.replace(observation, received_at=datetime.now(UTC))
        skew = self.config.max_clock_skew
        decided: list[Event] = []  # what the last decision was (it may be asked again)

        def decide(state: State) -> list[Event]:
            if check is not None:
                check(state)
            out = apply_observation(state, observation, max_clock_skew=skew)
            if out:
                out += guards.context_check(state, observation.remote_context_id)
            for type_, data in list(out):
                if type_ == ev.STATE_CHANGED and data["to"] == "failed":
                    if not agent_revision:
                        agent_revision.append(self._agent_revision(state))
                    out += guards.failure_review(
                        state, "failed", data.get("message"), agent_revision[0]
                    )
            hook = state.get("webhook") or {}
            if observation.source == "push" and hook.get("status") == "provisional":
                # R5: the first valid delivery confirms the webhook.
                out.append((ev.WEBHOOK_CONFIRMED, {"config_id": hook.get("config_id")}))
            if recorded is not None:
                recorded[:] = out
            decided[:] = out
            return out

        before, after = self.log.record(key, decide)
        if not decided and observation.state is not None:
            # R12: a report that repeats one already recorded: counted, not appended.
            self.log.count_repeat(key)
        return before, after

    def _agent_revision(self, state: Mapping[str, Any]) -> str | None:
        head = self.store.stream(ev.agent_stream_id(str(state.get("agent"))))  # on a worker
        return None if head is None else head.state.get("revision")

    async def _boundary_recheck(self, key: str) -> None:
        agent_url = (await self._known_state(key))["agent_url"]
        # Many tasks of one agent cross a boundary at once: they share one read in flight.
        card, failure = await self._read(agent_url, fresh=True, share=True)
        if failure is None and card is not None and card.push_notifications:
            return  # push still offered: nothing to record, whatever the task's state now
        # Decided on the task as it is when the outcome is appended, not as it was before the
        # read (another report may have switched it to polling meanwhile).
        await self._decide(key, lambda state: guards.push_recheck(state, card, failure))

    async def _revalidate(self, key: str) -> None:
        state = await self._state(key)
        card, failure, unread = await self._task_card(state, fresh=False, share=True)
        if unread is not None:  # the public card stands in for the extended one
            await self._decide(key, lambda s: guards.reconcile_stand_in(s, card, failure, unread))
            return
        previous = await self._calls.run(self._card, state.get("latest_card_revision"))
        await self._decide(key, lambda s: guards.reconcile_card(s, card, failure, previous))

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
        self, agent_url: str, *, fresh: bool, share: bool = False
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

    # -- replies and cancels (R10) ------------------------------------------------------------

    async def reply(self, ref: str, text: str, *, media_type: str = "text/plain") -> TaskView:
        """Answer an input-required (or auth-required) task."""
        key = await self._find(ref)
        state = await self._state(key)
        if state["state"] not in INTERRUPTED:
            raise UsageError(f"task {key} is {state['state']}, not waiting for input")
        message_id = f"m-{uuid.uuid4().hex}"
        transport = await self._task_transport(state)
        await self._record(key, [(ev.REPLY_SENT, {"message_id": message_id, "chars": len(text)})])
        try:
            answer = await transport.send_message(
                text=text,
                message_id=message_id,
                context_id=state.get("remote_context_id") or state["context_id"],
                task_id=state["remote_task_id"],
                metadata={"skillId": state["skill"]},
                media_type=media_type,
            )
        except AuthorizationFailedError as refused:
            await self._record(key, [_authorization_failed(refused, "reply")])
            raise
        except EndpointUnreachableError as failure:
            await self._record(key, [(ev.ENDPOINT_UNREACHABLE, _unreachable(failure, "reply"))])
            raise
        except WrongTaskAnswerError as wrong:
            await self._record_wrong_task(key, wrong, "send")
            raise
        if isinstance(answer, RemoteTask):
            return await self._observe(key, from_task(answer, "send"))
        return await self._observe(key, from_message(answer, "send"))

    async def cancel(self, ref: str) -> TaskView:
        """Ask the remote to cancel. The state moves only when the remote reports it (R10)."""
        key = await self._find(ref)
        state = await self._state(key)
        if not state.get("remote_task_id"):
            raise UsageError(f"task {key} has no remote task id: run `resume` first")
        transport = await self._task_transport(state)
        await self._record(key, [(ev.CANCEL_REQUESTED, {"at": _now_iso()})])
        try:
            answer = await transport.cancel_task(state["remote_task_id"])
        except AuthorizationFailedError as refused:
            await self._record(key, [_authorization_failed(refused, "cancel")])
            raise
        except RemoteRefusedError as refusal:
            await self._record(
                key, [(ev.CANCEL_REFUSED, {"code": refusal.code, "detail": str(refusal)})]
            )
            raise
        except EndpointUnreachableError as failure:
            await self._record(key, [(ev.ENDPOINT_UNREACHABLE, _unreachable(failure, "cancel"))])
            raise
        except WrongTaskAnswerError as wrong:
            await self._record_wrong_task(key, wrong, "send")
            raise
        return await self._observe(key, from_task(answer, "send"))

    # -- resume (R9) ---------------------------------------------------------------------------

    async def resume(self, ref: str, *, accept_contract: bool = False) -> TaskView:
        """Reconcile the task with a fresh card before any request to its endpoint (R9), and
        find its remote id if a crash fell between send and record. Raises
        :class:`TaskOrphanedError` (the state untouched) when the card no longer carries its
        skill compatibly. Does not drive; call :meth:`drive` next.

        R15: when the endpoint moved to another origin than the one the task's credentials were
        granted for, they are not sent there; ``accept_contract`` accepts the fresh card's
        contract (R3, ``ContractAccepted`` when it changed) and moves the credentials to the
        endpoint's origin (``CredentialsMoved``)."""
        key = await self._find(ref)
        state = await self._state(key)
        if state["state"] in TERMINAL or guards.never_created(state):
            return TaskView.of(state)  # R3: a refused creation is final, never sent again
        await self._reconcile_endpoint(key)
        state = await self._state(key)
        if accept_contract:
            await self._move_credentials(key, state)
            state = await self._state(key)
        if not state.get("remote_task_id"):
            await self._rebind(key, state)
        return TaskView.of(await self._state(key))

    async def _move_credentials(self, key: str, state: State) -> None:
        """R15: the caller accepts the origin the task's endpoint moved to, under the contract
        a fresh read finds there (accepted for the agent, R3)."""
        recorded = state.get("authorization") or {}
        old = recorded.get("origin")
        new = normalise_origin(str(state["endpoint"]["url"]))
        if not recorded.get("schemes") or old == new:
            return
        missing = [name for name in recorded["schemes"] if not self.authorizer.has(new, name)]
        if missing:  # the same schemes, never others (R3): each must be configured there
            needs = "; or ".join(f"[{name}]: not configured for {new}" for name in missing)
            raise CredentialsMissingError(new, str(state["skill"]), needs)
        read = await self.discovery.read(str(state["agent_url"]), fresh=True)
        await self.discovery.check_contract(read, accept=True)
        moved = {"old": old, "new": new, "revision": read.card.revision, "at": _now_iso()}
        await self._record(key, [(ev.CREDENTIALS_MOVED, moved)])

    async def _reconcile_endpoint(self, key: str) -> None:
        state = await self._state(key)
        card, failure, unread = await self._task_card(state, fresh=True)
        insecure = self._allow_insecure
        plan = (
            guards.resume_check(state, card, failure, allow_insecure=insecure)
            if unread is None
            else guards.resume_stand_in(state, card, failure, unread, allow_insecure=insecure)
        )
        await self._record(key, plan.events)
        if plan.orphaned:
            revision = card.revision if card else ""
            raise TaskOrphanedError(key, str(state["skill"]), revision, plan.detail)

    async def _rebind(self, key: str, state: State) -> None:
        """The send may or may not have reached the agent: ask it for our context's tasks."""
        transport = await self._task_transport(state)
        found = await transport.list_tasks(context_id=state["context_id"])
        if found:
            # ListTasks may leave artifacts out (a2a-sdk does by default): read the whole task.
            whole = await transport.get_task(found[0].id)
            await self._observe(key, from_task(whole, "poll"))
            return
        # Never reached the agent: sending it now is a creation (R3), gated like one: a fresh
        # card (R2) that still offers the skill for the media type, under the task's frozen
        # contract -- wherever the endpoint now is. Same messageId, so an agent that did get
        # the first send can tell. Its text lives in TaskSubmitted only (kept out of the
        # projection, rewritten every step).
        await self._resend_gate(key, state)
        state = await self._state(key)
        submitted = (await self._calls.run(self.store.read_stream, task_stream_id(key)))[0].data
        await self._send_creation(
            key,
            await self._task_transport(state),
            submitted["text"],
            state["message_id"],
            state["context_id"],
            state["skill"],
            state.get("media_type") or "text/plain",
        )

    async def _resend_gate(self, key: str, state: State) -> None:
        """R2 and R3 for a re-send by ``resume``; raises (nothing sent) and records the refusal
        in the agent's stream."""
        agent_url, skill = str(state["agent_url"]), str(state["skill"])
        try:
            read = await self.discovery.read(agent_url, fresh=True)
        except DiscoveryError as failure:
            failure.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(failure), skill, key)
            raise
        extended: AgentCard | None = None
        if state.get("extended"):  # R15: its skill is on the authenticated extended card
            extended, _, _ = await self._task_card(state, fresh=True)
        decision = guards.resend_check(state, read.card, extended)
        if decision.allowed:
            return
        await self._refuse(agent_url, decision.reason, decision.detail, skill, key)
        if decision.reason == "contract_changed":
            raise ContractChangedError(
                read.agent, str(state["contract_hash"]), read.card.contract_hash,
                f"task {key} was created under the first; a re-send is a creation under it",
            )  # fmt: skip
        raise SkillUnavailableError(read.agent, skill, decision.detail)

    # -- push deliveries (R5, R12) -------------------------------------------------------------

    async def deliver(self, body: bytes, headers: Mapping[str, str]) -> webhook.Delivery:
        """Ingest one push delivery: checked (size, type, shape, credentials), then applied like
        any other observation. Refusals write nothing."""
        try:
            update = webhook.decode(body, headers)
        except webhook.Refused as refused:
            return refused.delivery
        observation = observation_from_update(update, "push")
        recorded: list[Event] = []
        try:
            key, moved = await self._calls.run(
                self._ingest, update.task_id or "", headers, observation, recorded
            )
        except webhook.Refused as refused:
            return refused.delivery
        if observation is None or moved is None:
            return webhook.Delivery(200, "ignored", "a message, not a task update", key)
        self._observed(key, observation, *moved, whole=update.kind == "task")
        self._wake(key)
        cut = any(_truncated(data) for _, data in recorded)
        detail = FLAG_PAYLOAD_TRUNCATED if cut else ""
        return webhook.Delivery(200, _delivery_outcome(recorded), detail, key)

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
    ) -> A2ATransport:
        """The transport to ``endpoint``, carrying ``credentials`` (one per grant and place;
        ``keep`` False: a transport for one request, not kept), in the A2A version the endpoint
        was recorded with (1.0 for tasks recorded before it was kept)."""
        url, binding = str(endpoint["url"]), str(endpoint["binding"])
        version = guards.endpoint_version(endpoint)
        place = (url, binding, version, id(credentials.grant) if credentials else 0)
        transport = self._transports.get(place)
        if transport is None:
            cert = credentials.client_cert() if credentials is not None else None
            transport = A2ATransport(
                self._client_for(cert), Interface(url, binding, version),
                timeout=self.config.request_timeout, credentials=credentials,
                slots=self._request_slots,
            )  # fmt: skip
            if keep:
                self._transports[place] = transport
        return transport

    async def _task_transport(self, state: State) -> A2ATransport:
        """The transport for a request of the task ``state`` describes: to its recorded
        endpoint, with the credentials its frozen contract grants -- none when that endpoint
        is no longer at the origin the task was created at (R15: never leak)."""
        recorded = state.get("authorization")
        if not recorded or not recorded.get("schemes"):
            return self._transport(state["endpoint"])
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
        return self._transport(state["endpoint"], credentials)

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
            self.background_errors.append(error)

    async def settle(self) -> None:
        """Wait for background re-checks, re-validations and closing reads; raise the first error
        one of them hit (tests, shutdown). Closing reads included."""
        while self._background or self._closing:
            jobs = [*self._background, *self._closing.values()]
            await asyncio.gather(*jobs, return_exceptions=True)
        if self.background_errors:
            raise self.background_errors.pop(0)


def _truncated(data: Mapping[str, Any]) -> bool:
    """Whether an event kept part of a report as its size and SHA-256 only (R16)."""
    return bool(data.get("truncated") or data.get("payload_truncated"))


def _delivery_outcome(recorded: Sequence[Event]) -> str:
    """``applied`` (a transition or a new artifact), ``duplicate``, ``stale`` or ``ignored``."""
    types = {type_ for type_, _ in recorded}
    if ev.STATE_CHANGED in types or ev.ARTIFACT_RECEIVED in types:
        return "applied"
    reasons = {data.get("reason") for type_, data in recorded if type_ == ev.OBSERVATION_IGNORED}
    for reason in ("duplicate", "stale"):
        if reason in reasons:
            return reason
    return "ignored" if reasons else "duplicate"


def _submitted(
    key: str,
    agent_url: str,
    read: CardRead,
    contract_hash: str,
    skill: str,
    endpoint: Mapping[str, Any],
    message_id: str,
    context_id: str,
    text: str,
    media_type: str,
) -> Event:
    card = read.card
    return ev.TASK_SUBMITTED, {
        "task": key,
        "agent": read.agent,
        "agent_url": agent_url,
        "card_url": read.url,
        "skill": skill,
        "message_id": message_id,
        "context_id": context_id,
        "text": text,
        "media_type": media_type,
        "card_revision": card.revision,
        "card_version": card.version,
        "contract_hash": contract_hash,
        "skill_hash": card.compatibility_hash(skill),
        "endpoint": dict(endpoint),
        "submitted_at": _now_iso(),
    }


def _authorization_failed(refused: AuthorizationFailedError, during: str) -> Event:
    """R15: a 401/403 (or no token to be had) is an annotation, never a transition (R1)."""
    return ev.AUTHORIZATION_FAILED, {
        "url": refused.url,
        "status": refused.status,
        "schemes": list(refused.schemes),
        "detail": str(refused),
        "during": during,
        "at": _now_iso(),
    }


def _unreachable(failure: Exception, during: str) -> dict[str, Any]:
    return {"url": getattr(failure, "url", ""), "detail": str(failure), "during": during}
