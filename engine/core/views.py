"""What the API returns and the CLI prints about a task: a read-only view of its projection,
its content (kept out of line, R17) given back in place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cardfence.engine.core.answers import TaskState
from cardfence.engine.core.content import ARTIFACT_NAME, is_outline, resolved_parts, text_of

Contents = Mapping[str, Mapping[str, Any]]
"""Content records by digest, their bodies decoded (what a view reads its content from)."""


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as its projection stands (the fields of ``cardfence run --json`` and more).

    ``task`` is the task's local key (also :attr:`key`); ``state`` a :class:`TaskState`, which
    compares equal to its name as a string."""

    task: str
    remote_task_id: str | None
    context_id: str | None
    state: TaskState
    delivery_mode: str
    card_revision: str | None
    contract_hash: str | None
    flags: tuple[str, ...]
    artifacts: tuple[Mapping[str, Any], ...]
    agent: str | None
    skill: str | None
    last_message: str | None
    updated_at: datetime | None = None
    # The last message's parts when one is not text (a form as a data part, a file); () else
    last_message_parts: tuple[Mapping[str, Any], ...] = ()
    # R12: reports that repeated one already recorded, counted and not appended (as far as a
    # later event of the task carries the count)
    repeats_ignored: int = 0
    # Polls that failed as the task's last recorded failure did, counted and not appended
    failures_repeated: int = 0
    # The tasks of this store (their keys) the task's message referenced (referenceTaskIds)
    references: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        state: Mapping[str, Any],
        updated_at: datetime | None = None,
        contents: Contents | None = None,
    ) -> TaskView:
        """The view of a task's projection; the content its outlines name read from
        ``contents`` (an outline whose record is not there, erased, stays as it is, marked
        ``erased`` when ``contents`` are given)."""
        last_message = state.get("last_message")
        message_parts = tuple(state.get("last_message_parts") or ())
        artifacts = tuple(state.get("artifacts") or ())
        if contents is not None:
            if last_message is None and message_parts:
                parts, _ = resolved_parts(message_parts, contents)
                last_message = text_of(parts)
                message_parts = tuple(parts) if any(p["kind"] != "text" for p in parts) else ()
            artifacts = tuple(_resolved_artifact(a, contents) for a in artifacts)
        return cls(
            task=state["task"],
            remote_task_id=state.get("remote_task_id"),
            context_id=state.get("remote_context_id") or state.get("context_id"),
            state=_state(state["state"]),
            delivery_mode=state.get("delivery_mode") or "polling",
            card_revision=state.get("card_revision"),
            contract_hash=state.get("contract_hash"),
            flags=tuple(state.get("flags") or ()),
            artifacts=artifacts,
            agent=state.get("agent"),
            skill=state.get("skill"),
            last_message=last_message,
            updated_at=updated_at,
            last_message_parts=message_parts,
            repeats_ignored=int(state.get("repeats_ignored") or 0),
            failures_repeated=int(state.get("failures_repeated") or 0),
            references=tuple(state.get("references") or ()),
        )

    @property
    def key(self) -> str:
        """The task's local key (the same as :attr:`task`)."""
        return self.task

    def to_json(self) -> dict[str, Any]:
        """The ``run`` / ``reply`` / ``cancel`` / ``resume`` JSON document of docs/cli.md."""
        return {
            "task": self.task,
            "remote_task_id": self.remote_task_id,
            "context_id": self.context_id,
            "state": self.state,
            "delivery_mode": self.delivery_mode,
            "card_revision": self.card_revision,
            "flags": list(self.flags),
            "artifacts": [dict(a) for a in self.artifacts],
            "last_message": self.last_message,
            "last_message_parts": [dict(p) for p in self.last_message_parts],
            "references": list(self.references),
        }

    def to_row(self) -> dict[str, Any]:
        """One row of ``cardfence tasks --json``."""
        return {
            "task": self.task,
            "remote_task_id": self.remote_task_id,
            "agent": self.agent,
            "skill": self.skill,
            "state": self.state,
            "delivery_mode": self.delivery_mode,
            "flags": list(self.flags),
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


def digests_named(state: Mapping[str, Any]) -> list[str]:
    """The digests of the content records a task's projection names (its artifacts' parts and
    its last message's)."""
    parts: list[Any] = list(state.get("last_message_parts") or ())
    names: list[str] = []
    for artifact in state.get("artifacts") or ():
        parts.extend(artifact.get("parts") or ())
        if artifact.get("name_sha256"):
            names.append(str(artifact["name_sha256"]))
    return [str(p["sha256"]) for p in parts if is_outline(p)] + names


def _resolved_artifact(artifact: Mapping[str, Any], contents: Contents) -> Mapping[str, Any]:
    parts = artifact.get("parts")
    if artifact.get("name_sha256"):  # kept as its digest: its name alone was kept apart
        named = contents.get(str(artifact["name_sha256"])) or {}
        return {**artifact, "name": named.get(ARTIFACT_NAME)}
    if not parts or not any(is_outline(p) for p in parts):
        return artifact
    resolved, around = resolved_parts(parts, contents)
    name = artifact.get("name")
    if name is None:
        name = around.get(ARTIFACT_NAME)
    return {**artifact, "name": name, "parts": resolved}


def _state(name: str) -> TaskState:
    """The state a projection holds, as a :class:`TaskState`; a name this cardfence does not
    know (a newer one wrote it) is ``unknown``, as a remote's unknown state is."""
    try:
        return TaskState(name)
    except ValueError:
        return TaskState.UNKNOWN
