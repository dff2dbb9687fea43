"""Value types the event store takes and gives: events, projections, card snapshots."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of a stream's first event."""


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
        """The decoded payload (a fresh dict on every access)."""
        value = json.loads(self.payload)
        assert isinstance(value, dict)
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


@dataclass(frozen=True, slots=True)
class CardSnapshot:
    """A card body stored once under the SHA-256 of its text (R14)."""

    revision: str
    body: str
    source_url: str
    etag: str | None
    http_status: int
    fetched_at: datetime
