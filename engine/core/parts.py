"""The parts a message or an artifact is made of, as a caller builds and reads them. Pure.

A message sent to an agent and an artifact read from one hold parts of three kinds (A2A's
``Part``): :class:`Text` (text with its media type), :class:`File` (bytes sent inline, or a URL,
with a filename and a media type) and :class:`Data` (a JSON object). They are what
:meth:`Engine.start_task` and :meth:`Engine.reply` accept and what a :class:`TaskView` gives back.

Each part has two recorded forms: the *content* (what a content record keeps: text, bytes,
URL, filename, data) and its *outline* in an event (kind, media type, size). :func:`recorded`
gives the stored dict of a part; :func:`from_recorded` reads one back, whatever cardfence
wrote it.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "DEFAULT_FILE_TYPE",
    "Data",
    "File",
    "Part",
    "PartKind",
    "Text",
    "from_recorded",
    "media_type_of",
    "recorded",
]

DEFAULT_FILE_TYPE: Final = "application/octet-stream"

PartKind: TypeAlias = Literal["text", "file", "url", "data"]
"""A part's kind as recorded: a file given by its bytes is ``file``, by its address ``url``."""


@dataclass(frozen=True, slots=True)
class Text:
    """Text, with its media type."""

    text: str
    media_type: str = "text/plain"

    @property
    def kind(self) -> PartKind:
        return "text"


@dataclass(frozen=True, slots=True)
class File:
    """A file: its bytes (sent inline) or its URL (sent by reference), exactly one of them.

    ``media_type`` is what the part declares; when none is given, the filename's, else
    ``application/octet-stream``, travels (:attr:`declared_type`)."""

    data: bytes | None = None
    url: str | None = None
    filename: str | None = None
    media_type: str | None = None

    def __post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise ValueError("a file part holds either its bytes or its URL, not both or neither")

    @classmethod
    def from_path(cls, path: str | Path, *, media_type: str | None = None) -> File:
        """The file at ``path``, read whole: its base name the filename, its media type the one
        given, else guessed from the name. ``OSError`` if it cannot be read."""
        where = Path(path)
        return cls(data=where.read_bytes(), filename=where.name, media_type=media_type)

    @property
    def kind(self) -> PartKind:
        return "file" if self.data is not None else "url"

    @property
    def declared_type(self) -> str:
        """The media type the part travels with."""
        if self.media_type:
            return self.media_type
        guessed = mimetypes.guess_type(self.filename or "")[0] if self.filename else None
        return guessed or DEFAULT_FILE_TYPE


@dataclass(frozen=True, slots=True)
class Data:
    """Structured data: a JSON object as a caller sends it (0.3 carries objects only); what an
    agent sends back may be any JSON value."""

    data: Any = field(hash=False)
    media_type: str = "application/json"

    @property
    def kind(self) -> PartKind:
        return "data"


Part: TypeAlias = Text | File | Data


def media_type_of(part: Part) -> str:
    """The media type a part travels with (what the skill's input modes must accept, R2)."""
    return part.declared_type if isinstance(part, File) else part.media_type


def recorded(part: Part) -> dict[str, Any]:
    """A part as an event records it inline: its kind, media type, and content (``text``;
    ``bytes`` in base64 and ``filename``; ``url`` and ``filename``; ``data``)."""
    out: dict[str, Any] = {"kind": part.kind, "media_type": media_type_of(part)}
    if isinstance(part, Text):
        out["text"] = part.text
    elif isinstance(part, Data):
        out["data"] = part.data
    else:
        if part.data is not None:
            out["bytes"] = base64.b64encode(part.data).decode("ascii")
        else:
            out["url"] = part.url
        if part.filename is not None:
            out["filename"] = part.filename
    return out


def from_recorded(doc: Mapping[str, Any]) -> Part | None:
    """The part a recorded dict holds, from any cardfence: inline parts of today, and the parts
    of a remote report as recorded before (``kind`` ``raw``: base64 text in ``data``). None when
    the dict holds no content (an outline whose content is out of line, or was erased)."""
    kind = doc.get("kind")
    media_type = doc.get("media_type")
    filename = doc.get("filename")
    if kind == "text" and isinstance(doc.get("text"), str):
        return Text(doc["text"], media_type or "text/plain")
    if kind == "data" and "data" in doc:
        return Data(doc["data"], media_type or "application/json")
    if kind == "url" and isinstance(doc.get("url"), str):
        return File(url=doc["url"], filename=filename, media_type=media_type)
    encoded = doc.get("bytes") if kind == "file" else doc.get("data") if kind == "raw" else None
    if isinstance(encoded, str):
        try:
            return File(
                data=base64.b64decode(encoded, validate=True),
                filename=filename,
                media_type=media_type,
            )
        except (binascii.Error, ValueError):
            return None
    return None
