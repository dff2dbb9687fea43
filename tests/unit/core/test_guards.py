"""The guards' decisions and events, field by field (R2-R11).

The events a guard returns are recorded and audited, so their exact payloads (keys, reasons,
details, revisions) are the contract, not just their types."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from support import cards
from support.cards import card_document, interface, skill
from support.events import stored, submitted

from cardfence.engine.cards.diff import diff
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.cli._render import describe
from cardfence.engine.core import events as ev
from cardfence.engine.core.guards import (
    Decision,
    ResumePlan,
    boundary_recheck_due,
    card_is_stale,
    context_check,
    creation_check,
    downgrade,
    failure_review,
    never_created,
    push_recheck,
    reconcile_card,
    reconcile_stand_in,
    refused_creation,
    registration_check,
    resend_check,
    resume_check,
    resume_stand_in,
    sole_skill,
    throttled,
    unavailable,
    wrong_task,
)
from cardfence.engine.core.replay import (
    apply_agent_event,
    fold_agent,
    fold_task,
    initial_task_state,
)
from cardfence.engine.errors import DiscoveryError

CARD_URL = "http://a.test/.well-known/agent-card.json"
RPC = {"url": "http://a.test/rpc", "binding": "JSONRPC"}
REST = {"url": "http://a.test/rest", "binding": "HTTP+JSON"}
BASE = card_document(
    supportedInterfaces=[
        interface("http://a.test/rpc"),
        interface("http://a.test/rest", "HTTP+JSON"),
    ],
    capabilities={"pushNotifications": True},
    skills=[skill("echo"), skill("ask", inputModes=["application/json", "image/png"])],
)
FAILED = DiscoveryError(CARD_URL, "http_status", "503")


def card(change: Any = None) -> AgentCard:
    doc = copy.deepcopy(BASE)
    if change is not None:
        change(doc)
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


def no_push(doc: dict[str, Any]) -> None:
    doc["capabilities"]["pushNotifications"] = False


def drop_echo(doc: dict[str, Any]) -> None:
    doc["skills"].pop(0)


def change_echo(doc: dict[str, Any]) -> None:
    doc["skills"][0]["inputModes"] = ["image/png"]


def rotate_contract(doc: dict[str, Any]) -> None:
    doc["securitySchemes"] = {"m": {"mtlsSecurityScheme": {}}}


def task_on(c: AgentCard, skill: str = "echo", **extra: Any) -> dict[str, Any]:
    return {
        **initial_task_state("k"),
        "skill": skill,
        "card_revision": c.revision,
        "latest_card_revision": c.revision,
        "contract_hash": c.contract_hash,
        "skill_hash": c.compatibility_hash(skill),
        "endpoint": dict(RPC),
        **extra,
    }


def downgraded(revision: str | None) -> ev.DeliveryDowngraded:
    return ev.DeliveryDowngraded(
        reason="push_withdrawn",
        detail="card withdrew pushNotifications",
        card_revision=revision,
        to="polling",
    )


def unavailable_during(during: str) -> ev.DiscoveryUnavailable:
    return ev.DiscoveryUnavailable(kind="http_status", detail="503", url=CARD_URL, during=during)


# -- R2 creation ----------------------------------------------------------------------------------


def test_creation_refusal_names_the_skills_the_card_offers() -> None:
    assert creation_check(card(), "translate", "text/plain") == Decision(
        False, "skill_absent", "is absent from the card (offered: echo, ask)"
    )


def test_creation_refusal_on_a_card_without_skills_says_none_are_offered() -> None:
    empty = card(lambda d: d.update(skills=[]))
    assert creation_check(empty, "echo", "text/plain") == Decision(
        False, "skill_absent", "is absent from the card (offered: none)"
    )


def test_creation_refusal_names_the_media_types_the_skill_accepts() -> None:
    assert creation_check(card(), "ask", "text/plain") == Decision(
        False,
        "media_type_not_accepted",
        "does not accept text/plain (accepts: application/json, image/png)",
    )


def test_creation_allowed_is_recorded_as_ok() -> None:
    assert creation_check(card(), "ask", "image/png") == Decision(True, "ok", "")


def test_creation_checks_every_parts_media_type_and_names_the_first_refused() -> None:
    assert creation_check(card(), "ask", ["image/png", "application/json"]) == Decision(True, "ok")
    assert creation_check(card(), "ask", ["image/png", "text/csv", "text/plain"]) == Decision(
        False,
        "media_type_not_accepted",
        "does not accept text/csv (accepts: application/json, image/png)",
    )


def test_creation_needs_one_accepted_output_mode_the_skill_produces() -> None:
    outputs = card(lambda d: d["skills"][1].update(outputModes=["image/png", "text"]))
    for accepted in (["image/*"], ["text/markdown"], ["audio/ogg", "image/png"], ["*/*"]):
        assert creation_check(outputs, "ask", "image/png", (), accepted).allowed, accepted
    assert creation_check(outputs, "ask", "image/png", (), ["audio/*", "video/mp4"]) == Decision(
        False,
        "output_mode_not_accepted",
        "produces none of audio/*, video/mp4 (produces: image/png, text)",
    )


def test_creation_without_a_skill_named_is_refused_naming_the_skills_offered() -> None:
    assert creation_check(card(), None, "text/plain") == Decision(
        False, "skill_absent", "was not named, and the card offers 2 (offered: echo, ask)"
    )


def test_the_sole_skill_of_a_card_is_the_one_a_creation_may_leave_unnamed() -> None:
    assert sole_skill(card(drop_echo)) == "ask"
    assert sole_skill(card()) is None
    assert sole_skill(card(lambda d: d.update(skills=[]))) is None


# -- R4 registration ------------------------------------------------------------------------------


def test_registration_refused_on_a_failed_read_carries_the_failure() -> None:
    expected = Decision(False, "discovery_failed", f"GET {CARD_URL} -> 503")
    assert registration_check(None, FAILED) == expected
    # A failure wins even if some card is at hand: the read made for this registration failed.
    assert registration_check(card(), FAILED) == expected


def test_registration_refused_without_a_card_or_a_failure_says_no_card() -> None:
    assert registration_check(None, None) == Decision(False, "discovery_failed", "no card")


def test_registration_refused_names_the_revision_that_says_no_push() -> None:
    withdrawn = card(no_push)
    assert registration_check(withdrawn, None) == Decision(
        False, "push_not_advertised", f"card {withdrawn.revision[:12]} says no push"
    )


def test_registration_allowed_is_recorded_as_push_advertised() -> None:
    assert registration_check(card(), None) == Decision(True, "push_advertised", "")


def test_downgrade_and_unavailable_events_have_their_recorded_shape() -> None:
    assert stored([downgrade("why", "what", "rev")]) == [
        (
            ev.DELIVERY_DOWNGRADED,
            {"reason": "why", "detail": "what", "card_revision": "rev", "to": "polling"},
        )
    ]
    assert stored([downgrade("why", "what")]) == [
        (
            ev.DELIVERY_DOWNGRADED,
            {"reason": "why", "detail": "what", "card_revision": None, "to": "polling"},
        )
    ]
    assert unavailable(FAILED, "somewhen") == unavailable_during("somewhen")


# -- R6 boundary re-check -------------------------------------------------------------------------


def test_boundary_recheck_events_in_full() -> None:
    fresh = card()
    task = task_on(fresh, delivery_mode="push")
    withdrawn = card(no_push)
    assert push_recheck(task, withdrawn, None) == [downgraded(withdrawn.revision)]
    assert push_recheck(task, None, FAILED) == [unavailable_during("boundary_recheck")]
    assert push_recheck(task_on(fresh), withdrawn, None) == []  # already polling


# -- R7, R8 mid-task reconciliation ---------------------------------------------------------------


def test_a_mid_task_card_change_is_recorded_with_the_diff_from_the_previous_revision() -> None:
    fresh = card()
    task = task_on(fresh, state="working", delivery_mode="push")
    dropped = card(lambda d: (drop_echo(d), no_push(d)))
    assert reconcile_card(task, dropped, None, fresh) == [
        ev.CardRevisionChanged(
            old=fresh.revision, new=dropped.revision, changes=diff(fresh, dropped).to_json()
        ),
        downgraded(dropped.revision),
        ev.FlaggedForReview(
            reason="skill_withdrawn",
            detail=f"skill 'echo' is absent from {dropped.revision}",
            revision=dropped.revision,
        ),
    ]
    assert diff(fresh, dropped).to_json()  # the diff is not empty


def test_a_card_change_without_the_previous_revision_records_no_changes() -> None:
    fresh = card()
    renamed = card(lambda d: d.update(name="renamed"))
    task = task_on(fresh, state="working")
    assert reconcile_card(task, renamed, None, None) == [
        ev.CardRevisionChanged(old=fresh.revision, new=renamed.revision, changes={}),
    ]


def test_an_incompatible_skill_change_mid_task_is_flagged_as_changed() -> None:
    fresh = card()
    changed = card(change_echo)
    events = reconcile_card(task_on(fresh, state="working"), changed, None, fresh)
    assert events[1:] == [
        ev.FlaggedForReview(
            reason="skill_changed",
            detail="skill 'echo' changed incompatibly",
            revision=changed.revision,
        )
    ]


def test_a_polling_task_is_not_downgraded_when_the_card_drops_push() -> None:
    fresh = card()
    withdrawn = card(no_push)
    events = reconcile_card(task_on(fresh, state="working"), withdrawn, None, fresh)
    assert [event.type for event in events] == [ev.CARD_REVISION_CHANGED]


@pytest.mark.parametrize("terminal", ["completed", "failed", "canceled", "rejected"])
def test_a_skill_dropped_after_the_task_ended_is_not_flagged(terminal: str) -> None:
    fresh = card()
    dropped = card(drop_echo)
    events = reconcile_card(task_on(fresh, state=terminal), dropped, None, fresh)
    assert [event.type for event in events] == [ev.CARD_REVISION_CHANGED]


def test_a_contract_divergence_names_the_frozen_and_the_observed_contract() -> None:
    fresh = card()
    rotated = card(rotate_contract)
    events = reconcile_card(task_on(fresh, state="working"), rotated, None, fresh)
    assert events[-1] == ev.ContractDiverged(
        frozen=fresh.contract_hash, observed=rotated.contract_hash, revision=rotated.revision
    )
    assert fresh.contract_hash != rotated.contract_hash


# -- R9 resume ------------------------------------------------------------------------------------


def test_resume_on_the_same_card_stays_where_it_was_and_records_nothing() -> None:
    fresh = card()
    task = task_on(fresh)
    assert resume_check(task, fresh, None) == ResumePlan(False, RPC, (), "")


def test_resume_keeps_the_recorded_binding_when_the_card_prefers_another() -> None:
    fresh = card()
    task = task_on(fresh, endpoint=dict(REST))  # the card lists JSON-RPC first
    assert resume_check(task, fresh, None) == ResumePlan(False, REST, (), "")


def test_resume_of_a_task_without_a_recorded_endpoint_moves_nowhere() -> None:
    fresh = card()
    task = task_on(fresh, endpoint=None)
    assert resume_check(task, fresh, None) == ResumePlan(False, None, (), "")


def test_resume_on_a_card_with_no_speakable_interface_stays_on_the_recorded_endpoint() -> None:
    fresh = card()
    grpc_only = card(
        lambda d: d.update(
            supportedInterfaces=[
                {"url": "grpc://a.test", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
            ]
        )
    )
    plan = resume_check(task_on(fresh), grpc_only, None)
    assert (plan.orphaned, plan.endpoint) == (False, RPC)
    assert ev.ENDPOINT_MOVED not in [event.type for event in plan.events]


def test_resume_without_a_card_or_a_failure_goes_on_and_records_nothing() -> None:
    task = task_on(card())
    assert resume_check(task, None, None) == ResumePlan(False, RPC, (), "")


def test_resume_on_a_failed_read_records_it_as_during_resume() -> None:
    task = task_on(card())
    assert resume_check(task, None, FAILED) == ResumePlan(
        False, RPC, (unavailable_during("resume"),), ""
    )


def test_resume_orphans_a_task_whose_skill_is_absent_with_the_reason_recorded() -> None:
    fresh = card()
    dropped = card(drop_echo)
    detail = "skill 'echo' is absent"
    orphaned = ev.TaskOrphaned(
        reason="skill_absent", skill="echo", revision=dropped.revision, detail=detail
    )
    assert resume_check(task_on(fresh), dropped, None) == ResumePlan(True, RPC, (orphaned,), detail)


def test_resume_orphans_a_task_whose_skill_changed_with_the_reason_recorded() -> None:
    fresh = card()
    changed = card(change_echo)
    detail = "skill 'echo' changed incompatibly"
    orphaned = ev.TaskOrphaned(
        reason="skill_incompatible", skill="echo", revision=changed.revision, detail=detail
    )
    assert resume_check(task_on(fresh), changed, None) == ResumePlan(True, RPC, (orphaned,), detail)


def test_resume_records_a_new_revision_a_divergence_and_a_move_in_full() -> None:
    fresh = card()

    def move_and_rotate(doc: dict[str, Any]) -> None:
        rotate_contract(doc)
        doc["supportedInterfaces"][0]["url"] = "https://b.test/rpc"

    moved = card(move_and_rotate)
    new_endpoint = {"url": "https://b.test/rpc", "binding": "JSONRPC", "protocol_version": "1.0"}
    assert resume_check(task_on(fresh), moved, None) == ResumePlan(
        False,
        new_endpoint,
        (
            ev.CardRevisionChanged(old=fresh.revision, new=moved.revision, changes={}),
            ev.ContractDiverged(
                frozen=fresh.contract_hash, observed=moved.contract_hash, revision=moved.revision
            ),
            ev.EndpointMoved(old=RPC, new=new_endpoint),
        ),
        "",
    )


# -- R9's other trigger, R11 ----------------------------------------------------------------------


def test_the_card_is_stale_when_the_agent_recorded_another_revision() -> None:
    task = task_on(card())
    assert card_is_stale(task, {"revision": "f" * 64})
    assert not card_is_stale(task, {"revision": task["latest_card_revision"]})
    assert not card_is_stale(task, {"revision": None})
    assert not card_is_stale(task, {})


def test_a_bare_failure_after_a_revision_change_is_flagged_in_full() -> None:
    task = task_on(card())
    assert failure_review(task, "failed", "", "f" * 64) == [
        ev.FlaggedForReview(
            reason="revision_skew",
            detail="failed without a diagnostic after the card revision changed",
            revision="f" * 64,
        )
    ]
    assert failure_review(task, "failed", None, None) == []


# -- R2, R3 a creation sent again by resume, a creation the agent refused -------------------------


def test_resend_on_the_card_the_task_was_created_on_is_allowed() -> None:
    fresh = card()
    assert resend_check(task_on(fresh, media_type="text/plain"), fresh) == Decision(True, "ok", "")
    assert resend_check(task_on(fresh, "ask", media_type="image/png"), fresh) == Decision(
        True, "ok", ""
    )


def test_resend_of_a_task_without_a_media_type_checks_text_plain() -> None:
    fresh = card()
    assert resend_check(task_on(fresh), fresh) == Decision(True, "ok", "")
    assert resend_check(task_on(fresh, "ask", media_type=None), fresh) == Decision(
        False,
        "media_type_not_accepted",
        "does not accept text/plain (accepts: application/json, image/png)",
    )


def test_resend_checks_the_parts_and_output_modes_of_the_message_sent_again() -> None:
    fresh = card()
    task = task_on(fresh, "ask", media_type=None)
    assert resend_check(task, fresh, media_types=["image/png", "application/json"]).allowed
    assert resend_check(task, fresh, media_types=["image/png", "text/plain"]).reason == (
        "media_type_not_accepted"
    )
    refused = resend_check(task, fresh, media_types=["image/png"], accept=["audio/*"])
    assert refused.reason == "output_mode_not_accepted"


def test_resend_refused_when_the_skill_is_gone_or_no_longer_takes_the_media_type() -> None:
    fresh = card()
    dropped = card(drop_echo)
    assert resend_check(task_on(fresh), dropped) == Decision(
        False, "skill_absent", "is absent from the card (offered: ask)"
    )
    task = task_on(fresh, media_type="text/plain")
    assert resend_check(task, card(change_echo)) == Decision(
        False, "media_type_not_accepted", "does not accept text/plain (accepts: image/png)"
    )


def test_resend_refused_when_the_contract_changed_names_the_frozen_contract() -> None:
    fresh = card()
    rotated = card(rotate_contract)
    assert rotated.contract_hash != fresh.contract_hash
    assert resend_check(task_on(fresh), rotated) == Decision(
        False, "contract_changed", f"the contract is no longer {fresh.contract_hash}"
    )
    # The skill check comes first: a dropped skill is named, whatever the contract.
    gone = card(lambda d: (rotate_contract(d), drop_echo(d)))
    assert resend_check(task_on(fresh), gone).reason == "skill_absent"


def test_a_creation_the_agent_refused_is_recorded_with_its_code_message_and_url() -> None:
    assert stored([refused_creation(-32602, "bad params", "http://a.test/rpc")]) == [
        (
            ev.TASK_CREATION_REFUSED,
            {
                "reason": "remote_refused",
                "code": -32602,
                "message": "bad params",
                "url": "http://a.test/rpc",
            },
        )
    ]


def test_a_task_is_never_created_when_closed_so_or_flagged_send_refused_by_an_older_version() -> (
    None
):
    fresh = card()
    assert never_created(task_on(fresh, closed="never_created"))
    assert never_created(task_on(fresh, flags=["send_refused"]))
    assert never_created({"flags": ["other", "send_refused"]})
    assert not never_created(task_on(fresh))
    assert not never_created(task_on(fresh, closed="done", flags=["wrong_task"]))
    assert not never_created({"flags": None})
    assert not never_created({})


# -- R12 an answer about another task, a report in another context --------------------------------


def test_an_answer_about_another_task_is_ignored_and_flagged_with_both_ids() -> None:
    task = task_on(card())
    assert stored(wrong_task(task, "t-1", "t-2", "working", "poll")) == [
        (
            ev.OBSERVATION_IGNORED,
            {
                "reason": "wrong_task",
                "state": "working",
                "source": "poll",
                "remote_timestamp": None,
                "asked": "t-1",
                "answered": "t-2",
            },
        ),
        (
            ev.FLAGGED_FOR_REVIEW,
            {
                "reason": "wrong_task",
                "detail": "asked about task t-1, the agent answered about task t-2",
            },
        ),
    ]
    assert wrong_task({"flags": None}, "a", "b", None, "send")[0].payload()["state"] is None


def test_an_answer_about_another_task_adds_nothing_once_the_task_is_flagged() -> None:
    task = task_on(card(), flags=["clock_skew", "wrong_task"])
    assert wrong_task(task, "t-1", "t-2", "working", "poll") == []
    assert len(wrong_task(task_on(card(), flags=["clock_skew"]), "t-1", "t-2", None, "poll")) == 2


def test_a_report_in_another_context_is_flagged_once_with_both_contexts() -> None:
    task = task_on(card(), remote_context_id="ctx-1")
    assert stored(context_check(task, "ctx-2")) == [
        (
            ev.FLAGGED_FOR_REVIEW,
            {
                "reason": "context_mismatch",
                "detail": "the task's context is ctx-1, a report named ctx-2",
            },
        )
    ]
    flagged = task_on(card(), remote_context_id="ctx-1", flags=["wrong_task", "context_mismatch"])
    assert context_check(flagged, "ctx-2") == []
    other_flag = task_on(card(), remote_context_id="ctx-1", flags=["wrong_task"])
    assert len(context_check(other_flag, "ctx-2")) == 1
    assert len(context_check({"remote_context_id": "ctx-1", "flags": None}, "ctx-2")) == 1


def test_a_report_in_the_bound_context_or_with_no_context_on_either_side_is_not_flagged() -> None:
    bound = task_on(card(), remote_context_id="ctx-1")
    assert context_check(bound, "ctx-1") == []
    assert context_check(bound, None) == []
    assert context_check(bound, "") == []
    unbound = task_on(card())  # remote_context_id None: nothing to compare with
    assert context_check(unbound, "ctx-2") == []
    assert context_check({**unbound, "remote_context_id": ""}, "ctx-2") == []


# -- R9 resume: which interface, under the R16 rule ------------------------------------------------

HTTPS_RPC = {"url": "https://a.test/rpc", "binding": "JSONRPC"}
HTTPS_REST = {"url": "https://a.test/rest", "binding": "HTTP+JSON"}


def https(doc: dict[str, Any]) -> None:
    for entry in doc["supportedInterfaces"]:
        entry["url"] = entry["url"].replace("http://", "https://")


def test_resume_on_the_same_https_card_stays_on_the_recorded_interface() -> None:
    fresh = card(https)
    for endpoint in (HTTPS_RPC, HTTPS_REST):  # the card lists JSON-RPC first
        task = task_on(fresh, endpoint=dict(endpoint))
        assert resume_check(task, fresh, None) == ResumePlan(False, endpoint, (), "")


def test_resume_follows_an_interface_moved_for_the_recorded_binding() -> None:
    fresh = card(https)

    def move_rest(doc: dict[str, Any]) -> None:
        https(doc)
        doc["supportedInterfaces"][1]["url"] = "https://b.test/rest"

    moved = card(move_rest)
    new = {"url": "https://b.test/rest", "binding": "HTTP+JSON", "protocol_version": "1.0"}
    plan = resume_check(task_on(fresh, endpoint=dict(HTTPS_REST)), moved, None)
    assert (plan.orphaned, plan.endpoint) == (False, new)
    assert plan.events[-1] == ev.EndpointMoved(old=HTTPS_REST, new=new)


def test_resume_moves_to_plain_http_elsewhere_only_when_insecure_http_is_allowed() -> None:
    fresh = card()

    def move(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://b.test/rpc"

    moved = card(move)
    task = task_on(fresh)
    assert resume_check(task, moved, None).endpoint == RPC
    assert resume_check(task, moved, None, allow_insecure=False).endpoint == RPC
    plan = resume_check(task, moved, None, allow_insecure=True)
    assert plan.endpoint == {
        "url": "http://b.test/rpc",
        "binding": "JSONRPC",
        "protocol_version": "1.0",
    }


# --------------------------------------------------------------------------------------------------
# The decisions of rules R2-R11 as pure functions of recorded facts.


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
    [event] = push_recheck(task, withdrawn, None)
    assert isinstance(event, ev.DeliveryDowngraded)
    assert event.reason == "push_withdrawn"
    [event] = push_recheck(task, None, FAILED)
    assert isinstance(event, ev.DiscoveryUnavailable)
    assert push_recheck(task, fresh, None) == []


def test_a_changed_card_mid_task_is_recorded_and_flagged_never_acted_on() -> None:
    fresh = card()
    task = task_on(fresh, state="working", delivery_mode="push")
    dropped = card(
        lambda d: (d["skills"].pop(0), d["capabilities"].update(pushNotifications=False))
    )
    kinds = [event.type for event in reconcile_card(task, dropped, None, fresh)]
    assert kinds == [ev.CARD_REVISION_CHANGED, ev.DELIVERY_DOWNGRADED, ev.FLAGGED_FOR_REVIEW]
    assert all(kind not in (ev.STATE_CHANGED, ev.CANCEL_REQUESTED) for kind in kinds)


def test_a_rotated_contract_mid_task_is_a_divergence() -> None:
    fresh = card()
    rotated = card(lambda d: d.update(securitySchemes={"m": {"mtlsSecurityScheme": {}}}))
    events = reconcile_card(task_on(fresh, state="working"), rotated, None, fresh)
    assert [e.type for e in events] == [ev.CARD_REVISION_CHANGED, ev.CONTRACT_DIVERGED]


def test_an_unchanged_card_or_a_failed_read_mid_task() -> None:
    fresh = card()
    assert reconcile_card(task_on(fresh), fresh, None, fresh) == []
    [event] = reconcile_card(task_on(fresh), None, FAILED, fresh)
    assert isinstance(event, ev.DiscoveryUnavailable)
    assert event.during == "revalidation"


def test_resume_orphans_a_task_whose_skill_vanished_or_changed_incompatibly() -> None:
    fresh = card()
    task = task_on(fresh)
    gone = resume_check(task, card(lambda d: d["skills"].pop(0)), None)
    assert gone.orphaned
    assert isinstance(gone.events[0], ev.TaskOrphaned)
    assert gone.events[0].reason == "skill_absent"
    changed = resume_check(
        task, card(lambda d: d["skills"][0].update(inputModes=["image/png"])), None
    )
    assert changed.orphaned
    assert isinstance(changed.events[0], ev.TaskOrphaned)
    assert changed.events[0].reason == "skill_incompatible"


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
    assert [e.type for e in plan.events] == [ev.CARD_REVISION_CHANGED, ev.ENDPOINT_MOVED]


def test_resume_on_a_failed_read_stays_on_the_recorded_endpoint() -> None:
    task = task_on(card())
    plan = resume_check(task, None, FAILED)
    assert (plan.orphaned, plan.endpoint) == (False, task["endpoint"])
    assert plan.events[0].type == ev.DISCOVERY_UNAVAILABLE


def test_a_bare_failure_after_a_revision_change_is_flagged_as_possible_skew() -> None:
    fresh = card()
    task = task_on(fresh)
    [event] = failure_review(task, "failed", None, "f" * 64)
    assert isinstance(event, ev.FlaggedForReview)
    assert event.reason == "revision_skew"
    assert failure_review(task, "failed", "out of memory", "f" * 64) == []
    assert failure_review(task, "failed", None, fresh.revision) == []
    assert failure_review(task, "completed", None, "f" * 64) == []


def test_an_agent_asking_for_time_is_recorded_once_as_a_flag_and_nothing_else() -> None:
    task = initial_task_state("k")
    [event] = throttled(task, "http://a.test/rpc", 429, 20.0, 12.3456, "poll")
    assert stored([event]) == [(
        ev.THROTTLED,
        {"url": "http://a.test/rpc", "status": 429, "asked": 20.0, "wait": 12.346,
         "during": "poll"},
    )]  # fmt: skip
    after = fold_task("k", [event], task)
    assert after == {**task, "flags": ["throttled"]}  # an annotation: no state, no transition
    assert throttled(after, "http://a.test/rpc", 503, None, None, "send") == []


# --------------------------------------------------------------------------------------------------
# R15's authenticated extended card in the pure parts: the guards when the public card stands in for
# an extended card that could not be read again, the comparisons that follow the public card, the
# agent projection an extended ``CardFetched`` leaves alone (replay of older logs unchanged), and
# the words ``show`` prints for it.


PUBLIC = card_document(
    "http://a.test/rpc", capabilities={"pushNotifications": True, "extendedAgentCard": True}
)
UNREAD = DiscoveryError(RPC["url"], "extended_card", "RemoteRefusedError: -32007")


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


def unavailable_event(failure: DiscoveryError, during: str) -> ev.DiscoveryUnavailable:
    return ev.DiscoveryUnavailable(
        kind=failure.kind, detail=failure.detail, url=failure.url, during=during
    )


# -- R7: the public card stands in -----------------------------------------------------------------


def test_revalidation_with_the_public_card_standing_in_only_annotates() -> None:
    assert reconcile_stand_in(extended_task(), public(), None, UNREAD) == [
        unavailable_event(UNREAD, "revalidation")
    ]


def test_revalidation_standing_in_annotates_a_public_card_failure_too() -> None:
    assert reconcile_stand_in(extended_task(), None, FAILED, UNREAD) == [
        unavailable_event(UNREAD, "revalidation"),
        unavailable_event(FAILED, "revalidation"),
    ]


def test_revalidation_standing_in_downgrades_push_the_public_card_withdrew() -> None:
    no_push = public(lambda d: d["capabilities"].update(pushNotifications=False))
    task = extended_task(delivery_mode="push")
    assert reconcile_stand_in(task, no_push, None, UNREAD) == [
        unavailable_event(UNREAD, "revalidation"),
        ev.DeliveryDowngraded(
            reason="push_withdrawn",
            detail="card withdrew pushNotifications",
            card_revision=no_push.revision,
            to="polling",
        ),
    ]


def test_revalidation_standing_in_leaves_a_polled_task_alone_when_the_card_has_no_push() -> None:
    no_push = public(lambda d: d["capabilities"].update(pushNotifications=False))
    for mode in ("polling", None):
        task = extended_task(delivery_mode=mode)
        assert reconcile_stand_in(task, no_push, None, UNREAD) == [
            unavailable_event(UNREAD, "revalidation")
        ]


# -- R9: never orphaned by the public card ---------------------------------------------------------


def test_resume_with_the_public_card_standing_in_never_orphans_and_stays_put() -> None:
    plan = resume_stand_in(extended_task(), public(), None, UNREAD)
    assert plan.orphaned is False
    assert plan.endpoint == RPC
    assert plan.events == (unavailable_event(UNREAD, "resume"),)


def test_resume_standing_in_follows_the_endpoint_the_public_card_moved() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), None, UNREAD, allow_insecure=True)
    new = {"url": "http://a.test/rpc2", "binding": "JSONRPC", "protocol_version": "1.0"}
    assert plan.orphaned is False
    assert plan.endpoint == new
    assert plan.events == (
        unavailable_event(UNREAD, "resume"),
        ev.EndpointMoved(old=RPC, new=new),
    )


def test_resume_standing_in_never_moves_to_plain_http_unless_allowed() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), None, UNREAD)
    assert (plan.orphaned, plan.endpoint, plan.events) == (
        False,
        RPC,
        (unavailable_event(UNREAD, "resume"),),
    )


def test_resume_standing_in_with_a_public_card_failure_stays_at_the_recorded_endpoint() -> None:
    def moved(doc: dict[str, Any]) -> None:
        doc["supportedInterfaces"][0]["url"] = "http://a.test/rpc2"

    plan = resume_stand_in(extended_task(), public(moved), FAILED, UNREAD, allow_insecure=True)
    assert (plan.orphaned, plan.endpoint, plan.events) == (
        False,
        RPC,
        (
            unavailable_event(UNREAD, "resume"),
            unavailable_event(FAILED, "resume"),
        ),
    )


def test_resume_standing_in_without_any_card_goes_on_at_the_recorded_endpoint() -> None:
    plan = resume_stand_in(extended_task(), None, FAILED, UNREAD)
    assert plan.orphaned is False
    assert plan.endpoint == RPC
    assert plan.events == (
        unavailable_event(UNREAD, "resume"),
        unavailable_event(FAILED, "resume"),
    )


# -- what follows the public card ------------------------------------------------------------------


def test_an_extended_task_is_stale_only_when_the_public_card_moved() -> None:
    task = extended_task()
    assert not card_is_stale(task, {"revision": public().revision})
    assert card_is_stale(task, {"revision": public(lambda d: d.update(version="2")).revision})


def test_a_bare_failure_of_an_extended_task_is_flagged_only_when_the_public_card_moved() -> None:
    task = extended_task()
    assert failure_review(task, "failed", None, public().revision) == []
    moved = public(lambda d: d.update(version="2")).revision
    assert [e.payload()["reason"] for e in failure_review(task, "failed", None, moved)] == [
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
    said = describe(ev.CardFetched.from_payload(read))
    assert str(said).startswith(f"extended card {ext.revision[:12]} ")
    said = describe(ev.CardFetched.from_payload(fetched(ext)))
    assert str(said).startswith(f"card {ext.revision[:12]} ")
    public_task = submitted(card_url=CARD_URL, skill="vip", card_revision=ext.revision)
    extended = dataclasses.replace(public_task, extended=True)
    assert " extended card " in str(describe(extended))
    assert " extended card " not in str(describe(public_task))
