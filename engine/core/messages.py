"""A message the engine sends for a caller: its parts, metadata, the tasks it names and the
output modes it accepts; and how a recorded one reads back. Pure.

:func:`outgoing` checks what a caller gives :meth:`Engine.start_task` and :meth:`Engine.reply`
(``text=`` is the short form of a first :class:`Text` part). :func:`recorded_parts` is the one
place a sent message's parts become what its event records (``TaskSubmitted``, ``ReplySent``);
:func:`submitted_message` reads a ``TaskSubmitted`` back, whichever cardfence wrote it (before
parts were recorded, its one text part was ``text`` and ``media_type``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cardfence.engine.cards.urls import without_userinfo
from cardfence.engine.core.parts import Data, File, Part, Text, from_recorded, recorded
from cardfence.engine.errors import UsageError

__all__ = [
    "Message",
    "json_object",
    "outgoing",
    "recorded_parts",
    "submitted_message",
]


@dataclass(frozen=True, slots=True)
class Message:
    """What a message carries beyond its ids: the caller's ``parts`` (one at least) and
    ``metadata``, the remote ids of the tasks it references (``referenceTaskIds``) and the
    output modes the caller accepts (``acceptedOutputModes``)."""

    parts: tuple[Part, ...]
    metadata: Mapping[str, Any] | None = field(default=None, hash=False)
    references: tuple[str, ...] = ()
    accepted_output_modes: tuple[str, ...] = ()


def outgoing(
    text: str | None,
    media_type: str,
    parts: Sequence[Part],
    metadata: Mapping[str, Any] | None = None,
) -> tuple[tuple[Part, ...], dict[str, Any] | None]:
    """The parts a caller sends (``text`` first, as a :class:`Text` of ``media_type``, then
    ``parts``) and its metadata, checked: at least one part, each a :class:`Text`,
    :class:`File` or :class:`Data` (a data part holding a JSON object), metadata a JSON object.
    :class:`UsageError` (nothing recorded, nothing sent) otherwise."""
    given: list[Part] = [] if text is None else [Text(text, media_type)]
    for part in parts:
        if not isinstance(part, Text | File | Data):
            raise UsageError(
                f"a message part is a Text, File or Data, not {type(part).__name__}: "
                "nothing was sent"
            )
        if isinstance(part, Data):
            json_object(part.data, "a data part")
        if (
            isinstance(part, File)
            and part.url is not None
            and without_userinfo(part.url) != part.url
        ):
            # R15: credentials never ride in a URL -- here one the agent and the store would keep
            shown = without_userinfo(part.url)
            raise UsageError(
                f"a file URL carries credentials ({shown} with user:password@): "
                "nothing was recorded or sent"
            )
        given.append(part)
    if not given:
        raise UsageError(
            "a message needs at least one part (text, a file or data): nothing was sent"
        )
    return tuple(given), None if metadata is None else json_object(metadata, "the metadata")


def json_object(value: object, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object (string keys, finite numbers, JSON values all the way
    down), as a dict; :class:`UsageError` naming ``what`` otherwise."""
    if not isinstance(value, Mapping):
        raise UsageError(f"{what} must be a JSON object, not {type(value).__name__}")
    try:
        # A round trip proves it is JSON: no NaN, no keys but strings, nothing but JSON values.
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        out = json.loads(text)
    except (TypeError, ValueError, RecursionError) as refused:
        raise UsageError(f"{what} is not JSON: {str(refused)[:120]}") from None
    if not isinstance(out, dict) or any(not isinstance(k, str) for k in value):
        raise UsageError(f"{what} must be a JSON object with string keys")
    return out


def recorded_parts(parts: Sequence[Part]) -> list[dict[str, Any]]:
    """The parts of a sent message as its event records them (``TaskSubmitted.parts``,
    ``ReplySent.parts``): inline, each as :func:`~cardfence.engine.core.parts.recorded`."""
    return [recorded(part) for part in parts]


def submitted_message(doc: Mapping[str, Any]) -> Message:
    """The message a ``TaskSubmitted`` payload (``doc``) recorded as sent: its ``parts``, else
    (recorded before parts were) its one text part, ``text`` and ``media_type``; its
    ``metadata``, ``references`` and ``accepted_output_modes``, empty when absent. A part whose
    content is not in the payload is left out."""
    parts: tuple[Part, ...]
    if isinstance(doc.get("parts"), list):
        read = (from_recorded(p) for p in doc["parts"] if isinstance(p, Mapping))
        parts = tuple(p for p in read if p is not None)
    elif isinstance(doc.get("text"), str):
        parts = (Text(doc["text"], str(doc.get("media_type") or "text/plain")),)
    else:
        parts = ()
    metadata = doc.get("metadata")
    return Message(
        parts=parts,
        metadata=dict(metadata) if isinstance(metadata, Mapping) else None,
        references=tuple(str(r) for r in doc.get("references") or ()),
        accepted_output_modes=tuple(str(m) for m in doc.get("accepted_output_modes") or ()),
    )
