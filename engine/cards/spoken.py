"""What cardfence speaks. Pure: no I/O.

Two bindings (``JSONRPC``, ``HTTP+JSON``, which 0.3 also called ``REST``: :data:`BINDING_ALIASES`),
two A2A versions (:data:`V10` for any 1.x, :data:`V03` for 0.3 and 0.2: :func:`spoken_version`;
:func:`dialect_of` the methods and shapes a request takes), and the media types a skill's modes
name (:func:`modes_match`; 0.3's bare words name the kind of part: :func:`part_kind`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BINDING_ALIASES",
    "HTTP_JSON",
    "JSONRPC",
    "SPOKEN_BINDINGS",
    "V03",
    "V10",
    "dialect_of",
    "modes_match",
    "modes_meet",
    "part_kind",
    "spoken_version",
]

JSONRPC: Final = "JSONRPC"
HTTP_JSON: Final = "HTTP+JSON"
SPOKEN_BINDINGS: Final = (JSONRPC, HTTP_JSON)
# The A2A versions cardfence speaks: 1.0 (any 1.x is sent as 1.0) and 0.3 (0.2 agents use the
# same method names and shapes, docs/wire.md).
V10: Final = "1.0"
V03: Final = "0.3"
# 0.3 also called HTTP+JSON "REST"; names are compared upper-cased.
BINDING_ALIASES: Final = {"JSONRPC": JSONRPC, "HTTP+JSON": HTTP_JSON, "REST": HTTP_JSON}


def modes_match(modes: tuple[str, ...], media_type: str) -> bool:
    """Media ranges ``*/*`` and ``type/*`` match; parameters and case are ignored. The bare
    words of 0.3 cards name the kind of part the agent takes (docs/wire.md): ``text`` is any
    ``text/*`` type (a text part), ``data`` a JSON type (``application/json``, ``*/*+json``: a
    data part), ``file`` any other type (a file part)."""
    if not modes:
        return True
    wanted = _essence(media_type)
    for mode in map(_essence, modes):
        if mode in ("*/*", "*", wanted) or part_kind(wanted) == mode:
            return True
        if mode.endswith("/*") and wanted.partition("/")[0] == mode[:-2] and "/" in wanted:
            return True
    return False


def modes_meet(offered: tuple[str, ...], wanted: str) -> bool:
    """Whether a media range the caller accepts (``wanted``: a type, ``type/*`` or ``*/*``)
    meets one of the ``offered`` modes (a skill's output modes: types, ranges, or 0.3's bare
    words); no modes offered meets anything."""
    if not offered or modes_match(offered, wanted):
        return True
    range_ = _essence(wanted)
    if range_ in ("*/*", "*"):
        return True
    if range_.endswith("/*"):
        major = range_[:-2]
        # A bare word names a kind of part: ``text`` the text/* types, ``data`` the JSON
        # types (application/...), ``file`` every other type.
        kinds = {"text": major == "text", "data": major == "application", "file": major != "text"}
        for mode in map(_essence, offered):
            if ("/" in mode and mode.partition("/")[0] == major) or kinds.get(mode, False):
                return True
    return False


def part_kind(media_type: str) -> str:
    """The 0.3 part a message of this media type travels in: ``text``, ``data`` or ``file`` --
    what the bare words of a 0.3 card's modes name."""
    media_type = _essence(media_type)
    if media_type.startswith("text/"):
        return "text"
    if media_type == "application/json" or media_type.endswith("+json"):
        return "data"
    return "file"


def _essence(media_type: str) -> str:
    return media_type.partition(";")[0].strip().lower()


def dialect_of(declared: str, *, legacy_card: bool = False) -> str:
    """The version whose methods and shapes a request to an interface that declares
    ``declared`` takes: :data:`V03` for any 0.x (and a 0.x card that declares none), else
    :data:`V10`."""
    version = declared.strip()
    return V03 if version.startswith("0.") or (legacy_card and not version) else V10


def spoken_version(declared: str, *, legacy_card: bool = False) -> str:
    """The A2A version cardfence speaks to an interface that declares ``declared``: :data:`V10`
    for 1.x, :data:`V03` for 0.3 and 0.2 (same methods and shapes), ``""`` for any other.
    Nothing declared means 1.0 (it is required there), or 0.3 on a 0.x-shaped card
    (``legacy_card``: 0.2 cards had no ``protocolVersion``)."""
    version = declared.strip()
    if not version:
        return V03 if legacy_card else V10
    major, _, rest = version.partition(".")
    if major == "1":
        return V10
    if major == "0" and rest.partition(".")[0] in ("2", "3"):
        return V03
    return ""
