"""How one request's answer is told apart (engine/wire/exchange.py, R11), each outcome compared
whole.

The requests are answered by httpx's MockTransport, an agent that answers what no real agent
answers on request (an id of ``null`` on a result, a JSON-RPC error code of ``true``, a 300 with
a valid envelope), and, for bodies whose encoding is broken (which httpx decodes before a mock's
answer is read), by a raw server on 127.0.0.1. Each test names what an operator would read: the
error's type, its URL, the task it is about, and every word of its message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from support.hostile import Reply, RoutedServer
from support.mocked import REST, RPC, Handler, Make, rpc_answer

from cardfence.engine.auth.credentials import RequestAuth
from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.errors import (
    AuthorizationFailedError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    ProtocolMismatchError,
    RemoteRefusedError,
    ThrottledError,
    UsageError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import ACCEPT_ENCODING, BodyRefused, BoundedDecoder
from cardfence.engine.http.pool import REPLAYABLE
from cardfence.engine.wire.exchange import retry_after_seconds
from cardfence.engine.wire.transport import A2ATransport

TASK = {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_WORKING"}}
TASK03 = {"kind": "task", "id": "t-1", "contextId": "c-1", "status": {"state": "working"}}


def _invalid(url: str, detail: str) -> str:
    return f"{url}: invalid agent response: {detail} (nothing was changed)"


# -- JSON-RPC envelopes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (lambda r: httpx.Response(200, json=[]), "not a JSON-RPC 2.0 response object"),
        (lambda r: rpc_answer(r), "JSON-RPC response needs exactly one of result, error"),
        (lambda r: rpc_answer(r, error="boom"), "JSON-RPC error needs an object with integer code"),
        (
            lambda r: rpc_answer(r, error={"code": True, "message": "m"}),
            "JSON-RPC error needs an object with integer code",
        ),
        (
            lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": None, "result": TASK}),
            "JSON-RPC id 'None' does not answer request id 1",
        ),
        (
            lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": "9" * 50, "result": {}}),
            f"JSON-RPC id {'9' * 40!r} does not answer request id 1",
        ),
        (lambda r: httpx.Response(200, content=b"{" * 3), "body is not JSON ("),
    ],
)
async def test_a_malformed_envelope_is_an_invalid_answer_saying_what_is_wrong(
    agent: Make, answer: Handler, detail: str
) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        await agent(answer).get_task("t-1")
    assert caught.value.url == RPC
    if detail.endswith("("):
        assert str(caught.value).startswith(_invalid(RPC, detail)[: -len(" (nothing was changed)")])
    else:
        assert str(caught.value) == _invalid(RPC, detail)


async def test_a_body_that_is_not_i_json_is_named_with_200_characters_of_the_reason(
    agent: Make,
) -> None:
    name = "k" * 300  # a repeated member name is quoted in the refusal: a long one is cut
    body = f'{{"{name}": 1, "{name}": 2}}'
    with pytest.raises(InvalidAgentResponseError) as caught:
        await agent(lambda r: httpx.Response(200, content=body.encode())).get_task("t")
    assert str(caught.value) == _invalid(RPC, f"{name}: duplicate member name"[:200])


async def test_a_body_over_the_limit_is_named_with_the_limit(agent: Make) -> None:
    big = httpx.Response(200, content=b" " * 2000 + b"{}")
    with pytest.raises(InvalidAgentResponseError) as caught:
        await agent(lambda r: big, HTTP_JSON, max_bytes=1000).get_task("t-1")
    assert str(caught.value) == _invalid(f"{REST}/tasks/t-1", "body over the limit of 1000 bytes")


async def test_a_3xx_is_never_read_as_a_result(agent: Make) -> None:
    for status in (300, 301):
        with pytest.raises(EndpointUnreachableError) as caught:
            await agent(lambda r, s=status: rpc_answer(r, s, result=TASK)).get_task("t-1")  # type: ignore[misc]
        assert caught.value.detail == f"HTTP {status} without an A2A error body"
        assert (caught.value.url, caught.value.task, caught.value.status) == (RPC, "t-1", status)


async def test_a_json_rpc_error_with_any_integer_code_is_the_agents_refusal(agent: Make) -> None:
    for status in (200, 500):
        with pytest.raises(RemoteRefusedError) as caught:
            await agent(
                lambda r, s=status: rpc_answer(r, s, error={"code": 7, "message": "no such thing"})  # type: ignore[misc]
            ).cancel_task("t-9")
        assert type(caught.value) is RemoteRefusedError
        assert (caught.value.url, caught.value.code, caught.value.task) == (RPC, 7, "t-9")
        assert str(caught.value) == f"{RPC}: agent refused (7: no such thing)"


async def test_an_error_message_that_is_not_text_is_left_out_and_a_long_one_is_cut(
    agent: Make,
) -> None:
    with pytest.raises(RemoteRefusedError) as caught:
        await agent(lambda r: rpc_answer(r, error={"code": -32001, "message": 5})).get_task("t-1")
    assert caught.value.detail == ""
    with pytest.raises(RemoteRefusedError) as caught:
        await agent(lambda r: rpc_answer(r, error={"code": -32001, "message": "m" * 300})).get_task(
            "t"
        )
    assert caught.value.detail == "m" * 200


async def test_a_non_2xx_error_body_without_the_jsonrpc_member_is_not_taken_as_json_rpc(
    agent: Make,
) -> None:
    body = {"id": 1, "error": {"code": 7, "message": "no"}}  # 7: no JSON-RPC code range either
    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(lambda r: httpx.Response(500, json=body)).get_task("t-1")
    assert caught.value.detail == "HTTP 500 without an A2A error body"


# -- REST errors ----------------------------------------------------------------------------------


def _rest_error(status: int, **error: Any) -> Handler:
    return lambda r: httpx.Response(status, json={"error": {"message": "no", **error}})


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"code": -32768}, -32768),
        ({"code": -32000}, -32000),
        ({"code": 400, "data": [{"reason": "TASK_NOT_FOUND"}]}, -32001),
        ({"code": 400, "data": {"reason": "TASK_NOT_FOUND"}}, -32001),
        ({"code": 400, "details": "?", "data": [{"reason": "TASK_NOT_FOUND"}]}, -32001),
        ({"code": 400, "details": ["note", 3, {"reason": "TASK_NOT_CANCELABLE"}]}, -32002),
        ({"code": 400, "details": [{"reason": 5}, {"reason": "INVALID_PARAMS"}]}, -32602),
        ({"code": 400, "details": [{"reason": "R" * 300}]}, "R" * 200),
    ],
)
async def test_a_rest_error_is_the_agents_refusal_by_its_reason_or_json_rpc_code(
    agent: Make, error: dict[str, Any], code: int | str
) -> None:
    with pytest.raises(RemoteRefusedError) as caught:
        await agent(_rest_error(400, **error), HTTP_JSON).get_task("t-1")
    assert type(caught.value) is RemoteRefusedError  # a 1.0 interface: no mismatch
    assert (caught.value.url, caught.value.code, caught.value.detail) == (
        f"{REST}/tasks/t-1", code, "no",
    )  # fmt: skip
    assert caught.value.task == "t-1"


@pytest.mark.parametrize("code", [-32769, -31999, 0])
async def test_a_rest_error_code_outside_the_json_rpc_range_is_no_a2a_error(
    agent: Make, code: int
) -> None:
    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(_rest_error(400, code=code), HTTP_JSON).get_task("t-1")
    assert caught.value.detail == "HTTP 400 without an A2A error body"


async def test_a_404_without_an_a2a_body_is_a_route_gone_never_a_missing_task(agent: Make) -> None:
    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(lambda r: httpx.Response(404, text="nope"), HTTP_JSON).get_task("t-1")
    assert str(caught.value) == (
        f"{REST}/tasks/t-1: HTTP 404 without an A2A error body: endpoint gone or moved "
        "(nothing was changed)"
    )


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_credential_names_the_url_task_and_status(agent: Make, status: int) -> None:
    with pytest.raises(AuthorizationFailedError) as caught:
        await agent(lambda r: httpx.Response(status), HTTP_JSON).cancel_task("t-3")
    assert (caught.value.url, caught.value.task, caught.value.status) == (
        f"{REST}/tasks/t-3:cancel", "t-3", status,
    )  # fmt: skip
    assert caught.value.detail == f"HTTP {status}: the agent refused no credentials"


# -- R5: an agent asking for time -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "said", "asked"),
    [(429, "20", 20.0), (429, None, None), (429, "soon", None), (503, "7", 7.0)],
)
async def test_a_429_or_a_503_naming_a_wait_is_throttled_with_the_seconds_asked(
    agent: Make, status: int, said: str | None, asked: float | None
) -> None:
    headers = {} if said is None else {"Retry-After": said}
    answer = httpx.Response(status, headers=headers, text="busy")
    with pytest.raises(ThrottledError) as caught:
        await agent(lambda r: answer, HTTP_JSON).get_task("t-1")
    assert (caught.value.status, caught.value.retry_after) == (status, asked)
    why = "too many requests" if status == 429 else "unavailable"
    named = "no wait named" if asked is None else f"Retry-After {asked:g}s"
    assert caught.value.detail == f"HTTP {status} ({why}; {named})"


async def test_a_503_without_a_readable_wait_is_unreachable_not_throttled(agent: Make) -> None:
    answer = httpx.Response(503, headers={"Retry-After": "later"})
    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(lambda r: answer).get_task("t-1")
    assert not isinstance(caught.value, ThrottledError)
    assert caught.value.detail == "HTTP 503 without an A2A error body"


async def test_an_event_stream_refused_with_a_429_is_throttled(agent: Make) -> None:
    answer = httpx.Response(429, headers={"Retry-After": "3"})
    with pytest.raises(ThrottledError) as caught:
        async with agent(lambda r: answer).subscribe("t-1"):
            pass
    assert caught.value.retry_after == 3.0


NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        (" 120 ", 120.0),
        ("9" * 12, 86_400.0),  # a day at most
        ("Thu, 01 Jan 2026 00:00:30 GMT", 30.0),
        ("Wed, 31 Dec 2025 23:00:00 GMT", 0.0),  # a date past: now
        ("Thu, 01 Jan 2026 00:01:00 -0000", 60.0),
        ("-5", None),
        ("1.5", None),
        ("tomorrow", None),
        ("", None),
        ("1" * 65, None),
        (None, None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date_bounded_and_garbage_asks_nothing(
    value: str | None, seconds: float | None
) -> None:
    assert retry_after_seconds(value, NOW) == seconds


# -- protocol mismatches --------------------------------------------------------------------------


async def test_an_unknown_method_on_a_1_0_interface_names_its_0_3_name(agent: Make) -> None:
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(lambda r: rpc_answer(r, error={"code": -32601, "message": "what"})).get_task(
            "t-1"
        )
    error = caught.value
    assert (error.url, error.task, error.code) == (RPC, "t-1", -32601)
    assert (error.method, error.declared, error.spoken, error.legacy) == (
        "GetTask", "1.0", "0.3", "tasks/get",
    )  # fmt: skip
    assert str(error) == (
        f"{RPC}: protocol mismatch: the card says A2A 1.0, the endpoint speaks another version "
        "(0.3 perhaps): it does not know the method GetTask, which 0.3 calls tasks/get "
        "(nothing was changed)"
    )


async def test_an_unknown_method_on_a_0_3_interface_names_its_1_0_name(agent: Make) -> None:
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(
            lambda r: rpc_answer(r, error={"code": -32601, "message": "what"}), version="0.3"
        ).get_task("t-1")
    error = caught.value
    assert (error.method, error.declared, error.spoken, error.legacy) == (
        "tasks/get", "0.3", "1.0", "GetTask",
    )  # fmt: skip
    assert (error.url, error.task) == (RPC, "t-1")


async def test_an_operation_without_another_name_is_named_alone(agent: Make) -> None:
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(lambda r: rpc_answer(r, error={"code": -32601, "message": "w"})).list_tasks(
            context_id="c-1"
        )
    assert (caught.value.method, caught.value.legacy) == ("ListTasks", "")
    assert "which 0.3 calls" not in str(caught.value)


async def test_version_not_supported_keeps_the_agents_words(agent: Make) -> None:
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(
            lambda r: rpc_answer(r, error={"code": -32009, "message": "speak 0.3"})
        ).get_task("t-1")
    error = caught.value
    assert (error.code, error.task, error.url) == (-32009, "t-1", RPC)
    assert error.detail.endswith("it refused GetTask with -32009 (speak 0.3)")


async def test_a_rest_version_refusal_names_the_operation_and_no_other_name(agent: Make) -> None:
    info = [{"reason": "VERSION_NOT_SUPPORTED"}]
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(_rest_error(400, code=400, details=info), HTTP_JSON).get_task("t-1")
    assert (caught.value.method, caught.value.legacy, caught.value.spoken) == (
        "GetTask", "", "0.3",
    )  # fmt: skip
    assert (caught.value.url, caught.value.task) == (f"{REST}/tasks/t-1", "t-1")


async def test_a_1_0_error_body_from_a_0_3_rest_interface_is_a_mismatch(agent: Make) -> None:
    info = [{"reason": "TASK_NOT_FOUND"}]
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(_rest_error(404, code=404, details=info), HTTP_JSON, version="0.3").get_task(
            "t-1"
        )
    error = caught.value
    assert (error.url, error.task, error.code, error.method) == (
        f"{REST}/v1/tasks/t-1", "t-1", -32001, "GetTask",
    )  # fmt: skip
    assert (error.declared, error.spoken) == ("0.3", "1.0")
    assert error.detail.endswith("it refused GetTask with -32001 (no)")


async def test_a_json_rpc_code_in_a_0_3_rest_error_is_a_refusal_not_a_mismatch(
    agent: Make,
) -> None:
    with pytest.raises(RemoteRefusedError) as caught:
        await agent(_rest_error(404, code=-32001), HTTP_JSON, version="0.3").get_task("t-1")
    assert type(caught.value) is RemoteRefusedError
    assert caught.value.code == -32001


@pytest.mark.parametrize("body", [b"", b"<html>", b"[1]"])
async def test_a_0_3_rest_failure_without_a_json_object_is_unreachable(
    agent: Make, body: bytes
) -> None:
    answer = httpx.Response(500, content=body)
    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(lambda r: answer, HTTP_JSON, version="0.3").get_task("t-1")
    assert caught.value.detail == "HTTP 500 without an A2A error body"


# -- the request ----------------------------------------------------------------------------------


async def test_a_json_rpc_request_is_compact_json(agent: Make) -> None:
    seen: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        return rpc_answer(request, result=TASK)

    await agent(answer).get_task("t-1")
    assert seen == [
        b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t-1","historyLength":0}}'
    ]


async def test_a_request_that_is_not_json_is_refused_before_sending(agent: Make) -> None:
    seen: list[httpx.Request] = []
    transport = agent(lambda r: seen.append(r) or rpc_answer(r, result=TASK))  # type: ignore[func-returns-value]
    with pytest.raises(UsageError) as caught:
        await transport.send_message(
            text="x", message_id="m", context_id=None, metadata={"n": math.nan}
        )
    assert str(caught.value).startswith("request is not JSON-serialisable: Out of range float")
    assert seen == []


class _Key:
    """Credentials adding an API key to the query (a scheme ``in: query``)."""

    schemes = ("key",)
    refreshable = False

    async def prepare(self, *, refresh: bool = False) -> RequestAuth:
        return RequestAuth(params=(("api_key", "s3cr3t-value"),), secrets=("s3cr3t-value",))


async def test_a_network_error_never_shows_a_secret_the_request_carried(agent: Make) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url}", request=request)

    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(refuse, HTTP_JSON, credentials=_Key()).get_task("t-1")
    assert "s3cr3t-value" not in str(caught.value)
    assert caught.value.detail.startswith(f"network error: cannot reach {REST}/tasks/t-1?")
    assert "api_key=" in caught.value.detail


async def test_a_network_error_without_credentials_is_shown_as_it_is(agent: Make) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("cannot reach it, key=abc", request=request)

    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(refuse, HTTP_JSON).get_task("t-1")
    assert caught.value.detail == "network error: cannot reach it, key=abc"


async def test_a_0_3_json_rpc_answer_is_read_in_0_3_shape(agent: Make) -> None:
    task = await agent(lambda r: rpc_answer(r, result=TASK03), version="0.3").get_task("t-1")
    assert (task.id, task.state) == ("t-1", "working")


@pytest.mark.parametrize(("binding", "url"), [(JSONRPC, RPC), (HTTP_JSON, f"{REST}/tasks/t-1")])
async def test_a_3xx_with_a_valid_body_is_never_read_as_an_answer(
    agent: Make, binding: str, url: str
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return (
            rpc_answer(request, 300, result=TASK)
            if binding == JSONRPC
            else httpx.Response(300, json=TASK)
        )

    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(answer, binding).get_task("t-1")
    assert str(caught.value) == f"{url}: HTTP 300 without an A2A error body (nothing was changed)"


async def test_a_rest_answer_that_is_not_json_names_the_url_asked(agent: Make) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        await agent(lambda r: httpx.Response(200, content=b"<html>"), HTTP_JSON).get_task("t-1")
    assert caught.value.url == f"{REST}/tasks/t-1"


async def test_an_operation_about_no_task_names_none(agent: Make) -> None:
    with pytest.raises(RemoteRefusedError) as caught:
        await agent(lambda r: rpc_answer(r, error={"code": -32004, "message": "no"})).list_tasks(
            context_id="c-1"
        )
    assert caught.value.task == ""


async def test_only_the_trailing_slash_of_an_interface_url_is_dropped(agent: Make) -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json=TASK)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    async with client:
        interface = Interface("http://agent.test/BOX/", HTTP_JSON, "1.0")
        await A2ATransport(client, interface).get_task("t-1")
    assert seen == ["/BOX/tasks/t-1"]


async def test_reads_may_be_replayed_and_nothing_else_and_a_get_carries_no_body(
    agent: Make,
) -> None:
    seen: list[tuple[str, bool, bytes]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        replayable = bool(request.extensions.get(REPLAYABLE))
        seen.append((request.method, replayable, request.content))
        return httpx.Response(200, json=TASK)

    transport = agent(answer, HTTP_JSON)
    await transport.get_task("t-1")
    await transport.cancel_task("t-1")
    assert seen == [("GET", True, b""), ("POST", False, b"{}")]


async def test_each_request_is_bounded_by_its_timeout_and_connects_within_ten_seconds(
    agent: Make,
) -> None:
    seen: list[dict[str, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return rpc_answer(request, result=TASK)

    await agent(answer, timeout=30.0).get_task("t-1")
    await agent(answer, timeout=4.0).get_task("t-1")
    assert seen == [
        {"connect": 10.0, "read": 30.0, "write": 30.0, "pool": 30.0},
        {"connect": 4.0, "read": 4.0, "write": 4.0, "pool": 4.0},
    ]


async def test_a_deadline_already_passed_sends_nothing_and_says_so(agent: Make) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return rpc_answer(request, result=TASK)

    with deadline.within(-1.0), pytest.raises(EndpointUnreachableError) as caught:
        await agent(answer).get_task("t-1")
    assert str(caught.value) == (
        f"{RPC}: timeout: the deadline passed before the request could be sent (not sent) "
        "(nothing was changed)"
    )
    assert caught.value.task == "t-1"
    assert seen == []


class _Token:
    """A bearer token that a refresh replaces (``refreshable``, as an OAuth grant is)."""

    schemes = ("oauth",)

    def __init__(self, *, refreshable: bool = True) -> None:
        self.refreshable = refreshable
        self.asked: list[bool] = []

    async def prepare(self, *, refresh: bool = False) -> RequestAuth:
        self.asked.append(refresh)
        token = f"token-{len(self.asked)}"
        return RequestAuth(headers=(("Authorization", f"Bearer {token}"),), secrets=(token,))


def _accepting(token: str, seen: list[str]) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {token}":
            return httpx.Response(401)
        return rpc_answer(request, result=TASK)

    return answer


async def test_a_refused_token_is_refreshed_once_and_the_request_asked_again(
    agent: Make,
) -> None:
    seen: list[str] = []
    credentials = _Token()
    task = await agent(_accepting("token-2", seen), credentials=credentials).get_task("t-1")
    assert task.id == "t-1"
    assert credentials.asked == [False, True]
    assert seen == ["Bearer token-1", "Bearer token-2"]


async def test_an_accepted_token_is_not_refreshed(agent: Make) -> None:
    seen: list[str] = []
    credentials = _Token()
    await agent(_accepting("token-1", seen), credentials=credentials).get_task("t-1")
    assert (credentials.asked, seen) == ([False], ["Bearer token-1"])


async def test_credentials_that_cannot_be_refreshed_are_refused_after_one_request(
    agent: Make,
) -> None:
    seen: list[str] = []
    credentials = _Token(refreshable=False)
    with pytest.raises(AuthorizationFailedError) as caught:
        await agent(_accepting("token-2", seen), credentials=credentials).get_task("t-1")
    assert (credentials.asked, seen) == ([False], ["Bearer token-1"])
    assert caught.value.detail == "HTTP 401: the agent refused credentials of oauth"


async def test_a_redirect_is_never_followed_whatever_the_client_does() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/elsewhere":
            return httpx.Response(200, json=TASK)
        return httpx.Response(302, headers={"Location": "http://agent.test/elsewhere"})

    transport = httpx.MockTransport(answer)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as client:
        exchange = A2ATransport(client, Interface(REST, HTTP_JSON, "1.0"))
        with pytest.raises(EndpointUnreachableError) as caught:
            await exchange.get_task("t-1")
    assert caught.value.detail == "HTTP 302 without an A2A error body"
    assert seen == ["/a2a/rest/tasks/t-1"]


async def _garbled(server: RoutedServer, client: httpx.AsyncClient, status: int) -> None:
    """GetTask answered ``status`` with a body that says gzip and is not (a raw server: httpx
    decodes the bodies a mock answers before the exchange reads them)."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    server.routes["/api/tasks/t-1?historyLength=0"] = Reply(
        status=status, body=b"this is not gzip", headers=headers
    )
    await A2ATransport(client, Interface(f"{server.url}/api", HTTP_JSON, "1.0")).get_task("t-1")


async def test_a_2xx_body_that_cannot_be_decoded_is_an_invalid_answer_saying_why(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    with pytest.raises(BodyRefused) as refused:
        list(BoundedDecoder("gzip", 1 << 20).feed(b"this is not gzip"))
    with pytest.raises(InvalidAgentResponseError) as caught:
        await _garbled(server, client, 200)
    assert str(caught.value) == _invalid(f"{server.url}/api/tasks/t-1", refused.value.detail)


@pytest.mark.parametrize("status", [300, 500])
async def test_a_failure_whose_body_cannot_be_decoded_is_a_failure_without_a_body(
    server: RoutedServer, client: httpx.AsyncClient, status: int
) -> None:
    with pytest.raises(EndpointUnreachableError) as caught:
        await _garbled(server, client, status)
    assert caught.value.detail == f"HTTP {status} without an A2A error body"


# -- what every request carries ---------------------------------------------------------------


def _headers_sent(agent: Make, version: str, **options: Any) -> Callable[[], Any]:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return rpc_answer(request, result=TASK03 if version == "0.3" else TASK)

    transport = agent(answer, version=version, **options)

    async def send() -> httpx.Headers:
        await transport.get_task("t-1")
        return seen[-1]

    return send


async def test_a_1_0_request_says_its_version_and_what_it_accepts_whatever_the_caller_passed(
    agent: Make,
) -> None:
    given = {"A2A-Version": "0.3", "Content-Type": "text/plain", "Accept": "*/*", "X-Mine": "1",
             "Accept-Encoding": "br"}  # fmt: skip
    headers = await _headers_sent(agent, "1.0", headers=given)()
    assert headers["A2A-Version"] == "1.0"
    assert headers["Content-Type"] == "application/json"
    assert headers["Accept"] == "application/json, application/a2a+json"
    assert headers["Accept-Encoding"] == ACCEPT_ENCODING
    assert headers["User-Agent"] == "cardfence/0.1"
    assert headers["X-Mine"] == "1"
    assert "A2A-Extensions" not in headers


async def test_a_0_3_request_has_no_version_header_even_if_the_caller_passed_one(
    agent: Make,
) -> None:
    headers = await _headers_sent(agent, "0.3", headers={"A2A-Version": "1.0"})()
    assert "A2A-Version" not in headers
    assert headers["Content-Type"] == "application/json"


async def test_a_callers_user_agent_is_kept(agent: Make) -> None:
    headers = await _headers_sent(agent, "1.0", headers={"User-Agent": "orchestrator/2"})()
    assert headers["User-Agent"] == "orchestrator/2"


@pytest.mark.parametrize(
    ("version", "name"), [("1.0", "A2A-Extensions"), ("0.3", "X-A2A-Extensions")]
)
async def test_the_extensions_a_task_activated_are_named_in_its_versions_header(
    agent: Make, version: str, name: str
) -> None:
    headers = await _headers_sent(agent, version, extensions=("urn:a", "urn:b"))()
    assert headers[name] == "urn:a, urn:b"


async def test_each_json_rpc_request_has_the_next_id(agent: Make) -> None:
    ids: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        ids.append(json.loads(request.content)["id"])
        return rpc_answer(request, result=TASK)

    transport = agent(answer)
    for _ in range(3):
        await transport.get_task("t-1")
    assert ids == [1, 2, 3]


async def test_an_interface_in_another_binding_or_with_no_budget_is_refused(
    agent: Make,
) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(UsageError) as caught:
            A2ATransport(client, Interface("http://a.test/g", "GRPC", "1.0"))
        assert str(caught.value) == "http://a.test/g: binding 'GRPC' is not spoken"
        interface = Interface(RPC, JSONRPC, "1.0")
        for option in ("timeout", "max_bytes", "max_pages"):
            with pytest.raises(UsageError) as caught:
                A2ATransport(client, interface, **{option: 0})
            assert str(caught.value) == "timeout, max_bytes and max_pages must be positive"
        bounded = A2ATransport(client, interface, timeout=1e-3, max_bytes=1, max_pages=1)
        assert (bounded.timeout, bounded.max_bytes, bounded.max_pages) == (1e-3, 1, 1)
        assert (bounded.version, bounded.legacy, bounded.binding) == ("1.0", False, JSONRPC)
        old = A2ATransport(client, Interface(RPC, HTTP_JSON, "0.3"))
        assert (old.version, old.legacy, old.binding) == ("0.3", True, HTTP_JSON)
        assert (old.timeout, old.max_bytes, old.max_pages) == (30.0, 8 * 1024 * 1024, 20)


class _Everything:
    """Credentials adding a header, two cookies and a query parameter."""

    schemes = ("all",)
    refreshable = False

    async def prepare(self, *, refresh: bool = False) -> RequestAuth:
        return RequestAuth(
            headers=(("X-Api-Key", "k1"),),
            cookies=(("session", "c1"), ("tenant", "c2")),
            params=(("sig", "p1"),),
        )


async def _get_task_sent(agent: Make, credentials: Any) -> httpx.Request:
    """The one request of a REST ``GetTask`` made with ``credentials``."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=TASK)

    await agent(answer, HTTP_JSON, credentials=credentials).get_task("t-1")
    (request,) = seen
    return request


async def test_credentials_add_headers_cookies_and_query_parameters_to_the_request(
    agent: Make,
) -> None:
    request = await _get_task_sent(agent, _Everything())
    assert request.headers["X-Api-Key"] == "k1"
    assert request.headers["Cookie"] == "session=c1; tenant=c2"
    assert dict(request.url.params) == {"historyLength": "0", "sig": "p1"}


async def test_credentials_with_no_query_parameters_keep_the_query_as_it_is(agent: Make) -> None:
    request = await _get_task_sent(agent, _Token())
    assert dict(request.url.params) == {"historyLength": "0"}
    assert request.headers["Authorization"] == "Bearer token-1"
    assert "Cookie" not in request.headers


async def test_an_unknown_method_answered_with_a_failure_status_is_a_mismatch_too(
    agent: Make,
) -> None:
    with pytest.raises(ProtocolMismatchError) as caught:
        await agent(lambda r: rpc_answer(r, 500, error={"code": -32601, "message": "w"})).get_task(
            "t"
        )
    assert (caught.value.method, caught.value.legacy) == ("GetTask", "tasks/get")


async def test_a_timeout_names_the_url_the_task_and_whether_the_deadline_cut_it(
    server: RoutedServer,
) -> None:
    server.routes["/rpc"] = Reply(chunks=[b"{"], end="hang")
    url = f"{server.url}/rpc"
    async with httpx.AsyncClient() as client:
        transport = A2ATransport(client, Interface(url, JSONRPC, "1.0"), timeout=0.2)
        with pytest.raises(EndpointUnreachableError) as caught:
            await transport.get_task("t-1")
        assert str(caught.value) == (
            f"{url}: timeout: no complete answer within 0.2s (nothing was changed)"
        )
        assert caught.value.task == "t-1"
        slow = A2ATransport(client, Interface(url, JSONRPC, "1.0"), timeout=30.0)
        with deadline.within(0.25), pytest.raises(EndpointUnreachableError) as caught:
            await slow.get_task("t-2")
        assert caught.value.detail.startswith("timeout: no complete answer within 0.2")
        assert caught.value.detail.endswith("s (the deadline)")
        assert (caught.value.url, caught.value.task) == (url, "t-2")


async def test_a_network_error_without_words_is_named_by_its_type(agent: Make) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("", request=request)

    with pytest.raises(EndpointUnreachableError) as caught:
        await agent(refuse).get_task("t-1")
    assert str(caught.value) == f"{RPC}: network error: ConnectError (nothing was changed)"
    assert caught.value.task == "t-1"
