"""cardfence: a lifecycle engine for A2A v1.0 tasks.

Card state may gate task creation and webhook registration. It never gates task continuation.

The public API: :class:`Engine` (start, follow, reply to, cancel, resume tasks, ingest push
deliveries), :func:`audit` and :func:`replay` (no network), the card model
(:func:`parse_card`), and the one error tree under :class:`CardfenceError`.
"""

from cardfence.engine.audit import AuditReport, Violation, audit, replay
from cardfence.engine.cards.discovery import CardLimits
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.engine import Engine, EngineConfig, WebhookOutcome
from cardfence.engine.errors import (
    AuditViolation,
    CardfenceError,
    CardInvalidError,
    ConcurrencyError,
    ContractChangedError,
    CreationRefusedError,
    CredentialsConfigError,
    CredentialsMissingError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    PayloadError,
    ProtocolMismatchError,
    RemoteRefusedError,
    SchemaTooNewError,
    SkillUnavailableError,
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
    StreamDroppedError,
    TaskEndedError,
    TaskOrphanedError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.tasklog import AsOf
from cardfence.engine.views import TaskView
from cardfence.engine.webhook import Delivery

__version__ = "0.1.0"

__all__ = [
    "AgentCard",
    "AsOf",
    "AuditReport",
    "AuditViolation",
    "CardInvalidError",
    "CardLimits",
    "CardfenceError",
    "ConcurrencyError",
    "ContractChangedError",
    "CreationRefusedError",
    "CredentialsConfigError",
    "CredentialsMissingError",
    "DeadlineExceeded",
    "Delivery",
    "DiscoveryError",
    "EndpointUnreachableError",
    "Engine",
    "EngineConfig",
    "InvalidAgentResponseError",
    "PayloadError",
    "ProtocolMismatchError",
    "RemoteRefusedError",
    "SchemaTooNewError",
    "SkillUnavailableError",
    "SnapshotMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "StreamDroppedError",
    "TaskEndedError",
    "TaskOrphanedError",
    "TaskView",
    "UsageError",
    "Violation",
    "WebhookOutcome",
    "WrongTaskAnswerError",
    "__version__",
    "audit",
    "parse_card",
    "replay",
]
