"""cardfence: a lifecycle engine for A2A v1.0 tasks.

Card state may gate task creation and webhook registration. It never gates task continuation.

The public API: :class:`Engine` (``async with Engine.connect(url)``: start, follow, reply to,
cancel, resume tasks, ingest push deliveries, await a task's updates and states:
:class:`TaskView`, :class:`TaskState`, :class:`TaskUpdate`); inside a host application, the
driver of ``cardfence serve`` (:func:`serving`) and its webhook (:func:`webhook_app`);
the parts a message is made of (:class:`Text`, :class:`File`, :class:`Data`);
:func:`audit`, :func:`rebuild_projections` and :func:`replay` (no network), the card model
(:func:`parse_card`), credentials for agents that require them (:class:`CredentialsConfig` and
the secrets it holds: :class:`ApiKey`, :class:`Bearer`, :class:`Basic`, :class:`OAuthClient`,
:class:`MutualTls`; :func:`load_credentials`), and the one error tree under
:class:`CardfenceError`.
"""

import importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from cardfence.engine.auth.config import (
        ApiKey,
        Basic,
        Bearer,
        CredentialsConfig,
        MutualTls,
        OAuthClient,
        load_credentials,
    )
    from cardfence.engine.cards.model import AgentCard, parse_card
    from cardfence.engine.client.artifacts import TaskArtifact
    from cardfence.engine.client.audit import (
        AuditReport,
        Violation,
        audit,
        rebuild_projections,
        replay,
    )
    from cardfence.engine.client.config import EngineConfig
    from cardfence.engine.client.creation import WebhookOutcome
    from cardfence.engine.client.engine import Engine
    from cardfence.engine.client.tasklog import AsOf
    from cardfence.engine.client.updates import TaskUpdate
    from cardfence.engine.core.answers import TaskState
    from cardfence.engine.core.parts import Data, File, Text
    from cardfence.engine.core.views import TaskView
    from cardfence.engine.discovery.fetch import CardLimits
    from cardfence.engine.errors import (
        AuditViolation,
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
        ExtensionRequiredError,
        FetchRefusedError,
        InvalidAgentResponseError,
        MessageTooLargeError,
        OperationUnsupportedError,
        ProtocolMismatchError,
        ProtocolUnsupportedError,
        RemoteRefusedError,
        SkillUnavailableError,
        StreamDroppedError,
        TaskEndedError,
        TaskOrphanedError,
        TokenRequestError,
        UsageError,
        WrongTaskAnswerError,
    )
    from cardfence.engine.serve.host import serving
    from cardfence.engine.serve.ingress import webhook_app
    from cardfence.engine.wire.push import Delivery
    from cardfence.store.errors import (
        CardfenceError,
        ConcurrencyError,
        ContentMismatchError,
        CorruptRecordError,
        LeaseLostError,
        PayloadError,
        SchemaTooNewError,
        SnapshotMismatchError,
        StoreError,
        StoreUnavailableError,
    )

__version__ = "0.2.0"

__all__ = [
    "AgentCard",
    "ApiKey",
    "AsOf",
    "AuditReport",
    "AuditViolation",
    "AuthorizationFailedError",
    "Basic",
    "Bearer",
    "CardInvalidError",
    "CardLimits",
    "CardSignatureError",
    "CardfenceError",
    "ConcurrencyError",
    "ContentMismatchError",
    "ContractChangedError",
    "CorruptRecordError",
    "CreationRefusedError",
    "CredentialsConfig",
    "CredentialsConfigError",
    "CredentialsMissingError",
    "Data",
    "DeadlineExceeded",
    "Delivery",
    "DiscoveryError",
    "EndpointUnreachableError",
    "Engine",
    "EngineConfig",
    "ExtensionRequiredError",
    "FetchRefusedError",
    "File",
    "InvalidAgentResponseError",
    "LeaseLostError",
    "MessageTooLargeError",
    "MutualTls",
    "OAuthClient",
    "OperationUnsupportedError",
    "PayloadError",
    "ProtocolMismatchError",
    "ProtocolUnsupportedError",
    "RemoteRefusedError",
    "SchemaTooNewError",
    "SkillUnavailableError",
    "SnapshotMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "StreamDroppedError",
    "TaskArtifact",
    "TaskEndedError",
    "TaskOrphanedError",
    "TaskState",
    "TaskUpdate",
    "TaskView",
    "Text",
    "TokenRequestError",
    "UsageError",
    "Violation",
    "WebhookOutcome",
    "WrongTaskAnswerError",
    "__version__",
    "audit",
    "load_credentials",
    "parse_card",
    "rebuild_projections",
    "replay",
    "serving",
    "webhook_app",
]

# Where each public name lives, imported on first use (PEP 562): importing cardfence is cheap,
# so the console script and ``python -m cardfence`` set their signal handlers before the engine
# loads (docs/cli.md, exit 130), and a host application loads only what it uses. The names not
# listed here are the rest of the error tree's (engine/errors.py).
_HOMES = {
    "cardfence.engine.client.audit": (
        "AuditReport", "Violation", "audit", "rebuild_projections", "replay",
    ),
    "cardfence.engine.discovery.fetch": ("CardLimits",),
    "cardfence.engine.cards.model": ("AgentCard", "parse_card"),
    "cardfence.engine.auth.config": (
        "ApiKey", "Basic", "Bearer", "CredentialsConfig", "MutualTls", "OAuthClient",
        "load_credentials",
    ),
    "cardfence.engine.client.creation": ("WebhookOutcome",),
    "cardfence.engine.client.config": ("EngineConfig",),
    "cardfence.engine.client.artifacts": ("TaskArtifact",),
    "cardfence.engine.client.engine": ("Engine",),
    "cardfence.engine.client.tasklog": ("AsOf",),
    "cardfence.engine.client.updates": ("TaskUpdate",),
    "cardfence.engine.core.answers": ("TaskState",),
    "cardfence.engine.core.parts": ("Data", "File", "Text"),
    "cardfence.engine.core.views": ("TaskView",),
    "cardfence.engine.serve.host": ("serving",),
    "cardfence.engine.serve.ingress": ("webhook_app",),
    "cardfence.engine.wire.push": ("Delivery",),
    "cardfence.store.errors": (
        "CardfenceError", "ConcurrencyError", "CorruptRecordError", "LeaseLostError",
        "PayloadError", "SchemaTooNewError", "SnapshotMismatchError", "ContentMismatchError",
        "StoreError",
        "StoreUnavailableError",
    ),
}  # fmt: skip
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> _typing.Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF.get(name, "cardfence.engine.errors")), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
