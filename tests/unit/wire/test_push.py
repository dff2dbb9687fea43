"""Webhook ingress, answer by answer (R12, R16).

A delivery's HTTP status and the detail it is refused with are what the agent sees, and which task a
delivery is matched to, or refused for, is the security boundary (never the remote task id alone).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cardfence.engine.wire.push import (
    MAX_DELIVERY_BYTES,
    Delivery,
    IngressLimits,
    Refused,
    authenticates,
    check_credentials,
    decode,
    digest,
    match_task,
)

UPDATE = {"statusUpdate": {"taskId": "t-1", "status": {"state": "TASK_STATE_WORKING"}}}
JSON = {"Content-Type": "application/json"}
TOKEN = "tok-1"
AUTH = "Bearer abc"
HOOK: dict[str, Any] = {"token_sha256": digest(TOKEN), "auth_sha256": None}
HOOK_AUTH: dict[str, Any] = {"token_sha256": digest(TOKEN), "auth_sha256": digest(AUTH)}


def body(document: object = UPDATE) -> bytes:
    return json.dumps(document).encode()


def refusal(call: Any, *args: Any) -> Delivery:
    with pytest.raises(Refused) as caught:
        call(*args)
    return caught.value.delivery


# --- digest ------------------------------------------------------------------------------------


def test_a_secret_is_kept_as_its_sha256_hex_digest() -> None:
    # The published SHA-256 of "secret", and of the UTF-8 bytes of a non-ASCII secret.
    assert digest("secret") == "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
    assert digest("é") == "4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"


# --- decode ------------------------------------------------------------------------------------


def test_a_delivery_is_decoded_into_its_stream_update() -> None:
    update = decode(body(), JSON)
    assert (update.kind, update.task_id, update.state) == ("status", "t-1", "working")


def test_a_delivery_of_exactly_the_limit_is_read_and_one_byte_more_is_refused_413() -> None:
    raw = body()
    exact = raw + b" " * (MAX_DELIVERY_BYTES - len(raw))
    assert len(exact) == MAX_DELIVERY_BYTES == 256 * 1024
    assert decode(exact, JSON).task_id == "t-1"
    refused = refusal(decode, exact + b" ", JSON)
    assert refused == Delivery(
        413, "refused", f"body of {MAX_DELIVERY_BYTES + 1} bytes is over {MAX_DELIVERY_BYTES}"
    )
    assert refused.task is None


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        " application/json ; charset=utf-8",
        "application/json;charset=utf-8;x=y",
        "application/a2a+json",
    ],
)
def test_json_content_types_are_accepted_whatever_their_case_and_parameters(
    content_type: str,
) -> None:
    assert decode(body(), {"content-TYPE": content_type}).task_id == "t-1"


@pytest.mark.parametrize(
    ("headers", "shown"),
    [
        ({"Content-Type": "text/plain"}, "'text/plain'"),
        ({"Content-Type": "text/plain; x=application/json"}, "'text/plain; x=application/json'"),
        ({"Content-Type": "application/jsonx"}, "'application/jsonx'"),
        ({"Content-Type": ""}, "'none'"),
        ({}, "'none'"),
    ],
)
def test_a_delivery_that_is_not_json_by_content_type_is_refused_415(
    headers: dict[str, str], shown: str
) -> None:
    assert refusal(decode, body(), headers) == Delivery(
        415, "refused", f"content type {shown} is not JSON"
    )


def test_a_body_that_is_not_json_is_refused_400_with_the_parser_error() -> None:
    refused = refusal(decode, b"{not json", JSON)
    assert refused.status == 400
    assert refused.detail.startswith("body is not JSON (Expecting property name")


def test_a_non_finite_number_is_refused_400_at_its_path() -> None:
    refused = refusal(decode, b'{"x": NaN}', JSON)
    assert refused == Delivery(400, "refused", "x: NaN and Infinity are not JSON numbers")


def test_the_refusal_is_cut_to_200_characters() -> None:
    name = "k" * 300  # a repeated member name is quoted in the refusal: a long one is cut
    refused = refusal(decode, f'{{"{name}": 1, "{name}": 2}}'.encode(), JSON)
    assert refused.status == 400
    assert refused.detail == f"{name}: duplicate member name"[:200]


def test_json_that_is_not_a_stream_response_is_refused_400_naming_the_field() -> None:
    refused = refusal(decode, body({"statusUpdate": {"status": {}}}), JSON)
    assert refused == Delivery(
        400,
        "refused",
        "not an A2A StreamResponse: webhook: invalid agent response: "
        "statusUpdate.taskId: required: a non-empty string (nothing was changed)",
    )


# --- credentials --------------------------------------------------------------------------------


def test_a_delivery_authenticates_with_the_registered_token_in_any_header_case() -> None:
    assert authenticates(HOOK, {"X-A2A-Notification-Token": TOKEN})
    assert authenticates(HOOK, {"x-a2a-notification-token": TOKEN})


def test_a_delivery_without_the_right_token_does_not_authenticate() -> None:
    assert not authenticates(HOOK, {})
    assert not authenticates(HOOK, {"X-A2A-Notification-Token": "other"})
    assert not authenticates(None, {"X-A2A-Notification-Token": TOKEN})
    assert not authenticates({"auth_sha256": None}, {"X-A2A-Notification-Token": TOKEN})


def test_a_configured_authorization_must_be_presented_too() -> None:
    token = {"X-A2A-Notification-Token": TOKEN}
    assert authenticates(HOOK_AUTH, {**token, "Authorization": AUTH})
    assert not authenticates(HOOK_AUTH, token)
    assert not authenticates(HOOK_AUTH, {**token, "Authorization": "Bearer other"})
    assert not authenticates(HOOK_AUTH, {"Authorization": AUTH})


def test_check_credentials_says_which_credential_is_wrong() -> None:
    token = {"X-A2A-Notification-Token": TOKEN}
    check_credentials(HOOK, token)
    check_credentials(HOOK_AUTH, {**token, "authorization": AUTH})
    assert refusal(check_credentials, HOOK, {}) == Delivery(
        401, "refused", "missing or wrong X-A2A-Notification-Token"
    )
    assert refusal(check_credentials, {}, token) == Delivery(
        401, "refused", "missing or wrong X-A2A-Notification-Token"
    )
    assert refusal(check_credentials, HOOK_AUTH, token) == Delivery(
        401, "refused", "missing or wrong Authorization"
    )
    assert refusal(check_credentials, HOOK_AUTH, {**token, "Authorization": "x"}) == Delivery(
        401, "refused", "missing or wrong Authorization"
    )


# --- match_task ---------------------------------------------------------------------------------


def test_a_delivery_goes_to_the_one_task_whose_webhook_it_authenticates_as() -> None:
    other = {"token_sha256": digest("tok-2"), "auth_sha256": None}
    candidates = [("a", other), ("b", None), ("c", HOOK)]
    assert match_task("r", candidates, {"X-A2A-Notification-Token": TOKEN}) == "c"
    assert match_task("r", candidates, {"X-A2A-Notification-Token": "tok-2"}) == "a"


def test_no_task_with_the_remote_id_is_404() -> None:
    assert refusal(match_task, "r-1", [], {}) == Delivery(
        404, "refused", "no task with remote id 'r-1'"
    )


def test_tasks_without_a_webhook_are_404_even_with_a_token() -> None:
    headers = {"X-A2A-Notification-Token": TOKEN}
    assert refusal(match_task, "r-1", [("a", None), ("b", None)], headers) == Delivery(
        404, "refused", "no task with remote id 'r-1' has a webhook registered"
    )


def test_no_webhook_authenticating_is_401_naming_the_wrong_credential() -> None:
    token = {"X-A2A-Notification-Token": TOKEN}
    assert refusal(match_task, "r", [("a", None), ("b", HOOK)], {}) == Delivery(
        401, "refused", "missing or wrong X-A2A-Notification-Token"
    )
    # The token is right, the Authorization is not: the first registered webhook says so.
    assert refusal(match_task, "r", [("a", None), ("b", HOOK_AUTH)], token) == Delivery(
        401, "refused", "missing or wrong Authorization"
    )


def test_several_tasks_sharing_credentials_are_409() -> None:
    token = {"X-A2A-Notification-Token": TOKEN}
    assert refusal(match_task, "r-1", [("a", HOOK), ("b", HOOK), ("c", None)], token) == Delivery(
        409,
        "refused",
        "2 tasks with remote id 'r-1' share these credentials: "
        "register each webhook with its own token",
    )


def test_a_refusal_reads_as_its_detail() -> None:
    assert str(Refused(401, "missing or wrong Authorization")) == "missing or wrong Authorization"


def test_a_refusal_names_the_task_it_was_refused_for() -> None:
    assert Refused(401, "bad token", "k-1").delivery == Delivery(401, "refused", "bad token", "k-1")
    assert Refused(404, "unknown task").delivery.task is None


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"deliveries": 0}, "IngressLimits.deliveries must be at least 1"),
        ({"body_seconds": 0.0}, "IngressLimits.body_seconds must be more than 0"),
        ({"body_seconds": float("nan")}, "IngressLimits.body_seconds must be more than 0"),
        ({"refusals": 0}, r"IngressLimits.refusals must be at least 1 \(None: no limit\)"),
    ],
)
def test_ingress_limits_below_their_minimum_are_refused_by_name(
    limits: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        IngressLimits(**limits)


def test_ingress_limits_take_their_minimum_and_no_refusal_limit() -> None:
    smallest = IngressLimits(deliveries=1, body_seconds=0.001, refusals=1)
    assert (smallest.deliveries, smallest.body_seconds, smallest.refusals) == (1, 0.001, 1)
    assert IngressLimits(refusals=None).refusals is None
