"""Applying what the remote agent reports about a task: the continuation path (R1, R10, R12).

Pure: no I/O, and — by construction of its signature — no card, no discovery outcome. Whatever the
source (a SendMessage or CancelTask answer, a GetTask result, an authenticated push delivery, a
stream event), an observation goes through :func:`apply_observation`, which returns the events to
record. The task's sequence of ``StateChanged`` events is therefore a function of the remote's
reports alone (R1), and the property tests prove it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cardfence.engine import events as ev
from cardfence.engine.lifecycle import TERMINAL, is_legal
from cardfence.engine.remote import Artifact, RemoteMessage, RemoteTask, StreamUpdate, TaskState

# Why an observation changed no state (ObservationIgnored.reason).
IGNORED_UNKNOWN = "unknown_state"  # the remote reported `unknown` / an unrecognised state
IGNORED_AFTER_TERMINAL = "after_terminal"  # terminal states absorb (R10)
IGNORED_DUPLICATE = "duplicate"  # the same state at the same time: a redelivery (R12)
IGNORED_STALE = "stale"  # older than what was already applied (R12)
IGNORED_SAME_STATE = "same_state"  # newer, but no transition (e.g. a new status message)
IGNORED_ILLEGAL = "illegal"  # not a transition the lifecycle allows (e.g. back to submitted)


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """An artifact as recorded: its id, name and parts (JSON-able)."""

    artifact_id: str
    name: str | None
    parts: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"artifact_id": self.artifact_id, "name": self.name, "parts": list(self.parts)}


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


Event = tuple[str, dict[str, Any]]


def apply_observation(task: Mapping[str, Any], observation: Observation) -> list[Event]:
    """The events that record ``observation`` against the task's current projection.

    One state event (``StateChanged`` or ``ObservationIgnored`` with its reason) when the
    observation carries a state — except a poll reading back exactly the applied state, which
    records nothing — plus one ``ArtifactReceived`` per artifact not seen before.
    """
    out: list[Event] = []
    if observation.state is not None:
        event = _state_event(task, observation)
        # A poll that reads back exactly what was already applied is the same report read
        # again, not a new one: recording it would add an event per safety poll for hours.
        if not (observation.source == "poll" and event[1].get("reason") == IGNORED_DUPLICATE):
            out.append(event)
    seen = {a["artifact_id"]: a for a in task.get("artifacts", ())}
    for artifact in observation.artifacts:
        record = artifact.to_json()
        if seen.get(artifact.artifact_id) != record:
            out.append((ev.ARTIFACT_RECEIVED, {**record, "source": observation.source}))
            seen[artifact.artifact_id] = record
    return out


def _state_event(task: Mapping[str, Any], observation: Observation) -> Event:
    current = task["state"]
    state = observation.state
    assert state is not None
    base: dict[str, Any] = {
        "source": observation.source,
        "remote_timestamp": _iso(observation.remote_timestamp),
    }
    if observation.generation is not None:
        base["generation"] = observation.generation
    if observation.remote_task_id and not task.get("remote_task_id"):
        # The observation that first names the remote task binds it (crash safety: docs/cli.md,
        # `run`).
        base["remote_task_id"] = observation.remote_task_id
        base["remote_context_id"] = observation.remote_context_id

    reason = _ignored_reason(task, observation)
    if reason is not None:
        return ev.OBSERVATION_IGNORED, {"reason": reason, "state": state, **base}
    changed = {"from": current, "to": state, **base}
    if observation.message is not None:
        changed["message"] = observation.message
    return ev.STATE_CHANGED, changed


def _ignored_reason(task: Mapping[str, Any], observation: Observation) -> str | None:
    current = task["state"]
    state = observation.state
    if state == TaskState.UNKNOWN:
        return IGNORED_UNKNOWN
    if current in TERMINAL:
        return IGNORED_DUPLICATE if state == current else IGNORED_AFTER_TERMINAL
    order = _compare(task, observation)
    if order < 0:
        return IGNORED_STALE
    if state == current:
        return IGNORED_DUPLICATE if order == 0 else IGNORED_SAME_STATE
    if not is_legal(current, state or ""):
        return IGNORED_ILLEGAL
    return None


def _compare(task: Mapping[str, Any], observation: Observation) -> int:
    """-1 older than what was applied, 0 the same moment, 1 newer (or unordered: by arrival)."""
    applied_generation = task.get("generation")
    if observation.generation is not None and applied_generation is not None:
        return _sign(observation.generation - applied_generation)
    applied = task.get("remote_timestamp")
    observed = _iso(observation.remote_timestamp)
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


def artifact_record(artifact: Artifact) -> ArtifactRecord:
    parts: list[dict[str, Any]] = []
    for part in artifact.parts:
        fields = {
            "kind": part.kind,
            "text": part.text,
            "data": part.data,
            "url": part.url,
            "media_type": part.media_type,
        }
        parts.append({k: v for k, v in fields.items() if v is not None})
    return ArtifactRecord(artifact.artifact_id, artifact.name, tuple(parts))


def from_task(task: RemoteTask, source: str) -> Observation:
    """An observation of a whole Task snapshot (send and cancel answers, polls, task pushes)."""
    return Observation(
        source=source,
        state=task.state,
        remote_timestamp=task.timestamp,
        generation=task.generation,
        message=task.message.text if task.message is not None else None,
        artifacts=tuple(artifact_record(a) for a in task.artifacts),
        remote_task_id=task.id,
        remote_context_id=task.context_id,
    )


def from_message(message: RemoteMessage, source: str) -> Observation:
    """A SendMessage answered with a bare Message: the agent's final answer, no task (A2A §7.1).

    The remote reported the outcome itself, so the task is ``completed`` with that message.
    """
    return Observation(source=source, state="completed", message=message.text)


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
            remote_task_id=update.task_id,
            remote_context_id=update.context_id,
        )
    if update.kind == "artifact" and update.artifact is not None:
        return Observation(
            source=source,
            state=None,
            artifacts=(artifact_record(update.artifact),),
            remote_task_id=update.task_id,
            remote_context_id=update.context_id,
        )
    return None
