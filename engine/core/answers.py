"""What an agent's answers say, as typed immutable values. Pure: no I/O.

Every report a remote makes about a task is read (by :mod:`engine.wire.v10`, whose public names
include these) into one of the values here, whatever its source, so the engine applies them the
same way (R12): a task snapshot (:class:`RemoteTask`), a bare message (:class:`RemoteMessage`), a
stream event or push delivery (:class:`StreamUpdate`), and what they carry (:class:`Part`,
:class:`Artifact`, :class:`StatusMessage`); and a push-notification config (:class:`PushConfig`),
which the engine also sends.

Task states have our names (:class:`TaskState`: the lower-case 0.3 spelling), sorted into
terminal, interrupted and active; :func:`normalise_state` reads any 1.0 or 0.3 spelling into them,
never failing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

__all__ = [
    "ACTIVE_STATES",
    "INTERRUPTED_STATES",
    "MAX_ANSWER_BYTES",
    "TERMINAL_STATES",
    "Artifact",
    "Part",
    "PushConfig",
    "RemoteMessage",
    "RemoteTask",
    "StatusMessage",
    "StreamUpdate",
    "TaskState",
    "normalise_state",
]


MAX_ANSWER_BYTES: Final = 8 * 1024 * 1024
"""The longest answer the transport reads (R16): the wire's default bound, and what the
observation path keeps of an artifact or a status message whole (content out of line, R17)."""


class TaskState(enum.StrEnum):
    """Our names for A2A task states, the lower-case 0.3 spelling: each is the string it names
    (``TaskState.WORKING == "working"``), so a state read from the store compares as it is."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    AUTH_REQUIRED = "auth-required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REJECTED = "rejected"
    UNKNOWN = "unknown"


TERMINAL_STATES: Final = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED}
)
INTERRUPTED_STATES: Final = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})
# Live: every known non-terminal state, the interrupted ones included.
ACTIVE_STATES: Final = frozenset({TaskState.SUBMITTED, TaskState.WORKING}) | INTERRUPTED_STATES

_STATES: Final = frozenset(TERMINAL_STATES | ACTIVE_STATES)
# By proto enum number (proto JSON parsers accept numbers in place of names).
_STATE_NUMBERS: Final = (
    TaskState.UNKNOWN,
    TaskState.SUBMITTED,
    TaskState.WORKING,
    TaskState.COMPLETED,
    TaskState.FAILED,
    TaskState.CANCELED,
    TaskState.INPUT_REQUIRED,
    TaskState.REJECTED,
    TaskState.AUTH_REQUIRED,
)


def normalise_state(value: object) -> str:
    """Our name for a 1.0 (``TASK_STATE_INPUT_REQUIRED``, or its enum number) or 0.3
    (``input-required``) state; ``unknown`` for anything else, never an error.

    ``cancelled`` (double L) is read as ``canceled``: neither version spells it so, but an agent
    that does has ended the task all the same.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return _STATE_NUMBERS[value] if 0 <= value < len(_STATE_NUMBERS) else TaskState.UNKNOWN
    if not isinstance(value, str):
        return TaskState.UNKNOWN
    name = value.strip().lower().replace("_", "-").removeprefix("task-state-")
    if name == "cancelled":
        return TaskState.CANCELED
    return name if name in _STATES else TaskState.UNKNOWN


# --- values ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    """One part. ``raw`` content stays base64 text in ``data`` (the engine never needs the bytes);
    ``data`` is the decoded JSON value as received — do not mutate it. ``filename``: the name a
    file part gives its content (1.0 ``filename``, 0.3 ``file.name``)."""

    kind: Literal["text", "data", "url", "raw"]
    text: str | None = None
    data: object = field(default=None, hash=False)
    url: str | None = None
    media_type: str | None = None
    filename: str | None = None


@dataclass(frozen=True, slots=True)
class Artifact:
    artifact_id: str
    name: str | None
    parts: tuple[Part, ...]
    description: str | None = None


@dataclass(frozen=True, slots=True)
class StatusMessage:
    """A message carried in a status (the question of input-required, a failure's diagnostic)."""

    message_id: str
    role: str  # "user", "agent" or "unknown"
    parts: tuple[Part, ...]
    text: str  # the text parts joined with newlines; "" when there are none


@dataclass(frozen=True, slots=True)
class RemoteTask:
    """A Task snapshot. ``timestamp`` is the status timestamp, aware UTC, when the agent sent one;
    ``generation`` is the A2A 1.1 draft counter, when sent (R12 orders on both). ``history_ids``:
    the ``messageId`` of each message of its ``history`` the agent sent, oldest first (R3 tells
    our task by the creation's among them)."""

    id: str
    context_id: str | None
    state: str
    timestamp: datetime | None
    generation: int | None
    message: StatusMessage | None
    artifacts: tuple[Artifact, ...]
    history_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RemoteMessage:
    """A SendMessage answered with a bare Message, no task."""

    message_id: str
    context_id: str | None
    task_id: str | None
    role: str
    parts: tuple[Part, ...]
    text: str


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    """One StreamResponse (push delivery or stream event), flattened.

    ``kind`` "task": everything from the task, which is also in ``task``. "status": state,
    timestamp, generation, message. "artifact": ``artifact`` (artifact updates carry no
    timestamp), and ``append``: its parts extend the artifact of that id sent before (a chunk).
    "message": ``message``, ids from the message. ``size``: the bytes of the stream event it
    was read from (what reading ahead of it holds, :mod:`engine.client._readahead`).
    """

    kind: Literal["task", "status", "artifact", "message"]
    task_id: str | None
    context_id: str | None
    state: str | None = None
    timestamp: datetime | None = None
    generation: int | None = None
    message: StatusMessage | None = None
    artifact: Artifact | None = None
    task: RemoteTask | None = None
    append: bool = False
    size: int = 0  # the bytes of the event it came in (a stream's), 0 when not counted


@dataclass(frozen=True, slots=True)
class PushConfig:
    """A push-notification config; ``id`` is always ours (a2a-sdk would default it to the task id
    and let a second registration overwrite the first). Secrets stay out of ``repr``."""

    id: str
    url: str
    token: str | None = field(default=None, repr=False)
    auth_scheme: str | None = None
    auth_credentials: str | None = field(default=None, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        """What a delivery presents, which no answer may show (:mod:`engine.auth.redaction`)."""
        return tuple(s for s in (self.token, self.auth_credentials) if s)

    def to_json(self) -> dict[str, Any]:
        """The 1.0 ``TaskPushNotificationConfig`` fields, without ``taskId``."""
        body: dict[str, Any] = {"id": self.id, "url": self.url}
        if self.token is not None:
            body["token"] = self.token
        if self.auth_scheme is not None:
            auth = {"scheme": self.auth_scheme}
            if self.auth_credentials is not None:
                auth["credentials"] = self.auth_credentials
            body["authentication"] = auth
        return body
