"""The audit (R13, R14, R17): every stream's hash chain and version sequence, replay against the
stored projection, every referenced card snapshot present and hashing to its key, and every
content record an event outlines present and hashing, with its salt, to the digest the event
carries (``content_missing``, ``content_mismatch``). No network.

The audit may run beside processes still writing (``cardfence audit`` while ``serve`` runs): each
stream is checked as of its head read first, so events appended since are not taken for a
broken chain or a wrong projection (they are checked by the next audit); events beyond a head
that has not moved were written without it, and are reported.

Unknown event types (from a newer cardfence) are reported, not crashed on: the replay leaves the
state unchanged for them, so a projection a newer version wrote may then differ, and says so. A
known event whose payload cannot be folded (a field its type holds is missing or of another type)
is reported at its position as ``replay_failed``, and the audit goes on with the next stream.
A payload that is not a JSON object at all (altered in the store) is ``payload_invalid``, and
its stream is not replayed.

With ``verify_signatures`` (``cardfence audit --verify-signatures``), every card read recorded as
verified (a ``CardFetched`` whose ``signature`` says ``verified``) is verified again: its stored
snapshot with the signatures the event recorded, against the key set stored under the revision
the event names. A failure is a ``signature_invalid`` violation.

:func:`rebuild_projections` (``cardfence audit --rebuild-projections``) repairs what the log can
repair: a stream whose only violations are of its projection (altered in the store: not a JSON
object, or not what its events replay to), its chain intact and every event folded, has its
projection rewritten from its events (its head row put back, when it was deleted) -- the log
is the truth, the projection derived from it.
Nothing else is ever written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cardfence.engine.cards.signatures import reverify
from cardfence.engine.client.tasklog import projection_of
from cardfence.engine.core import content
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import is_live
from cardfence.engine.core.replay import State, fold_agent, fold_task
from cardfence.store.chain import content_hash, salted_hash, verify_chain
from cardfence.store.event_store import EventStore
from cardfence.store.records import Projection, RecordedEvent, StreamRecord, json_object

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
    signatures_checked: int | None = None  # verified card reads checked again; None: not asked
    rebuilt: tuple[str, ...] | None = None  # streams whose projection was rebuilt; None: not asked
    contents_checked: int = 0  # content records checked against their digests (R17)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "streams_checked": self.streams_checked,
            "events_checked": self.events_checked,
            "contents_checked": self.contents_checked,
            "violations": [v.to_json() for v in self.violations],
        }
        if self.signatures_checked is not None:
            document["signatures_checked"] = self.signatures_checked
        if self.rebuilt is not None:
            document["rebuilt"] = list(self.rebuilt)
        return document


def replay(stream_id: str, events: Iterable[RecordedEvent]) -> State | None:
    """Fold a stream's events into its projection; ``None`` for a stream kind we do not know."""
    return _fold(stream_id, ((e.type, e.data) for e in events))


def _fold(stream_id: str, pairs: Iterable[tuple[str, Mapping[str, Any]]]) -> State | None:
    if stream_id.startswith(ev.AGENT_STREAM_PREFIX):
        return fold_agent(stream_id.removeprefix(ev.AGENT_STREAM_PREFIX), pairs)
    if stream_id.startswith(ev.TASK_STREAM_PREFIX):
        return fold_task(stream_id.removeprefix(ev.TASK_STREAM_PREFIX), pairs)
    return None


def audit(store: EventStore, *, verify_signatures: bool = False) -> AuditReport:
    """Check every stream and every card snapshot the store holds; with ``verify_signatures``,
    every card read recorded as verified is verified again."""
    violations: list[Violation] = []
    referenced: dict[str, tuple[str, int]] = {}
    signed: list[tuple[str, int, dict[str, Any]]] = []
    streams = events_checked = contents_checked = 0
    for stream_id, (head, logged) in _as_of_heads(store):
        streams += 1
        events_checked += len(logged)
        broken = verify_chain(stream_id, logged, None if head is None else head.version)
        if broken is not None:
            violations.append(Violation(stream_id, broken.position, broken.kind, broken.detail))
        decoded: list[tuple[int, str, dict[str, Any]]] = []  # (position, type, payload)
        outlined: dict[str, int] = {}  # R17: digest -> the first event outlining it
        for event in logged:
            if event.type not in ev.KNOWN_EVENTS:
                violations.append(
                    Violation(
                        stream_id, event.position, "unknown_event_type",
                        f"{event.type} (schema {event.schema_version}) is not in this "
                        "cardfence's catalogue: written by a newer version?",
                    )
                )  # fmt: skip
            data = json_object(event.payload)
            if isinstance(data, str):
                violations.append(
                    Violation(stream_id, event.position, "payload_invalid",
                              f"the payload {data}: nothing in it was read")
                )  # fmt: skip
                continue
            decoded.append((event.position, event.type, data))
            for digest in content.outline_digests(event.type, data):
                outlined.setdefault(digest, event.position)
            for name in _REVISION_FIELDS.get(event.type, ()):
                revision = data.get(name)
                if isinstance(revision, str) and revision:
                    referenced.setdefault(revision, (stream_id, event.position))
            keys = _verified_keys(event.type, data)
            if keys is not None:  # a signed card read: the key set it was verified with is stored
                if keys:
                    referenced.setdefault(keys, (stream_id, event.position))
                signed.append((stream_id, event.position, data))
        if head is not None and head.unreadable is not None:
            violations.append(
                Violation(stream_id, logged[-1].position if logged else 0, "projection_invalid",
                          f"the stored projection {head.unreadable}: it was not compared")
            )  # fmt: skip
        elif len(decoded) == len(logged):  # else there is nothing to replay it from (reported)
            violations.extend(_projection_check(stream_id, decoded, head.state if head else None))
        if outlined:
            contents_checked += len(outlined)
            violations.extend(_content_check(store, stream_id, outlined))
    violations.extend(_snapshot_check(store, referenced))
    signatures = None
    if verify_signatures:
        violations.extend(_signature_check(store, signed))
        signatures = len(signed)
    return AuditReport(
        streams, events_checked, tuple(violations), signatures, contents_checked=contents_checked
    )


# The violations a rebuild from the log repairs: the projection's own, nothing of the log's.
REBUILDABLE = frozenset({"projection_mismatch", "projection_invalid", "projection_missing"})


def rebuild_projections(store: EventStore, *, verify_signatures: bool = False) -> AuditReport:
    """Audit; rewrite from its events the projection of every stream whose violations are all
    in :data:`REBUILDABLE` (its chain checked again as of the head the rewrite is made on, which
    is refused if the head moves meanwhile); then audit again. The report is the second audit's
    (the first's when nothing was rebuilt), with the streams rebuilt."""
    first = audit(store, verify_signatures=verify_signatures)
    kinds: dict[str, set[str]] = {}
    for violation in first.violations:
        kinds.setdefault(violation.stream, set()).add(violation.kind)
    rebuilt: list[str] = []
    for stream_id in sorted(s for s, found in kinds.items() if found <= REBUILDABLE):
        head, logged = store.read_as_of_head(stream_id)
        version = head.version if head is not None else None
        if not logged or verify_chain(stream_id, logged, version) is not None:
            continue  # appended to meanwhile, and broken: the next audit says so
        state = replay(stream_id, logged)
        projection = None if state is None else _projection_for(stream_id, state)
        if projection is None:
            continue
        last = logged[-1]
        done = (
            store.restore_head(stream_id, last.version, projection, last.recorded_at)
            if head is None  # its head row deleted: put back as of its last event
            else store.rewrite_projection(stream_id, head.version, projection)
        )
        if done:
            rebuilt.append(stream_id)
    after = audit(store, verify_signatures=verify_signatures) if rebuilt else first
    return dataclasses.replace(after, rebuilt=tuple(rebuilt))


def _projection_for(stream_id: str, state: State) -> Projection | None:
    """The projection an append writes for ``state``, its due-work row made to match."""
    if stream_id.startswith(ev.AGENT_STREAM_PREFIX):
        origin = stream_id.removeprefix(ev.AGENT_STREAM_PREFIX)
        return Projection(state, category=ev.AGENT_CATEGORY, alias=origin)
    if stream_id.startswith(ev.TASK_STREAM_PREFIX):
        return dataclasses.replace(projection_of(state), live=is_live(state))
    return None


def _as_of_heads(
    store: EventStore, batch: int = 500
) -> Iterator[tuple[str, tuple[StreamRecord | None, list[RecordedEvent]]]]:
    """Every stream, each with its head and its events as of it (``read_as_of_head``), read
    ``batch`` streams at a time: a few queries a batch, not a few a stream."""
    ids = store.stream_ids()
    for start in range(0, len(ids), batch):
        read = store.read_as_of_heads(ids[start : start + batch])
        yield from read.items()


def _verified_keys(type_: str, data: Mapping[str, Any]) -> str | None:
    """The stored key set's revision of a card read recorded as verified, else None."""
    signature = data.get("signature") if type_ == ev.CARD_FETCHED else None
    if not isinstance(signature, dict) or signature.get("status") != "verified":
        return None
    keys = signature.get("keys")
    revision = keys.get("revision") if isinstance(keys, dict) else None
    return revision if isinstance(revision, str) and revision else ""


def _signature_check(
    store: EventStore, signed: list[tuple[str, int, dict[str, Any]]]
) -> list[Violation]:
    out: list[Violation] = []
    for stream, position, data in signed:
        revision = str(data.get("revision") or "")
        record = data["signature"]
        keys_revision = _verified_keys(ev.CARD_FETCHED, data) or ""
        card = store.get_snapshot(revision) if revision else None
        keys = store.get_snapshot(keys_revision) if keys_revision else None
        if card is None or keys is None:
            missing = "card snapshot" if card is None else "key set"
            reason: str | None = f"the {missing} it was verified with is not stored"
        else:
            reason = reverify(card.body, record, keys.body)
        if reason is not None:
            out.append(
                Violation(stream, position, "signature_invalid",
                          f"card revision {revision[:12]}: {reason}")
            )  # fmt: skip
    return out


def _projection_check(
    stream_id: str,
    decoded: list[tuple[int, str, dict[str, Any]]],
    stored: Mapping[str, Any] | None,
) -> list[Violation]:
    """The stream's events (``(position, type, payload)``, each payload decoded once, by the
    audit's walk) folded and compared with its stored projection."""
    folded = 0  # the position of the event being folded
    position = decoded[-1][0] if decoded else 0

    def folding() -> Iterator[tuple[str, Mapping[str, Any]]]:
        nonlocal folded
        for at, type_, data in decoded:
            folded = at
            yield type_, data

    try:
        replayed = _fold(stream_id, folding())
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        # A known event whose payload lacks what it must hold: altered, or written by a
        # cardfence that recorded it otherwise. Reported where the fold stopped, never raised.
        return [
            Violation(
                stream_id, folded, "replay_failed",
                f"the fold stopped here ({type(error).__name__}: {str(error)[:200]}): the "
                "payload lacks what its type holds",
            )
        ]  # fmt: skip
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


def _content_check(
    store: EventStore, stream_id: str, outlined: Mapping[str, int]
) -> list[Violation]:
    """Each content record the stream's events outline: kept, and hashing with its salt to the
    digest its event carries (R17)."""
    out: list[Violation] = []
    kept = store.contents(stream_id, outlined)
    for digest, position in sorted(outlined.items(), key=lambda item: item[1]):
        record = kept.get(digest)
        if record is None:
            out.append(
                Violation(stream_id, position, "content_missing",
                          f"content {digest} is outlined by the event but not kept")
            )  # fmt: skip
        elif not _hashes_to(record.salt, record.body, digest):
            out.append(
                Violation(stream_id, position, "content_mismatch",
                          f"content kept as {digest} does not hash to it: altered in the store")
            )  # fmt: skip
    return out


def _hashes_to(salt: str, body: str, digest: str) -> bool:
    try:
        return salted_hash(salt, body) == digest
    except ValueError:  # a salt that is not hex: altered in the store
        return False


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
