"""Content kept out of line (R17): what an event keeps of a part, and the record that keeps the
rest. Pure: no I/O.

A message or an artifact part is the user's content; the event that records it keeps only its
*outline*: its kind, media type, size, and ``SHA-256(salt ‖ content)``. The content (text,
bytes, URL, filename, data, the artifact's name, the message's metadata) goes to a content
record stored beside the event under that digest. The hash chain covers the digests, so the
audit proves every event and checks every record against its digest; erasing content deletes
records and leaves every event whole; and without the salt (deleted with the content) a digest
left behind confirms no guess.

:func:`outlined` turns an event payload as the engine builds it (content inline) into the payload
stored and the records to keep; :func:`resolved_parts` gives outlined parts their content back
from the records that are kept. Events written before content moved out of line hold their
content inline and are read as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cardfence.engine.core import events as ev
from cardfence.store.chain import salted_hash

__all__ = [
    "ARTIFACT_NAME",
    "MESSAGE_METADATA",
    "Kept",
    "carries_content",
    "is_outline",
    "outline_digests",
    "outlined",
    "resolved_parts",
    "schema_version",
    "upcast",
]

# What an outline holds: nothing of the content but its size and salted digest.
_OUTLINE_KEYS: Final = frozenset({"kind", "media_type", "size", "sha256"})
# The keys of an inline part that are content (the rest, kind and media type, is structure).
_CONTENT_KEYS: Final = ("text", "bytes", "url", "data", "filename")
ARTIFACT_NAME: Final = "artifact_name"
"""The key of a part's content record holding the name of the artifact the part belongs to."""
MESSAGE_METADATA: Final = "message_metadata"
"""The key of a part's content record holding the metadata of the message the part belongs to."""


SCHEMA_VERSIONS: Final = {
    ev.TASK_SUBMITTED: 2,
    ev.REPLY_SENT: 2,
    ev.STATE_CHANGED: 2,
    ev.ARTIFACT_RECEIVED: 2,
}
"""The schema version of each type whose payload changed shape when content moved out of line:
version 2 outlines its parts (version 1, every event written before, holds content inline and is
read through :func:`upcast`). Every other type is at version 1."""


def schema_version(type_: str) -> int:
    """The schema version an event of ``type_`` is written with today."""
    return SCHEMA_VERSIONS.get(type_, 1)


def upcast(type_: str, version: int, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A stored payload in today's shape, its content inline where it was written inline: a
    version 1 ``TaskSubmitted`` (one text part as ``text`` and ``media_type``) with ``parts``;
    a version 1 ``StateChanged`` message (``message``, and ``message_parts`` when one was not
    text) as its parts; a version 1 artifact's parts with a file given by its bytes as
    ``kind: file`` and ``bytes`` (recorded as ``raw``, base64 in ``data``). What was never
    recorded (a version 1 reply's text) stays absent. Today's payloads are returned as they are."""
    out = dict(payload)
    if version >= SCHEMA_VERSIONS.get(type_, 1):
        return out
    if type_ == ev.TASK_SUBMITTED and isinstance(out.get("text"), str) and "parts" not in out:
        media_type = out.get("media_type") or "text/plain"
        out["parts"] = [{"kind": "text", "media_type": media_type, "text": out.pop("text")}]
    elif type_ == ev.STATE_CHANGED and isinstance(out.get("message"), str):
        text = out.pop("message")
        out["message_parts"] = [
            _upcast_part(p) for p in out.get("message_parts") or [{"kind": "text", "text": text}]
        ]
    elif type_ == ev.ARTIFACT_RECEIVED and isinstance(out.get("parts"), list):
        out["parts"] = [_upcast_part(p) for p in out["parts"]]
    return out


def _upcast_part(part: Any) -> Any:
    if isinstance(part, Mapping) and part.get("kind") == "raw":
        inline = {k: v for k, v in part.items() if k != "data"}
        return {**inline, "kind": "file", "bytes": part.get("data")}
    return part


@dataclass(frozen=True, slots=True)
class Kept:
    """A content record to store: its digest, and the JSON text the digest covers."""

    digest: str
    body: str


def is_outline(part: object) -> bool:
    """Whether a recorded part is an outline (its content out of line), not inline content."""
    return (
        isinstance(part, Mapping)
        and "sha256" in part
        and not any(key in part for key in _CONTENT_KEYS)
    )


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)  # ASCII: any text stores


def _size(part: Mapping[str, Any]) -> int:
    """The size in bytes of a part's content: text as UTF-8, a file's decoded bytes, a URL's
    text, data as its JSON."""
    if isinstance(part.get("text"), str):
        return len(part["text"].encode())
    encoded = part.get("bytes")
    if part.get("kind") == "raw" and isinstance(part.get("data"), str):
        encoded = part["data"]  # base64 text as remote reports gave it
    if isinstance(encoded, str):
        try:
            return len(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            return len(encoded.encode())
    if isinstance(part.get("url"), str):
        return len(part["url"].encode())
    return len(_json(part.get("data")).encode())


def _kind(part: Mapping[str, Any]) -> str:
    kind = str(part.get("kind") or "text")
    return "file" if kind == "raw" else kind


def _outline(
    part: Mapping[str, Any], salt: str, around: Mapping[str, Any], kept: dict[str, Kept]
) -> dict[str, Any]:
    """A part's outline, its content record added to ``kept`` (one per digest)."""
    if is_outline(part):
        return dict(part)
    content = {k: v for k, v in part.items() if k not in ("kind", "media_type")}
    if part.get("kind") == "raw" and "data" in content:  # a remote file given by its bytes
        content["bytes"] = content.pop("data")
    body = _json({**content, **around})
    digest = salted_hash(salt, body)
    kept.setdefault(digest, Kept(digest, body))
    outline: dict[str, Any] = {"kind": _kind(part)}
    if part.get("media_type") is not None:
        outline["media_type"] = part["media_type"]
    outline.update(size=_size(part), sha256=digest)
    return outline


def _outlines(
    parts: object, salt: str, around: Mapping[str, Any], kept: dict[str, Kept]
) -> list[Any] | None:
    if not isinstance(parts, list | tuple):
        return None
    return [_outline(p, salt, around, kept) if isinstance(p, Mapping) else p for p in parts]


def carries_content(type_: str, payload: Mapping[str, Any]) -> bool:
    """Whether an event payload holds content to put out of line."""
    if type_ in (ev.TASK_SUBMITTED, ev.REPLY_SENT, ev.ARTIFACT_RECEIVED):
        return any(payload.get(key) for key in ("parts", "metadata")) or any(
            isinstance(payload.get(key), str) for key in ("text", "name")
        )
    return type_ == ev.STATE_CHANGED and isinstance(payload.get("message"), str)


def outlined(
    type_: str, payload: Mapping[str, Any], salt: str
) -> tuple[dict[str, Any], list[Kept]]:
    """The payload to store for an event built with its content inline, and the content records
    to keep beside it (salted with ``salt``, hex). An event that carries no content is returned
    as it is.

    - ``TaskSubmitted`` and ``ReplySent``: each of ``parts`` outlined (a ``text`` given alone
      is one text part), the message's ``metadata`` kept in each part's record.
    - ``StateChanged``: the status message's parts outlined (a message of text alone is one text
      part), its joined text (``message``) dropped: it is the text of those parts.
    - ``ArtifactReceived``: each of ``parts`` outlined, the artifact's ``name`` kept in each
      part's record (the event's ``name`` is then null).
    """
    kept: dict[str, Kept] = {}
    out = dict(payload)
    if type_ in (ev.TASK_SUBMITTED, ev.REPLY_SENT):
        metadata = out.pop("metadata", None)
        around = {} if not metadata else {MESSAGE_METADATA: metadata}
        if isinstance(out.get("text"), str) and "parts" not in out:  # a message of one text
            media_type = out.get("media_type") or "text/plain"
            out["parts"] = [{"kind": "text", "media_type": media_type, "text": out.pop("text")}]
        parts = _outlines(out.get("parts"), salt, around, kept)
        if parts is not None:
            out["parts"] = parts
    elif type_ == ev.STATE_CHANGED and isinstance(out.get("message"), str):
        inline = out.get("message_parts") or [
            {"kind": "text", "media_type": "text/plain", "text": out["message"]}
        ]
        out["message_parts"] = _outlines(list(inline), salt, {}, kept)
        del out["message"]
    elif type_ == ev.ARTIFACT_RECEIVED and isinstance(out.get("parts"), list | tuple):
        around = {} if out.get("name") is None else {ARTIFACT_NAME: out["name"]}
        out["parts"] = _outlines(out["parts"], salt, around, kept)
        if around:
            out["name"] = None
    elif type_ == ev.ARTIFACT_RECEIVED and isinstance(out.get("name"), str):
        # kept as its size and digest (truncated): its name alone is content, kept apart
        body = _json({ARTIFACT_NAME: out["name"]})
        digest = salted_hash(salt, body)
        kept[digest] = Kept(digest, body)
        out.update(name=None, name_sha256=digest)
    return out, list(kept.values())


def outline_digests(type_: str, payload: Mapping[str, Any]) -> list[str]:
    """The digests of the content records a stored event's outlines name (none for an event
    written with its content inline)."""
    key = "message_parts" if type_ == ev.STATE_CHANGED else "parts"
    if type_ not in (ev.TASK_SUBMITTED, ev.REPLY_SENT, ev.STATE_CHANGED, ev.ARTIFACT_RECEIVED):
        return []
    parts = payload.get(key)
    named = [str(payload["name_sha256"])] if payload.get("name_sha256") else []
    if not isinstance(parts, list):
        return named
    return [str(p["sha256"]) for p in parts if is_outline(p)] + named


def resolved_parts(
    parts: Iterable[Any], contents: Mapping[str, Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``parts`` with their content back in line, from ``contents`` (decoded record bodies by
    digest), and what the records say of their message or artifact (its name, its metadata).
    An outline whose record is not kept (erased) stays an outline, marked ``erased``."""
    out: list[dict[str, Any]] = []
    around: dict[str, Any] = {}
    for part in parts:
        if not is_outline(part):
            out.append(dict(part))
            continue
        body = contents.get(part["sha256"])
        if body is None:
            out.append({**part, "erased": True})
            continue
        for key in (ARTIFACT_NAME, MESSAGE_METADATA):
            if key in body:
                around.setdefault(key, body[key])
        content = {k: v for k, v in body.items() if k not in (ARTIFACT_NAME, MESSAGE_METADATA)}
        out.append({**part, **content})
    return out, around


def text_of(parts: Sequence[Mapping[str, Any]]) -> str | None:
    """The text parts' text joined with newlines (a status message's text), None without any."""
    texts = [p["text"] for p in parts if p.get("kind") == "text" and isinstance(p.get("text"), str)]
    return "\n".join(texts) if texts else None
