"""The decisions of rules R2-R11 as pure functions of recorded facts."""

from __future__ import annotations

import copy
import json
from typing import Any

from support.cards import card_document, interface, skill

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import (
    boundary_recheck_due,
    creation_check,
    failure_review,
    push_recheck,
    reconcile_card,
    registration_check,
    resume_check,
    throttled,
)
from cardfence.engine.core.replay import fold_task, initial_task_state
from cardfence.engine.errors import DiscoveryError

BASE = card_document(
    supportedInterfaces=[
        interface("http://a.test/rpc"),
        interface("http://a.test/rest", "HTTP+JSON"),
    ],
    capabilities={"pushNotifications": True},
    skills=[skill("echo"), skill("ask", inputModes=["application/json"])],
)


def card(change: Any = None) -> AgentCard:
    doc = copy.deepcopy(BASE)
    if change is not None:
        change(doc)
    return parse_card(json.dumps(doc).encode(), url="http://a.test/.well-known/agent-card.json")


def task_on(c: AgentCard, skill: str = "echo", **extra: Any) -> dict[str, Any]:
    return {
        **initial_task_state("k"),
        "skill": skill,
        "card_revision": c.revision,
        "latest_card_revision": c.revision,
        "contract_hash": c.contract_hash,
        "skill_hash": c.compatibility_hash(skill),
        "endpoint": {"url": "http://a.test/rpc", "binding": "JSONRPC"},
        **extra,
    }


FAILED = DiscoveryError("http://a.test/.well-known/agent-card.json", "http_status", "503")


def test_creation_needs_the_skill_and_its_media_type() -> None:
    fresh = card()
    assert creation_check(fresh, "echo", "text/plain").allowed
    absent = creation_check(fresh, "translate", "text/plain")
    assert (absent.allowed, absent.reason) == (False, "skill_absent")
    wrong = creation_check(fresh, "ask", "text/plain")
    assert (wrong.allowed, wrong.reason) == (False, "media_type_not_accepted")


def test_registration_needs_push_in_the_read_made_for_it() -> None:
    assert registration_check(card(), None).allowed
    no_push = card(lambda d: d["capabilities"].update(pushNotifications=False))
    assert registration_check(no_push, None).reason == "push_not_advertised"
    assert registration_check(None, FAILED).reason == "discovery_failed"


def test_boundary_recheck_only_when_waiting_for_push_after_a_real_transition() -> None:
    push = {"delivery_mode": "push"}
    assert boundary_recheck_due(push, "submitted", "working")
    assert not boundary_recheck_due(push, "working", "completed")
    assert not boundary_recheck_due(push, "working", "working")
    assert not boundary_recheck_due({"delivery_mode": "polling"}, "submitted", "working")


def test_push_withdrawn_at_a_boundary_downgrades_and_a_failed_read_only_annotates() -> None:
    fresh = card()
    task = task_on(fresh, delivery_mode="push")
    withdrawn = card(lambda d: d["capabilities"].update(pushNotifications=False))
    [(kind, data)] = push_recheck(task, withdrawn, None)
    assert (kind, data["reason"]) == (ev.DELIVERY_DOWNGRADED, "push_withdrawn")
    [(kind, _)] = push_recheck(task, None, FAILED)
    assert kind == ev.DISCOVERY_UNAVAILABLE
    assert push_recheck(task, fresh, None) == []


def test_a_changed_card_mid_task_is_recorded_and_flagged_never_acted_on() -> None:
    fresh = card()
    task = task_on(fresh, state="working", delivery_mode="push")
    dropped = card(
        lambda d: (d["skills"].pop(0), d["capabilities"].update(pushNotifications=False))
    )
    kinds = [kind for kind, _ in reconcile_card(task, dropped, None, fresh)]
    assert kinds == [ev.CARD_REVISION_CHANGED, ev.DELIVERY_DOWNGRADED, ev.FLAGGED_FOR_REVIEW]
    assert all(kind not in (ev.STATE_CHANGED, ev.CANCEL_REQUESTED) for kind in kinds)


def test_a_rotated_contract_mid_task_is_a_divergence() -> None:
    fresh = card()
    rotated = card(lambda d: d.update(securitySchemes={"m": {"mtlsSecurityScheme": {}}}))
    events = reconcile_card(task_on(fresh, state="working"), rotated, None, fresh)
    assert [k for k, _ in events] == [ev.CARD_REVISION_CHANGED, ev.CONTRACT_DIVERGED]


def test_an_unchanged_card_or_a_failed_read_mid_task() -> None:
    fresh = card()
    assert reconcile_card(task_on(fresh), fresh, None, fresh) == []
    [(kind, data)] = reconcile_card(task_on(fresh), None, FAILED, fresh)
    assert (kind, data["during"]) == (ev.DISCOVERY_UNAVAILABLE, "revalidation")


def test_resume_orphans_a_task_whose_skill_vanished_or_changed_incompatibly() -> None:
    fresh = card()
    task = task_on(fresh)
    gone = resume_check(task, card(lambda d: d["skills"].pop(0)), None)
    assert gone.orphaned
    assert gone.events[0][1]["reason"] == "skill_absent"
    changed = resume_check(
        task, card(lambda d: d["skills"][0].update(inputModes=["image/png"])), None
    )
    assert changed.orphaned
    assert changed.events[0][1]["reason"] == "skill_incompatible"


def test_resume_ignores_descriptive_edits_and_follows_a_moved_endpoint() -> None:
    fresh = card()
    task = task_on(fresh)

    def move(d: dict[str, Any]) -> None:
        d["skills"][0]["description"] = "now with more words"
        d["supportedInterfaces"][0]["url"] = "https://b.test/rpc"

    plan = resume_check(task, card(move), None)
    assert not plan.orphaned
    assert plan.endpoint == {
        "url": "https://b.test/rpc",
        "binding": "JSONRPC",
        "protocol_version": "1.0",
    }
    assert [k for k, _ in plan.events] == [ev.CARD_REVISION_CHANGED, ev.ENDPOINT_MOVED]


def test_resume_on_a_failed_read_stays_on_the_recorded_endpoint() -> None:
    task = task_on(card())
    plan = resume_check(task, None, FAILED)
    assert (plan.orphaned, plan.endpoint) == (False, task["endpoint"])
    assert plan.events[0][0] == ev.DISCOVERY_UNAVAILABLE


def test_a_bare_failure_after_a_revision_change_is_flagged_as_possible_skew() -> None:
    fresh = card()
    task = task_on(fresh)
    [(kind, data)] = failure_review(task, "failed", None, "f" * 64)
    assert (kind, data["reason"]) == (ev.FLAGGED_FOR_REVIEW, "revision_skew")
    assert failure_review(task, "failed", "out of memory", "f" * 64) == []
    assert failure_review(task, "failed", None, fresh.revision) == []
    assert failure_review(task, "completed", None, "f" * 64) == []


def test_an_agent_asking_for_time_is_recorded_once_as_a_flag_and_nothing_else() -> None:
    task = initial_task_state("k")
    [event] = throttled(task, "http://a.test/rpc", 429, 20.0, 12.3456, "poll")
    assert event == (
        ev.THROTTLED,
        {"url": "http://a.test/rpc", "status": 429, "asked": 20.0, "wait": 12.346,
         "during": "poll"},
    )  # fmt: skip
    after = fold_task("k", [event], task)
    assert after == {**task, "flags": ["throttled"]}  # an annotation: no state, no transition
    assert throttled(after, "http://a.test/rpc", 503, None, None, "send") == []
