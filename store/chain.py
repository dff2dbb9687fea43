"""The per-stream hash chain (R13): each event's hash covers its stream, version, type, schema
version, recording time, payload and the hash of its predecessor, so an edited, removed or
reordered event is detected by :func:`verify_chain`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from cardfence.store.records import GENESIS_HASH, RecordedEvent


def timestamp_text(moment: datetime) -> str:
    """The exact text of a recording time as it enters the hash (UTC, microseconds)."""
    return moment.isoformat(timespec="microseconds")


def event_hash(
    stream_id: str,
    version: int,
    type_: str,
    schema_version: int,
    recorded_at: datetime,
    payload: str,
    prev_hash: str,
) -> str:
    """SHA-256 of an event's identity and content, chained to ``prev_hash``."""
    header = json.dumps(
        [stream_id, version, type_, schema_version, timestamp_text(recorded_at), prev_hash],
        separators=(",", ":"),
    )
    return hashlib.sha256(f"{header}\n{payload}".encode()).hexdigest()


def salted_hash(salt: str, body: str) -> str:
    """The digest of out-of-line content: SHA-256 of its salt's bytes (``salt`` is hex) then its
    body's UTF-8. Without the salt, the digest confirms no guess of the body."""
    return hashlib.sha256(bytes.fromhex(salt) + body.encode()).hexdigest()


def content_hash(body: str) -> str:
    """The content address of a stored card body."""
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first place a stream's chain does not hold.

    ``kind`` is ``gap`` (a version missing or out of sequence), ``broken_link`` (``prev_hash`` is
    not the previous event's hash), ``hash_mismatch`` (the event's content does not hash to its
    ``hash``), ``reordered`` (global positions do not grow with versions) or ``head_mismatch``
    (the projection's version is not the last event's).
    """

    stream_id: str
    position: int
    version: int
    kind: str
    detail: str


def verify_chain(
    stream_id: str, events: Iterable[RecordedEvent], head_version: int | None = None
) -> ChainBreak | None:
    """Walk a stream's events in version order; return the first break, or ``None``."""
    expected_version = 1
    prev_hash = GENESIS_HASH
    prev_position = 0
    for event in events:
        if event.version != expected_version:
            return ChainBreak(
                stream_id,
                event.position,
                event.version,
                "gap",
                f"expected version {expected_version}, found {event.version}",
            )
        if event.position <= prev_position:
            return ChainBreak(
                stream_id,
                event.position,
                event.version,
                "reordered",
                f"position {event.position} does not follow {prev_position}",
            )
        if event.prev_hash != prev_hash:
            return ChainBreak(
                stream_id,
                event.position,
                event.version,
                "broken_link",
                "prev_hash is not the previous event's hash",
            )
        actual = event_hash(
            event.stream_id,
            event.version,
            event.type,
            event.schema_version,
            event.recorded_at,
            event.payload,
            event.prev_hash,
        )
        if actual != event.hash:
            return ChainBreak(
                stream_id,
                event.position,
                event.version,
                "hash_mismatch",
                "content does not hash to the recorded hash (edited?)",
            )
        prev_hash = event.hash
        prev_position = event.position
        expected_version += 1
    last = expected_version - 1
    if head_version is not None and head_version != last:
        return ChainBreak(
            stream_id,
            prev_position,
            last,
            "head_mismatch",
            f"stream head says version {head_version}, the log ends at {last}",
        )
    return None
