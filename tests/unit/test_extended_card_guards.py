"""R15's authenticated extended card in the pure parts: the guards when the public card stands in
for an extended card that could not be read again, the comparisons that follow the public card,
the agent projection an extended ``CardFetched`` leaves alone (replay of older logs unchanged),
and the words ``show`` prints for it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from support import cards
from support.cards import card_document

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.cli._render import describe
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import (
    Decision,
    card_is_stale,
    failure_review,
    reconcile_stand_in,
    resend_check,
    resume_stand_in,
)
from cardfence.engine.core.replay import apply_agent_event, fold_agent, initial_task_state
from cardfence.engine.errors import DiscoveryError

CARD_URL = "http://a.test/.well-known/agent-card.json"
RPC = {"url": "http://a.test/rpc", "binding": "JSONRPC"}
PUBLIC = card_document(
    "http://a.test/rpc", capabilities={"pushNotifications": True, "extendedAgentCard": True}
)
UNREAD = DiscoveryError(RPC["url"], "extended_card", "RemoteRefusedError: -32007")
FAILED = DiscoveryError(CARD_URL, "http_status", "503")


def parse(doc: dict[str, Any]) -> AgentCard:
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


def public(change: Any = None) -> AgentCard:
    doc = copy.deepcopy(PUBLIC)
    if change is not None:
        change(doc)
    return parse(doc)


def extended_card() -> AgentCard:
    doc = copy.deepcopy(PUBLIC)
    doc["skills"].append({"id": "vip", "name": "VIP", "description": "for members"})
    return parse(doc)


def extended_task(**extra: Any) -> dict[str, Any]:
    """A task created under the extended card, for its skill ``vip``."""
    ext, pub = extended_card(), public()
    return {
        **initial_task_state("k"),
        "skill": "vip",
        "card_revision": ext.revision,
        "latest_card_revision": ext.revision,
        "contract_hash": ext.contract_hash,
        "skill_hash": ext.compatibility_hash("vip"),
        "endpoint": dict(RPC),
        "extended": True,
        "public_revision": pub.revision,
        "public_contract_hash": pub.contract_hash,
        **extra,
    }


def unavailable(failure: DiscoveryError, during: str) -> tuple[str, dict[str, Any]]:
    return ev.DISCOVERY_UNAVAILABLE, {
        "kind": failure.kind,
        "detail": failure.detail,
        "url": failure.url,
        "during": during,
    }


# -- R7: the public card stands in -----------------------------------------------------------------


def test_revalidation_with_the_public_card_standing_in_only_annotates() -> None:
    assert reconcile_stand_in(extended_task(), public(), None, UNREAD) == [
        unavailable(UNREAD, "revalidation")
    ]


def test_revalidation_standing_in_annotates_a_public_card_failure_too() -> None:
    assert reconcile_stand_in(extended_task(), None, FAILED, UNREAD) == [
        unavailable(UNREAD, "revalidation"),
        unavailable(FAILED, "revalidation"),
    ]


def test_revalidation_standing_in_downgrades_push_the_public_card_withdrew() -> None:
    no_push = public(lambda d: d["capabilities"].update(pushNotifications=False))
    task = extended_task(delivery_mode="push")
    assert reconcile_stand_in(task, no_push, None, UNREAD) == [
        unavailable(UNREAD, "revalidation"),
        (
            ev.DELIVERY_DOWNGRADED,
            {
                "reason": "push_withdrawn",
                "detail": "card withdrew pushNotifications",
                "card_revision": no_push.revision,
                "to": "polling",
            },
        ),
    ]


def test_revalidation_standing_in_leaves_a_polled_task_alone_when_the_card_has_no_push() -> None:
    no_push = public(lambda d: d["capabilities"].update(pushNotifications=False))
    for mode in ("polling", None):
        task = extended_task(delivery_mode=mode)
        assert reconcile_stand_in(task, no_push, None, UNREAD) == [
            unavailable(UNREAD, "revalidation")
        ]


# -- R9: never orphaned by the public card ---------------------------------------------------------


def test_resume_with_the_public_card_standing_in_never_orphans_and_stays_put() -> None:
    plan = resume_stand_in(extended_task(), public(), None, UNREAD)
    assert plan.orphaned is False
    assert plan.endpoint == RPC
    assert plan.events == (unavailable(UNREAD, "resume"),)


def test_resume_standing_in_follows_the_endpoint_the_public_card_moved() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), None, UNREAD, allow_insecure=True)
    new = {"url": "http://a.test/rpc2", "binding": "JSONRPC", "protocol_version": "1.0"}
    assert plan.orphaned is False
    assert plan.endpoint == new
    assert plan.events == (
        unavailable(UNREAD, "resume"),
        (ev.ENDPOINT_MOVED, {"old": RPC, "new": new}),
    )


def test_resume_standing_in_never_moves_to_plain_http_unless_allowed() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), None, UNREAD)
    assert (plan.orphaned, plan.endpoint, plan.events) == (
        False,
        RPC,
        (unavailable(UNREAD, "resume"),),
    )


def test_resume_standing_in_with_a_public_card_failure_stays_at_the_recorded_endpoint() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), FAILED, UNREAD, allow_insecure=True)
    assert (plan.orphaned, plan.endpoint, plan.events) == (
        False,
        RPC,
        (unavailable(UNREAD, "resume"), unavailable(FAILED, "resume")),
    )


def test_resume_standing_in_without_any_card_goes_on_at_the_recorded_endpoint() -> None:
    plan = resume_stand_in(extended_task(), None, FAILED, UNREAD)
    assert plan.orphaned is False
    assert plan.endpoint == RPC
    assert plan.events == (unavailable(UNREAD, "resume"), unavailable(FAILED, "resume"))


# -- what follows the public card ------------------------------------------------------------------


def test_an_extended_task_is_stale_only_when_the_public_card_moved() -> None:
    task = extended_task()
    assert not card_is_stale(task, {"revision": public().revision})
    assert card_is_stale(task, {"revision": public(lambda d: d.update(version="2")).revision})


def test_a_bare_failure_of_an_extended_task_is_flagged_only_when_the_public_card_moved() -> None:
    task = extended_task()
    assert failure_review(task, "failed", None, public().revision) == []
    moved = public(lambda d: d.update(version="2")).revision
    assert [e[1]["reason"] for e in failure_review(task, "failed", None, moved)] == [
        "revision_skew"
    ]


def test_a_resend_of_an_extended_task_compares_the_public_contract() -> None:
    task = extended_task(skill="echo", skill_hash=extended_card().compatibility_hash("echo"))
    assert resend_check(task, public()).allowed
    secured = public(lambda d: d.update(securitySchemes={"m": {"mtlsSecurityScheme": {}}}))
    refused = resend_check(task, secured)
    assert (refused.allowed, refused.reason) == (False, "contract_changed")
    assert task["public_contract_hash"] in refused.detail


def test_a_resend_of_an_extended_task_checks_its_skill_on_the_extended_card_read_again() -> None:
    task = extended_task(public_contract_hash=public().contract_hash)
    assert resend_check(task, public(), extended_card()) == Decision(True, "ok")
    refused = resend_check(task, public())  # the public card alone lacks the skill
    assert (refused.allowed, refused.reason) == (False, "skill_absent")


def test_a_resend_compares_the_public_card_with_the_public_contract_not_the_extended_one() -> None:
    def secured(doc: dict[str, Any]) -> None:
        doc["securitySchemes"] = {"m": {"mtlsSecurityScheme": {}}}
        doc["securityRequirements"] = [{"schemes": {"m": {"list": []}}}]

    ext_doc = copy.deepcopy(PUBLIC)
    secured(ext_doc)
    ext_doc["skills"].append({"id": "vip", "name": "VIP", "description": "for members"})
    ext = parse(ext_doc)
    task = extended_task(contract_hash=ext.contract_hash)
    assert ext.contract_hash != public().contract_hash
    assert resend_check(task, public(), ext) == Decision(True, "ok")
    bare = {k: v for k, v in task.items() if k != "public_contract_hash"}  # a non-extended task
    refused = resend_check(bare, public(), ext)
    assert refused == Decision(
        False, "contract_changed", f"the contract is no longer {ext.contract_hash}"
    )


# -- the agent projection --------------------------------------------------------------------------


def fetched(card: AgentCard, **extra: Any) -> dict[str, Any]:
    return cards.fetched(card, CARD_URL, **extra)


def test_an_extended_read_leaves_the_public_projection_and_adds_its_own_keys() -> None:
    pub, ext = public(), extended_card()
    after_public = fold_agent("http://a.test", [(ev.CARD_FETCHED, fetched(pub))])
    extended = fetched(
        ext,
        url=RPC["url"],
        fetched_at="2026-12-01T00:00:01+00:00",
        extended=True,
        binding="JSONRPC",
        public_revision=pub.revision,
    )
    after = apply_agent_event(after_public, ev.CARD_FETCHED, extended)
    assert {k: v for k, v in after.items() if not k.startswith("extended_")} == after_public
    assert after["extended_revision"] == ext.revision
    assert after["extended_fetched_at"] == "2026-12-01T00:00:01+00:00"


def test_a_log_without_extended_reads_replays_to_the_same_keys_as_before() -> None:
    state = fold_agent("http://a.test", [(ev.CARD_FETCHED, fetched(public()))])
    assert "extended_revision" not in state
    assert "extended_fetched_at" not in state


def test_the_words_name_the_extended_card() -> None:
    ext = extended_card()
    read = fetched(ext, extended=True, binding="JSONRPC", public_revision=public().revision)
    assert str(describe(ev.CARD_FETCHED, read)).startswith(f"extended card {ext.revision[:12]} ")
    assert str(describe(ev.CARD_FETCHED, fetched(ext))).startswith(f"card {ext.revision[:12]} ")
    submitted = {"skill": "vip", "agent": "http://a.test", "card_revision": ext.revision}
    assert " extended card " in str(describe(ev.TASK_SUBMITTED, {**submitted, "extended": True}))
    assert " extended card " not in str(describe(ev.TASK_SUBMITTED, submitted))
