"""cardfence: a lifecycle engine for A2A v1.0 tasks.

Card state may gate task creation and webhook registration. It never gates task continuation.
"""

from engine.errors import (
    AuditViolation,
    CardfenceError,
    CardInvalidError,
    ConcurrencyError,
    ContractChangedError,
    DeadlineExceeded,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    PayloadError,
    RemoteRefusedError,
    SchemaTooNewError,
    SkillUnavailableError,
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
    TaskEndedError,
    TaskOrphanedError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "AuditViolation",
    "CardInvalidError",
    "CardfenceError",
    "ConcurrencyError",
    "ContractChangedError",
    "DeadlineExceeded",
    "DiscoveryError",
    "EndpointUnreachableError",
    "InvalidAgentResponseError",
    "PayloadError",
    "RemoteRefusedError",
    "SchemaTooNewError",
    "SkillUnavailableError",
    "SnapshotMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "TaskEndedError",
    "TaskOrphanedError",
    "UsageError",
    "__version__",
]
