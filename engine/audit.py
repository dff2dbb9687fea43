"""The audit (R13, R14): every stream's hash chain and version sequence, replay against the stored
projection, and every referenced card snapshot present and hashing to its key. No network.

Unknown event types (from a newer cardfence) are reported, not crashed on: the replay leaves the
state unchanged for them, so a projection a newer version wrote may then differ, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cardfence.engine import events as ev
from cardfence.engine.replay import State, fold_agent, fold_task
from cardfence.store import EventStore, RecordedEvent
from cardfence.store.chain import content_hash, verify_chain

# Payload fields that name a card revision, by event type (R14: events refer to revisions).
_REVISION_FIELDS: Mapping[str, tuple[str, ...]] = {
    ev.CARD_FETCHED: ("revision", "public_revision"),
    ev.CONTRACT_PINNED: ("revision",),
    ev.CONTRACT_ACCEPTED: ("revision",),
    ev.TASK_SUBMITTED: ("card_revision", "public_revision"),
    ev.CARD_REVISION_CHANGED: ("old", "new"),
    ev.WEBHOOK_REGISTERED: ("card_revision",),
    ev.DELIVERY_DOWNGRADED: ("card_revision",),
    ev.FLAGGED_FOR_REVIEW: ("revision",),
    ev.CONTRACT_DIVERGED: ("revision",),
    ev.TASK_ORPHANED: ("revision",),
}


@dataclass(frozen=True, slots=True)
class Violation:
    stream: str
    position: int
    kind: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "position": self.position,
            "kind": self.kind,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class AuditReport:
    streams_checked: int
    events_checked: int
    violations: tuple[Violation, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "streams_checked": self.streams_checked,
            "events_checked": self.events_checked,
            "violations": [v.to_json() for v in self.violations],
        }


def replay(stream_id: str, events: Iterable[RecordedEvent]) -> State | None:
    """Fold a stream's events into its projection; ``None`` for a stream kind we do not know."""
    pairs = ((e.type, e.data) for e in events)
    if stream_id.startswith(ev.AGENT_STREAM_PREFIX):
        return fold_agent(stream_id.removeprefix(ev.AGENT_STREAM_PREFIX), pairs)
    if stream_id.startswith(ev.TASK_STREAM_PREFIX):
        return fold_task(stream_id.removeprefix(ev.TASK_STREAM_PREFIX), pairs)
    return None


def audit(store: EventStore) -> AuditReport:
    """Check every stream and every card snapshot the store holds."""
    violations: list[Violation] = []
    referenced: dict[str, tuple[str, int]] = {}
    streams = events_checked = 0
    for stream_id in store.stream_ids():
        streams += 1
        logged = store.read_stream(stream_id)
        events_checked += len(logged)
        head = store.stream(stream_id)
        broken = verify_chain(stream_id, logged, None if head is None else head.version)
        if broken is not None:
            violations.append(Violation(stream_id, broken.position, broken.kind, broken.detail))
        for event in logged:
            if event.type not in ev.KNOWN_EVENTS:
                violations.append(
                    Violation(
                        stream_id, event.position, "unknown_event_type",
                        f"{event.type} (schema {event.schema_version}) is not in this "
                        "cardfence's catalogue: written by a newer version?",
                    )
                )  # fmt: skip
            for name in _REVISION_FIELDS.get(event.type, ()):
                revision = event.data.get(name)
                if isinstance(revision, str) and revision:
                    referenced.setdefault(revision, (stream_id, event.position))
        violations.extend(_projection_check(stream_id, logged, head.state if head else None))
    violations.extend(_snapshot_check(store, referenced))
    return AuditReport(streams, events_checked, tuple(violations))


def _projection_check(
    stream_id: str, logged: list[RecordedEvent], stored: Mapping[str, Any] | None
) -> list[Violation]:
    replayed = replay(stream_id, logged)
    position = logged[-1].position if logged else 0
    if replayed is None:
        return [Violation(stream_id, position, "unknown_stream", "not an agent or task stream")]
    if stored is None:
        return [Violation(stream_id, position, "projection_missing", "no stored projection")]
    if replayed == stored:
        return []
    keys = sorted(k for k in set(replayed) | set(stored) if replayed.get(k) != stored.get(k))
    return [
        Violation(
            stream_id, position, "projection_mismatch",
            f"replay differs from the stored projection in: {', '.join(keys)}",
        )
    ]  # fmt: skip


def _snapshot_check(
    store: EventStore, referenced: Mapping[str, tuple[str, int]]
) -> list[Violation]:
    out: list[Violation] = []
    for revision in sorted(set(store.snapshot_revisions()) | set(referenced)):
        stream, position = referenced.get(revision, ("card_snapshots", 0))
        snapshot = store.get_snapshot(revision)
        if snapshot is None:
            out.append(
                Violation(stream, position, "snapshot_missing", f"card revision {revision} is "
                          "referenced but not stored")
            )  # fmt: skip
        elif content_hash(snapshot.body) != revision:
            out.append(
                Violation(stream, position, "snapshot_mismatch",
                          f"card snapshot {revision} does not hash to its key")
            )  # fmt: skip
    return out
