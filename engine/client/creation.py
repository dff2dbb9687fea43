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
from cardfence.engine.core.messages import Message, outgoing, recorded_parts
from cardfence.engine.core.observations import from_message, from_task
from cardfence.engine.core.parts import Part, media_type_of
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import card_urls
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
from cardfence.engine.wire.transport import A2ATransport, check_message_size
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
        skill: str | None = None,
        text: str | None = None,
        media_type: str = "text/plain",
        parts: Sequence[Part] = (),
        context: str | None = None,
        references: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        accept: Sequence[str] = (),
        accept_contract: bool = False,
        key: str | None = None,
        extensions: Sequence[str] = (),
    ) -> TaskView:
        """Create a task: fresh card read, skill, media-type, output-mode and extension check,
        contract check, freeze, record, send. Nothing is sent on any refusal
        (``DiscoveryError``, ``CardInvalidError``, ``SkillUnavailableError``,
        ``ExtensionRequiredError``, ``ContractChangedError``), and the refusal is recorded. An
        ``agent_url`` that cannot be used (``card_urls``: credentials or a fragment in it, a port
        outside 1-65535, not http(s)) is the caller's error, :class:`UsageError`: nothing read,
        recorded or sent.

        The message is ``text`` (a :class:`Text` of ``media_type``), then ``parts``: one part at
        least, each accepted by the skill's input modes (R2); ``metadata`` a JSON object. When
        ``accept`` names output modes, the skill must produce one of them (R2); they are sent as
        ``acceptedOutputModes``. ``context`` (an earlier task of this store, at the same agent
        origin) is the conversation the task continues (its ``contextId``); ``references`` name
        earlier tasks of this store, sent by their remote ids (``referenceTaskIds``). ``skill``
        may be left out when the card the task would be created under offers exactly one. A
        message over ``max_message_bytes`` encoded is :class:`MessageTooLargeError`. Each of
        these caller's errors is a :class:`UsageError`: nothing read, recorded or sent.

        ``extensions``: the URIs of the A2A extensions the caller activates (it complies with
        them): named on every request of the task (``A2A-Extensions``), frozen with it. A card
        that requires an extension not among them refuses the creation."""
        activated = _activated(extensions)
        given, sent_metadata = outgoing(text, media_type, parts, metadata)
        modes = _accepted(accept)
        origin = card_urls(agent_url)[0]
        key = key or uuid.uuid4().hex
        message_id = f"m-{uuid.uuid4().hex}"
        context_id, context_task = await self._context_of(context, origin)
        remote_refs, ref_keys = await self._references(references)
        message = Message(given, sent_metadata, remote_refs, modes)
        self._check_size(message, message_id, context_id, skill)
        try:
            read = await self.discovery.read(agent_url, fresh=True)
        except DiscoveryError as failure:
            failure.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(failure), skill or "")
            raise
        # R15: when the card offers an authenticated extended card, its skills count too (R2),
        # and the task is frozen under it. Unreadable, the public card alone decides; read but
        # refused by its agent's signature policy, nothing is created.
        try:
            extended, unread = await self._extended_at_creation(read, accept_contract)
        except CardSignatureError as refused:
            refused.consequence = "nothing was sent"
            await self._refuse(agent_url, "discovery_failed", str(refused), skill or "")
            raise
        card = read.card if extended is None else extended.card
        chosen = skill if skill is not None else guards.sole_skill(card)
        types = [media_type_of(part) for part in given]
        decision = guards.creation_check(card, chosen, types, activated, modes)
        if not decision.allowed or chosen is None:
            detail = decision.detail
            if unread:
                detail += f"; the extended card could not be read ({unread})"
            await self._refuse(agent_url, decision.reason, detail, chosen or "")
            if decision.reason == guards.EXTENSION_REQUIRED:
                raise ExtensionRequiredError(read.agent, decision.extensions)
            raise SkillUnavailableError(read.agent, chosen or "", detail)
        skill = chosen
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
        endpoint = guards.endpoint_of(interface)
        submitted = _submitted(key, agent_url, read, check.contract_hash, skill, endpoint,
                               message_id, context_id, message)  # fmt: skip
        if ref_keys:
            submitted = dataclasses.replace(submitted, referenced_tasks=list(ref_keys))
        if context_task is not None:
            submitted = dataclasses.replace(submitted, context_task=context_task)
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
            await self.send_creation(key, transport, message, message_id, context_id, skill)
        )

    async def _context_of(self, ref: str | None, origin: str) -> tuple[str, str | None]:
        """The ``contextId`` a new task's message is sent in, and the task of this store whose
        conversation it continues (``ref``; None: a new context). That task must be of the same
        agent origin: a context id means nothing to another agent (:class:`UsageError`)."""
        if ref is None:
            return f"c-{uuid.uuid4().hex}", None
        key = await self.records.find(ref)
        state = await self.records.state(key)
        theirs = card_urls(str(state.get("agent_url") or ""))[0] if state.get("agent_url") else ""
        if theirs != origin:
            raise UsageError(
                f"task {key} is of {theirs or 'no agent'}, not {origin}: a conversation goes on "
                "at one agent (nothing was recorded or sent)"
            )
        return str(state.get("remote_context_id") or state["context_id"]), key

    async def _references(self, refs: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The remote ids of the tasks ``refs`` name (sent as ``referenceTaskIds``), and their
        keys; a task without a remote id yet cannot be referenced (:class:`UsageError`)."""
        remote: list[str] = []
        keys: list[str] = []
        for ref in dict.fromkeys(refs):
            key = await self.records.find(ref)
            remote_id = (await self.records.state(key)).get("remote_task_id")
            if not remote_id:
                raise UsageError(
                    f"task {key} has no remote task id yet: it cannot be referenced "
                    "(nothing was recorded or sent)"
                )
            if key not in keys:
                keys.append(key)
                remote.append(str(remote_id))
        return tuple(remote), tuple(keys)

    def _check_size(
        self, message: Message, message_id: str, context_id: str, skill: str | None
    ) -> None:
        """The bound on a message (``max_message_bytes``), measured on the request's params as
        a creation sends them; over it, nothing is read, recorded or sent."""
        check_message_size(
            message,
            self.config.max_message_bytes,
            message_id=message_id,
            context_id=context_id,
            metadata={"skillId": skill or ""},
        )

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
        message: Message,
        message_id: str,
        context_id: str,
        skill: str,
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
                return await self._send_once(key, transport, message, message_id, context_id, skill)
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
            await self.resend_gate(key, state, message)
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
        message: Message,
        message_id: str,
        context_id: str,
        skill: str,
    ) -> State:
        """One SendMessage of a creation, and what came of it (see :meth:`send_creation`); a
        :class:`ThrottledError` is raised unrecorded."""
        try:
            answer = await transport.send_message(
                message=message,
                message_id=message_id,
                context_id=context_id,
                metadata={"skillId": skill},
                return_immediately=True,
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

    async def resend_gate(self, key: str, state: State, message: Message) -> None:
        """R2 and R3 for a re-send of ``message`` (by ``resume``, or after the agent asked for
        time); raises (nothing sent) and records the refusal in the agent's stream."""
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
        decision = guards.resend_check(
            state,
            read.card,
            extended,
            media_types=[media_type_of(part) for part in message.parts],
            accept=message.accepted_output_modes,
        )
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


def _accepted(accept: Sequence[str]) -> tuple[str, ...]:
    """The output modes a caller accepts, each once, in its order: media types or ranges
    (``type/subtype``, ``type/*``, ``*/*``); anything else is a :class:`UsageError`."""
    modes = tuple(dict.fromkeys(mode.strip() for mode in accept))
    for mode in modes:
        kind, slash, sub = mode.partition(";")[0].strip().partition("/")
        if not (slash and kind and sub) or any(c.isspace() for c in kind + sub):
            raise UsageError(
                f"accepted output mode {mode!r} is not a media type or range (type/subtype, "
                "type/*, */*): nothing was sent"
            )
    return modes


def _submitted(
    key: str,
    agent_url: str,
    read: CardRead,
    contract_hash: str,
    skill: str,
    endpoint: Mapping[str, Any],
    message_id: str,
    context_id: str,
    message: Message,
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
        parts=recorded_parts(message.parts),
        metadata=message.metadata,
        references=list(message.references) or None,
        accepted_output_modes=list(message.accepted_output_modes) or None,
        card_revision=card.revision,
        card_version=card.version,
        contract_hash=contract_hash,
        skill_hash=card.compatibility_hash(skill),
        endpoint=dict(endpoint),
        submitted_at=_now_iso(),
    )
