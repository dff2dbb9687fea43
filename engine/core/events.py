"""The event catalogue (docs/events.md): every event type cardfence records, by stream, and
one class per type. Pure: no I/O.

Names are the ones ``cardfence show`` prints and audits parse; they never change meaning. Each
class builds its payload (:meth:`payload`: exactly the JSON the store keeps and hashes, optional
keys left out as they always were) and reads one back (:meth:`from_payload`); a type this
cardfence does not know is read as an :class:`UnknownEvent`, which replay passes over.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Final, Self

AGENT_STREAM_PREFIX: Final = "agent:"
TASK_STREAM_PREFIX: Final = "task:"
AGENT_CATEGORY: Final = "agent"
TASK_CATEGORY: Final = "task"

# Agent stream: one per agent, keyed by the card URL's origin.
CARD_FETCHED: Final = "CardFetched"
DISCOVERY_FAILED: Final = "DiscoveryFailed"
CONTRACT_PINNED: Final = "ContractPinned"
CONTRACT_ACCEPTED: Final = "ContractAccepted"
TASK_CREATION_REFUSED: Final = "TaskCreationRefused"
# R15: a creation refused before sending, the contract's credentials not being configured.
CREDENTIALS_MISSING: Final = "CredentialsMissing"

AGENT_EVENTS: Final = frozenset(
    {
        CARD_FETCHED,
        DISCOVERY_FAILED,
        CONTRACT_PINNED,
        CONTRACT_ACCEPTED,
        TASK_CREATION_REFUSED,
        CREDENTIALS_MISSING,
    }
)

# Task stream: one per task, keyed by a local task key made before sending.
TASK_SUBMITTED: Final = "TaskSubmitted"
STATE_CHANGED: Final = "StateChanged"
OBSERVATION_IGNORED: Final = "ObservationIgnored"
WEBHOOK_REGISTERED: Final = "WebhookRegistered"
WEBHOOK_CONFIRMED: Final = "WebhookConfirmed"
DELIVERY_DOWNGRADED: Final = "DeliveryDowngraded"
DISCOVERY_UNAVAILABLE: Final = "DiscoveryUnavailable"
CARD_REVISION_CHANGED: Final = "CardRevisionChanged"
FLAGGED_FOR_REVIEW: Final = "FlaggedForReview"
CONTRACT_DIVERGED: Final = "ContractDiverged"
TASK_ORPHANED: Final = "TaskOrphaned"
ENDPOINT_MOVED: Final = "EndpointMoved"
ENDPOINT_UNREACHABLE: Final = "EndpointUnreachable"
CANCEL_REQUESTED: Final = "CancelRequested"
CANCEL_REFUSED: Final = "CancelRefused"
REPLY_SENT: Final = "ReplySent"
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
ARTIFACT_RECEIVED: Final = "ArtifactReceived"
# R15: the agent answered 401/403 to a request of the task; an annotation, never a transition.
AUTHORIZATION_FAILED: Final = "AuthorizationFailed"
# R5: the agent answered 429 (or 503 with Retry-After): the wait it asked for and the one taken,
# once per task; an annotation, never a transition.
THROTTLED: Final = "Throttled"
# R15: the caller accepted the origin the task's endpoint moved to; its credentials go there now.
CREDENTIALS_MOVED: Final = "CredentialsMoved"
# Also on the task stream (R3): the agent refused the creation with an A2A error; final.
# TASK_CREATION_REFUSED, same name as the agent stream's refusal.

TASK_EVENTS: Final = frozenset(
    {
        TASK_SUBMITTED,
        STATE_CHANGED,
        OBSERVATION_IGNORED,
        WEBHOOK_REGISTERED,
        WEBHOOK_CONFIRMED,
        DELIVERY_DOWNGRADED,
        DISCOVERY_UNAVAILABLE,
        CARD_REVISION_CHANGED,
        FLAGGED_FOR_REVIEW,
        CONTRACT_DIVERGED,
        TASK_ORPHANED,
        ENDPOINT_MOVED,
        ENDPOINT_UNREACHABLE,
        CANCEL_REQUESTED,
        CANCEL_REFUSED,
        REPLY_SENT,
        DEADLINE_EXCEEDED,
        ARTIFACT_RECEIVED,
        AUTHORIZATION_FAILED,
        CREDENTIALS_MOVED,
        TASK_CREATION_REFUSED,
        THROTTLED,
    }
)

KNOWN_EVENTS: Final = AGENT_EVENTS | TASK_EVENTS

# R12: a field any task event may carry: how many repeated reports were counted, not appended,
# since the stream's previous event. The fold adds it up in the projection's field of that name.
REPEATS_IGNORED: Final = "repeats_ignored"
# A field any task event may carry: how many failed polls and card re-validations, each exactly
# as one of the failures the task's last events recorded, were counted, not appended, since the
# stream's previous event (engine/client/tasklog.py). The fold adds it up like ``repeats_ignored``.
FAILURES_REPEATED: Final = "failures_repeated"

# Scale-out: a field on the first event of every append a driver makes under its lease on the
# task (``{"owner": ..., "epoch": ...}``), so the log shows which process drove the task when.
# The fold ignores it.
LEASE: Final = "lease"

# R12: a projection field, per artifactId the digests of the versions a later one replaced. A
# version seen once is never appended again, so an agent alternating two versions of one artifact
# does not grow the log on every read. The fold keeps it; it appears once an artifact is replaced.
SUPERSEDED_ARTIFACTS: Final = "superseded_artifacts"


def agent_stream_id(origin: str) -> str:
    """The agent stream of the agent whose card is served from ``origin``."""
    return f"{AGENT_STREAM_PREFIX}{origin}"


# -- one class per event type ------------------------------------------------------------------


class Absent(enum.Enum):
    """An optional payload key the event does not hold, where null is a value it may hold."""

    ABSENT = "absent"


ABSENT: Final = Absent.ABSENT

_KEY: Final = "key"  # the payload key of a field whose name is not it (``from``)
_OPTIONAL: Final = "optional"  # left out of the payload while the field holds its default


def _optional() -> Any:
    """An optional key, left out of the payload when ``None`` (never written as null)."""
    return field(default=None, metadata={_OPTIONAL: True})


# An optional key that may hold null: left out of the payload when :data:`ABSENT`.
_OR_NULL: Final[Mapping[str, object]] = {_OPTIONAL: True}


def _named(key: str) -> Any:
    """A key the payload always holds, under a name that is no Python name (``from``)."""
    return field(metadata={_KEY: key})


@dataclass(frozen=True, slots=True)
class _Spec:
    attribute: str
    key: str
    optional: bool
    default: object


_SPECS: dict[type, tuple[_Spec, ...]] = {}


def _specs(cls: type) -> tuple[_Spec, ...]:
    """The payload keys of an event class, read once from its fields."""
    specs = _SPECS.get(cls)
    if specs is None:
        specs = _SPECS[cls] = tuple(
            _Spec(
                f.name, f.metadata.get(_KEY) or f.name, bool(f.metadata.get(_OPTIONAL)), f.default
            )
            for f in fields(cls)
            if f.name != "extra"
        )
    return specs


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Recorded:
    """What every event class holds: its type name, and the keys of a stored payload that the
    class does not know (a later cardfence may add fields), given back as they were read."""

    TYPE: ClassVar[str]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.TYPE

    def __eq__(self, other: object) -> bool:
        """Two events are equal when they record the same: their type and payload."""
        if isinstance(other, Recorded | UnknownEvent):
            return (self.type, self.payload()) == (other.type, other.payload())
        return NotImplemented

    def payload(self) -> dict[str, Any]:
        """The payload as recorded: every key the event holds, optional ones only when set."""
        out: dict[str, Any] = {}
        for spec in _specs(type(self)):
            value = getattr(self, spec.attribute)
            if spec.optional and value is spec.default:
                continue
            out[spec.key] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Self:
        """The event a stored payload records. ``KeyError`` names a key the type always holds
        that the payload lacks (then it cannot be folded: the audit's ``replay_failed``)."""
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        known: set[str] = set()
        for spec in _specs(cls):
            known.add(spec.key)
            if spec.key not in data:
                if not spec.optional:
                    raise KeyError(spec.key)
                continue
            value = data[spec.key]
            if spec.optional and value is None and spec.default is None:
                extra[spec.key] = None  # an explicit null where the key is left out: kept
                continue
            values[spec.attribute] = value
        extra.update((key, value) for key, value in data.items() if key not in known)
        return cls(**values, extra=extra)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TaskRecorded(Recorded):
    """A task event. The first event of an append may carry what was counted, not appended,
    since the stream's previous event (:data:`REPEATS_IGNORED`, :data:`FAILURES_REPEATED`) and
    the lease it was appended under (:data:`LEASE`); the task log adds them."""

    repeats_ignored: int | None = _optional()
    failures_repeated: int | None = _optional()
    lease: Mapping[str, Any] | None = _optional()


@dataclass(frozen=True, slots=True, eq=False)
class UnknownEvent:
    """An event of a type this cardfence does not know (written by a newer one): kept as
    stored; replay leaves the state unchanged and the audit reports it."""

    type: str
    data: Mapping[str, Any]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Recorded | UnknownEvent):
            return (self.type, self.payload()) == (other.type, other.payload())
        return NotImplemented

    def payload(self) -> dict[str, Any]:
        return dict(self.data)


# Agent stream.


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CardFetched(Recorded):
    """A card read that reached the wire and gave a card (R14; R15 when ``extended``)."""

    TYPE: ClassVar[str] = CARD_FETCHED
    url: str
    status: int
    revision: str
    version: str | None
    etag: str | None
    last_modified: str | None
    contract_hash: str
    push_notifications: bool
    fetched_at: str
    extended: bool | None = _optional()
    binding: str | None = _optional()
    public_revision: str | Absent | None = field(default=ABSENT, metadata=_OR_NULL)
    signature: Mapping[str, Any] | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DiscoveryFailed(Recorded):
    """A card read failed."""

    TYPE: ClassVar[str] = DISCOVERY_FAILED
    url: str
    kind: str
    detail: str
    at: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ContractPinned(Recorded):
    """The first creation for an agent pinned its contract (R3)."""

    TYPE: ClassVar[str] = CONTRACT_PINNED
    contract_hash: str
    revision: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ContractAccepted(Recorded):
    """Another contract than the pinned one, accepted by the caller (R3)."""

    TYPE: ClassVar[str] = CONTRACT_ACCEPTED
    previous: str
    contract_hash: str
    revision: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TaskCreationRefused(Recorded):
    """The engine refused to create (or re-send) a task; nothing was sent (agent stream)."""

    TYPE: ClassVar[str] = TASK_CREATION_REFUSED
    reason: str
    detail: str
    skill: str
    at: str
    task: str | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CredentialsMissing(Recorded):
    """A creation refused: the credentials the contract requires are not configured (R15)."""

    TYPE: ClassVar[str] = CREDENTIALS_MISSING
    reason: str
    detail: str
    skill: str
    at: str
    task: str | None = _optional()


# Task stream.


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TaskSubmitted(TaskRecorded):
    """The task's first event, before its message is sent: the card in force frozen into it."""

    TYPE: ClassVar[str] = TASK_SUBMITTED
    task: str
    agent: str
    agent_url: str
    card_url: str
    skill: str
    message_id: str
    context_id: str
    # Before parts were recorded, the message was one text part: its text and media type.
    text: str | None = _optional()
    media_type: str | None = _optional()
    card_revision: str
    card_version: str | None
    contract_hash: str
    skill_hash: str | None
    endpoint: Mapping[str, Any]
    submitted_at: str
    extended: bool | None = _optional()
    public_revision: str | None = _optional()
    public_contract_hash: str | None = _optional()
    extended_unread: str | None = _optional()
    authorization: Mapping[str, Any] | None = _optional()
    extensions: Sequence[str] | None = _optional()
    # The message sent (core.messages.submitted_message reads it back, whichever was written):
    # its parts, the caller's metadata, the remote ids it references and the local tasks they
    # are, the output modes accepted, and the task whose context it continues.
    parts: Sequence[Mapping[str, Any]] | None = _optional()
    metadata: Mapping[str, Any] | None = _optional()
    references: Sequence[str] | None = _optional()
    referenced_tasks: Sequence[str] | None = _optional()
    accepted_output_modes: Sequence[str] | None = _optional()
    context_task: str | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StateChanged(TaskRecorded):
    """A transition the remote reported (R1, R12)."""

    TYPE: ClassVar[str] = STATE_CHANGED
    from_: str = _named("from")
    to: str
    source: str
    remote_timestamp: str | None
    reported_timestamp: str | None = _optional()
    clock_skew: bool | None = _optional()
    generation: int | None = _optional()
    reported_generation: int | None = _optional()
    generation_skew: bool | None = _optional()
    remote_task_id: str | None = _optional()
    remote_context_id: str | Absent | None = field(default=ABSENT, metadata=_OR_NULL)
    said: str | None = _optional()
    message: str | Absent | None = field(default=ABSENT, metadata=_OR_NULL)
    message_parts: Sequence[Mapping[str, Any]] | None = _optional()
    message_bytes: int | None = _optional()
    message_sha256: str | None = _optional()
    payload_truncated: bool | None = _optional()
    report: str | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ObservationIgnored(TaskRecorded):
    """A report that changed no state, and why (R10, R12)."""

    TYPE: ClassVar[str] = OBSERVATION_IGNORED
    reason: str
    state: str | None
    source: str
    remote_timestamp: str | None
    reported_timestamp: str | None = _optional()
    clock_skew: bool | None = _optional()
    generation: int | None = _optional()
    reported_generation: int | None = _optional()
    generation_skew: bool | None = _optional()
    remote_task_id: str | None = _optional()
    remote_context_id: str | Absent | None = field(default=ABSENT, metadata=_OR_NULL)
    said: str | None = _optional()
    report: str | None = _optional()
    repeat: bool | None = _optional()
    asked: str | None = _optional()
    answered: str | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ArtifactReceived(TaskRecorded):
    """An artifact new or changed, or a chunk of one (R12, R16)."""

    TYPE: ClassVar[str] = ARTIFACT_RECEIVED
    artifact_id: str
    name: str | None
    name_sha256: str | None = _optional()  # R17: the name of an artifact kept as its digest
    parts: Sequence[Mapping[str, Any]] | None = _optional()
    bytes: int | None = _optional()
    sha256: str | None = _optional()
    truncated: bool | None = _optional()
    append: bool | None = _optional()
    partial: bool | None = _optional()
    chunks: int | None = _optional()
    source: str
    replaces: bool | None = _optional()
    dropped: Sequence[Mapping[str, Any]] | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class WebhookRegistered(TaskRecorded):
    """A push config registered after a fresh read said push (R4)."""

    TYPE: ClassVar[str] = WEBHOOK_REGISTERED
    config_id: str
    url: str
    token_sha256: str
    auth_sha256: str | None
    status: str
    card_revision: str | None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class WebhookConfirmed(TaskRecorded):
    """The first valid push delivery while the webhook was provisional (R5)."""

    TYPE: ClassVar[str] = WEBHOOK_CONFIRMED
    config_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DeliveryDowngraded(TaskRecorded):
    """Push is off for the task; it continues by polling (R4, R6, R7)."""

    TYPE: ClassVar[str] = DELIVERY_DOWNGRADED
    reason: str
    detail: str
    card_revision: str | None
    to: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DiscoveryUnavailable(TaskRecorded):
    """A card read failed while the task was live: an annotation (R8)."""

    TYPE: ClassVar[str] = DISCOVERY_UNAVAILABLE
    kind: str
    detail: str
    url: str
    during: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CardRevisionChanged(TaskRecorded):
    """The card revision the task last saw was replaced (R7, R9)."""

    TYPE: ClassVar[str] = CARD_REVISION_CHANGED
    old: str | None
    new: str
    changes: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FlaggedForReview(TaskRecorded):
    """Something a person should look at; the task is not acted on (R7, R11, R12)."""

    TYPE: ClassVar[str] = FLAGGED_FOR_REVIEW
    reason: str
    detail: str
    revision: str | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ContractDiverged(TaskRecorded):
    """A card read after the send implies another contract than the task's (R3)."""

    TYPE: ClassVar[str] = CONTRACT_DIVERGED
    frozen: str | None
    observed: str
    revision: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TaskOrphaned(TaskRecorded):
    """At resume, the card no longer carries the task's skill compatibly (R9)."""

    TYPE: ClassVar[str] = TASK_ORPHANED
    reason: str
    skill: str
    revision: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EndpointMoved(TaskRecorded):
    """At resume, the task follows its skill to another interface (R9)."""

    TYPE: ClassVar[str] = ENDPOINT_MOVED
    old: Mapping[str, Any]
    new: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EndpointUnreachable(TaskRecorded):
    """A request to the task's endpoint got no usable answer (R11)."""

    TYPE: ClassVar[str] = ENDPOINT_UNREACHABLE
    url: str
    detail: str
    during: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AuthorizationFailed(TaskRecorded):
    """A request of the task refused with 401/403, or no token to be had (R15)."""

    TYPE: ClassVar[str] = AUTHORIZATION_FAILED
    url: str
    status: int | None
    schemes: Sequence[str]
    detail: str
    during: str
    at: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Throttled(TaskRecorded):
    """The agent asked for time (R5); once per task."""

    TYPE: ClassVar[str] = THROTTLED
    url: str
    status: int | None
    asked: float | None
    wait: float | None
    during: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CredentialsMoved(TaskRecorded):
    """The caller accepted the origin the task's endpoint moved to (R15)."""

    TYPE: ClassVar[str] = CREDENTIALS_MOVED
    old: str | None
    new: str
    revision: str
    at: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CancelRequested(TaskRecorded):
    """The caller asked to cancel; the request is about to be sent (R10)."""

    TYPE: ClassVar[str] = CANCEL_REQUESTED
    at: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CancelRefused(TaskRecorded):
    """The remote refused the cancel with an A2A error."""

    TYPE: ClassVar[str] = CANCEL_REFUSED
    code: int | str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ReplySent(TaskRecorded):
    """An answer to an interrupted task, recorded before it is sent: the characters of its
    text parts and (recorded since messages carry any parts) its parts, outlined, their content
    and the message's metadata out of line (R17)."""

    TYPE: ClassVar[str] = REPLY_SENT
    message_id: str
    chars: int
    parts: Sequence[Mapping[str, Any]] | None = _optional()
    metadata: Mapping[str, Any] | None = _optional()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DeadlineExceeded(TaskRecorded):
    """The deadline passed before the task reached the point asked for (R10)."""

    TYPE: ClassVar[str] = DEADLINE_EXCEEDED
    state: str
    seconds: float
    until: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CreationRefusedRemotely(TaskRecorded):
    """``TaskCreationRefused`` on the task stream: the agent refused the creation with an A2A
    error; final (R3)."""

    TYPE: ClassVar[str] = TASK_CREATION_REFUSED
    reason: str
    code: int | str
    message: str
    url: str


AgentEvent = (
    CardFetched
    | DiscoveryFailed
    | ContractPinned
    | ContractAccepted
    | TaskCreationRefused
    | CredentialsMissing
)
"""An event the engine appends to an agent stream."""
TaskEvent = (
    TaskSubmitted
    | StateChanged
    | ObservationIgnored
    | ArtifactReceived
    | WebhookRegistered
    | WebhookConfirmed
    | DeliveryDowngraded
    | DiscoveryUnavailable
    | CardRevisionChanged
    | FlaggedForReview
    | ContractDiverged
    | TaskOrphaned
    | EndpointMoved
    | EndpointUnreachable
    | AuthorizationFailed
    | Throttled
    | CredentialsMoved
    | CancelRequested
    | CancelRefused
    | ReplySent
    | DeadlineExceeded
    | CreationRefusedRemotely
)
"""An event the engine appends to a task stream."""
Event = AgentEvent | TaskEvent | UnknownEvent
"""Any event, of either stream, as written or read (a type not known included)."""

AGENT_CLASSES: Final[Mapping[str, type[Recorded]]] = {
    cls.TYPE: cls
    for cls in (
        CardFetched,
        DiscoveryFailed,
        ContractPinned,
        ContractAccepted,
        TaskCreationRefused,
        CredentialsMissing,
    )
}
"""The class of each agent-stream type."""

TASK_CLASSES: Final[Mapping[str, type[TaskRecorded]]] = {
    cls.TYPE: cls
    for cls in (
        TaskSubmitted,
        StateChanged,
        ObservationIgnored,
        ArtifactReceived,
        WebhookRegistered,
        WebhookConfirmed,
        DeliveryDowngraded,
        DiscoveryUnavailable,
        CardRevisionChanged,
        FlaggedForReview,
        ContractDiverged,
        TaskOrphaned,
        EndpointMoved,
        EndpointUnreachable,
        AuthorizationFailed,
        Throttled,
        CredentialsMoved,
        CancelRequested,
        CancelRefused,
        ReplySent,
        DeadlineExceeded,
        CreationRefusedRemotely,
    )
}
"""The class of each task-stream type."""


def agent_event(type_: str, data: Mapping[str, Any]) -> AgentEvent | UnknownEvent:
    """An agent-stream event read from its type and payload (:class:`UnknownEvent` for a type
    this cardfence does not know)."""
    cls = AGENT_CLASSES.get(type_)
    if cls is None:
        return UnknownEvent(type_, data)
    return cls.from_payload(data)  # type: ignore[return-value]


def task_event(type_: str, data: Mapping[str, Any]) -> TaskEvent | UnknownEvent:
    """A task-stream event read from its type and payload (:class:`UnknownEvent` for a type
    this cardfence does not know)."""
    cls = TASK_CLASSES.get(type_)
    if cls is None:
        return UnknownEvent(type_, data)
    return cls.from_payload(data)  # type: ignore[return-value]


def stream_event(stream_id: str, type_: str, data: Mapping[str, Any]) -> Event:
    """An event of the stream ``stream_id`` read from its type and payload; one of a stream
    that is neither an agent's nor a task's is an :class:`UnknownEvent`."""
    if stream_id.startswith(AGENT_STREAM_PREFIX):
        return agent_event(type_, data)
    if stream_id.startswith(TASK_STREAM_PREFIX):
        return task_event(type_, data)
    return UnknownEvent(type_, data)
