"""Folding a stream's events into its projection (R13). Pure: no I/O.

The engine computes every projection it writes by applying these same functions to the events it
appends, so a replay reproduces the stored projection by construction; the audit checks that it
does. Unknown event types (from a newer cardfence) leave the state unchanged and are reported by
the audit, never crashed on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine import events as ev

State = dict[str, Any]


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
    if type_ == ev.CARD_FETCHED:
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
    elif type_ == ev.DISCOVERY_FAILED:
        out["last_failure"] = {
            "kind": data.get("kind"),
            "detail": data.get("detail"),
            "at": data.get("at"),
        }
        out["failures"] = out["failures"] + 1
    elif type_ in (ev.CONTRACT_PINNED, ev.CONTRACT_ACCEPTED):
        out["pinned_contract"] = data["contract_hash"]
        out["pinned_revision"] = data.get("revision")
    elif type_ == ev.TASK_CREATION_REFUSED:
        out["refusals"] = out["refusals"] + 1
    return out


def fold_agent(
    origin: str, events: Iterable[tuple[str, Mapping[str, Any]]], state: State | None = None
) -> State:
    """Fold ``(type, data)`` pairs over an agent stream's state (from its initial state)."""
    current: State = initial_agent_state(origin) if state is None else state
    for type_, data in events:
        current = apply_agent_event(current, type_, data)
    return current
