"""What a remote agent sends, read into typed immutable values. Pure: no I/O.

The values and the task states are :mod:`engine.core.answers`; what is here is the reading.

Every report a remote makes about a task — a SendMessage, GetTask or CancelTask answer, a ListTasks
page, a push delivery, a stream event — is read here, whatever its source (R12: observations are
applied the same way). The input is untrusted JSON, decoded as I-JSON by
:func:`engine.cards.canonical.loads` (R16); each parser returns a value or raises
:class:`InvalidAgentResponseError` naming the field (``task.status.state: must be a string, not a
list``), never another exception, for any input. Linear time; nothing recurses on the input.

Shapes accepted (docs/wire.md):

- A2A 1.0 proto JSON as a2a-sdk 1.3 speaks it: ``TASK_STATE_*`` / ``ROLE_*`` enum names (and their
  numbers), a ``SendMessageResponse`` (``{"task"}`` | ``{"message"}``), a ``StreamResponse``
  (exactly one of ``task``, ``statusUpdate``, ``artifactUpdate``, ``message``), parts as
  ``{"text"}`` | ``{"raw"}`` | ``{"url"}`` | ``{"data"}``.
- A2A 0.3: lower-case states (``input-required``…), ``user``/``agent`` roles, a bare ``Task`` or
  ``Message`` marked ``"kind": "task"`` / ``"message"`` (0.3 SendMessage results and push bodies),
  ``"kind": "status-update"`` / ``"artifact-update"`` events, and ``file`` parts
  (``{"file": {"uri" | "bytes", "mimeType"}}``).

Required: the ids the engine keys on (``Task.id``, ``messageId``, ``artifactId``, an update's
``taskId``) and ``Task.status``. Everything else may be absent: proto JSON omits fields at their
default, and ListTasks prints them as ``""`` / ``[]``, so empty means absent. A wrong JSON type is
always refused. An unknown state reads as ``unknown`` (it changes nothing downstream); unknown
fields are ignored; ``metadata`` is not read, nor of a task's ``history`` anything but the
``messageId`` of its first :data:`HISTORY_IDS_KEPT` messages (R3: a task found by ``ListTasks`` is
ours only if the creation's is among them); an entry without a string one is passed over.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final, TypeVar

from cardfence.engine.cards import fields
from cardfence.engine.core.answers import (
    Artifact,
    Part,
    PushConfig,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    StreamUpdate,
    normalise_state,
)
from cardfence.engine.errors import InvalidAgentResponseError

__all__ = [
    "parse_push_config",
    "parse_send_response",
    "parse_stream_response",
    "parse_task",
    "parse_task_page",
    "parse_timestamp",
]


_ROLES: Final = {"user": "user", "agent": "agent", "1": "user", "2": "agent"}
_CONTENT_KEYS: Final = ("text", "raw", "url", "data")
_STREAM_KEYS: Final = ("task", "statusUpdate", "artifactUpdate", "message")
_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_GENERATION: Final = re.compile(r"[0-9]{1,19}")
# The messageIds of a task's history kept, the oldest first: the creation's is the first an agent
# records, and ListTasks is asked for no more than these (engine.creation).
HISTORY_IDS_KEPT: Final = 50


# --- public parsers ------------------------------------------------------------------------------

_T = TypeVar("_T")


def _read(build: Callable[[object, str], _T], obj: object, url: str) -> _T:
    try:
        return build(obj, "")
    except fields.FieldError as bad:
        raise InvalidAgentResponseError(url, f"{bad.path or 'body'}: {bad.detail}") from None


def parse_task(obj: object, *, url: str = "") -> RemoteTask:
    """A bare Task (GetTask, CancelTask results; a 0.3 SendMessage result marked ``kind``)."""
    return _read(_task, obj, url)


def parse_send_response(obj: object, *, url: str = "") -> RemoteTask | RemoteMessage:
    """A SendMessageResponse: ``{"task": …}`` or ``{"message": …}`` (0.3: the bare object)."""
    return _read(_send_response, obj, url)


def parse_stream_response(obj: object, *, url: str = "") -> StreamUpdate:
    """A StreamResponse: a push delivery body or one stream event (0.3 ``kind`` shapes too)."""
    return _read(_stream, obj, url)


def parse_task_page(obj: object, *, url: str = "") -> tuple[tuple[RemoteTask, ...], str | None]:
    """A ListTasksResponse: its tasks and the next page token (``None`` on the last page)."""
    return _read(_task_page, obj, url)


def parse_push_config(obj: object, *, url: str = "") -> PushConfig:
    """A TaskPushNotificationConfig as the agent stored and echoed it."""
    return _read(_push_config, obj, url)


def parse_timestamp(value: object, *, url: str = "") -> datetime:
    """An RFC 3339 timestamp as aware UTC; any number of fractional digits (cut to µs)."""
    return _read(lambda stamp, _: _timestamp(stamp, "timestamp"), value, url)


# --- building ------------------------------------------------------------------------------------


def _send_response(obj: object, path: str) -> RemoteTask | RemoteMessage:
    doc = fields.as_object(obj, path)
    if "task" not in doc and "message" not in doc and "kind" in doc:
        kind = _opt_str(doc, "kind", path)
        if kind in ("task", "message"):
            return _task(doc, path) if kind == "task" else _remote_message(doc, path)
    if _one_of(doc, ("task", "message"), path) == "task":
        return _task(doc["task"], fields.join(path, "task"))
    return _remote_message(doc["message"], fields.join(path, "message"))


def _task_page(obj: object, path: str) -> tuple[tuple[RemoteTask, ...], str | None]:
    doc = fields.as_object(obj, path)
    tasks = tuple(_task(item, at) for item, at in fields.items(doc, "tasks", path))
    return tasks, _opt_str(doc, "nextPageToken", path)


def _push_config(obj: object, path: str) -> PushConfig:
    doc = fields.as_object(obj, path)
    auth = fields.optional_object(doc, "authentication", path)
    at = fields.join(path, "authentication")
    return PushConfig(
        id=_req_id(doc, "id", path),
        url=_req_str(doc, "url", path),
        token=_opt_str(doc, "token", path),
        auth_scheme=_opt_str(auth, "scheme", at),
        auth_credentials=_opt_str(auth, "credentials", at),
    )


def _task(obj: object, path: str) -> RemoteTask:
    doc = fields.as_object(obj, path)
    task_id = _req_id(doc, "id", path)
    status_at = fields.join(path, "status")
    status = fields.as_object(doc.get("status"), status_at, required=True)
    state, timestamp, message = _status(status, status_at)
    return RemoteTask(
        id=task_id,
        context_id=_opt_id(doc, "contextId", path),
        state=state,
        timestamp=timestamp,
        generation=_first_generation(doc, path, status, status_at),
        message=message,
        artifacts=tuple(_artifact(item, at) for item, at in fields.items(doc, "artifacts", path)),
        history_ids=_history_ids(doc, path),
    )


def _history_ids(doc: dict[str, Any], path: str) -> tuple[str, ...]:
    """The ``messageId`` of the first :data:`HISTORY_IDS_KEPT` messages of ``history`` (a list,
    else refused). Leniently: the history never decided a task's state, so an entry that is not
    an object with a string ``messageId`` is passed over, not refused; nothing else is read."""
    found: list[str] = []
    for item, _ in fields.items(doc, "history", path)[:HISTORY_IDS_KEPT]:
        message_id = item.get("messageId") if isinstance(item, dict) else None
        if isinstance(message_id, str) and message_id:
            found.append(message_id)
    return tuple(found)


def _status(status: dict[str, Any], path: str) -> tuple[str, datetime | None, StatusMessage | None]:
    """``state``, ``timestamp`` and ``message`` of a TaskStatus (1.0 and 0.3 alike)."""
    state = status.get("state")
    if state is not None and (isinstance(state, bool) or not isinstance(state, str | int)):
        # An unknown *value* reads as "unknown"; a wrong *type* is a broken body.
        raise fields.FieldError(
            fields.join(path, "state"), f"must be a string, not {fields.kind(state)}"
        )
    stamp = status.get("timestamp")
    message = status.get("message")
    return (
        normalise_state(state),
        None if stamp in (None, "") else _timestamp(stamp, fields.join(path, "timestamp")),
        None if message is None else _status_message(message, fields.join(path, "message")),
    )


def _first_generation(
    doc: dict[str, Any], path: str, status: dict[str, Any], at: str
) -> int | None:
    """The 1.1 draft ``generation``: on the task (or update), else on its status."""
    found = _generation(doc, path)
    return found if found is not None else _generation(status, at)


def _generation(doc: dict[str, Any], path: str) -> int | None:
    value = doc.get("generation")
    if value is None:
        return None
    # Proto JSON writes 64-bit integers as strings.
    if isinstance(value, str) and _GENERATION.fullmatch(value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise fields.FieldError(fields.join(path, "generation"), "must be a non-negative integer")


def _status_message(obj: object, path: str) -> StatusMessage:
    message = _remote_message(obj, path)  # the same Message, read for the fields a status needs
    return StatusMessage(message.message_id, message.role, message.parts, message.text)


def _remote_message(obj: object, path: str) -> RemoteMessage:
    doc = fields.as_object(obj, path)
    parts = _parts(doc, path)
    return RemoteMessage(
        message_id=_req_str(doc, "messageId", path),
        context_id=_opt_id(doc, "contextId", path),
        task_id=_opt_id(doc, "taskId", path),
        role=_role(doc, path),
        parts=parts,
        text=_text(parts),
    )


def _role(doc: dict[str, Any], path: str) -> str:
    value = doc.get("role")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    elif value is not None and not isinstance(value, str):
        raise fields.FieldError(
            fields.join(path, "role"), f"must be a string, not {fields.kind(value)}"
        )
    name = (value or "").lower().removeprefix("role_")
    return _ROLES.get(name, "unknown")


def _text(parts: tuple[Part, ...]) -> str:
    return "\n".join(p.text for p in parts if p.kind == "text" and p.text is not None)


def _artifact(obj: object, path: str) -> Artifact:
    doc = fields.as_object(obj, path)
    return Artifact(
        artifact_id=_req_str(doc, "artifactId", path),
        name=_opt_str(doc, "name", path),
        parts=_parts(doc, path),
        description=_opt_str(doc, "description", path),
    )


def _parts(doc: dict[str, Any], path: str) -> tuple[Part, ...]:
    return tuple(_part(item, at) for item, at in fields.items(doc, "parts", path))


def _part(obj: object, path: str) -> Part:
    doc = fields.as_object(obj, path)
    if "file" in doc and not any(k in doc for k in _CONTENT_KEYS):
        return _file_part_v03(doc, path)
    # Proto JSON: "data" is a google.protobuf.Value, so "data": null is set; the others are not.
    present = [k for k in _CONTENT_KEYS if (k == "data" and k in doc) or doc.get(k) is not None]
    if len(present) != 1:
        got = ", ".join(present) or "none"
        raise fields.FieldError(
            path, f"exactly one of text, raw, url, data is required (got {got})"
        )
    # 1.0 "mediaType"; 0.3 had "metadata.mimeType" only on files, handled above.
    media_type = _opt_str(doc, "mediaType", path)
    filename = _opt_str(doc, "filename", path)
    key = present[0]
    if key == "data":
        return Part("data", data=doc["data"], media_type=media_type, filename=filename)
    value = _req_str(doc, key, path, allow_empty=key == "text")
    if key == "text":
        return Part("text", text=value, media_type=media_type, filename=filename)
    if key == "url":
        return Part("url", url=value, media_type=media_type, filename=filename)
    return Part("raw", data=value, media_type=media_type, filename=filename)


def _file_part_v03(doc: dict[str, Any], path: str) -> Part:
    at = fields.join(path, "file")
    file = fields.as_object(doc["file"], at)
    media_type = _opt_str(file, "mimeType", at)
    filename = _opt_str(file, "name", at)
    if file.get("uri") is not None:
        return Part("url", url=_req_str(file, "uri", at), media_type=media_type, filename=filename)
    return Part("raw", data=_req_str(file, "bytes", at), media_type=media_type, filename=filename)


def _stream(obj: object, path: str) -> StreamUpdate:
    doc = fields.as_object(obj, path)
    if not any(k in doc for k in _STREAM_KEYS) and "kind" in doc:  # 0.3: the bare event, marked
        kind = _opt_str(doc, "kind", path) or ""
        if kind not in _V03_STREAM_KINDS:
            raise fields.FieldError(
                fields.join(path, "kind"), f"unknown 0.3 event kind {kind[:40]!r}"
            )
        return _STREAM_READERS[_V03_STREAM_KINDS[kind]](doc, path)
    key = _one_of(doc, _STREAM_KEYS, path)
    return _STREAM_READERS[key](doc[key], fields.join(path, key))


def _task_update(obj: object, path: str) -> StreamUpdate:
    task = _task(obj, path)
    return StreamUpdate(
        kind="task",
        task_id=task.id,
        context_id=task.context_id,
        state=task.state,
        timestamp=task.timestamp,
        generation=task.generation,
        message=task.message,
        task=task,
    )


def _message_update(obj: object, path: str) -> StreamUpdate:
    message = _remote_message(obj, path)
    status = StatusMessage(message.message_id, message.role, message.parts, message.text)
    return StreamUpdate("message", message.task_id, message.context_id, message=status)


def _status_update(obj: object, path: str) -> StreamUpdate:
    doc = fields.as_object(obj, path)
    task_id = _req_id(doc, "taskId", path)
    at = fields.join(path, "status")
    status = fields.as_object(doc.get("status"), at, required=True)
    state, timestamp, message = _status(status, at)
    return StreamUpdate(
        kind="status",
        task_id=task_id,
        context_id=_opt_id(doc, "contextId", path),
        state=state,
        timestamp=timestamp,
        generation=_first_generation(doc, path, status, at),
        message=message,
    )


def _artifact_update(obj: object, path: str) -> StreamUpdate:
    doc = fields.as_object(obj, path)
    at = fields.join(path, "artifact")
    return StreamUpdate(
        kind="artifact",
        task_id=_req_id(doc, "taskId", path),
        context_id=_opt_id(doc, "contextId", path),
        generation=_generation(doc, path),
        artifact=_artifact(fields.as_object(doc.get("artifact"), at, required=True), at),
        append=_opt_bool(doc, "append", path),
    )


_STREAM_READERS: Final[dict[str, Callable[[object, str], StreamUpdate]]] = {
    "task": _task_update,
    "message": _message_update,
    "statusUpdate": _status_update,
    "artifactUpdate": _artifact_update,
}
_V03_STREAM_KINDS: Final = {
    "task": "task",
    "message": "message",
    "status-update": "statusUpdate",
    "artifact-update": "artifactUpdate",
}


def _timestamp(value: object, path: str) -> datetime:
    if not isinstance(value, str):
        raise fields.FieldError(path, f"must be an RFC 3339 string, not {fields.kind(value)}")
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise fields.FieldError(path, f"not an RFC 3339 timestamp: {value[:40]!r}")
    *parts, fraction, zulu, sign, off_h, off_m = match.groups()
    year, month, day, hour, minute, second = map(int, parts)
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    if second == 60:  # RFC 3339 allows a leap second; datetime does not
        second, micros = 59, 999_999
    try:
        offset = timedelta(0) if zulu else timedelta(hours=int(off_h), minutes=int(off_m))
        zone = timezone(-offset if sign == "-" else offset)
        return datetime(year, month, day, hour, minute, second, micros, zone).astimezone(UTC)
    except (ValueError, OverflowError):
        raise fields.FieldError(path, f"not a valid date and time: {value[:40]!r}") from None


# --- typed field access: every failure names its dotted path ------------------------------------


def _opt_str(doc: dict[str, Any], key: str, path: str) -> str | None:
    """A string field; absent, null and "" all read as ``None`` (ListTasks prints defaults)."""
    value = doc.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise fields.FieldError(
            fields.join(path, key), f"must be a string, not {fields.kind(value)}"
        )
    return value


def _opt_bool(doc: dict[str, Any], key: str, path: str) -> bool:
    """A boolean field; absent and null read as ``False``."""
    value = doc.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise fields.FieldError(
            fields.join(path, key), f"must be a boolean, not {fields.kind(value)}"
        )
    return value


MAX_ID_CHARS: Final = 256


def _req_id(doc: dict[str, Any], key: str, path: str) -> str:
    found = _opt_id(doc, key, path)
    if found is None:
        raise fields.FieldError(fields.join(path, key), "required: a non-empty string")
    return found


def _opt_id(doc: dict[str, Any], key: str, path: str) -> str | None:
    """An identifier we store and look up by: printable text of bounded length (a NUL or a lone
    surrogate cannot be stored in PostgreSQL text nor encoded for a query)."""
    value = _opt_str(doc, key, path)
    if value is None:
        return None
    if len(value) > MAX_ID_CHARS:
        raise fields.FieldError(fields.join(path, key), f"longer than {MAX_ID_CHARS} characters")
    if "\x00" in value or not value.isprintable() or not _is_utf8(value):
        raise fields.FieldError(fields.join(path, key), "must be printable text")
    return value


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _req_str(doc: dict[str, Any], key: str, path: str, *, allow_empty: bool = False) -> str:
    value = doc.get(key)
    if allow_empty and value == "":
        return ""
    found = _opt_str(doc, key, path)
    if found is None:
        raise fields.FieldError(fields.join(path, key), "required: a non-empty string")
    return found


def _one_of(doc: dict[str, Any], keys: tuple[str, ...], path: str) -> str:
    present = [k for k in keys if doc.get(k) is not None]
    if len(present) != 1:
        got = ", ".join(present) or "none"
        raise fields.FieldError(path, f"exactly one of {', '.join(keys)} is required (got {got})")
    return present[0]
