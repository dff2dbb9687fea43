"""Creation (R2, R3, R15) and webhook registration (R4): the only two things card state may
gate. A creation refused sends nothing and is recorded in the agent's stream
(``TaskCreationRefused``); a registration refused before it is sent (an insecure URL, a card
read failing or without push), or refused by the agent, is recorded in the task's stream as
``DeliveryDowngraded``, and the task goes on by polling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cardfence.engine.auth.authorization import Grant
from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import AgentCard
from cardfence.engine.cards.spoken import V03
from cardfence.engine.cards.urls import checked_url, url_refusal
from cardfence.engine.client._access import Access
from cardfence.engine.client._asking import ASK_AGAIN_AFTER, Asking
from cardfence.engine.client._connections import EXTENDED_FAILURES, Connections
from cardfence.engine.client._observing import Observing
from cardfence.engine.client._records import (
    TaskRecords,
    _authorization_failed,
    _now_iso,
    _unreachable,
)
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.answers import PushConfig, RemoteTask
from cardfence.engine.core.observations import from_message, from_task
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CardInvalidError,
    CardSignatureError,
    ContractChangedError,
    CreationRefusedError,
    CredentialsConfigError,
    CredentialsMissingError,
    DiscoveryError,
    EndpointUnreachableError,
    ExtensionRequiredError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    SkillUnavailableError,
    ThrottledError,
    UsageError,
)
from cardfence.engine.wire import push as webhook
from cardfence.engine.wire.transport import A2ATransport
from cardfence.engine.wire.v10 import HISTORY_IDS_KEPT
from cardfence.store.errors import CorruptRecordError


def check_webhook_url(url: str) -> None:
    """A webhook URL the caller gives, refused (:class:`UsageError`, nothing recorded or
    registered) when it is no usable URL: not http(s) with a host, a port outside 1-65535,
    credentials in it (stored with the URL, and sent by the agent with every push; the
    webhook's token is what authenticates a delivery, R15), a fragment."""
    checked_url(
        url,
        "webhook URL",
        instead="a delivery is authenticated by the webhook's token (--webhook-token) instead",
        consequence="nothing was recorded or registered",
    )


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


class Creation:
    """Task creation and webhook registration, each gated by a card read made for it."""

    def __init__(
        self,
        config: EngineConfig,
        discovery: Discovery,
        records: TaskRecords,
        connections: Connections,
        access: Access,
        asking: Asking,
        observing: Observing,
    ) -> None:
        self.config = config
        self.discovery = discovery
        self.records = records
        self.connections = connections
        self.access = access
        self.asking = asking
        self.observing = observing

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
        extensions: Sequence[str] = (),
    ) -> TaskView:
        """Create a task: fresh card read, skill, media-type and extension check, contract
        check, freeze, record, send. Nothing is sent on any refusal (``DiscoveryError``,
        ``CardInvalidError``, ``SkillUnavailableError``, ``ExtensionRequiredError``,
        ``ContractChangedError``), and the refusal is recorded. An ``agent_url`` that cannot be
        used (``card_urls``: credentials or a fragment in it, a port outside 1-65535, not
        http(s)) is the caller's error, :class:`UsageError`: nothing read, recorded or sent.

        ``extensions``: the URIs of the A2A extensions the caller activates (it complies with
        them): named on every request of the task (``A2A-Extensions``), frozen with it. A card
        that requires an extension not among them refuses the creation."""
        activated = _activated(extensions)
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
        decision = guards.creation_check(card, skill, media_type, activated)
        if not decision.allowed:
            detail = decision.detail
            if unread:
                detail += f"; the extended card could not be read ({unread})"
            await self._refuse(agent_url, decision.reason, detail, skill)
            if decision.reason == guards.EXTENSION_REQUIRED:
                raise ExtensionRequiredError(read.agent, decision.extensions)
            raise SkillUnavailableError(read.agent, skill, detail)
        try:
            check = await self.discovery.check_contract(read, accept=accept_contract)
            interface = select_interface(
                read.card,
                self.config.prefer_bindings,
                allow_insecure=self.connections.allow_insecure,
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
            submitted = dataclasses.replace(
                submitted,
                card_revision=card.revision,
                card_version=card.version,
                contract_hash=card.contract_hash,
                skill_hash=card.compatibility_hash(skill),
                extended=True,
                public_revision=read.revision,
                public_contract_hash=check.contract_hash,
            )
        elif unread:
            submitted = dataclasses.replace(submitted, extended_unread=unread)
        submitted = dataclasses.replace(submitted, authorization=self.access.grant_record(grant))
        if activated:
            submitted = dataclasses.replace(submitted, extensions=list(activated))
        await self.records.calls.run(self.records.log.create, key, [submitted])
        credentials = self.access.authorizer.for_task(grant, interface.url)
        transport = self.connections.transport(endpoint, credentials, extensions=activated)
        return await self.records.view(
            await self.send_creation(key, transport, text, message_id, context_id, skill,
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
                card, self.config.prefer_bindings, allow_insecure=self.connections.allow_insecure
            )
            credentials = self.access.authorizer.for_task(
                self.access.authorizer.grant(card, "", interface.url), interface.url
            )
            transport = self.connections.transport(
                guards.endpoint_of(interface), credentials, keep=False
            )
            extended = await self.discovery.read_extended(
                read.agent, transport, public_revision=read.revision
            )
        except EXTENDED_FAILURES as failure:
            return None, f"{type(failure).__name__}: {failure}"
        return extended, ""

    async def _creation_grant(
        self, agent_url: str, card: AgentCard, skill: str, endpoint_url: str
    ) -> Grant:
        """R15 at creation: the alternative the task's requests will carry, its credentials
        tried (an OAuth token fetched) before anything is recorded or sent. A contract whose
        requirements no configured credential covers is refused (``CredentialsMissing``)."""
        try:
            grant = self.access.authorizer.grant(card, skill, endpoint_url)
            credentials = self.access.authorizer.for_task(grant, endpoint_url)
            if credentials is not None:
                await credentials.prepare()
        except CredentialsMissingError as missing:
            await self._refuse(
                agent_url, "credentials_missing", str(missing), skill, type_=ev.CredentialsMissing
            )
            raise
        except (AuthorizationFailedError, CredentialsConfigError) as failure:
            await self._refuse(agent_url, "credentials_unusable", str(failure), skill)
            raise
        return grant

    async def send_creation(
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
        outcome unknown: ``resume`` looks for the task by its context before sending again.

        An agent asking for time (:class:`ThrottledError`, R3, R5) is given it, within the
        deadline: after a 429 nothing was created, and the send goes again through the gate
        (:meth:`resend_gate`) with the same ``messageId``; after a 503 its outcome is unknown,
        so ``ListTasks`` on its context comes first, as for ``resume``. ``Throttled`` is recorded
        once. Raises :class:`DeadlineExceeded` when the wait asked for (at least a second,
        doubling) would leave no time to send again, and the :class:`ThrottledError` itself once
        the waits add up to more than ``max_retry_after``."""
        pause, waited = ASK_AGAIN_AFTER, 0.0
        while True:
            try:
                return await self._send_once(
                    key, transport, text, message_id, context_id, skill, media_type
                )
            except ThrottledError as throttled:
                unknown = throttled.status != 429  # R3: a 503 may come after the task was made
                outcome = (
                    "the send's outcome is unknown: `cardfence resume` looks for it first"
                    if unknown
                    else "nothing was created: `cardfence resume` sends it again"
                )
                waited += await self.asking.wait_asked(
                    key, throttled, "send", pause, waited, outcome
                )
            pause = min(pause * 2, self.config.max_retry_after)
            state = await self.records.state(key)
            if unknown and await self.found_sent(key, state):
                return await self.records.state(key)
            await self.resend_gate(key, state)
            transport = await self.connections.task_transport(await self.records.state(key))

    async def found_sent(self, key: str, state: State) -> bool:
        """Whether a send whose outcome is unknown reached the agent: ``ListTasks`` on the
        task's context (R3); the task found is read whole and applied. Several tasks may share
        the context (a continued conversation): one is ours only if its history holds the
        creation's ``messageId`` and no other task of this store (of this agent, R16) is bound
        to its id. None ours: nothing found."""
        transport = await self.connections.task_transport(state)
        found = await transport.list_tasks(
            context_id=state["context_id"], history_length=HISTORY_IDS_KEPT
        )
        sent = [task.id for task in found if state["message_id"] in task.history_ids]
        ours = await self.records.calls.run(self._unbound, key, state, sent)
        if ours is None:
            return False
        # ListTasks may leave artifacts out (a2a-sdk does by default): read the whole task.
        whole = await transport.get_task(ours)
        await self.observing.observe(key, from_task(whole, "poll"))
        return True

    def _unbound(self, key: str, state: State, remote_ids: Sequence[str]) -> str | None:
        """The first of ``remote_ids`` no other task of this store is bound to at this agent
        (R16: a remote task id is unique per agent only)."""
        for remote_id in remote_ids:
            heads = self.records.log.by_remote_id(remote_id)
            if not any(h.key != key and h.state.get("agent") == state.get("agent") for h in heads):
                return remote_id
        return None

    async def _send_once(
        self,
        key: str,
        transport: A2ATransport,
        text: str,
        message_id: str,
        context_id: str,
        skill: str,
        media_type: str,
    ) -> State:
        """One SendMessage of a creation, and what came of it (see :meth:`send_creation`); a
        :class:`ThrottledError` is raised unrecorded."""
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
            await self.records.record(key, [_authorization_failed(refused, "send")])
            raise
        except ThrottledError:
            raise
        except (EndpointUnreachableError, InvalidAgentResponseError) as failure:
            await self.records.record(key, [_unreachable(failure, "send")])
            raise
        except RemoteRefusedError as refusal:
            await self.records.record(
                key, [guards.refused_creation(refusal.code, refusal.detail, refusal.url)]
            )
            state = await self.records.state(key)
            await self._refuse(str(state["agent_url"]), "remote_refused", str(refusal), skill)
            raise CreationRefusedError(
                refusal.url, refusal.code, refusal.detail, task=key
            ) from refusal
        observation = (
            from_task(answer, "send")
            if isinstance(answer, RemoteTask)
            else from_message(answer, "send")
        )
        return await self.observing.observe_state(key, observation)

    async def resend_gate(self, key: str, state: State) -> None:
        """R2 and R3 for a re-send (by ``resume``, or after the agent asked for time); raises
        (nothing sent) and records the refusal in the agent's stream."""
        agent_url, skill = str(state["agent_url"]), str(state["skill"])
        try:
            read = await self.discovery.read(agent_url, fresh=True)
        except DiscoveryError as failure:
            failure.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(failure), skill, key)
            raise
        extended: AgentCard | None = None
        if state.get("extended"):  # R15: its skill is on the authenticated extended card
            extended, _, _ = await self.connections.task_card(state, fresh=True)
        decision = guards.resend_check(state, read.card, extended)
        if decision.allowed:
            return
        await self._refuse(agent_url, decision.reason, decision.detail, skill, key)
        if decision.reason == "contract_changed":
            raise ContractChangedError(
                read.agent, str(state["contract_hash"]), read.card.contract_hash,
                f"task {key} was created under the first; a re-send is a creation under it",
            )  # fmt: skip
        if decision.reason == guards.EXTENSION_REQUIRED:
            raise ExtensionRequiredError(read.agent, decision.extensions)
        raise SkillUnavailableError(read.agent, skill, decision.detail)

    async def _refuse(
        self,
        agent_url: str,
        reason: str,
        detail: str,
        skill: str,
        task: str | None = None,
        *,
        type_: type[ev.TaskCreationRefused | ev.CredentialsMissing] = ev.TaskCreationRefused,
    ) -> None:
        refusal = type_(reason=reason, detail=detail, skill=skill, at=_now_iso(), task=task)
        # Not recorded when the agent's record cannot be read (altered in the store): the
        # refusal is the caller's error all the same.
        with contextlib.suppress(DiscoveryError, CorruptRecordError):
            await self.discovery.record_refusal(agent_url, refusal)

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

        A ``url`` that is no usable URL is the caller's error (:func:`check_webhook_url`:
        :class:`UsageError`, nothing recorded or sent).
        """
        check_webhook_url(url)
        key = await self.records.find(ref)
        state = await self.records.state(key)
        if not state.get("remote_task_id"):
            raise UsageError(f"task {key} has no remote task id yet: nothing to register for")
        refusal = url_refusal(url, allow_insecure=self.connections.allow_insecure)
        if refusal is not None:  # R16: the agent would push the task's updates in clear text
            detail = f"webhook URL {url}: {refusal}; nothing was registered"
            await self.records.record(key, [guards.downgrade("insecure_url", detail)])
            return WebhookOutcome(False, "insecure_url", detail)
        card: AgentCard | None = None
        failure: DiscoveryError | None = None
        try:
            card = (await self.discovery.read(state["agent_url"], fresh=True)).card
        except DiscoveryError as error:
            failure = error
        decision = guards.registration_check(card, failure)
        if not decision.allowed:
            await self.records.record(key, [guards.downgrade(decision.reason, decision.detail)])
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
            transport = await self.connections.task_transport(state)
            await transport.create_push_config(state["remote_task_id"], config)
        except AuthorizationFailedError as refused:
            detail = f"{refused}; the task goes on by polling"
            await self.records.record(
                key,
                [_authorization_failed(refused, "register"),
                 guards.downgrade("credentials_rejected", detail)],
            )  # fmt: skip
            return WebhookOutcome(False, "credentials_rejected", detail)
        except RemoteRefusedError as refusal:
            detail = str(refusal)
            await self.records.record(key, [guards.downgrade("push_refused", detail)])
            return WebhookOutcome(False, "push_refused", detail)
        auth = f"{auth_scheme} {auth_credentials}" if auth_scheme and auth_credentials else None
        registered = ev.WebhookRegistered(
            config_id=config_id,
            url=url,
            token_sha256=webhook.digest(token),
            auth_sha256=webhook.digest(auth) if auth else None,
            status="provisional",
            card_revision=card.revision if card else None,
        )
        await self.records.record(key, [registered])
        return WebhookOutcome(True, "registered", "", config_id, token, auth)


def _activated(extensions: Sequence[str]) -> tuple[str, ...]:
    """The extension URIs a caller activates, stripped, each once, in its order. Each goes in
    a request header, so it must be what a URI is: printable ASCII without spaces (a comma would
    split it in two)."""
    activated = tuple(dict.fromkeys(uri.strip() for uri in extensions))
    for uri in activated:
        if not uri or not all("!" <= c <= "~" and c != "," for c in uri):
            raise UsageError(
                f"extension {uri!r} is not a URI (printable ASCII, no spaces or commas): "
                "nothing was sent"
            )
    return activated


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
) -> ev.TaskSubmitted:
    card = read.card
    return ev.TaskSubmitted(
        task=key,
        agent=read.agent,
        agent_url=agent_url,
        card_url=read.url,
        skill=skill,
        message_id=message_id,
        context_id=context_id,
        text=text,
        media_type=media_type,
        card_revision=card.revision,
        card_version=card.version,
        contract_hash=contract_hash,
        skill_hash=card.compatibility_hash(skill),
        endpoint=dict(endpoint),
        submitted_at=_now_iso(),
    )
