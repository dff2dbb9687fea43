"""A2ATransport against the real a2a-sdk 1.3 agent, on both bindings; hostile answers via mocks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from support import Peer
from support.mocked import Handler, Make, mocked_agents, rpc_answer

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core.answers import PushConfig, RemoteMessage, RemoteTask, TaskState
from cardfence.engine.errors import (
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    UsageError,
)
from cardfence.engine.wire.exchange import A2AErrorCode
from cardfence.engine.wire.transport import A2ATransport

BINDINGS = [JSONRPC, HTTP_JSON]


@pytest.fixture(scope="module")
def module_peer() -> Iterator[Peer]:
    with Peer() as peer:
        yield peer


@pytest.fixture
def peer(module_peer: Peer) -> Iterator[Peer]:
    module_peer.reset()
    yield module_peer
    module_peer.reset()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def interface(peer: Peer, binding: str) -> Interface:
    """The interface as the peer's card declares it."""
    return Interface(peer.jsonrpc_url if binding == JSONRPC else peer.rest_url, binding, "1.0")


@pytest.fixture(params=BINDINGS)
def transport(
    request: pytest.FixtureRequest, peer: Peer, client: httpx.AsyncClient
) -> A2ATransport:
    return A2ATransport(client, interface(peer, request.param), timeout=5.0)


async def send(transport: A2ATransport, text: str, **kwargs: Any) -> RemoteTask:
    kwargs.setdefault("context_id", None)
    answer = await transport.send_message(text=text, message_id=f"m-{uuid.uuid4()}", **kwargs)
    assert isinstance(answer, RemoteTask)
    return answer


async def poll_until(transport: A2ATransport, task_id: str, states: set[str]) -> RemoteTask:
    for _ in range(100):
        task = await transport.get_task(task_id)
        if task.state in states:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} still {task.state}")


# --- the lifecycle on the real agent -------------------------------------------------------------


async def test_blocking_echo_completes_with_its_artifact(transport: A2ATransport) -> None:
    task = await send(transport, "echo hello", return_immediately=False)
    assert task.state == TaskState.COMPLETED
    assert task.timestamp is not None
    assert task.context_id
    assert [p.text for a in task.artifacts for p in a.parts] == ["hello"]


async def test_return_immediately_answers_submitted_then_polling_sees_completed(
    transport: A2ATransport,
) -> None:
    task = await send(transport, "echo hi")
    assert task.state == TaskState.SUBMITTED
    done = await poll_until(transport, task.id, {TaskState.COMPLETED})
    assert done.timestamp is not None
    assert task.timestamp is not None
    assert done.timestamp >= task.timestamp


async def test_ask_is_answered_by_a_reply_carrying_task_and_context(
    transport: A2ATransport, peer: Peer
) -> None:
    asked = await send(transport, "ask", return_immediately=False)
    assert asked.state == TaskState.INPUT_REQUIRED
    assert asked.message is not None
    assert asked.message.text == "What is your answer?"
    assert asked.message.role == "agent"
    done = await send(
        transport,
        "42",
        task_id=asked.id,
        context_id=asked.context_id,
        return_immediately=False,
        metadata={"note": "reply"},
    )
    assert (done.id, done.context_id, done.state) == (asked.id, asked.context_id, "completed")
    assert [p.text for a in done.artifacts for p in a.parts] == ["answer: 42"]
    assert [method for _, method in peer.calls] == ["SendMessage", "SendMessage"]


async def test_a_reply_without_its_context_is_refused_before_sending(
    transport: A2ATransport, peer: Peer
) -> None:
    with pytest.raises(UsageError, match="context id"):
        await transport.send_message(text="42", message_id="m", context_id=None, task_id="t-1")
    assert peer.calls == []


async def test_cancel_reaches_canceled_and_a_second_cancel_is_not_cancelable(
    transport: A2ATransport,
) -> None:
    task = await send(transport, "slow 5")
    canceled = await transport.cancel_task(task.id)
    assert canceled.state == TaskState.CANCELED
    with pytest.raises(RemoteRefusedError) as caught:
        await transport.cancel_task(task.id)
    assert caught.value.code == A2AErrorCode.TASK_NOT_CANCELABLE == -32002
    assert caught.value.task == task.id


async def test_an_unknown_task_is_task_not_found_not_an_unreachable_endpoint(
    transport: A2ATransport,
) -> None:
    # REST answers 404 here, but WITH an ErrorInfo reason: TaskNotFound (R11).
    with pytest.raises(RemoteRefusedError) as caught:
        await transport.get_task("no-such-task")
    assert caught.value.code == -32001
    assert caught.value.task == "no-such-task"


async def test_fail_reaches_failed_with_no_diagnostic(transport: A2ATransport) -> None:
    task = await send(transport, "fail", return_immediately=False)
    assert (task.state, task.message) == (TaskState.FAILED, None)
    diagnosed = await send(transport, "fail-diag", return_immediately=False)
    assert diagnosed.state == TaskState.FAILED
    assert diagnosed.message is not None
    assert "fail-diag" in diagnosed.message.text


async def test_push_config_echoes_our_id_and_the_secrets_it_repeats_are_hidden(
    transport: A2ATransport,
) -> None:
    task = await send(transport, "echo x", return_immediately=False)  # terminal: no deliveries
    ours = PushConfig(f"cfg-{uuid.uuid4()}", "http://127.0.0.1:9/hook", "tok-1", "Bearer", "s3")
    stored = await transport.create_push_config(task.id, ours)
    assert stored == dataclasses.replace(ours, token="***", auth_credentials="***")


async def test_list_tasks_by_context_follows_pages(transport: A2ATransport) -> None:
    first = await send(transport, "echo one", return_immediately=False)
    second = await send(
        transport, "echo two", context_id=first.context_id, return_immediately=False
    )
    found = await transport.list_tasks(context_id=first.context_id or "", page_size=1)
    assert {t.id for t in found} == {first.id, second.id}
    assert {t.state for t in found} == {TaskState.COMPLETED}
    assert await transport.list_tasks(context_id=f"ctx-{uuid.uuid4()}") == ()


async def test_the_version_header_is_ours_whatever_the_caller_passes(
    peer: Peer, client: httpx.AsyncClient
) -> None:
    # The peer refuses a request without A2A-Version 1.0 (-32009 / HTTP 400): success proves it.
    for binding in BINDINGS:
        transport = A2ATransport(client, interface(peer, binding), headers={"a2a-version": "0.3"})
        assert (await send(transport, "echo v", return_immediately=False)).state == "completed"


# --- R11: unreachable is not TaskNotFound --------------------------------------------------------


async def test_endpoint_gone_is_unreachable_never_task_not_found(
    transport: A2ATransport, peer: Peer
) -> None:
    task = await send(transport, "echo x", return_immediately=False)
    peer.set_endpoint_gone(True)
    with pytest.raises(EndpointUnreachableError, match="HTTP 404 without an A2A error body") as e:
        await transport.get_task(task.id)
    assert (e.value.task, e.value.status) == (task.id, 404)
    with pytest.raises(EndpointUnreachableError, match="endpoint gone or moved"):
        await transport.send_message(text="echo y", message_id="m-y", context_id=None)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_closed_port_is_unreachable(binding: str, client: httpx.AsyncClient) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/a2a/{'jsonrpc' if binding == JSONRPC else 'rest'}"
    transport = A2ATransport(client, Interface(url, binding, "1.0"), timeout=2.0)
    with pytest.raises(EndpointUnreachableError, match="network error") as caught:
        await transport.get_task("t-1")
    assert (caught.value.task, caught.value.status) == ("t-1", None)


# --- hostile answers (httpx.MockTransport) -------------------------------------------------------


@pytest.fixture
async def mocked() -> AsyncIterator[Make]:
    async with mocked_agents() as make:
        yield make


TASK = {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_WORKING"}}


@pytest.mark.parametrize(
    ("binding", "answer", "named"),
    [
        (JSONRPC, lambda r: httpx.Response(200, text="<html>ok</html>"), "body is not JSON"),
        (JSONRPC, lambda r: httpx.Response(200, json=[]), "not a JSON-RPC 2.0 response"),
        (JSONRPC, lambda r: rpc_answer(r), "exactly one of result, error"),
        (
            JSONRPC,
            lambda r: rpc_answer(r, result=TASK, error={"code": 1}),
            "exactly one of result, error",
        ),
        (
            JSONRPC,
            lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": 999, "result": TASK}),
            "does not answer request id",
        ),
        (
            JSONRPC,
            lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": True, "result": TASK}),
            "does not answer request id",
        ),
        (JSONRPC, lambda r: rpc_answer(r, result={"id": "t-1"}), "status: required"),
        (JSONRPC, lambda r: rpc_answer(r, error="boom"), "JSON-RPC error needs an object"),
        (JSONRPC, lambda r: rpc_answer(r, result={**TASK, "id": "t-2"}), "answered t-2"),
        (HTTP_JSON, lambda r: httpx.Response(200, content=b'{"id": "t-1", '), "body is not JSON"),
        (HTTP_JSON, lambda r: httpx.Response(200, json=[TASK]), "body: must be an object"),
        (HTTP_JSON, lambda r: httpx.Response(200, json={"task": TASK}), "id: required"),
        (HTTP_JSON, lambda r: httpx.Response(200, content=b"\xff\xfe\x00"), "body is not UTF-8"),
    ],
)
async def test_a_malformed_2xx_reply_is_an_invalid_agent_response(
    binding: str, answer: Handler, named: str, mocked: Make
) -> None:
    transport = mocked(answer, binding)
    with pytest.raises(InvalidAgentResponseError, match=named):
        await transport.get_task("t-1")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_reply_over_the_size_cap_is_refused_while_streaming(
    binding: str, mocked: Make
) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the cap must count
        for _ in range(100):
            yield b" " * 4096

    def huge(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks())

    transport = mocked(huge, binding, max_bytes=64 * 1024)
    with pytest.raises(InvalidAgentResponseError, match="over the limit of 65536 bytes"):
        await transport.get_task("t-1")
    declared = mocked(
        lambda r: httpx.Response(200, content=b" " * 70_000), binding, max_bytes=65536
    )
    with pytest.raises(InvalidAgentResponseError, match="over the limit of 65536 bytes"):
        await declared.get_task("t-1")


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (404, "Not Found", "HTTP 404 without an A2A error body: endpoint gone or moved"),
        (404, '{"error": {"code": 404, "message": "nope"}}', "HTTP 404 without an A2A error body"),
        (500, "Internal Server Error", "HTTP 500 without an A2A error body"),
        (502, "<html>Bad Gateway</html>", "HTTP 502 without an A2A error body"),
        (307, "", "HTTP 307 without an A2A error body"),
    ],
)
async def test_a_non_2xx_without_an_a2a_body_is_unreachable(
    binding: str, status: int, body: str, detail: str, mocked: Make
) -> None:
    transport = mocked(lambda r: httpx.Response(status, text=body), binding)
    with pytest.raises(EndpointUnreachableError, match=detail) as caught:
        await transport.cancel_task("t-1")
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("binding", "status", "error", "code"),
    [
        (HTTP_JSON, 400, {"reason": "VERSION_NOT_SUPPORTED"}, -32009),
        (HTTP_JSON, 400, {"reason": "INVALID_PARAMS"}, -32602),
        (HTTP_JSON, 400, {"reason": "PUSH_NOTIFICATION_NOT_SUPPORTED"}, -32003),
        (HTTP_JSON, 409, {"reason": "SOMETHING_NEW"}, "SOMETHING_NEW"),
        (HTTP_JSON, 404, {"code": -32001}, -32001),  # a JSON-RPC code in a REST error
        (JSONRPC, 500, {"code": -32603, "jsonrpc": True}, -32603),
    ],
)
async def test_a2a_error_bodies_map_to_the_json_rpc_code(
    binding: str, status: int, error: dict[str, Any], code: int | str, mocked: Make
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if error.get("jsonrpc"):
            body: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": error["code"], "message": "no"},
            }
        elif "reason" in error:
            info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": error["reason"]}
            body = {"error": {"code": status, "message": "no", "details": [info]}}
        else:
            body = {"error": {"code": error["code"], "message": "no"}}
        return httpx.Response(status, json=body)

    with pytest.raises(RemoteRefusedError) as caught:
        await mocked(answer, binding).create_push_config("t-1", PushConfig("c", "http://h"))
    assert caught.value.code == code


async def test_a_json_rpc_error_with_a_null_id_is_still_a_refusal(mocked: Make) -> None:
    def parse_error(request: httpx.Request) -> httpx.Response:
        error = {"code": -32700, "message": "Expecting property name"}
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": None, "error": error})

    with pytest.raises(RemoteRefusedError) as caught:
        await mocked(parse_error).get_task("t-1")
    assert caught.value.code == A2AErrorCode.PARSE_ERROR


async def test_a_timeout_is_unreachable(mocked: Make) -> None:
    async def stall(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    with pytest.raises(EndpointUnreachableError, match=r"timeout: no complete answer within 0\.2s"):
        await mocked(stall, timeout=0.2).get_task("t-1")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_what_goes_on_the_wire(binding: str, mocked: Make) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        result = {"message": {"messageId": "a-1", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}
        return (
            rpc_answer(request, result=result)
            if binding == JSONRPC
            else httpx.Response(200, json=result)
        )

    transport = mocked(answer, binding, headers={"Authorization": "Bearer sekrit"})
    push = PushConfig("cfg-1", "http://me.test/hook", "tok", "Bearer", "cred")
    reply = await transport.send_message(
        text="hello",
        message_id="m-1",
        context_id="c-1",
        task_id="t-1",
        metadata={"skillId": "echo"},
        push_config=push,
    )
    assert isinstance(reply, RemoteMessage)
    assert reply.text == "hi"
    (request,) = seen
    assert request.headers["A2A-Version"] == "1.0"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Authorization"] == "Bearer sekrit"
    body = json.loads(request.content)
    if binding == JSONRPC:
        assert (body["jsonrpc"], body["method"]) == ("2.0", "SendMessage")
        body = body["params"]
    else:
        assert (request.method, request.url.path) == ("POST", "/a2a/rest/message:send")
    assert body == {
        "message": {
            "messageId": "m-1",
            "role": "ROLE_USER",
            "parts": [{"text": "hello", "mediaType": "text/plain"}],
            "contextId": "c-1",
            "taskId": "t-1",
            "metadata": {"skillId": "echo"},
        },
        "configuration": {
            "returnImmediately": True,
            "taskPushNotificationConfig": {
                "id": "cfg-1",
                "url": "http://me.test/hook",
                "token": "tok",
                "authentication": {"scheme": "Bearer", "credentials": "cred"},
            },
        },
    }


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        (
            JSONRPC,
            [
                ("POST", "/a2a/jsonrpc", "GetTask", {"id": "t-1", "historyLength": 0}),
                ("POST", "/a2a/jsonrpc", "CancelTask", {"id": "t-1"}),
                (
                    "POST",
                    "/a2a/jsonrpc",
                    "CreateTaskPushNotificationConfig",
                    {"taskId": "t-1", "id": "cfg-1", "url": "http://me.test/hook"},
                ),
                ("POST", "/a2a/jsonrpc", "ListTasks", {"contextId": "c-1", "pageSize": 50}),
            ],
        ),
        (
            HTTP_JSON,
            [
                ("GET", "/a2a/rest/tasks/t-1", "", {"historyLength": "0"}),
                ("POST", "/a2a/rest/tasks/t-1:cancel", "", {}),
                (
                    "POST",
                    "/a2a/rest/tasks/t-1/pushNotificationConfigs",
                    "",
                    {"id": "cfg-1", "url": "http://me.test/hook"},
                ),
                ("GET", "/a2a/rest/tasks", "", {"contextId": "c-1", "pageSize": "50"}),
            ],
        ),
    ],
)
async def test_each_operation_uses_its_method_and_path(
    binding: str, expected: list[tuple[str, str, str, dict[str, Any]]], mocked: Make
) -> None:
    seen: list[tuple[str, str, str, dict[str, Any]]] = []
    answers = iter([TASK, TASK, {"id": "cfg-1", "url": "http://me.test/hook"}, {"tasks": [TASK]}])

    def answer(request: httpx.Request) -> httpx.Response:
        result = next(answers)
        if binding == JSONRPC:
            call = json.loads(request.content)
            seen.append((request.method, request.url.path, call["method"], call["params"]))
            return rpc_answer(request, result=result)
        sent = dict(request.url.params) or json.loads(request.content or b"{}")
        seen.append((request.method, request.url.path, "", sent))
        return httpx.Response(200, json=result)

    transport = mocked(answer, binding)
    assert (await transport.get_task("t-1")).state == "working"
    assert (await transport.cancel_task("t-1")).state == "working"
    assert (
        await transport.create_push_config("t-1", PushConfig("cfg-1", "http://me.test/hook"))
    ).id
    assert len(await transport.list_tasks(context_id="c-1")) == 1
    assert seen == expected


async def test_list_tasks_stops_on_a_repeating_page_token(mocked: Make) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return rpc_answer(request, result={"tasks": [TASK], "nextPageToken": "again"})

    with pytest.raises(InvalidAgentResponseError, match="nextPageToken 'again' repeats"):
        await mocked(answer).list_tasks(context_id="c-1")
    bounded = mocked(
        lambda r: rpc_answer(r, result={"tasks": [TASK], "nextPageToken": str(uuid.uuid4())}),
        max_pages=3,
    )
    assert len(await bounded.list_tasks(context_id="c-1")) == 3
