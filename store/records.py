"""Value types the event store takes and gives: events, projections, card snapshots, content
records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cardfence.store.errors import CorruptRecordError

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of a stream's first event."""

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}  # fmt: skip


def json_object(text: str) -> dict[str, Any] | str:
    """``text`` decoded when it is a JSON object, else why it is not ("is not JSON (…)", "is an
    array, not a JSON object"): stored text cardfence wrote is always an object, so anything
    else was altered in the store."""
    try:
        value = json.loads(text)
    except ValueError as error:  # JSONDecodeError, and an integer past Python's digit limit
        return f"is not JSON ({str(error).splitlines()[0][:120]})"
    if isinstance(value, dict):
        return value
    return f"is {_JSON_KINDS.get(type(value), 'not an object')}, not a JSON object"


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended. ``data`` must be JSON-serialisable."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = 1


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: its place in its stream and in the global log, and its chain link."""

    position: int
    stream_id: str
    version: int
    type: str
    schema_version: int
    payload: str
    recorded_at: datetime
    prev_hash: str
    hash: str

    @property
    def data(self) -> dict[str, Any]:
        """The decoded payload (a fresh dict on every access); :class:`CorruptRecordError` when
        the stored text is not a JSON object."""
        value = json_object(self.payload)
        if isinstance(value, str):
            raise CorruptRecordError.in_event(
                self.stream_id, self.version, self.position, self.type, f"its payload {value}"
            )
        return value


@dataclass(frozen=True, slots=True)
class Projection:
    """A stream's current state, written in the same transaction as the events (R13).

    ``category``, ``alias`` and ``status`` are indexed lookup keys whose meaning belongs to the
    caller (the engine uses them for the stream kind, the remote task id and the task state).
    ``live`` keeps the stream's due-work row in step in the same transaction: ``True`` adds it
    (the stream needs driving), ``False`` removes it, ``None`` leaves it as it is.
    """

    state: Mapping[str, Any]
    category: str | None = None
    alias: str | None = None
    status: str | None = None
    live: bool | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on one live stream: ``owner`` drives it until another claim raises ``epoch``.

    An append made under a lease (``EventStore.append(..., lease=...)``) commits only while the
    stream's due-work row still names this owner and epoch: a process that lost its lease cannot
    append for the stream.
    """

    stream_id: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream's head: its version and stored projection."""

    stream_id: str
    version: int
    state: dict[str, Any]
    category: str | None
    alias: str | None
    status: str | None
    updated_at: datetime
    # Set only by the audit's reads (``read_as_of_heads``): why the stored projection is not a
    # JSON object, ``state`` being then empty. Every other read raises CorruptRecordError.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class CardSnapshot:
    """A card body stored once under the SHA-256 of its text (R14)."""

    revision: str
    body: str
    source_url: str
    etag: str | None
    http_status: int
    fetched_at: datetime


@dataclass(frozen=True, slots=True)
class ContentRecord:
    """Content kept out of line (R17): a stream's message or artifact part, stored under
    ``SHA-256(salt ‖ body)`` (:func:`~cardfence.store.chain.salted_hash`), the digest its events
    carry. ``salt`` is hex; ``body`` the JSON text the digest covers."""

    stream_id: str
    digest: str
    salt: str
    body: str

    @property
    def data(self) -> dict[str, Any]:
        """The decoded body; :class:`CorruptRecordError` when it is not a JSON object."""
        value = json_object(self.body)
        if isinstance(value, str):
            raise CorruptRecordError(
                self.stream_id, f"content {self.digest[:16]}…", f"its body {value}"
            )
        return value
