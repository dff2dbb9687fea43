"""Folding a stream's events into its projection (R13). Pure: no I/O.

The engine computes every projection it writes by applying these same functions to the events it
appends, so a replay reproduces the stored projection by construction; the audit checks that it
does. Each event is folded by its class (``engine/core/events.py``), whether it comes as one or as
the ``(type, payload)`` pair the store gives; what the fold reads is its payload, as stored, so a
payload lacking a key the fold does not need still replays as it always did. Unknown event types
(from a newer cardfence) leave the state unchanged and are reported by the audit, never crashed
on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cardfence.engine.core import events as ev
from cardfence.engine.core.observations import joined_parts, watermark_after

State = dict[str, Any]
StoredEvent = tuple[str, Mapping[str, Any]]
"""An event as the store gives it: its type and decoded payload."""
AgentInput = ev.AgentEvent | ev.UnknownEvent | StoredEvent
TaskInput = ev.TaskEvent | ev.UnknownEvent | StoredEvent


def _stored(event: AgentInput | TaskInput) -> StoredEvent:
    """An event as the ``(type, payload)`` pair the store keeps."""
    if isinstance(event, tuple):
        return event
    return event.type, event.payload()


def _task_event(event: TaskInput) -> tuple[type[ev.Recorded] | None, Mapping[str, Any]]:
    """The class a task-stream event is folded by (None: a type not known), and its payload."""
    if isinstance(event, tuple):
        return ev.TASK_CLASSES.get(event[0]), event[1]
    if isinstance(event, ev.UnknownEvent):
        return None, event.data
    return type(event), event.payload()


def initial_agent_state(origin: str) -> State:
    return {
        "agent": origin,
        "card_url": None,
        "revision": None,
        "version": None,
        "etag": None,
        "last_modified": None,
        "contract_hash": None,
        "push_notifications": None,
        "fetched_at": None,
        "pinned_contract": None,
        "pinned_revision": None,
        "last_failure": None,
        "reads": 0,
        "failures": 0,
        "refusals": 0,
    }


def apply_agent_event(state: Mapping[str, Any], type_: str, data: Mapping[str, Any]) -> State:
    """The agent stream's state after one event (a new dict; ``state`` is not modified)."""
    out = dict(state)
    kind = ev.AGENT_CLASSES.get(type_)
    if kind is ev.CardFetched and data.get("extended"):
        # R15: the authenticated extended card. The public card's fields stay as they were; the
        # keys are added by the first such read, so older logs replay to their projections.
        out.update(extended_revision=data["revision"], extended_fetched_at=data.get("fetched_at"))
    elif kind is ev.CardFetched:
        out.update(
            card_url=data["url"],
            revision=data["revision"],
            version=data.get("version"),
            etag=data.get("etag"),
            last_modified=data.get("last_modified"),
            contract_hash=data.get("contract_hash"),
            push_notifications=data.get("push_notifications"),
            fetched_at=data.get("fetched_at"),
            reads=out["reads"] + 1,
        )
    elif kind is ev.DiscoveryFailed:
        out["last_failure"] = {
            "kind": data.get("kind"),
            "detail": data.get("detail"),
            "at": data.get("at"),
        }
        out["failures"] = out["failures"] + 1
    elif kind is ev.ContractPinned or kind is ev.ContractAccepted:
        out["pinned_contract"] = data["contract_hash"]
        out["pinned_revision"] = data.get("revision")
    elif kind is ev.TaskCreationRefused or kind is ev.CredentialsMissing:
        out["refusals"] = out["refusals"] + 1
    return out


def fold_agent(origin: str, events: Iterable[AgentInput], state: State | None = None) -> State:
    """Fold an agent stream's events over its state (from its initial state)."""
    current: State = initial_agent_state(origin) if state is None else state
    for event in events:
        type_, data = _stored(event)
        current = apply_agent_event(current, type_, data)
    return current


# -- task streams --------------------------------------------------------------------------------

_FLAG_FOR_EVENT: Mapping[type[ev.Recorded], str] = {
    ev.ContractDiverged: "contract_diverged",
    ev.TaskOrphaned: "orphaned",
    ev.DeliveryDowngraded: "delivery_downgraded",
    ev.EndpointMoved: "endpoint_moved",
    ev.DeadlineExceeded: "deadline_exceeded",
    ev.CreationRefusedRemotely: "never_created",
    ev.AuthorizationFailed: "credentials_rejected",
    ev.Throttled: "throttled",
}


def initial_task_state(key: str) -> State:
    return {
        "task": key,
        "agent": None,
        "agent_url": None,
        "card_url": None,
        "skill": None,
        "message_id": None,
        "context_id": None,
        "remote_task_id": None,
        "remote_context_id": None,
        "state": "submitted",
        "remote_timestamp": None,
        "generation": None,
        "delivery_mode": "polling",
        "webhook": None,
        "card_revision": None,
        "card_version": None,
        "contract_hash": None,
        "skill_hash": None,
        "endpoint": None,
        "latest_card_revision": None,
        "flags": [],
        "artifacts": [],
        "cancel_requested": False,
        "transitions": 0,
        "ignored": 0,
        "last_message": None,
        "submitted_at": None,
    }
    # Added by the first report that carries a fingerprint (R12), so logs written before they
    # existed replay to exactly their stored projections: `last_report` (the fingerprint of the
    # last report recorded), `reports_seen` (those of every report recorded since the last
    # reply), `reports_repeated` (those recorded once as a repeat; later repeats are not
    # recorded at all). A `ReplySent` clears them. `last_said` (what the last report applied
    # said of the status, whenever: a newer one saying it again with no new artifact is a
    # repeat) is added by the first event that carries `said`, and a `ReplySent` removes it.
    # `repeats_ignored` (how many later repeats were counted, not appended) is added by the
    # first event that carries such a count.


# What every projection of each kind holds from its first event on (none was added since the
# first release): a stored one without them was altered in the store.
AGENT_FIELDS = frozenset(initial_agent_state(""))
TASK_FIELDS = frozenset(initial_task_state(""))


def lacking(state: Mapping[str, Any], fields: frozenset[str]) -> str | None:
    """What a stored projection lacks of ``fields``, said in a few words; None: nothing."""
    missing = sorted(fields.difference(state))
    if not missing:
        return None
    named = ", ".join(missing[:5]) + (", …" if len(missing) > 5 else "")
    return f"lacks {len(missing)} of its fields ({named})"


def apply_task_event(state: Mapping[str, Any], type_: str, data: Mapping[str, Any]) -> State:
    """The task stream's state after one event (a new dict; ``state`` is not modified)."""
    return apply_task_events(state, ((type_, data),))


def apply_task_events(state: Mapping[str, Any], events: Iterable[TaskInput]) -> State:
    """The task stream's state after ``events`` (a new state; ``state`` is not modified).

    Linear in the events and the state (R16): the lists the events grow are copied once, then
    grown in place, and artifacts are found by id through an index made once per call.
    """
    out = dict(state)
    for name in ("artifacts", "reports_seen", "reports_repeated"):
        if name in out:
            out[name] = list(out[name])  # grown in place below: never the caller's list
    index: dict[str, int] | None = None
    superseded: dict[str, list[str]] | None = None
    for event in events:
        kind, data = _task_event(event)
        for counted in (ev.REPEATS_IGNORED, ev.FAILURES_REPEATED):  # carried on the next event
            repeats = data.get(counted)
            if isinstance(repeats, int) and repeats > 0:
                out[counted] = out.get(counted, 0) + repeats
        if kind is ev.ArtifactReceived:
            if index is None:
                index = {a["artifact_id"]: i for i, a in enumerate(out["artifacts"])}
            replaced = _apply_artifact(out["artifacts"], index, data)
            if replaced is not None and replaced.get("sha256"):
                if superseded is None:  # copied once per call, like the lists above
                    earlier = out.get(ev.SUPERSEDED_ARTIFACTS) or {}
                    superseded = {k: list(v) for k, v in earlier.items()}
                    out[ev.SUPERSEDED_ARTIFACTS] = superseded
                versions = superseded.setdefault(replaced["artifact_id"], [])
                if replaced["sha256"] not in versions:
                    versions.append(replaced["sha256"])
        elif kind is not None:
            _apply_in_place(out, kind, data)
    return out


_ARTIFACT_FIELDS = (
    "artifact_id", "name", "name_sha256", "parts", "truncated", "bytes", "sha256", "partial",
)  # fmt: skip


def _apply_artifact(
    artifacts: list[Any], index: dict[str, int], data: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Keyed by ``artifactId``: a new id is added at the end, a known one replaced in place (the
    replaced record is returned), or grown by a chunk (``append``: its parts added, text after
    text joined, its size and digest taken, ``chunks`` counted; nothing is returned, since no
    version was replaced)."""
    record = {k: data[k] for k in _ARTIFACT_FIELDS if k in data}
    record.setdefault("name", None)
    if "truncated" not in record:
        record.setdefault("parts", [])
    position = index.get(record["artifact_id"])
    if position is None:
        if int(data.get("chunks") or 1) > 1:  # a partial start made of several chunks
            record["chunks"] = int(data["chunks"]) - 1  # those after its first, as one by one
        index[record["artifact_id"]] = len(artifacts)
        artifacts.append(record)
        return None
    held: dict[str, Any] = artifacts[position]
    if data.get("append"):
        record["name"] = held.get("name")
        if held.get("name_sha256"):
            record["name_sha256"] = held["name_sha256"]
        record["chunks"] = int(held.get("chunks") or 0) + int(data.get("chunks") or 1)
        if held.get("partial"):
            record["partial"] = True  # its first chunks are still missing
        if "parts" in record and "parts" in held:
            record["parts"] = joined_parts([*held["parts"], *record["parts"]])
        artifacts[position] = record
        return None
    artifacts[position] = record
    return held


def _apply_in_place(out: State, kind: type[ev.Recorded], data: Mapping[str, Any]) -> None:
    if kind is ev.TaskSubmitted:
        for name in (
            "agent",
            "agent_url",
            "card_url",
            "skill",
            "message_id",
            "context_id",
            "card_revision",
            "card_version",
            "contract_hash",
            "skill_hash",
            "endpoint",
            "submitted_at",
            "media_type",
        ):
            out[name] = data.get(name)
        out["latest_card_revision"] = data.get("card_revision")
        if "authorization" in data:  # R15; absent from tasks created before it was recorded
            out["authorization"] = data["authorization"]
        for name in ("extended", "public_revision", "public_contract_hash"):
            if name in data:  # R15: created under the authenticated extended card
                out[name] = data[name]
        if "extensions" in data:  # the extensions it activated (absent: none)
            out["extensions"] = list(data["extensions"])
        if "referenced_tasks" in data:  # the tasks of this store its message referenced
            out["references"] = list(data["referenced_tasks"])
    elif kind is ev.StateChanged or kind is ev.ObservationIgnored:
        _apply_observation_event(out, kind.TYPE, data)
    elif kind is ev.WebhookRegistered:
        out["webhook"] = {
            k: data.get(k) for k in ("config_id", "url", "token_sha256", "auth_sha256")
        } | {"status": "provisional"}
        out["delivery_mode"] = "push"
    elif kind is ev.WebhookConfirmed:
        if out["webhook"] is not None:
            out["webhook"] = {**out["webhook"], "status": "confirmed"}
    elif kind is ev.DeliveryDowngraded:
        out["delivery_mode"] = "polling"
    elif kind is ev.CardRevisionChanged:
        out["latest_card_revision"] = data.get("new")
    elif kind is ev.FlaggedForReview:
        out["flags"] = _with_flag(out["flags"], str(data.get("reason")))
    elif kind is ev.EndpointMoved:
        out["endpoint"] = data.get("new")
    elif kind is ev.CredentialsMoved and out.get("authorization"):
        out["authorization"] = {**out["authorization"], "origin": data.get("new")}
    elif kind is ev.CancelRequested:
        out["cancel_requested"] = True
    elif kind is ev.ReplySent and "last_report" in out:
        # R12: after a reply the remote may rightly report again what it reported before.
        out.update(last_report=None, reports_seen=[], reports_repeated=[])
        out.pop("last_said", None)
    elif kind is ev.CreationRefusedRemotely:
        # R3: the agent refused the creation with an A2A error. The task is closed as never
        # created; its lifecycle state stays what the remote reported (nothing: `submitted`).
        out["closed"] = "never_created"
        out["creation_refused"] = {"code": data.get("code"), "message": data.get("message")}
    if kind in _FLAG_FOR_EVENT:
        out["flags"] = _with_flag(out["flags"], _FLAG_FOR_EVENT[kind])


def _apply_observation_event(out: State, type_: str, data: Mapping[str, Any]) -> None:
    if data.get("said") is not None:  # on transitions and same-state reports only (R12)
        out["last_said"] = data["said"]
    report = data.get("report")
    if report is not None:
        out["last_report"] = report
        if data.get("repeat"):
            out.setdefault("reports_repeated", []).append(report)  # counted as ignored below
        else:
            out.setdefault("reports_seen", []).append(report)
    timestamp, generation = watermark_after(out, type_, data)
    out["remote_timestamp"], out["generation"] = timestamp, generation
    if data.get("remote_task_id") and not out["remote_task_id"]:
        out["remote_task_id"] = data["remote_task_id"]
        out["remote_context_id"] = data.get("remote_context_id")
    if type_ == ev.STATE_CHANGED:
        out["state"] = data["to"]
        out["transitions"] = out["transitions"] + 1
        if data.get("message") is not None:
            out["last_message"] = data["message"]
            # Its parts, when one is not text (absent otherwise, as in stores from before).
            if data.get("message_parts"):
                out["last_message_parts"] = data["message_parts"]
            else:
                out.pop("last_message_parts", None)
        elif "message" not in data and data.get("message_parts"):
            # R17: the message out of line, its parts outlined (its text is theirs).
            out["last_message"] = None
            out["last_message_parts"] = data["message_parts"]
    else:
        out["ignored"] = out["ignored"] + 1


def _with_flag(flags: list[str], flag: str) -> list[str]:
    return sorted({*flags, flag})


def fold_task(key: str, events: Iterable[TaskInput], state: State | None = None) -> State:
    """Fold a task stream's events over its state (from its initial state)."""
    return apply_task_events(initial_task_state(key) if state is None else state, events)
