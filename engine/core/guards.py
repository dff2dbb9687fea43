"""The decisions of rules R2-R11, as pure functions of recorded facts. No I/O.

Each guard takes only what is recorded (the task's projection, its frozen card revision, contract
and skill hashes) and, where a rule allows it, a fresh card or the discovery failure; it returns a
decision or the events to record. The continuation guard — applying what the remote reported — is
:func:`engine.core.observations.apply_observation`, and takes no discovery input at all (R1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cardfence.engine.cards.diff import diff
from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import AgentCard, Interface
from cardfence.engine.cards.spoken import V10, dialect_of, modes_meet, spoken_version
from cardfence.engine.core import events as ev
from cardfence.engine.core.lifecycle import TERMINAL
from cardfence.engine.errors import CardInvalidError, DiscoveryError


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether an operation may go ahead, and why (the reason is recorded)."""

    allowed: bool
    reason: str
    detail: str = ""
    extensions: tuple[str, ...] = ()  # EXTENSION_REQUIRED: the URIs required, not activated


# -- R2: creation is gated by fresh discovery -----------------------------------------------------


def creation_check(
    card: AgentCard,
    skill_id: str | None,
    media_type: str | Sequence[str],
    extensions: Sequence[str] = (),
    accept: Sequence[str] = (),
) -> Decision:
    """May a task for ``skill_id`` be created on this fresh card, with a message whose parts
    have these media types (one, or each of several), by a caller that activates
    ``extensions`` (every extension the card requires among them) and accepts the output modes
    ``accept`` (none given: any)? ``skill_id`` None names none: refused unless the card offers
    exactly one skill (:func:`sole_skill`, which the caller asks first)."""
    if skill_id is None:
        offered = ", ".join(s.id for s in card.skills) or "none"
        count = len(card.skills)
        detail = f"was not named, and the card offers {count} (offered: {offered})"
        return Decision(False, "skill_absent", detail)
    skill = card.skill(skill_id)
    if skill is None:
        offered = ", ".join(s.id for s in card.skills) or "none"
        return Decision(False, "skill_absent", f"is absent from the card (offered: {offered})")
    types = [media_type] if isinstance(media_type, str) else list(media_type)
    for each in dict.fromkeys(types):
        if not skill.accepts(each):
            modes = ", ".join(skill.input_modes)
            return Decision(
                False, "media_type_not_accepted", f"does not accept {each} (accepts: {modes})"
            )
    if accept and not any(modes_meet(skill.output_modes, mode) for mode in accept):
        modes = ", ".join(skill.output_modes)
        wanted = ", ".join(accept)
        return Decision(
            False,
            "output_mode_not_accepted",
            f"produces none of {wanted} (produces: {modes})",
        )
    missing = required_extensions(card, extensions)
    if missing:
        return Decision(False, EXTENSION_REQUIRED, ", ".join(missing), tuple(missing))
    return Decision(True, "ok")


def sole_skill(card: AgentCard) -> str | None:
    """The id of the card's skill when it offers exactly one (a creation may leave it
    unnamed), else None."""
    return card.skills[0].id if len(card.skills) == 1 else None


EXTENSION_REQUIRED: Final = "extension_required"


def required_extensions(card: AgentCard, activated: Sequence[str]) -> list[str]:
    """The extensions ``card`` requires (``required: true``) that are not ``activated``."""
    return [e.uri for e in card.capabilities.extensions if e.required and e.uri not in activated]


def never_created(task: Mapping[str, Any]) -> bool:
    """R3: the agent refused this task's creation with an A2A error; nothing is sent for it
    again. (``send_refused``: how an older cardfence flagged such a refusal.)"""
    return task.get("closed") == "never_created" or "send_refused" in (task.get("flags") or ())


def is_live(task: Mapping[str, Any]) -> bool:
    """Whether the task needs driving: not ended, not refused, and bound to a remote id."""
    return (
        task.get("state") not in TERMINAL
        and not never_created(task)
        and bool(task.get("remote_task_id"))
    )


def resend_check(
    task: Mapping[str, Any],
    card: AgentCard,
    extended: AgentCard | None = None,
    *,
    media_types: Sequence[str] = (),
    accept: Sequence[str] = (),
) -> Decision:
    """May ``resume`` send a task's creation again on this fresh card (R2, R3)? The skill, the
    media types of the message's parts (``media_types``; none given: the task's recorded
    ``media_type``) and the output modes it accepts as for any creation -- on the fresh
    ``extended`` card when the task was created under one and it could be read again (R15) --
    and the contract must be the task's frozen one: a re-send is a creation under the contract
    the task was created with, never another."""
    offered = extended if extended is not None else card
    types = tuple(media_types) or (task.get("media_type") or "text/plain",)
    activated = tuple(task.get("extensions") or ())
    decision = creation_check(offered, str(task.get("skill")), types, activated, accept)
    if not decision.allowed:
        return decision
    # A task created under the authenticated extended card froze that card's contract; the
    # public card is compared with the public contract it was created beside (R15).
    frozen = task.get("public_contract_hash") or task.get("contract_hash")
    if card.contract_hash != frozen:
        return Decision(False, "contract_changed", f"the contract is no longer {frozen}")
    return Decision(True, "ok")


def refused_creation(code: int | str, message: str, url: str) -> ev.CreationRefusedRemotely:
    """``TaskCreationRefused`` on the task: the agent refused the creation; final (R3)."""
    return ev.CreationRefusedRemotely(reason="remote_refused", code=code, message=message, url=url)


def throttled(
    task: Mapping[str, Any],
    url: str,
    status: int | None,
    asked: float | None,
    wait: float | None,
    during: str,
) -> list[ev.TaskEvent]:
    """``Throttled``: the agent asked for time (R5); an annotation, never a transition, recorded
    once per task (the flag it sets says it was), so an agent throttling every request does not
    grow the log by an event a request. ``wait``: what the engine waits before its next request
    to the endpoint (``asked`` capped by ``max_retry_after`` and the deadline; None: the deadline
    comes first, and none is made)."""
    if "throttled" in task.get("flags", ()):
        return []
    waited = None if wait is None else round(wait, 3)
    return [ev.Throttled(url=url, status=status, asked=asked, wait=waited, during=during)]


# -- R4: webhook registration is gated by an unconditional fresh read ----------------------------


def registration_check(card: AgentCard | None, failure: DiscoveryError | None) -> Decision:
    """May a push webhook be registered, given the read made for this registration?"""
    if failure is not None or card is None:
        detail = str(failure) if failure is not None else "no card"
        return Decision(False, "discovery_failed", detail)
    if not card.push_notifications:
        return Decision(False, "push_not_advertised", f"card {card.revision[:12]} says no push")
    return Decision(True, "push_advertised")


def downgrade(reason: str, detail: str, revision: str | None = None) -> ev.DeliveryDowngraded:
    """``DeliveryDowngraded``: push is off for this task, it continues by polling (R4-R7)."""
    return ev.DeliveryDowngraded(reason=reason, detail=detail, card_revision=revision, to="polling")


# -- R6: capability re-checks are bound to state boundaries ---------------------------------------


def boundary_recheck_due(task: Mapping[str, Any], from_state: str, to_state: str) -> bool:
    """After ``from_state → to_state``, does the engine intend to wait for push (so re-check it)?"""
    return (
        task.get("delivery_mode") == "push" and from_state != to_state and to_state not in TERMINAL
    )


def push_recheck(
    task: Mapping[str, Any], card: AgentCard | None, failure: DiscoveryError | None
) -> list[ev.TaskEvent]:
    """The outcome of a boundary re-check (R6): the transition itself is already recorded (R1)."""
    if failure is not None:
        return [unavailable(failure, "boundary_recheck")]
    if card is not None and not card.push_notifications and task.get("delivery_mode") == "push":
        return [downgrade("push_withdrawn", "card withdrew pushNotifications", card.revision)]
    return []


# -- R7, R8: mid-task reconciliation, never by cancelling ----------------------------------------


def unavailable(failure: DiscoveryError, during: str) -> ev.DiscoveryUnavailable:
    """``DiscoveryUnavailable``: an annotation, nothing else happens (R8)."""
    return ev.DiscoveryUnavailable(
        kind=failure.kind, detail=failure.detail, url=failure.url, during=during
    )


def reconcile_card(
    task: Mapping[str, Any],
    card: AgentCard | None,
    failure: DiscoveryError | None,
    previous: AgentCard | None,
) -> list[ev.TaskEvent]:
    """What a mid-task card re-validation records (R7, R8): diagnostics, never a transition.

    ``previous`` is the revision the task last saw (``latest_card_revision``), for the diff.
    """
    if failure is not None:
        return [unavailable(failure, "revalidation")]
    if card is None or card.revision == task.get("latest_card_revision"):
        return []
    changes = diff(previous, card).to_json() if previous is not None else {}
    out: list[ev.TaskEvent] = [
        ev.CardRevisionChanged(
            old=task.get("latest_card_revision"), new=card.revision, changes=changes
        )
    ]
    if task.get("delivery_mode") == "push" and not card.push_notifications:
        out.append(downgrade("push_withdrawn", "card withdrew pushNotifications", card.revision))
    if task.get("state") not in TERMINAL:
        out.extend(_skill_review(task, card))
    if card.contract_hash != task.get("contract_hash"):
        out.append(_diverged(task, card))
    return out


def reconcile_stand_in(
    task: Mapping[str, Any],
    card: AgentCard | None,
    failure: DiscoveryError | None,
    unread: DiscoveryError,
) -> list[ev.TaskEvent]:
    """R7 for a task created under the authenticated extended card when that card could not be
    read again (``unread``, kind ``extended_card``): the public ``card`` (or its ``failure``)
    stands in. Annotations only, never a transition (R1, R8).

    The public card need not carry the task's skill, and its revision and contract are not the
    task's: the skill is not reviewed (a skill only on the extended card never looks withdrawn),
    and nothing is compared but the card-level ``pushNotifications``.
    """
    out: list[ev.TaskEvent] = [unavailable(unread, "revalidation")]
    if failure is not None:
        out.append(unavailable(failure, "revalidation"))
    elif card is not None and task.get("delivery_mode") == "push" and not card.push_notifications:
        out.append(downgrade("push_withdrawn", "card withdrew pushNotifications", card.revision))
    return out


def _skill_review(task: Mapping[str, Any], card: AgentCard) -> list[ev.TaskEvent]:
    skill_id = str(task.get("skill"))
    compat = card.compatibility_hash(skill_id)
    if compat is None:
        reason, detail = "skill_withdrawn", f"skill {skill_id!r} is absent from {card.revision}"
    elif compat != task.get("skill_hash"):
        reason, detail = "skill_changed", f"skill {skill_id!r} changed incompatibly"
    else:
        return []
    # Seed 004 #2: a skill dropped from the card is a reason to look, not to cancel.
    return [ev.FlaggedForReview(reason=reason, detail=detail, revision=card.revision)]


def _diverged(task: Mapping[str, Any], card: AgentCard) -> ev.ContractDiverged:
    # R3: the contract frozen at send governs the task; nothing is switched.
    return ev.ContractDiverged(
        frozen=task.get("contract_hash"), observed=card.contract_hash, revision=card.revision
    )


# -- R9: resume reconciles the task with a fresh card ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """How to resume: on which endpoint, or orphaned; and what to record first."""

    orphaned: bool
    endpoint: Mapping[str, Any] | None
    events: tuple[ev.TaskEvent, ...]
    detail: str = ""


def resume_check(
    task: Mapping[str, Any],
    card: AgentCard | None,
    failure: DiscoveryError | None,
    *,
    allow_insecure: bool = False,
) -> ResumePlan:
    """Reconcile a task with a fresh read before any request to its endpoint (R9). The endpoint
    moves only to an interface that may be used (R16: plain http only to loopback unless
    ``allow_insecure``)."""
    recorded = task.get("endpoint")
    if failure is not None or card is None:
        events: tuple[ev.TaskEvent, ...] = (
            () if failure is None else (unavailable(failure, "resume"),)
        )
        return ResumePlan(False, recorded, events)
    skill_id = str(task.get("skill"))
    compat = card.compatibility_hash(skill_id)
    if compat is None or compat != task.get("skill_hash"):
        reason = "skill_absent" if compat is None else "skill_incompatible"
        detail = (
            f"skill {skill_id!r} is absent"
            if compat is None
            else f"skill {skill_id!r} changed incompatibly"
        )
        orphaned = ev.TaskOrphaned(
            reason=reason, skill=skill_id, revision=card.revision, detail=detail
        )
        return ResumePlan(True, recorded, (orphaned,), detail)
    events_out: list[ev.TaskEvent] = []
    if card.revision != task.get("latest_card_revision"):
        events_out.append(
            ev.CardRevisionChanged(
                old=task.get("latest_card_revision"), new=card.revision, changes={}
            )
        )
    if card.contract_hash != task.get("contract_hash"):
        events_out.append(_diverged(task, card))
    endpoint, moved = _endpoint_on(recorded, card, allow_insecure)
    return ResumePlan(False, endpoint, (*events_out, *moved))


def resume_stand_in(
    task: Mapping[str, Any],
    card: AgentCard | None,
    failure: DiscoveryError | None,
    unread: DiscoveryError,
    *,
    allow_insecure: bool = False,
) -> ResumePlan:
    """R9 for a task created under the authenticated extended card when that card could not be
    read again (``unread``): the public ``card`` stands in for where the agent now lives (its
    endpoint may have moved). Never orphaned: the public card need not carry the task's skill,
    and its revision and contract are not the task's, so they are not compared."""
    recorded = task.get("endpoint")
    events: list[ev.TaskEvent] = [unavailable(unread, "resume")]
    if failure is not None or card is None:
        if failure is not None:
            events.append(unavailable(failure, "resume"))
        return ResumePlan(False, recorded, tuple(events))
    endpoint, moved = _endpoint_on(recorded, card, allow_insecure)
    return ResumePlan(False, endpoint, (*events, *moved))


def endpoint_of(interface: Interface) -> dict[str, Any]:
    """The endpoint a task records (``TaskSubmitted``, ``EndpointMoved``): where it lives, over
    which binding, in which A2A version (as declared, else the one spoken: never empty), and
    for which tenant (1.0, when the card names one)."""
    endpoint = {
        "url": interface.url,
        "binding": interface.binding,
        "protocol_version": interface.protocol_version or interface.speaks,
    }
    if interface.tenant:  # absent without one: endpoints recorded before are as they were
        endpoint["tenant"] = interface.tenant
    return endpoint


def endpoint_version(endpoint: Mapping[str, Any]) -> str:
    """The A2A version a recorded endpoint speaks. Tasks recorded before the version was kept
    lived at 1.0 endpoints: absent reads as ``1.0``, here at use, never in the fold, so their
    logs replay to what was stored."""
    return str(endpoint.get("protocol_version") or V10)


def endpoint_dialect(endpoint: Mapping[str, Any]) -> str:
    """The version whose methods and shapes requests to a recorded endpoint take (``1.0`` or
    ``0.3``: :func:`dialect_of`)."""
    return dialect_of(endpoint_version(endpoint))


def _endpoint_on(
    recorded: Mapping[str, Any] | None, card: AgentCard, allow_insecure: bool
) -> tuple[Mapping[str, Any] | None, tuple[ev.TaskEvent, ...]]:
    """The task's endpoint on ``card`` (same binding preferred; R16: only an interface that may
    be used), and ``EndpointMoved`` when it is not the recorded one: another URL, or the same
    URL now speaking another A2A version or for another tenant."""
    binding = recorded.get("binding") if recorded else None
    try:
        chosen = select_interface(
            card, prefer=[binding] if binding else (), allow_insecure=allow_insecure
        )
    except CardInvalidError:
        chosen = None
    if chosen is None or recorded is None:
        return recorded, ()
    same_version = chosen.speaks == spoken_version(endpoint_version(recorded))
    same_tenant = chosen.tenant == (recorded.get("tenant") or "")
    if chosen.url == recorded.get("url") and same_version and same_tenant:
        return recorded, ()
    endpoint = endpoint_of(chosen)
    return endpoint, (ev.EndpointMoved(old=recorded, new=endpoint),)


def card_is_stale(task: Mapping[str, Any], agent_state: Mapping[str, Any]) -> bool:
    """R9's other trigger: the agent's latest recorded revision differs from the task's (for a
    task created under the authenticated extended card, from the public card it was created
    beside: the agent's projection follows the public card)."""
    latest = agent_state.get("revision")
    return latest is not None and latest != _public_revision(task, "latest_card_revision")


def _public_revision(task: Mapping[str, Any], field: str) -> Any:
    """The public card revision a task is compared with: ``field``, unless the task was created
    under the authenticated extended card (R15), whose revision is no public card's."""
    if task.get("extended"):
        return task.get("public_revision")
    return task.get(field)


# -- R12: an answer about another task, or in another context ------------------------------------


def wrong_task(
    task: Mapping[str, Any], asked: str, answered: str, answered_state: str | None, source: str
) -> list[ev.TaskEvent]:
    """An answer naming another task than the one asked about: nothing of it is applied. The
    first is recorded (``ObservationIgnored``, reason ``wrong_task``) and flags the task; later
    ones add nothing, so a broken agent cannot grow the log poll after poll."""
    if "wrong_task" in (task.get("flags") or ()):
        return []
    detail = f"asked about task {asked}, the agent answered about task {answered}"
    return [
        ev.ObservationIgnored(
            reason="wrong_task",
            state=answered_state,
            source=source,
            remote_timestamp=None,
            asked=asked,
            answered=answered,
        ),
        ev.FlaggedForReview(reason="wrong_task", detail=detail),
    ]


def context_check(task: Mapping[str, Any], remote_context_id: str | None) -> list[ev.TaskEvent]:
    """A report about the task in another ``contextId`` than the one bound: applied (it is the
    task's own report), but flagged ``context_mismatch`` -- once."""
    bound = task.get("remote_context_id")
    if not bound or not remote_context_id or remote_context_id == bound:
        return []
    if "context_mismatch" in (task.get("flags") or ()):
        return []
    detail = f"the task's context is {bound}, a report named {remote_context_id}"
    return [ev.FlaggedForReview(reason="context_mismatch", detail=detail)]


# -- R11: a terminal `failed` without a diagnostic -----------------------------------------------


def failure_review(
    task: Mapping[str, Any], to_state: str, message: str | None, agent_revision: str | None
) -> list[ev.TaskEvent]:
    """A bare ``failed`` is terminal, never retried; flag it if the card moved since creation."""
    if to_state != "failed" or message:
        return []
    if agent_revision is None or agent_revision == _public_revision(task, "card_revision"):
        return []
    return [
        ev.FlaggedForReview(
            reason="revision_skew",
            detail="failed without a diagnostic after the card revision changed",
            revision=agent_revision,
        )
    ]
