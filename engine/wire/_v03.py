"""A2A 0.3 on the wire: the requests :class:`~cardfence.engine.wire.transport.A2ATransport` sends
to an
interface that speaks 0.3 (or 0.2, which has the same methods and shapes), and the answers brought
to the 1.0 shapes :mod:`engine.wire.v10` reads. Pure: no I/O. docs/wire.md ("A2A 0.3") shows the
bodies as a2a-sdk 0.3 exchanges them.

The transport builds each request as for 1.0 and hands it here (:func:`request`); what comes back
is handed here too (:func:`answer`), so the 1.0 path reads alone and the two versions differ in
this module only. The 0.3 bindings are two different dialects:

- JSON-RPC: the 0.3 JSON schema. Methods ``message/send``, ``tasks/get``, … (:data:`METHODS`);
  objects tagged with ``kind`` (``task``, ``message``, ``status-update``, ``artifact-update``),
  lower-case states (``input-required``), roles ``user`` / ``agent``, parts
  ``{"kind": "text", "text"}`` | ``{"kind": "file", "file": {"uri" | "bytes", "mimeType"}}`` |
  ``{"kind": "data", "data": {…}}``; a push config is ``{"taskId", "pushNotificationConfig"}``.
- HTTP+JSON: the protobuf JSON of the 0.3 ``a2a.proto``. Paths under ``/v1``; ``TASK_STATE_*`` /
  ``ROLE_*`` names (``TASK_STATE_CANCELLED``, two Ls); a message's parts in ``content``; parts
  ``{"text"}`` | ``{"file": {"fileWithUri" | "fileWithBytes", "mimeType"}}`` |
  ``{"data": {"data": {…}}}``; a push config is ``{"name", "pushNotificationConfig"}``; no
  status timestamps; errors are ``{"message": …}`` under an HTTP status, with no code
  (:func:`rest_error`).

Neither has ``ListTasks`` (the transport refuses it before sending) nor an ``A2A-Version``
header. A message's parts keep their kind: a file by bytes or by URL (with its name and type), a
data part; a text part is chosen by its media type as the bare words of 0.3 cards name them
(:func:`cardfence.engine.cards.spoken.part_kind`): ``text/*`` a text part, a JSON type a data
part (when the text is a JSON object), any other a file part carrying the text's UTF-8 bytes.
HTTP+JSON 0.3 has no ``referenceTaskIds``: they go by JSON-RPC only.

Translation never raises: what is not the expected shape is passed on as it is, and
:mod:`engine.wire.v10` refuses it, naming the field. Fixed depth; nothing recurses on the input.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final, Literal

from cardfence.engine.cards.spoken import part_kind

__all__ = [
    "EXTENDED_CARD_PATH",
    "METHODS",
    "PATH_PREFIX",
    "Answer",
    "answer",
    "push_body",
    "request",
    "rest_error",
    "rest_path",
]

# The 0.3 JSON-RPC name of each 1.0 operation the transport uses; 0.3 has no ListTasks.
METHODS: Final = {
    "SendMessage": "message/send",
    "SendStreamingMessage": "message/stream",
    "GetTask": "tasks/get",
    "CancelTask": "tasks/cancel",
    "CreateTaskPushNotificationConfig": "tasks/pushNotificationConfig/set",
    "SubscribeToTask": "tasks/resubscribe",
    "GetExtendedAgentCard": "agent/getAuthenticatedExtendedCard",
}
PATH_PREFIX: Final = "/v1"  # HTTP+JSON 0.3: /v1/message:send, /v1/tasks/{id}, …
EXTENDED_CARD_PATH: Final = "/v1/card"  # 1.0: /extendedAgentCard

Answer = Literal["send", "task", "stream", "push_config", "card"]

_STREAM_KEYS: Final = ("task", "message", "statusUpdate", "artifactUpdate")
_KINDS: Final = {
    "task": "task",
    "message": "message",
    "status-update": "statusUpdate",
    "artifact-update": "artifactUpdate",
}
# HTTP+JSON 0.3 errors carry no code: a2a-sdk 0.3 maps each A2A error to a status and sends
# {"message": …}. Statuses only an A2A handler gives such a body map by status; 404 only by the
# message a2a-sdk gives it, since a gateway's missing route can look the same (R11: a missing
# route is never TaskNotFound). Anything else is no A2A error.
_REST_STATUS_CODES: Final = {409: -32002, 415: -32005, 422: -32602, 501: -32004}
_REST_404_MESSAGES: Final = (
    ("task not found", -32001),
    ("authenticated extended card is not configured", -32007),
)


def rest_path(path: str) -> str:
    """The HTTP+JSON 0.3 path of a 1.0 one (``/tasks/{id}`` -> ``/v1/tasks/{id}``)."""
    if path == "/extendedAgentCard":
        return EXTENDED_CARD_PATH
    return PATH_PREFIX + path


# --- requests ------------------------------------------------------------------------------------


def request(operation: str, params: dict[str, Any], *, rest: bool) -> dict[str, Any]:
    """The 0.3 form of a 1.0 request: JSON-RPC ``params`` or (``rest``) the HTTP+JSON body.

    ``params`` are the 1.0 JSON-RPC params the transport built (which name the task, where a
    REST body would leave it to the path).
    """
    if operation in ("SendMessage", "SendStreamingMessage"):
        return _send_params(params, rest)
    if operation == "CreateTaskPushNotificationConfig":
        task_id = str(params.get("taskId", ""))
        config = _push_config_out(params)
        if not rest:
            return {"taskId": task_id, "pushNotificationConfig": config}
        name = f"tasks/{task_id}/pushNotificationConfigs/{config['id']}"
        return {
            "parent": f"tasks/{task_id}",
            "configId": config["id"],
            "config": {"name": name, "pushNotificationConfig": config},
        }
    if rest and operation == "CancelTask":
        return {"name": f"tasks/{params.get('id', '')}"}
    return dict(params)  # GetTask, CancelTask, SubscribeToTask, GetExtendedAgentCard: the same


def _send_params(params: dict[str, Any], rest: bool) -> dict[str, Any]:
    """A 1.0 SendMessageRequest as a 0.3 ``MessageSendParams`` (JSON-RPC) or proto
    ``SendMessageRequest`` (HTTP+JSON)."""
    message = dict(params.get("message") or {})
    parts = [_part_out(part, rest) for part in message.pop("parts", [])]
    message["role"] = "ROLE_USER" if rest else "user"
    if rest:
        # The 0.3 proto Message has no referenceTaskIds, and a2a-sdk 0.3 refuses a field it
        # does not know: they go by JSON-RPC only.
        message.pop("referenceTaskIds", None)
        message["content"] = parts
    else:
        message["parts"] = parts
        message["kind"] = "message"
    configuration = params.get("configuration") or {}
    # 1.0 blocks unless returnImmediately; 0.3 blocks unless blocking is false, and a2a-sdk
    # 0.3's HTTP+JSON reads an absent one as false (proto default): always say which.
    out: dict[str, Any] = {"blocking": not configuration.get("returnImmediately", False)}
    if configuration.get("acceptedOutputModes"):
        out["acceptedOutputModes"] = list(configuration["acceptedOutputModes"])
    push = configuration.get("taskPushNotificationConfig")
    if push:
        out["pushNotification" if rest else "pushNotificationConfig"] = _push_config_out(push)
    return {"message": message, "configuration": out}


def _part_out(part: dict[str, Any], rest: bool) -> dict[str, Any]:
    """One 1.0 part as the 0.3 part it travels in: a file by bytes (``raw``) or by URL with
    its ``name`` and ``mimeType``, a data part (its object: 0.3 keeps no media type for it), or
    a text part ``{"text", "mediaType"}`` chosen by its media type (:func:`_text_out`)."""
    if isinstance(part.get("text"), str):
        return _text_out(part["text"], str(part.get("mediaType") or "text/plain"), rest)
    media = {} if part.get("mediaType") is None else {"mimeType": part["mediaType"]}
    if part.get("filename"):
        media["name"] = part["filename"]
    if isinstance(part.get("raw"), str):
        return _file_bytes(part["raw"], media, rest)
    if isinstance(part.get("url"), str):
        if rest:
            return {"file": {"fileWithUri": part["url"], **media}}
        return {"kind": "file", "file": {"uri": part["url"], **media}}
    if "data" in part:
        return {"data": {"data": part["data"]}} if rest else {"kind": "data", "data": part["data"]}
    return dict(part)


def _text_out(text: str, media_type: str, rest: bool) -> dict[str, Any]:
    """A text part as the 0.3 part its media type travels in: ``text/*`` a text part, a JSON
    type a data part (when the text is a JSON object), any other a file of the text's bytes."""
    kind = part_kind(media_type)
    if kind == "data":
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):  # 0.3 data parts hold an object
            return {"data": {"data": value}} if rest else {"kind": "data", "data": value}
        kind = "file"
    if kind == "file":
        encoded = base64.b64encode(text.encode()).decode()
        return _file_bytes(encoded, {"mimeType": media_type}, rest)
    return {"text": text} if rest else {"kind": "text", "text": text}


def _file_bytes(encoded: str, media: dict[str, Any], rest: bool) -> dict[str, Any]:
    """A file part of the bytes whose base64 text is ``encoded``."""
    if rest:
        # a2a-sdk 0.3 puts the base64 text of FileWithBytes.bytes in the proto bytes field,
        # which proto JSON encodes in base64 once more: its own client sends this.
        twice = base64.b64encode(encoded.encode()).decode()
        return {"file": {"fileWithBytes": twice, **media}}
    return {"kind": "file", "file": {"bytes": encoded, **media}}


def _push_config_out(config: dict[str, Any]) -> dict[str, Any]:
    """A 1.0 push config (``authentication.scheme``) as a 0.3 ``PushNotificationConfig``
    (``authentication.schemes``, a list)."""
    out = {k: config[k] for k in ("id", "url", "token") if config.get(k) is not None}
    auth = config.get("authentication")
    if isinstance(auth, dict) and auth.get("scheme"):
        auth_out: dict[str, Any] = {"schemes": [auth["scheme"]]}
        if auth.get("credentials") is not None:
            auth_out["credentials"] = auth["credentials"]
        out["authentication"] = auth_out
    return out


# --- answers -------------------------------------------------------------------------------------


def answer(kind: Answer, doc: object, *, rest: bool) -> object:
    """A 0.3 result in the 1.0 shape :mod:`engine.wire.v10` reads for ``kind``: ``send`` a
    SendMessageResponse, ``task`` a Task, ``stream`` a StreamResponse, ``push_config`` a
    TaskPushNotificationConfig; ``card`` is returned as it is (cards parse in both versions)."""
    if not isinstance(doc, dict) or kind == "card":
        return doc
    if kind == "task":
        return _task(doc, rest)
    if kind == "push_config":
        return _push_config_in(doc)
    wrapped = doc if rest else _wrapped(doc)
    return _inner(wrapped, ("task", "message") if kind == "send" else _STREAM_KEYS, rest)


def push_body(doc: object) -> object:
    """A push delivery in the 1.0 shape (a StreamResponse). A 0.3 agent pushes the whole Task
    (a2a-sdk 0.3: the task's JSON, ``"kind": "task"``, after every event): told apart by shape,
    it is wrapped as ``{"task": …}``. A 1.0 body, or any other, is returned as it is."""
    if not isinstance(doc, dict) or any(key in doc for key in _STREAM_KEYS):
        return doc
    kind = doc.get("kind")
    if kind is None and "id" in doc and "status" in doc:  # a task without its tag
        return {"task": _task(doc, False)}
    known = isinstance(kind, str) and kind in _KINDS
    return _inner(_wrapped(doc), _STREAM_KEYS, False) if known else doc


def rest_error(status: int, doc: object, operation: str) -> tuple[int, str] | None:
    """``(code, message)`` when an HTTP+JSON 0.3 answer is an A2A error, else ``None``: the body
    a2a-sdk 0.3 sends, ``{"message": "…"}``, under the status it maps the error to."""
    if not isinstance(doc, dict) or "error" in doc or not isinstance(doc.get("message"), str):
        return None
    message: str = doc["message"][:200]
    code = _REST_STATUS_CODES.get(status)
    if code == -32004 and operation == "CreateTaskPushNotificationConfig":
        code = -32003  # PushNotificationNotSupported, also 501
    if status == 404:
        lowered = message.lower()
        code = next((c for start, c in _REST_404_MESSAGES if lowered.startswith(start)), None)
    return None if code is None else (code, message)


def _wrapped(doc: dict[str, Any]) -> dict[str, Any]:
    """A ``kind``-tagged 0.3 object as the 1.0 oneof that holds it (``{"statusUpdate": …}``);
    without ``kind``, told by its fields. Left as it is when neither says."""
    if any(key in doc for key in _STREAM_KEYS):
        return doc
    kind = doc.get("kind")
    key = _KINDS.get(kind) if isinstance(kind, str) else None
    if key is None and kind is None:
        if "taskId" in doc and "status" in doc:
            key = "statusUpdate"
        elif "taskId" in doc and "artifact" in doc:
            key = "artifactUpdate"
        elif "id" in doc and "status" in doc:
            key = "task"
        elif "messageId" in doc:
            key = "message"
    return doc if key is None else {key: doc}


def _inner(doc: dict[str, Any], keys: tuple[str, ...], rest: bool) -> dict[str, Any]:
    """``doc`` with the object under each of ``keys`` translated."""
    out = dict(doc)
    for key in keys:
        value = out.get(key)
        if not isinstance(value, dict):
            continue
        if key == "task":
            out[key] = _task(value, rest)
        elif key == "message":
            out[key] = _message(value, rest)
        elif key == "statusUpdate":
            out[key] = _with_status(value, rest)
        else:
            artifact = value.get("artifact")
            if isinstance(artifact, dict):
                out[key] = {**value, "artifact": _with_parts(artifact, rest)}
    return out


def _task(doc: dict[str, Any], rest: bool) -> dict[str, Any]:
    out = _with_status(doc, rest)
    artifacts = out.get("artifacts")
    if isinstance(artifacts, list):
        out["artifacts"] = [_with_parts(a, rest) if isinstance(a, dict) else a for a in artifacts]
    return out


def _with_status(doc: dict[str, Any], rest: bool) -> dict[str, Any]:
    """A task or status update with its status message translated."""
    out = dict(doc)
    status = out.get("status")
    if isinstance(status, dict) and isinstance(status.get("message"), dict):
        out["status"] = {**status, "message": _message(status["message"], rest)}
    return out


def _message(doc: dict[str, Any], rest: bool) -> dict[str, Any]:
    """A message's parts are ``content`` in 0.3 proto JSON, ``parts`` otherwise."""
    out = dict(doc)
    if rest and "parts" not in out and "content" in out:
        out["parts"] = out.pop("content")
    return _with_parts(out, rest)


def _with_parts(doc: dict[str, Any], rest: bool) -> dict[str, Any]:
    out = dict(doc)
    parts = out.get("parts")
    if isinstance(parts, list):
        out["parts"] = [_part_in(p, rest) if isinstance(p, dict) else p for p in parts]
    return out


def _part_in(doc: dict[str, Any], rest: bool) -> dict[str, Any]:
    """A 0.3 part, in either binding's dialect, as a 1.0 part (``text`` | ``url`` | ``raw`` |
    ``data``, with ``mediaType``, and a file's ``name`` as ``filename``). ``raw`` stays the
    base64 text received (the engine never reads the bytes)."""
    kind = doc.get("kind")
    if "text" in doc and kind in (None, "text"):
        return {"text": doc["text"]}
    file = doc.get("file")
    if isinstance(file, dict) and kind in (None, "file"):
        media = {} if file.get("mimeType") is None else {"mediaType": file["mimeType"]}
        if file.get("name") is not None:
            media["filename"] = file["name"]
        for key, to in (("uri", "url"), ("fileWithUri", "url"), ("bytes", "raw")):
            if file.get(key) is not None:
                return {to: file[key], **media}
        if file.get("fileWithBytes") is not None:
            return {"raw": _base64_text(file["fileWithBytes"]), **media}
        return doc
    if "data" in doc and kind in (None, "data"):
        data = doc["data"]
        if rest and isinstance(data, dict) and set(data) <= {"data"}:
            return {"data": data.get("data", {})}  # proto DataPart: {"data": {"data": {…}}}
        return {"data": data}
    return doc


def _base64_text(value: object) -> object:
    """The base64 text a2a-sdk 0.3 carries in a proto ``fileWithBytes`` (proto JSON encodes it
    in base64 once more: decoded once, it reads as the JSON-RPC ``bytes`` of the same file).
    Anything that does not decode so is kept as received."""
    if not isinstance(value, str):
        return value
    try:
        inner = base64.b64decode(value, validate=True).decode("ascii")
        base64.b64decode(inner, validate=True)
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return value
    return inner


def _push_config_in(doc: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 ``TaskPushNotificationConfig`` (``{"taskId" | "name", "pushNotificationConfig"}``)
    as the flat 1.0 config, ``authentication.schemes[0]`` as its ``scheme``."""
    config = doc.get("pushNotificationConfig")
    if not isinstance(config, dict):
        return doc
    out = dict(config)
    auth = out.get("authentication")
    if isinstance(auth, dict) and "scheme" not in auth:
        schemes = auth.get("schemes")
        flat = {k: v for k, v in auth.items() if k != "schemes"}
        if isinstance(schemes, list) and schemes:
            flat["scheme"] = schemes[0]
        out["authentication"] = flat
    return out
