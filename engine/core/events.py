"""The event catalogue (docs/events.md): every event type cardfence records, by stream.

Names are the ones ``cardfence show`` prints and audits parse; they never change meaning.
"""

from __future__ import annotations

from typing import Final

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
