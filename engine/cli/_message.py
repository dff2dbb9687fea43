"""The message ``run`` and ``reply`` send, read from their options (docs/cli.md, "Message
parts"): every ``--text``, ``--file``, ``--file-url``, then ``--data``, and ``--metadata``. Each
bad input is a one-line :class:`UsageError` (exit 2) before anything is opened or sent.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cardfence.engine import errors
from cardfence.engine.cards.urls import without_userinfo
from cardfence.engine.core.messages import json_object
from cardfence.engine.core.parts import Data, File, Part, Text

# A media type as RFC 6838 names one (type/subtype, optional parameters); not a bare word.
MEDIA_TYPE: Final = re.compile(r"[A-Za-z0-9][\w!#$&^.+-]*/[A-Za-z0-9][\w!#$&^.+-]*(\s*;.*)?")
_TYPE_SUFFIX: Final = ";type="


@dataclass(frozen=True, slots=True)
class MessageOptions:
    """What a command line gives of a message."""

    texts: Sequence[str] = ()
    media_type: str = "text/plain"
    files: Sequence[str] = ()
    file_urls: Sequence[str] = ()
    data: str | None = None
    metadata: str | None = None


def check_media_type(media_type: str, option: str = "--media-type") -> str:
    """``media_type`` stripped, or :class:`UsageError` when it is no ``type/subtype``."""
    if not MEDIA_TYPE.fullmatch(media_type.strip()):
        raise errors.UsageError(f"{option} {media_type!r}: not a media type (type/subtype)")
    return media_type.strip()


def check_media_range(media_range: str, option: str = "--accept") -> str:
    """``media_range`` stripped (a media type, ``type/*`` or ``*/*``), or :class:`UsageError`."""
    stripped = media_range.strip()
    if not MEDIA_TYPE.fullmatch(stripped.replace("*", "x")):
        raise errors.UsageError(f"{option} {media_range!r}: not a media type or range")
    return stripped


def message_parts(
    given: MessageOptions, max_bytes: int
) -> tuple[list[Part], dict[str, Any] | None]:
    """The parts, in their order, and the metadata a command line gives. A file is read whole
    here (one larger than ``max_bytes`` is refused unread: :class:`MessageTooLargeError`)."""
    media_type = check_media_type(given.media_type)
    parts: list[Part] = [Text(text, media_type) for text in given.texts]
    for spec in given.files:
        where, declared = _typed(spec, "--file")
        parts.append(_read_file(where, declared, max_bytes))
    for spec in given.file_urls:
        url, declared = _typed(spec, "--file-url")
        parsed = urlsplit(url)
        if not parsed.scheme or not (parsed.netloc or parsed.path) or any(c.isspace() for c in url):
            raise errors.UsageError(f"--file-url {without_userinfo(url)!r}: not a URL")
        name = os.path.basename(parsed.path) or None
        parts.append(File(url=url, filename=name, media_type=declared))
    if given.data is not None:
        parts.append(Data(_json_option("--data", given.data)))
    if not parts:
        raise errors.UsageError(
            "a message needs at least one part: --text, --file, --file-url or --data"
        )
    metadata = None if given.metadata is None else _json_option("--metadata", given.metadata)
    return parts, metadata


def _typed(spec: str, option: str) -> tuple[str, str | None]:
    """``PATH[;type=MEDIA]``: the path (or URL) and the media type given, if any."""
    where, found, declared = spec.rpartition(_TYPE_SUFFIX)
    if not found:
        return spec, None
    return where, check_media_type(declared, f"{option} ...;type=")


def _read_file(where: str, declared: str | None, max_bytes: int) -> File:
    path = Path(where)
    try:
        size = path.stat().st_size
        if path.is_file() and size > max_bytes:
            raise errors.MessageTooLargeError(size, max_bytes)
        return File.from_path(path, media_type=declared)
    except OSError as failure:
        raise errors.UsageError(f"--file {where}: cannot be read ({_why(failure)})") from None


def _json_option(option: str, value: str) -> dict[str, Any]:
    """The JSON object an option gives, inline or (``@PATH``) in a file."""
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as failure:
            why = _why(failure) if isinstance(failure, OSError) else "not UTF-8"
            raise errors.UsageError(f"{option} {value}: cannot be read ({why})") from None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as failure:
        raise errors.UsageError(f"{option}: not JSON ({str(failure)[:120]})") from None
    if not isinstance(parsed, dict):
        raise errors.UsageError(f"{option}: must be a JSON object, not {_json_kind(parsed)}")
    return json_object(parsed, option)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "true or false" if isinstance(value, bool) else "a number"


def _why(failure: OSError) -> str:
    return failure.strerror or type(failure).__name__
