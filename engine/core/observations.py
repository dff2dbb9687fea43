"""Applying what the remote agent reports about a task: the continuation path (R1, R10, R12).

Pure: no I/O, and — by construction of its signature — no card, no discovery outcome. Whatever the
source (a SendMessage or CancelTask answer, a GetTask result, an authenticated push delivery, a
stream event), an observation goes through :func:`apply_observation`, which returns the events to
record. The task's sequence of ``StateChanged`` events is therefore a function of the remote's
reports alone (R1), and the property tests prove it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from cardfence.engine.core import events as ev
from cardfence.engine.core.answers import (
    MAX_ANSWER_BYTES,
    Artifact,
    Part,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    StreamUpdate,
    TaskState,
)
from cardfence.engine.core.lifecycle import TERMINAL, is_legal

# Why an observation changed no state (ObservationIgnored.reason).
IGNORED_UNKNOWN = "unknown_state"  # the remote reported `unknown` / an unrecognised state
IGNORED_AFTER_TERMINAL = "after_terminal"  # terminal states absorb (R10)
IGNORED_DUPLICATE = "duplicate"  # the same state at the same time: a redelivery (R12)
IGNORED_STALE = "stale"  # older than what was already applied (R12)
IGNORED_SAME_STATE = "same_state"  # newer, but no transition (e.g. a new status message)
IGNORED_ILLEGAL = "illegal"  # not a transition the lifecycle allows (e.g. back to submitted)

# Task flags raised by what an observation carried (FlaggedForReview reason, recorded once).
FLAG_CLOCK_SKEW = "clock_skew"  # a status timestamp too far ahead was not used for ordering
FLAG_PAYLOAD_TRUNCATED = "payload_truncated"  # an oversize part was kept as size + SHA-256
FLAG_GENERATION_SKEW = "generation_skew"  # a generation too far ahead was not used for ordering
FLAG_ARTIFACT_DROPPED = "artifact_dropped"  # one answer named an artifactId twice: one was kept

DEFAULT_MAX_CLOCK_SKEW: Final = 300.0
"""Seconds a status timestamp may be ahead of local receipt and still order reports (R12)."""
MAX_GENERATION: Final = 2**53
"""The largest generation that orders reports (R12): past it, JSON numbers stop being exact."""
MAX_GENERATION_STEP: Final = 10**6
"""How far above the last generation applied (0 when none) a generation may be and still order
reports (R12): one far ahead would make every later report stale."""

# R16: what one event keeps of a remote report. Its parts are kept out of line (R17): the event
# holds an outline of each ({kind, media_type, size, sha256}), its content a record beside it. So
# an artifact or a status message is kept whole up to the transport's bound on an answer, and
# what bounds the event, and the artifact's record in the projection, is the number of its parts
# and their media types: at most MAX_RECORDED_PARTS parts, each outline at most about 400 bytes
# (a media type of MAX_RECORDED_MEDIA_TYPE_CHARS, a 64-digit digest, the size and the keys): under
# 400 KiB, well within the store's 1 MiB per event (``store._base.DEFAULT_MAX_PAYLOAD_BYTES``),
# and about what an artifact kept whole added to a projection before (256 KiB inline). Beyond any
# of these bounds the artifact or message is kept as its size and SHA-256 (flag
# ``payload_truncated``). tests/unit/core/test_observations.py checks the arithmetic.
MAX_RECORDED_ARTIFACT_BYTES: Final = MAX_ANSWER_BYTES
"""An artifact whose record ({id, name, parts} as stored JSON) is longer is kept as a digest."""
MAX_RECORDED_MESSAGE_BYTES: Final = MAX_ANSWER_BYTES
"""A status message whose stored JSON text is longer is kept as a digest."""
MAX_RECORDED_PARTS: Final = 1024
"""An artifact (chunks held included) or a status message of more parts is kept as a digest."""
MAX_REPORT_PARTS: Final = 32 * MAX_RECORDED_PARTS
"""The parts one report keeps whole over all its artifacts: past them, its later artifacts are
kept as digests. An answer of many artifacts of tiny parts (each outline up to eight times its
wire form) then adds at most 32,768 outlines, 12 MiB, to the projection, and the rest of its
records under five times its wire form (40 MiB): within the projection's 64 MiB
(``store._base.DEFAULT_MAX_PROJECTION_BYTES``)."""
MAX_RECORDED_MEDIA_TYPE_CHARS: Final = 255
"""An artifact or a status message with a part whose media type is longer as stored JSON (RFC
6838 allows 127 characters each to a type and its subtype) is kept as a digest."""
MAX_RECORDED_NAME_CHARS: Final = 256
"""The characters of an artifact's name kept when the artifact is kept as a digest."""


def _outlined_fits(parts: Iterable[Any], held: int = 0) -> bool:
    """Whether ``parts`` (after ``held`` parts already kept) outline within the bounds above."""
    count = held
    for part in parts:
        count += 1
        media_type = part.get("media_type") if isinstance(part, Mapping) else None
        if count > MAX_RECORDED_PARTS or (
            media_type is not None
            and len(stored_json(media_type)) - 2 > MAX_RECORDED_MEDIA_TYPE_CHARS
        ):
            return False
    return True


def stored_json(value: Any) -> str:
    """``value`` as the store encodes a payload (compact, ASCII, sorted keys): its length is the
    length the store checks against its limit."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """An artifact as recorded: its id, name and parts (JSON-able). ``append``: a chunk, whose
    parts extend the artifact of that id already held (A2A ``append``); ``chunks``: how many of
    the agent's chunks it is (:func:`coalesced` makes one of several)."""

    artifact_id: str
    name: str | None
    parts: tuple[Mapping[str, Any], ...] = ()
    append: bool = False
    chunks: int = 1  # a chunk: how many of the agent's chunks it holds (see coalesced)

    def to_json(self) -> dict[str, Any]:
        """The ``ArtifactReceived`` payload (without ``source``): id, name and parts with their
        size and SHA-256 (of the stored JSON of id, name and parts), or, over
        :data:`MAX_RECORDED_ARTIFACT_BYTES` or :data:`MAX_RECORDED_PARTS` (or with a media type
        too long), id, name, size and SHA-256 with ``truncated``."""
        whole = {"artifact_id": self.artifact_id, "name": self.name, "parts": list(self.parts)}
        text = stored_json(whole)
        size, digest = len(text), _sha256(text)
        if size <= MAX_RECORDED_ARTIFACT_BYTES and _outlined_fits(self.parts):
            return {**whole, "bytes": size, "sha256": digest}
        name = self.name if self.name is None else self.name[:MAX_RECORDED_NAME_CHARS]
        return {
            "artifact_id": self.artifact_id,
            "name": name,
            "truncated": True,
            "bytes": size,
            "sha256": digest,
        }


@dataclass(frozen=True, slots=True)
class Observation:
    """One report from the remote about a task.

    ``state`` is a lower-case A2A state name or ``None`` (an artifact-only update).
    ``remote_timestamp`` and ``generation`` order observations (R12); without either, an
    observation is ordered by arrival.
    """

    source: str
    state: str | None
    remote_timestamp: datetime | None = None
    generation: int | None = None
    message: str | None = None
    artifacts: tuple[ArtifactRecord, ...] = ()
    remote_task_id: str | None = None
    remote_context_id: str | None = None
    received_at: datetime | None = None  # local receipt time: bounds how far ahead a timestamp
    # may be and still order reports (R12); None: not checked (the engine always sets it)
    # The status message's parts when one is not text (a form as a data part, a file): all of
    # them, in order; () when the text says it all.
    message_parts: tuple[Mapping[str, Any], ...] = ()


def apply_observation(
    task: Mapping[str, Any],
    observation: Observation,
    *,
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
) -> list[ev.TaskEvent]:
    """The events that record ``observation`` against the task's current projection.

    One state event (``StateChanged`` or ``ObservationIgnored`` with its reason) when the
    observation carries a state, plus one ``ArtifactReceived`` per artifact not seen before (by
    ``artifactId`` and content), plus a ``FlaggedForReview`` the first time a task meets a
    timestamp or a generation too far ahead (``clock_skew``, ``generation_skew``), a part too
    large to keep (``payload_truncated``) or a report naming one artifact twice with different
    contents (``artifact_dropped``).

    Repeats never grow the log without bound (R12): a report that is exactly one already
    recorded since the last reply records one ``ObservationIgnored`` (``duplicate``,
    ``repeat: true``) the first time it comes back — nothing for a poll — and nothing ever after;
    a newer one saying the state and status message already applied again, with no new or changed
    artifact, records nothing.
    """
    usable = _usable_timestamp(observation, max_clock_skew)
    held = {a["artifact_id"]: a for a in task.get("artifacts") or ()}
    reported = [a for a in observation.artifacts if a.parts or not a.append]  # empty chunk: none
    records, dropped = _one_per_id(reported, held)
    report = _fingerprint(observation, records)
    flags = task.get("flags") or ()
    state_event: ev.StateChanged | ev.ObservationIgnored | None = None
    out: list[ev.TaskEvent] = []
    if observation.state is not None:
        if _is_repeat(task, report):
            if not (observation.source == "poll" or report in task.get("reports_repeated", ())):
                out.append(_repeat(observation, report))
            # Otherwise the same report read again: recorded once, then counted out.
            return out + _dropped_flag(dropped, flags)
        state_event = _state_event(task, observation, usable, report)
    received = _artifact_events(task, observation, records, dropped, held)
    if state_event and _kept(task, observation, state_event, received):
        out.append(state_event)
    out += received
    if _skewed(observation, max_clock_skew) and FLAG_CLOCK_SKEW not in flags:
        detail = (
            f"status timestamp {_iso(observation.remote_timestamp)} is more than "
            f"{max_clock_skew:g} s ahead of its receipt at {_iso(observation.received_at)}; "
            "not used for ordering"
        )
        out.append(ev.FlaggedForReview(reason=FLAG_CLOCK_SKEW, detail=detail))
    if _generation_skewed(task, observation) and FLAG_GENERATION_SKEW not in flags:
        detail = (
            f"generation {observation.generation} is above 2^53 or more than "
            f"{MAX_GENERATION_STEP:,} above the last one applied ({_last_generation(task)}); "
            "not used for ordering"
        )
        out.append(ev.FlaggedForReview(reason=FLAG_GENERATION_SKEW, detail=detail))
    truncated = any(event.truncated for event in received)
    message_cut = any(isinstance(e, ev.StateChanged) and e.payload_truncated for e in out)
    if (truncated or message_cut) and FLAG_PAYLOAD_TRUNCATED not in flags:
        detail = "an oversize part of a remote report was kept as its size and SHA-256"
        out.append(ev.FlaggedForReview(reason=FLAG_PAYLOAD_TRUNCATED, detail=detail))
    return out + _dropped_flag(dropped, flags)


def _kept(
    task: Mapping[str, Any],
    observation: Observation,
    event: ev.StateChanged | ev.ObservationIgnored,
    received: list[ev.ArtifactReceived],
) -> bool:
    """Whether the state event of a report that is not a repeat of a recorded one is appended."""
    reason = event.reason if isinstance(event, ev.ObservationIgnored) else None
    if observation.source == "poll" and reason == IGNORED_DUPLICATE:
        # A poll that reads back exactly what was already applied is the same report read
        # again, not a new one: recording it would add an event per safety poll for hours.
        return False
    # R12: the state the task is in, its status message again and no new or changed artifact is
    # a repeat whatever its timestamp (or generation): an agent restamping its status on every
    # poll must not add an event per poll. Counted, not appended (Observing.apply).
    restamped = event.said == task.get("last_said") and event.remote_task_id is None
    return not (reason == IGNORED_SAME_STATE and not received and restamped)


def _artifact_events(
    task: Mapping[str, Any],
    observation: Observation,
    records: list[dict[str, Any]],
    dropped: Mapping[str, list[dict[str, Any]]],
    held: Mapping[str, Mapping[str, Any]],
) -> list[ev.ArtifactReceived]:
    """One ``ArtifactReceived`` per record not held already, nor a version replaced before."""
    seen = {artifact_id: a.get("sha256") for artifact_id, a in held.items()}
    # Versions a later one replaced: never appended again (R12), or an agent alternating two
    # versions of one artifact would grow the log on every read.
    superseded = task.get(ev.SUPERSEDED_ARTIFACTS) or {}
    out: list[ev.ArtifactReceived] = []
    for record in records:
        artifact_id, digest = record["artifact_id"], record["sha256"]
        if seen.get(artifact_id) == digest:
            continue  # the same artifact again
        if record.get("append") or digest not in superseded.get(artifact_id, ()):
            # A chunk is never a version the agent went back to: it always adds to what is held.
            replaces = artifact_id in seen and not record.get("append")
            out.append(
                ev.ArtifactReceived(
                    artifact_id=artifact_id,
                    name=record["name"],
                    parts=record.get("parts"),
                    bytes=record.get("bytes"),
                    sha256=digest,
                    truncated=record.get("truncated"),
                    append=record.get("append"),
                    partial=record.get("partial"),
                    chunks=record.get("chunks"),
                    source=observation.source,
                    replaces=True if replaces else None,
                    dropped=dropped.get(artifact_id),
                )
            )
            seen[artifact_id] = digest
    return out


def _one_per_id(
    reported: Iterable[ArtifactRecord], held: Mapping[str, Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """One record per artifactId, the last one reported winning (in the place of the first), and
    by id the size and SHA-256 of the other versions the same report gave and that were dropped.

    A report naming one id twice must not flip-flop between the two versions, appending both,
    every time it is read again; and what it dropped is said, so the audit can tell (R12)."""
    records: dict[str, dict[str, Any]] = {}
    earlier: dict[str, list[dict[str, Any]]] = {}
    for artifact in reported:
        record = _recorded(artifact, held)
        before = records.get(artifact.artifact_id)
        if before is not None:
            version = {"bytes": before["bytes"], "sha256": before["sha256"]}
            earlier.setdefault(artifact.artifact_id, []).append(version)
        records[artifact.artifact_id] = record
    dropped: dict[str, list[dict[str, Any]]] = {}
    for artifact_id, versions in earlier.items():
        kept = records[artifact_id]["sha256"]
        digests = {v["sha256"]: v for v in versions if v["sha256"] != kept}  # each once
        if digests:
            dropped[artifact_id] = list(digests.values())
    return _within_report(records.values()), dropped


def _within_report(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` in order, those past :data:`MAX_REPORT_PARTS` parts kept whole by the ones
    before them kept as their size and digest (the digest unchanged, so a report read again is
    the same report)."""
    out: list[dict[str, Any]] = []
    kept = 0
    for record in records:
        parts = record.get("parts")
        if isinstance(parts, list) and parts:
            kept += len(parts)
            if kept > MAX_REPORT_PARTS:
                record = {k: v for k, v in record.items() if k != "parts"}
                if not record.get("append") and isinstance(record.get("name"), str):
                    record["name"] = record["name"][:MAX_RECORDED_NAME_CHARS]
                record["truncated"] = True
        out.append(record)
    return out


def _dropped_flag(
    dropped: Mapping[str, list[dict[str, Any]]], flags: Iterable[str]
) -> list[ev.TaskEvent]:
    """The ``artifact_dropped`` flag, the first time a report of the task dropped a version."""
    if not dropped or FLAG_ARTIFACT_DROPPED in flags:
        return []
    artifact_id, versions = next(iter(dropped.items()))
    more = sum(len(v) for v in dropped.values()) - 1
    detail = (
        f"one report named artifactId {artifact_id[:MAX_RECORDED_NAME_CHARS]!r} more than once "
        f"with different contents; the last was kept, and the one of {versions[0]['bytes']} "
        f"bytes with SHA-256 {versions[0]['sha256']} dropped"
        + (f" (and {more} more)" if more else "")
    )
    return [ev.FlaggedForReview(reason=FLAG_ARTIFACT_DROPPED, detail=detail)]


def _usable_timestamp(observation: Observation, max_clock_skew: float) -> datetime | None:
    """The status timestamp if it may order reports: not more than ``max_clock_skew`` ahead of
    the local receipt time (R12)."""
    if observation.remote_timestamp is None or _skewed(observation, max_clock_skew):
        return None
    return observation.remote_timestamp


def _skewed(observation: Observation, max_clock_skew: float) -> bool:
    stamp, received = observation.remote_timestamp, observation.received_at
    if stamp is None or received is None:
        return False
    return stamp - received > timedelta(seconds=max_clock_skew)


def _generation_skewed(task: Mapping[str, Any], observation: Observation) -> bool:
    """Whether the report's generation is too far ahead to order reports (R12): above
    :data:`MAX_GENERATION`, or more than :data:`MAX_GENERATION_STEP` above the last applied."""
    generation = observation.generation
    if generation is None:
        return False
    return generation > MAX_GENERATION or generation - _last_generation(task) > MAX_GENERATION_STEP


def _last_generation(task: Mapping[str, Any]) -> int:
    applied = task.get("generation")
    return applied if isinstance(applied, int) else 0


def _usable_generation(task: Mapping[str, Any], observation: Observation) -> int | None:
    """The report's generation if it may order reports (R12)."""
    return None if _generation_skewed(task, observation) else observation.generation


def _said(observation: Observation) -> str:
    """What a report says of the task's status, whenever it says it: its state and status
    message (R12: said again later with no new or changed artifact, it is a repeat)."""
    said = [observation.state, observation.message, list(observation.message_parts)]
    return _sha256(stored_json(said))[:32]


def _fingerprint(observation: Observation, records: list[dict[str, Any]]) -> str:
    """What makes two reports the same report: state, timestamp as reported, generation, status
    message and artifacts (ids and contents). Not the source: a push and a poll of one moment
    are one report."""
    said: list[Any] = [
        observation.state,
        _iso(observation.remote_timestamp),
        observation.generation,
        observation.message,
        [[r["artifact_id"], r["sha256"]] for r in records],
    ]
    if observation.message_parts:  # only then: the reports recorded before they were read
        said.append(list(observation.message_parts))
    return _sha256(stored_json(said))[:32]


def _is_repeat(task: Mapping[str, Any], report: str) -> bool:
    # A report recorded once is a repeat whenever it comes back, until a reply (``ReplySent``
    # clears the memory: after one, the remote may rightly report a state it reported before,
    # and without a timestamp or a message that report is the same bytes).
    return report == task.get("last_report") or report in set(task.get("reports_seen") or ())


def _repeat(observation: Observation, report: str) -> ev.ObservationIgnored:
    return ev.ObservationIgnored(
        reason=IGNORED_DUPLICATE,
        state=observation.state,
        source=observation.source,
        remote_timestamp=None,
        report=report,
        repeat=True,
    )


def _recorded(artifact: ArtifactRecord, held: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What ``artifact`` is recorded as: itself whole, or -- a chunk of one already held -- its
    own parts marked ``append``. A chunk costs what it holds, never the artifact again (an
    answer streamed token by token is thousands of chunks): its ``bytes`` add its parts' stored
    JSON to those held, its ``sha256`` chains the held digest with them, and past
    :data:`MAX_RECORDED_ARTIFACT_BYTES` or :data:`MAX_RECORDED_PARTS` (those held and its own)
    it is kept ``truncated``, as that size and digest. So a
    chunk-built artifact's digest is its own: the whole one read when the task ends is recorded
    once. A chunk of an artifact not held (its first chunks came before the stream was followed)
    is kept as it comes, marked ``partial``."""
    before = held.get(artifact.artifact_id)
    if not artifact.append:
        return artifact.to_json()
    counted = {"chunks": artifact.chunks} if artifact.chunks > 1 else {}
    added = stored_json(list(artifact.parts))
    if before is None:
        # Its digest chains nothing held with its parts: never the digest of a whole artifact
        # of the same content, so the whole read that completes it is recorded, unmarking it.
        chained = _sha256(f"None{added}")
        return {**artifact.to_json(), "sha256": chained, "partial": True, **counted}
    size = int(before.get("bytes") or 0) + len(added)
    record: dict[str, Any] = {
        "artifact_id": artifact.artifact_id,
        "name": before.get("name"),
        "bytes": size,
        "sha256": _sha256(f"{before.get('sha256')}{added}"),
        "append": True,
        **counted,
    }
    held_parts = before.get("parts")
    if (
        isinstance(held_parts, list)
        and size <= MAX_RECORDED_ARTIFACT_BYTES
        and _outlined_fits(artifact.parts, len(held_parts))
    ):
        return {**record, "parts": list(artifact.parts)}  # the fold adds them to those held
    return {**record, "truncated": True}


def _state_event(
    task: Mapping[str, Any], observation: Observation, usable: datetime | None, report: str
) -> ev.StateChanged | ev.ObservationIgnored:
    current = task["state"]
    state = observation.state
    assert state is not None
    # R12: a timestamp too far ahead of its receipt to order anything is kept as reported, not
    # as order; a generation too far ahead likewise.
    clock_skew = usable is None and observation.remote_timestamp is not None
    generation = _usable_generation(task, observation)
    generation_skew = generation is None and observation.generation is not None
    # The observation that first names the remote task binds it (crash safety: docs/cli.md,
    # `run`).
    binds = bool(observation.remote_task_id) and not task.get("remote_task_id")
    remote_timestamp = _iso(usable)
    reported_timestamp = _iso(observation.remote_timestamp) if clock_skew else None
    reported_generation = observation.generation if generation_skew else None
    remote_task_id = observation.remote_task_id if binds else None
    remote_context_id = observation.remote_context_id if binds else ev.ABSENT

    reason = _ignored_reason(task, observation, usable)
    if reason is not None:
        return ev.ObservationIgnored(
            reason=reason,
            state=state,
            source=observation.source,
            remote_timestamp=remote_timestamp,
            reported_timestamp=reported_timestamp,
            clock_skew=True if clock_skew else None,
            generation=generation,
            reported_generation=reported_generation,
            generation_skew=True if generation_skew else None,
            remote_task_id=remote_task_id,
            remote_context_id=remote_context_id,
            said=_said(observation) if reason == IGNORED_SAME_STATE else None,
            report=report,
        )
    message: str | ev.Absent | None = ev.ABSENT
    message_parts: list[Mapping[str, Any]] | None = None
    message_bytes: int | None = None
    message_sha256: str | None = None
    if observation.message is not None:
        parts = list(observation.message_parts)
        said = {"message": observation.message, "message_parts": parts}
        text = stored_json(said if parts else observation.message)
        if len(text) <= MAX_RECORDED_MESSAGE_BYTES and _outlined_fits(parts):
            message, message_parts = observation.message, parts or None
        else:  # R16: kept as its size and SHA-256
            message, message_bytes, message_sha256 = None, len(text), _sha256(text)
    return ev.StateChanged(
        from_=current,
        to=state,
        source=observation.source,
        remote_timestamp=remote_timestamp,
        reported_timestamp=reported_timestamp,
        clock_skew=True if clock_skew else None,
        generation=generation,
        reported_generation=reported_generation,
        generation_skew=True if generation_skew else None,
        remote_task_id=remote_task_id,
        remote_context_id=remote_context_id,
        said=_said(observation),
        message=message,
        message_parts=message_parts,
        message_bytes=message_bytes,
        message_sha256=message_sha256,
        payload_truncated=True if message_sha256 is not None else None,
        report=report,
    )


def _ignored_reason(
    task: Mapping[str, Any], observation: Observation, usable: datetime | None
) -> str | None:
    current = task["state"]
    state = observation.state
    if state == TaskState.UNKNOWN:
        return IGNORED_UNKNOWN
    if current in TERMINAL:
        return IGNORED_DUPLICATE if state == current else IGNORED_AFTER_TERMINAL
    if state in TERMINAL:
        # R10, R12: terminal states absorb on the remote too, so a terminal report is true
        # whenever it was stamped: no agent clock (or generation) keeps it from being applied.
        return None
    order = _compare(task, observation, usable)
    if order < 0:
        return IGNORED_STALE
    if state == current:
        return IGNORED_DUPLICATE if order == 0 else IGNORED_SAME_STATE
    if not is_legal(current, state or ""):
        return IGNORED_ILLEGAL
    return None


def _compare(task: Mapping[str, Any], observation: Observation, usable: datetime | None) -> int:
    """-1 older than what was applied, 0 the same moment, 1 newer (or unordered: by arrival)."""
    applied_generation = task.get("generation")
    generation = _usable_generation(task, observation)
    # An applied generation past MAX_GENERATION (recorded before R12 bounded them) orders
    # nothing either: it would make every later report stale.
    if (
        generation is not None
        and applied_generation is not None
        and applied_generation <= MAX_GENERATION
    ):
        return _sign(generation - applied_generation)
    applied = task.get("remote_timestamp")
    observed = _iso(usable)
    if observed is None or not isinstance(applied, str):
        return 1
    # ISO 8601 UTC strings of one fixed format compare like the instants they name.
    return int(observed > applied) - int(observed < applied)


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def watermark_after(
    task: Mapping[str, Any], type_: str, data: Mapping[str, Any]
) -> tuple[str | None, int | None]:
    """The (timestamp, generation) an observation event leaves as "last applied" (R12).

    Used by the projection fold: a transition or a newer same-state report moves it; stale,
    duplicate, illegal and post-terminal reports do not.
    """
    current = (task.get("remote_timestamp"), task.get("generation"))
    moved = type_ == ev.STATE_CHANGED or (
        type_ == ev.OBSERVATION_IGNORED and data.get("reason") == IGNORED_SAME_STATE
    )
    if not moved:
        return current
    timestamp = data.get("remote_timestamp") or current[0]
    generation = data.get("generation", current[1])
    return timestamp, generation


# -- from what the wire said -----------------------------------------------------------------------


def part_record(part: Part) -> dict[str, Any]:
    """A part as recorded (JSON-able): its non-null fields."""
    fields = {
        "kind": part.kind,
        "text": part.text,
        "data": part.data,
        "url": part.url,
        "media_type": part.media_type,
        "filename": part.filename,
    }
    return {k: v for k, v in fields.items() if v is not None}


def artifact_record(artifact: Artifact, *, append: bool = False) -> ArtifactRecord:
    parts = tuple(part_record(part) for part in artifact.parts)
    return ArtifactRecord(artifact.artifact_id, artifact.name, parts, append)


def _message_parts(message: StatusMessage | RemoteMessage | None) -> tuple[dict[str, Any], ...]:
    """A status message's parts, recorded, when one of them is not text; else ()."""
    if message is None or all(part.kind == "text" for part in message.parts):
        return ()
    return tuple(part_record(part) for part in message.parts)


def from_task(task: RemoteTask, source: str) -> Observation:
    """An observation of a whole Task snapshot (send and cancel answers, polls, task pushes)."""
    return Observation(
        source=source,
        state=task.state,
        remote_timestamp=task.timestamp,
        generation=task.generation,
        message=task.message.text if task.message is not None else None,
        message_parts=_message_parts(task.message),
        artifacts=tuple(artifact_record(a) for a in task.artifacts),
        remote_task_id=task.id,
        remote_context_id=task.context_id,
    )


def from_message(message: RemoteMessage, source: str) -> Observation:
    """A SendMessage answered with a bare Message: the agent's final answer, no task (A2A §7.1).

    The remote reported the outcome itself, so the task is ``completed`` with that message.
    """
    return Observation(
        source=source,
        state="completed",
        message=message.text,
        message_parts=_message_parts(message),
    )


def from_update(update: StreamUpdate, source: str) -> Observation | None:
    """An observation of a push delivery or stream event; ``None`` when it says nothing of the
    task (a bare message)."""
    if update.kind == "task" and update.task is not None:
        return from_task(update.task, source)
    if update.kind == "status":
        return Observation(
            source=source,
            state=update.state,
            remote_timestamp=update.timestamp,
            generation=update.generation,
            message=update.message.text if update.message is not None else None,
            message_parts=_message_parts(update.message),
            remote_task_id=update.task_id,
            remote_context_id=update.context_id,
        )
    if update.kind == "artifact" and update.artifact is not None:
        return Observation(
            source=source,
            state=None,
            artifacts=(artifact_record(update.artifact, append=update.append),),
            remote_task_id=update.task_id,
            remote_context_id=update.context_id,
        )
    return None


def coalesced(observations: Iterable[Observation]) -> list[Observation]:
    """``observations`` in order, each run of chunks of one artifact that follow one another
    (A2A ``append``, nothing else in the report, from one source about one task) made one chunk:
    its parts in order, text that follows text alike joined (:func:`joined_parts`), ``chunks``
    counting them. Applied in turn, the result holds what applying each would hold, in fewer
    events: a stream that brought a burst of an answer's tokens while the last was being
    recorded appends the burst once. A report of empty chunks records nothing and is left out.
    Anything else -- a state, a whole artifact, a chunk of another artifact -- ends the run and
    is kept as it is, in its place."""
    out: list[Observation] = []
    for observation in observations:
        if observation.state is None and _empty_chunks(observation.artifacts):
            continue  # records nothing, alone or in a run (and is not counted)
        last = out[-1] if out else None
        if last is not None and _joinable(last, observation):
            (held,) = last.artifacts
            (chunk,) = observation.artifacts
            grown = replace(
                held,
                parts=tuple(joined_parts([*held.parts, *chunk.parts])),
                chunks=held.chunks + chunk.chunks,
            )
            out[-1] = replace(last, artifacts=(grown,))
        else:
            out.append(observation)
    return out


def _empty_chunks(artifacts: tuple[ArtifactRecord, ...]) -> bool:
    return bool(artifacts) and all(a.append and not a.parts for a in artifacts)


def _joinable(last: Observation, observation: Observation) -> bool:
    if len(last.artifacts) != 1 or len(observation.artifacts) != 1:
        return False
    (held,) = last.artifacts
    (chunk,) = observation.artifacts
    return (
        held.append
        and chunk.append
        and held.artifact_id == chunk.artifact_id
        and last.state is None
        and observation.state is None
        and (last.source, last.remote_task_id, last.remote_context_id)
        == (observation.source, observation.remote_task_id, observation.remote_context_id)
    )


def joined_parts(parts: Iterable[Any]) -> list[Any]:
    """``parts``, each text part that follows a text part alike (the same fields but the text)
    joined to it. An answer streamed token by token is then one text part, not thousands."""
    out: list[Any] = []
    for part in parts:
        last = out[-1] if out else None
        if (
            isinstance(last, Mapping)
            and isinstance(part, Mapping)
            and last.get("kind") == part.get("kind") == "text"
            and {k: v for k, v in last.items() if k != "text"}
            == {k: v for k, v in part.items() if k != "text"}
        ):
            out[-1] = {**last, "text": f"{last.get('text', '')}{part.get('text', '')}"}
        else:
            out.append(part)
    return out
