"""A2A 0.3 on the wire (engine/wire/_v03.py through A2ATransport), against a fake 0.3 agent that
answers from bodies recorded from a2a-sdk 0.3.26 (JSON-RPC: its pydantic JSON; HTTP+JSON: the
protobuf JSON of its 0.3 ``a2a.proto``), ids shortened and ``history`` left out where noted.

What is checked: the requests a 0.3 interface gets (methods, paths, shapes, no ``A2A-Version``),
that every answer reads into the same values a 1.0 answer does, the errors (HTTP+JSON 0.3 has no
codes), protocol mismatches named with both versions, 0.3 push bodies, and the media-type words
of 0.3 cards.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.mocked import Make as MakeTransport

from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import Interface, parse_card
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC, dialect_of, part_kind, spoken_version
from cardfence.engine.cli.main import run as cli_run
from cardfence.engine.core import guards
from cardfence.engine.core.answers import PushConfig, RemoteMessage, RemoteTask
from cardfence.engine.errors import (
    CardInvalidError,
    EndpointUnreachableError,
    OperationUnsupportedError,
    ProtocolMismatchError,
    ProtocolUnsupportedError,
    RemoteRefusedError,
    StreamDroppedError,
)
from cardfence.engine.wire import _v03 as wire03
from cardfence.engine.wire import push as webhook
from cardfence.engine.wire.transport import A2ATransport

RPC_URL = "http://agent.test/a2a/jsonrpc"
REST_URL = "http://agent.test/a2a/rest"
TASK_ID = "8c20046d-fd45-4192-8b63-57b37d164863"
HISTORY = [
    {
        "contextId": "c-1",
        "kind": "message",
        "messageId": "m-6c73b159",
        "parts": [{"kind": "text", "text": "echo hi"}],
        "role": "user",
        "taskId": TASK_ID,
    }
]

# --- recorded: JSON-RPC (a2a-sdk 0.3.26, A2AStarletteApplication) ---------------------------------

RPC_SUBMITTED = {
    "contextId": "c-1",
    "history": HISTORY,
    "id": TASK_ID,
    "kind": "task",
    "status": {"state": "submitted"},
}
RPC_COMPLETED = {
    "artifacts": [
        {
            "artifactId": "e42a6b3e-8455-4dc4-89fb-faa9a633a919",
            "name": "parts",
            "parts": [
                {"kind": "text", "text": "t"},
                {
                    "file": {
                        "mimeType": "application/pdf",
                        "name": "f.pdf",
                        "uri": "https://x.test/f.pdf",
                    },
                    "kind": "file",
                },
                {"file": {"bytes": "aGk=", "mimeType": "text/plain"}, "kind": "file"},
                {"data": {"k": 1}, "kind": "data"},
            ],
        }
    ],
    "contextId": "c-1",
    "history": HISTORY,
    "id": TASK_ID,
    "kind": "task",
    "status": {"state": "completed", "timestamp": "2026-12-01T05:25:15.340125+00:00"},
}
RPC_INPUT_REQUIRED = {
    "contextId": "c-1",
    "id": TASK_ID,
    "kind": "task",
    "status": {
        "message": {
            "contextId": "c-1",
            "kind": "message",
            "messageId": "7274cabb-2cae-4466-ad17-d877010d662d",
            "parts": [{"kind": "text", "text": "what?"}],
            "role": "agent",
            "taskId": TASK_ID,
        },
        "state": "input-required",
        "timestamp": "2026-12-01T05:17:09.696643+00:00",
    },
}
RPC_CANCELED = {
    "contextId": "c-1",
    "id": TASK_ID,
    "kind": "task",
    "status": {"state": "canceled", "timestamp": "2026-12-01T05:17:09.908954+00:00"},
}
RPC_PUSH_CONFIG = {
    "pushNotificationConfig": {
        "authentication": {"credentials": "s2", "schemes": ["Bearer"]},
        "id": "cf-2",
        "token": "tok2",
        "url": "http://127.0.0.1:9/hook2",
    },
    "taskId": TASK_ID,
}
RPC_STREAM = [  # message/stream of `slow 0.2`
    {**RPC_SUBMITTED},
    {
        "contextId": "c-1",
        "final": False,
        "kind": "status-update",
        "status": {"state": "working", "timestamp": "2026-12-01T05:17:13.788863+00:00"},
        "taskId": TASK_ID,
    },
    {
        "artifact": {
            "artifactId": "b4af327e-f605-488a-b177-8a65e1d2dbdd",
            "name": "slow",
            "parts": [{"kind": "text", "text": "slept"}],
        },
        "contextId": "c-1",
        "kind": "artifact-update",
        "taskId": TASK_ID,
    },
    {
        "contextId": "c-1",
        "final": True,
        "kind": "status-update",
        "status": {"state": "completed", "timestamp": "2026-12-01T05:17:13.990071+00:00"},
        "taskId": TASK_ID,
    },
]
RPC_MESSAGE = {
    "contextId": "c-1",
    "kind": "message",
    "messageId": "m-a",
    "parts": [{"kind": "text", "text": "hello"}],
    "role": "agent",
}

# --- recorded: HTTP+JSON (a2a-sdk 0.3.26, A2ARESTFastAPIApplication) ------------------------------

REST_HISTORY = [
    {
        "messageId": "m-b6b6c102",
        "contextId": "c-1",
        "taskId": TASK_ID,
        "role": "ROLE_USER",
        "content": [{"text": "echo hi"}],
        "metadata": {},
    }
]
REST_SUBMITTED = {
    "task": {
        "id": TASK_ID,
        "contextId": "c-1",
        "status": {"state": "TASK_STATE_SUBMITTED"},
        "history": REST_HISTORY,
    }
}
REST_COMPLETED = {
    "id": TASK_ID,
    "contextId": "c-1",
    "status": {"state": "TASK_STATE_COMPLETED"},
    "artifacts": [
        {
            "artifactId": "1095a0c4-debd-44e8-8dcd-f58d68e80bcb",
            "name": "parts",
            "parts": [
                {"text": "t"},
                {
                    "file": {
                        "fileWithUri": "https://x.test/f.pdf",
                        "mimeType": "application/pdf",
                        "name": "f.pdf",
                    }
                },
                {"file": {"fileWithBytes": "YUdrPQ==", "mimeType": "text/plain"}},
                {"data": {"data": {"k": 1.0}}},
            ],
        }
    ],
    "history": REST_HISTORY,
}
REST_CANCELLED = {
    "id": TASK_ID,
    "contextId": "c-1",
    "status": {"state": "TASK_STATE_CANCELLED"},
    "history": REST_HISTORY,
}
REST_PUSH_CONFIG = {
    "name": f"tasks/{TASK_ID}/pushNotificationConfigs/cf-4",
    "pushNotificationConfig": {"id": "cf-4", "url": "http://127.0.0.1:9/h2", "token": "t2"},
}
REST_INPUT_REQUIRED_EVENT = {
    "statusUpdate": {
        "taskId": TASK_ID,
        "contextId": "c-1",
        "status": {
            "state": "TASK_STATE_INPUT_REQUIRED",
            "message": {
                "messageId": "97503614-ce5e-4258-835a-e860e2cf0549",
                "contextId": "c-1",
                "taskId": TASK_ID,
                "role": "ROLE_AGENT",
                "content": [{"text": "what?"}],
            },
        },
        "final": True,
    }
}
REST_STREAM = [REST_SUBMITTED, REST_INPUT_REQUIRED_EVENT]


# --- a fake 0.3 agent ----------------------------------------------------------------------------


class Fake03:
    """Answers each request from ``answers``, keyed by JSON-RPC method or ``"VERB /path"``: a
    JSON-RPC result (wrapped in the envelope), a ``(status, body)`` pair, or a list of events
    (an SSE stream). ``requests`` are what it received, decoded."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen = {
            "verb": request.method,
            "path": request.url.path,
            "query": dict(request.url.params),
            "headers": request.headers,
            "body": body,
        }
        self.requests.append(seen)
        rpc = request.url.path.endswith("/jsonrpc")
        key = body["method"] if rpc else f"{request.method} {request.url.path}"
        answer = self.answers[key]
        if isinstance(answer, tuple):
            status, payload = answer
            if rpc and status == 200:
                payload = {"jsonrpc": "2.0", "id": body["id"], **payload}
            return httpx.Response(status, json=payload)
        if isinstance(answer, list):
            events = [
                {"jsonrpc": "2.0", "id": body["id"], "result": e} if rpc else e for e in answer
            ]
            # HTTP+JSON 0.3 prints each event as indented JSON: one data line per JSON line.
            text = "".join(
                "".join(f"data: {line}\n" for line in json.dumps(e, indent=2).splitlines()) + "\n"
                for e in events
            )
            return sse(text)
        payload = {"jsonrpc": "2.0", "id": body["id"], "result": answer} if rpc else answer
        return httpx.Response(200, json=payload)


def sse(text: str) -> httpx.Response:
    """An event stream, read as it comes (not preloaded, as a real body is)."""
    stream = httpx.ByteStream(text.encode())
    return httpx.Response(200, stream=stream, headers={"content-type": "text/event-stream"})


Make = Callable[..., tuple[A2ATransport, Fake03]]


@pytest.fixture
def fake(agent: MakeTransport) -> Make:
    """``fake(answers, binding=JSONRPC, version="0.3.0")``: a transport to a :class:`Fake03`."""

    def make(
        answers: dict[str, Any], binding: str = JSONRPC, version: str = "0.3.0"
    ) -> tuple[A2ATransport, Fake03]:
        fake03 = Fake03(answers)
        return agent(fake03, binding, version), fake03

    return make


PUSH = PushConfig("cf-1", "https://hook.test/h", "tok", "Bearer", "sekrit")


# --- requests -------------------------------------------------------------------------------------


async def test_jsonrpc_send_is_message_send_with_kinds_and_blocking_false(fake: Make) -> None:
    transport, agent = fake({"message/send": RPC_SUBMITTED})
    answer = await transport.send_message(
        text="echo hi",
        message_id="m-1",
        context_id="c-1",
        metadata={"skillId": "echo"},
        push_config=PUSH,
    )
    assert isinstance(answer, RemoteTask)
    assert answer.state == "submitted"
    sent = agent.requests[0]
    assert "a2a-version" not in sent["headers"]
    assert sent["body"]["method"] == "message/send"
    assert sent["body"]["params"] == {
        "message": {
            "kind": "message",
            "messageId": "m-1",
            "role": "user",
            "parts": [{"kind": "text", "text": "echo hi"}],
            "contextId": "c-1",
            "metadata": {"skillId": "echo"},
        },
        "configuration": {
            "blocking": False,
            "pushNotificationConfig": {
                "id": "cf-1",
                "url": "https://hook.test/h",
                "token": "tok",
                "authentication": {"schemes": ["Bearer"], "credentials": "sekrit"},
            },
        },
    }


async def test_rest_send_is_proto_json_under_v1(fake: Make) -> None:
    transport, agent = fake({"POST /a2a/rest/v1/message:send": REST_SUBMITTED}, HTTP_JSON)
    answer = await transport.send_message(
        text="echo hi", message_id="m-1", context_id="c-1", push_config=PUSH
    )
    assert isinstance(answer, RemoteTask)
    assert (answer.id, answer.state, answer.timestamp) == (TASK_ID, "submitted", None)
    sent = agent.requests[0]
    assert "a2a-version" not in sent["headers"]
    assert sent["body"] == {
        "message": {
            "messageId": "m-1",
            "role": "ROLE_USER",
            "content": [{"text": "echo hi"}],
            "contextId": "c-1",
        },
        "configuration": {
            "blocking": False,
            "pushNotification": {
                "id": "cf-1",
                "url": "https://hook.test/h",
                "token": "tok",
                "authentication": {"schemes": ["Bearer"], "credentials": "sekrit"},
            },
        },
    }


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_a_reply_blocks_and_names_its_task(fake: Make, binding: str) -> None:
    answer = RPC_COMPLETED if binding == JSONRPC else {"task": REST_COMPLETED}
    transport, agent = fake(
        {"message/send": answer, "POST /a2a/rest/v1/message:send": answer}, binding
    )
    got = await transport.send_message(
        text="yes", message_id="m-2", context_id="c-1", task_id=TASK_ID, return_immediately=False
    )
    assert isinstance(got, RemoteTask)
    assert got.state == "completed"
    body = agent.requests[0]["body"]
    params = body["params"] if binding == JSONRPC else body
    assert params["configuration"] == {"blocking": True}  # a2a-sdk's REST reads absent as false
    assert params["message"]["taskId"] == TASK_ID


@pytest.mark.parametrize(
    ("media_type", "text", "rpc_part", "rest_part"),
    [
        ("text/plain", "hi", {"kind": "text", "text": "hi"}, {"text": "hi"}),
        ("text/markdown", "*hi*", {"kind": "text", "text": "*hi*"}, {"text": "*hi*"}),
        (
            "application/json",
            '{"a": 1}',
            {"kind": "data", "data": {"a": 1}},
            {"data": {"data": {"a": 1}}},
        ),
        (
            "application/json",  # not an object: 0.3 data parts hold objects only
            "[1]",
            {"kind": "file", "file": {"bytes": "WzFd", "mimeType": "application/json"}},
            {"file": {"fileWithBytes": "V3pGZA==", "mimeType": "application/json"}},
        ),
        (
            "application/pdf",
            "héllo",  # recorded: a2a-sdk 0.3 reads "aMOpbGxv" as the bytes over both bindings
            {"kind": "file", "file": {"bytes": "aMOpbGxv", "mimeType": "application/pdf"}},
            {"file": {"fileWithBytes": "YU1PcGJHeHY=", "mimeType": "application/pdf"}},
        ),
    ],
)
@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_the_media_type_chooses_the_part(
    fake: Make,
    binding: str,
    media_type: str,
    text: str,
    rpc_part: dict[str, Any],
    rest_part: dict[str, Any],
) -> None:
    transport, agent = fake(
        {"message/send": RPC_SUBMITTED, "POST /a2a/rest/v1/message:send": REST_SUBMITTED}, binding
    )
    await transport.send_message(text=text, message_id="m", context_id="c", media_type=media_type)
    body = agent.requests[0]["body"]
    if binding == JSONRPC:
        assert body["params"]["message"]["parts"] == [rpc_part]
    else:
        assert body["message"]["content"] == [rest_part]


@pytest.mark.parametrize(
    ("call", "method", "params", "verb", "path", "query", "body"),
    [
        (
            lambda t: t.get_task(TASK_ID),
            "tasks/get",
            {"id": TASK_ID, "historyLength": 0},
            "GET",
            f"/a2a/rest/v1/tasks/{TASK_ID}",
            {"historyLength": "0"},
            None,
        ),
        (
            lambda t: t.cancel_task(TASK_ID),
            "tasks/cancel",
            {"id": TASK_ID},
            "POST",
            f"/a2a/rest/v1/tasks/{TASK_ID}:cancel",
            {},
            {"name": f"tasks/{TASK_ID}"},
        ),
        (
            lambda t: t.create_push_config(
                TASK_ID, PushConfig("cf-4", "http://127.0.0.1:9/h2", "t2")
            ),
            "tasks/pushNotificationConfig/set",
            {
                "taskId": TASK_ID,
                "pushNotificationConfig": {
                    "id": "cf-4",
                    "url": "http://127.0.0.1:9/h2",
                    "token": "t2",
                },
            },
            "POST",
            f"/a2a/rest/v1/tasks/{TASK_ID}/pushNotificationConfigs",
            {},
            {
                "parent": f"tasks/{TASK_ID}",
                "configId": "cf-4",
                "config": {
                    "name": f"tasks/{TASK_ID}/pushNotificationConfigs/cf-4",
                    "pushNotificationConfig": {
                        "id": "cf-4",
                        "url": "http://127.0.0.1:9/h2",
                        "token": "t2",
                    },
                },
            },
        ),
        (
            lambda t: t.get_extended_card(),
            "agent/getAuthenticatedExtendedCard",
            {},
            "GET",
            "/a2a/rest/v1/card",
            {},
            None,
        ),
    ],
    ids=["get", "cancel", "push_config", "extended_card"],
)
@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_each_operation_has_its_03_method_and_path(
    fake: Make,
    binding: str,
    call: Callable[[A2ATransport], Any],
    method: str,
    params: dict[str, Any],
    verb: str,
    path: str,
    query: dict[str, str],
    body: dict[str, Any] | None,
) -> None:
    answers = {
        "tasks/get": RPC_COMPLETED,
        "tasks/cancel": RPC_CANCELED,
        "tasks/pushNotificationConfig/set": {
            **RPC_PUSH_CONFIG,
            "pushNotificationConfig": params.get("pushNotificationConfig"),
        },
        "agent/getAuthenticatedExtendedCard": {"name": "x", "url": RPC_URL},
        f"GET /a2a/rest/v1/tasks/{TASK_ID}": REST_COMPLETED,
        f"POST /a2a/rest/v1/tasks/{TASK_ID}:cancel": REST_CANCELLED,
        f"POST /a2a/rest/v1/tasks/{TASK_ID}/pushNotificationConfigs": REST_PUSH_CONFIG,
        "GET /a2a/rest/v1/card": {"name": "x", "url": RPC_URL},
    }
    transport, agent = fake(answers, binding)
    await call(transport)
    sent = agent.requests[0]
    assert "a2a-version" not in sent["headers"]
    if binding == JSONRPC:
        assert (sent["verb"], sent["body"]["method"], sent["body"]["params"]) == (
            "POST",
            method,
            params,
        )
    else:
        assert (sent["verb"], sent["path"], sent["query"], sent["body"]) == (
            verb,
            path,
            query,
            body,
        )


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_list_tasks_does_not_exist_in_03_and_nothing_is_sent(
    fake: Make, binding: str
) -> None:
    transport, agent = fake({}, binding)
    with pytest.raises(OperationUnsupportedError) as raised:
        await transport.list_tasks(context_id="c-1")
    assert agent.requests == []
    assert "ListTasks is not part of A2A 0.3" in str(raised.value)
    assert "not sent" in str(raised.value)


# --- answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_a_task_reads_the_same_from_either_binding(fake: Make, binding: str) -> None:
    transport, _ = fake(
        {"tasks/get": RPC_COMPLETED, f"GET /a2a/rest/v1/tasks/{TASK_ID}": REST_COMPLETED}, binding
    )
    task = await transport.get_task(TASK_ID)
    assert (task.id, task.context_id, task.state) == (TASK_ID, "c-1", "completed")
    (artifact,) = task.artifacts
    assert artifact.name == "parts"
    got = [(p.kind, p.text, p.url, p.data, p.media_type, p.filename) for p in artifact.parts]
    assert got == [
        ("text", "t", None, None, None, None),
        ("url", None, "https://x.test/f.pdf", None, "application/pdf", "f.pdf"),
        ("raw", None, None, "aGk=", "text/plain", None),  # REST: a2a-sdk's base64 of the base64
        ("data", None, None, {"k": 1}, None, None),
    ]


async def test_jsonrpc_status_messages_and_timestamps_are_read(fake: Make) -> None:
    transport, _ = fake({"tasks/get": RPC_INPUT_REQUIRED})
    task = await transport.get_task(TASK_ID)
    assert task.state == "input-required"
    assert task.message is not None
    assert (task.message.role, task.message.text) == ("agent", "what?")
    assert task.timestamp is not None
    assert task.timestamp.isoformat().startswith("2026-12-01T05:17")


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_canceled_is_read_in_both_spellings(fake: Make, binding: str) -> None:
    transport, _ = fake(
        {"tasks/cancel": RPC_CANCELED, f"POST /a2a/rest/v1/tasks/{TASK_ID}:cancel": REST_CANCELLED},
        binding,
    )
    assert (await transport.cancel_task(TASK_ID)).state == "canceled"


async def test_a_bare_message_answer_is_a_message(fake: Make) -> None:
    transport, _ = fake({"message/send": RPC_MESSAGE})
    answer = await transport.send_message(text="hi", message_id="m", context_id="c-1")
    assert isinstance(answer, RemoteMessage)
    assert answer.text == "hello"


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_a_push_config_is_read_flat(fake: Make, binding: str) -> None:
    path = f"POST /a2a/rest/v1/tasks/{TASK_ID}/pushNotificationConfigs"
    transport, _ = fake(
        {"tasks/pushNotificationConfig/set": RPC_PUSH_CONFIG, path: REST_PUSH_CONFIG}, binding
    )
    stored = await transport.create_push_config(TASK_ID, PUSH)
    if binding == JSONRPC:
        assert (stored.id, stored.token, stored.auth_scheme) == ("cf-2", "tok2", "Bearer")
        assert stored.auth_credentials == "s2"
    else:
        assert (stored.id, stored.url, stored.token) == ("cf-4", "http://127.0.0.1:9/h2", "t2")


async def test_a_jsonrpc_stream_reads_kind_tagged_events(fake: Make) -> None:
    transport, agent = fake({"message/stream": RPC_STREAM})
    async with transport.send_streaming_message(
        text="slow 0.2", message_id="m", context_id="c-1"
    ) as updates:
        got = [(u.kind, u.state) async for u in updates]
    assert got == [
        ("task", "submitted"),
        ("status", "working"),
        ("artifact", None),
        ("status", "completed"),
    ]
    assert agent.requests[0]["body"]["method"] == "message/stream"


async def test_a_rest_stream_reads_proto_json_events(fake: Make) -> None:
    transport, agent = fake({f"GET /a2a/rest/v1/tasks/{TASK_ID}:subscribe": REST_STREAM}, HTTP_JSON)
    async with transport.subscribe(TASK_ID) as updates:
        got = [u async for u in updates]
    assert [(u.kind, u.state) for u in got] == [("task", "submitted"), ("status", "input-required")]
    assert got[1].message is not None
    assert got[1].message.text == "what?"
    assert agent.requests[0]["verb"] == "GET"
    # Each update weighs the event it came in: what reading ahead of the stream holds.
    sizes = [len(json.dumps(event, indent=2).encode()) for event in REST_STREAM]
    assert [u.size for u in got] == sizes


async def test_a_jsonrpc_resubscribe_refused_in_the_stream_is_the_agents_refusal(
    agent: MakeTransport,
) -> None:
    """a2a-sdk 0.3 refuses a terminal task's resubscribe inside the event stream (-32602)."""

    def refusing(request: httpx.Request) -> httpx.Response:
        request_id = json.loads(request.content)["id"]
        error = {"code": -32602, "message": f"Task {TASK_ID} is in terminal state: failed"}
        event = {"error": error, "id": request_id, "jsonrpc": "2.0"}
        return sse(f"data: {json.dumps(event)}\n\n")

    transport = agent(refusing, JSONRPC, "0.3.0")
    with pytest.raises(RemoteRefusedError) as raised:
        async with transport.subscribe(TASK_ID) as updates:
            _ = [u async for u in updates]
    assert raised.value.code == -32602


async def test_a_rest_stream_cut_by_the_agent_is_a_drop(fake: Make) -> None:
    """a2a-sdk 0.3 answers a terminal task's subscribe over HTTP+JSON with an event stream it
    then breaks: a drop, the caller's cue to poll."""
    transport, _ = fake({f"GET /a2a/rest/v1/tasks/{TASK_ID}:subscribe": []}, HTTP_JSON)
    with pytest.raises(StreamDroppedError):
        async with transport.subscribe(TASK_ID) as updates:
            _ = [u async for u in updates]


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (404, {"message": "Task not found"}, -32001),  # recorded
        (409, {"message": "Task cannot be canceled - current state: TaskState.canceled"}, -32002),
        (501, {"message": "Streaming is not supported by the agent"}, -32004),
        (415, {"message": "Incompatible content types"}, -32005),
        (422, {"message": "Invalid parameters"}, -32602),
    ],
)
async def test_rest_03_errors_are_the_agents_refusals(
    fake: Make, status: int, body: dict[str, Any], code: int
) -> None:
    transport, _ = fake({f"GET /a2a/rest/v1/tasks/{TASK_ID}": (status, body)}, HTTP_JSON)
    with pytest.raises(RemoteRefusedError) as raised:
        await transport.get_task(TASK_ID)
    assert raised.value.code == code
    assert not isinstance(raised.value, ProtocolMismatchError)


async def test_rest_03_push_not_supported_is_its_own_code(fake: Make) -> None:
    path = f"POST /a2a/rest/v1/tasks/{TASK_ID}/pushNotificationConfigs"
    body = {"message": "Push notifications are not supported by the agent"}
    transport, _ = fake({path: (501, body)}, HTTP_JSON)
    with pytest.raises(RemoteRefusedError) as raised:
        await transport.create_push_config(TASK_ID, PUSH)
    assert raised.value.code == -32003


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, {"detail": "Not Found"}),  # recorded: a path a2a-sdk 0.3 (FastAPI) does not have
        (404, {"message": "Not Found"}),  # a gateway's missing route: never TaskNotFound (R11)
        (500, {"message": "unknown exception"}),  # recorded: the outcome is unknown
        (502, {"message": "Internal server error"}),
        (503, {"message": "Service Unavailable"}),
    ],
)
async def test_rest_03_answers_without_an_a2a_error_are_unreachable(
    fake: Make, status: int, body: dict[str, Any]
) -> None:
    transport, _ = fake({f"GET /a2a/rest/v1/tasks/{TASK_ID}": (status, body)}, HTTP_JSON)
    with pytest.raises(EndpointUnreachableError) as raised:
        await transport.get_task(TASK_ID)
    assert raised.value.status == status


# --- protocol mismatches -------------------------------------------------------------------------

METHOD_NOT_FOUND = {"error": {"code": -32601, "message": "Method not found"}}
VERSION_REFUSED = {  # a 1.0 a2a-sdk answering a request without A2A-Version (docs/wire.md)
    "error": {
        "code": -32009,
        "message": "A2A version '0.3' is not supported by this handler. Expected version '1.0'.",
        "data": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "VERSION_NOT_SUPPORTED",
                "domain": "a2a-protocol.org",
                "metadata": {},
            }
        ],
    }
}


async def test_a_03_interface_answering_method_not_found_speaks_10(fake: Make) -> None:
    transport, _ = fake({"message/send": (200, METHOD_NOT_FOUND)})
    with pytest.raises(ProtocolMismatchError) as raised:
        await transport.send_message(text="hi", message_id="m", context_id="c")
    text = str(raised.value)
    assert "the card says A2A 0.3.0, the endpoint speaks another version (1.0 perhaps)" in text
    assert "message/send, which 1.0 calls SendMessage" in text
    assert (raised.value.declared, raised.value.spoken, raised.value.code) == (
        "0.3.0",
        "1.0",
        -32601,
    )


async def test_a_10_interface_answering_method_not_found_speaks_03(fake: Make) -> None:
    transport, _ = fake({"GetTask": (200, METHOD_NOT_FOUND)}, JSONRPC, "1.0")
    with pytest.raises(ProtocolMismatchError) as raised:
        await transport.get_task(TASK_ID)
    text = str(raised.value)
    assert "the card says A2A 1.0, the endpoint speaks another version (0.3 perhaps)" in text
    assert "GetTask, which 0.3 calls tasks/get" in text


@pytest.mark.parametrize("version", ["0.3.0", "1.0"])
async def test_version_not_supported_is_a_mismatch_either_way(fake: Make, version: str) -> None:
    method = "tasks/get" if version.startswith("0.") else "GetTask"
    transport, _ = fake({method: (200, VERSION_REFUSED)}, JSONRPC, version)
    with pytest.raises(ProtocolMismatchError) as raised:
        await transport.get_task(TASK_ID)
    assert raised.value.code == -32009
    assert f"the card says A2A {version}" in str(raised.value)
    assert "Expected version '1.0'" in str(raised.value)


async def test_a_03_rest_interface_answering_a_10_error_body_is_a_mismatch(fake: Make) -> None:
    body = {
        "error": {
            "code": 404,
            "status": "NOT_FOUND",
            "message": "Task not found",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND"}
            ],
        }
    }
    transport, _ = fake({f"GET /a2a/rest/v1/tasks/{TASK_ID}": (404, body)}, HTTP_JSON)
    with pytest.raises(ProtocolMismatchError) as raised:
        await transport.get_task(TASK_ID)
    assert "the card says A2A 0.3.0, the endpoint speaks another version (1.0 perhaps)" in str(
        raised.value
    )


async def test_a_stream_refused_with_method_not_found_is_a_mismatch(fake: Make) -> None:
    transport, _ = fake({"tasks/resubscribe": (200, METHOD_NOT_FOUND)})
    with pytest.raises(ProtocolMismatchError, match=r"tasks/resubscribe, which 1\.0 calls"):
        async with transport.subscribe(TASK_ID):
            pass


# --- push deliveries ------------------------------------------------------------------------------

HEADERS = {"content-type": "application/json", "x-a2a-notification-token": "tok"}


def test_a_03_push_is_the_whole_task_and_reads_as_a_task_update() -> None:
    """a2a-sdk 0.3's BasePushNotificationSender posts ``task.model_dump(mode="json")``."""
    update = webhook.decode(json.dumps(RPC_COMPLETED).encode(), HEADERS)
    assert (update.kind, update.task_id, update.state) == ("task", TASK_ID, "completed")
    assert update.task is not None
    assert [p.kind for p in update.task.artifacts[0].parts] == ["text", "url", "raw", "data"]


def test_a_03_task_without_kind_is_told_by_its_shape() -> None:
    body = {k: v for k, v in RPC_INPUT_REQUIRED.items() if k != "kind"}
    update = webhook.decode(json.dumps(body).encode(), HEADERS)
    assert (update.kind, update.state) == ("task", "input-required")
    assert update.message is not None
    assert update.message.text == "what?"


def test_a_10_push_reads_as_before() -> None:
    body = {"statusUpdate": {"taskId": "t-1", "status": {"state": "TASK_STATE_WORKING"}}}
    update = webhook.decode(json.dumps(body).encode(), HEADERS)
    assert (update.kind, update.task_id, update.state) == ("status", "t-1", "working")


def test_a_push_of_neither_shape_is_refused() -> None:
    with pytest.raises(webhook.Refused) as raised:
        webhook.decode(json.dumps({"id": "t-1"}).encode(), HEADERS)
    assert raised.value.delivery.status == 400


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        "x",
        {"kind": 3},
        {"kind": []},  # unhashable: never looked up as a key
        {"kind": {}, "id": "t", "status": {}},
        {"kind": "task", "status": []},
        {"task": 1},
        {"content": 1, "parts": None, "file": {"fileWithBytes": 3}},
    ],
)
def test_translation_never_raises(doc: object) -> None:
    for kind in ("send", "task", "stream", "push_config", "card"):
        for rest in (False, True):
            wire03.answer(kind, doc, rest=rest)  # type: ignore[arg-type]
    wire03.push_body(doc)


# --- media-type words and versions on the card --------------------------------------------------


def card_03(**extra: Any) -> bytes:
    card: dict[str, Any] = {
        "name": "p03",
        "description": "0.3 peer",
        "version": "1",
        "url": "http://127.0.0.1:9/a2a/jsonrpc",
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "additionalInterfaces": [
            {"transport": "JSONRPC", "url": "http://127.0.0.1:9/a2a/jsonrpc"},
            {"transport": "HTTP+JSON", "url": "http://127.0.0.1:9/a2a/rest"},
        ],
        "capabilities": {"pushNotifications": True, "streaming": True},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [
            {"id": "echo", "name": "echo", "description": "echo", "tags": ["t"]},
            {"id": "files", "name": "f", "description": "f", "tags": [], "inputModes": ["file"]},
            {"id": "json", "name": "j", "description": "j", "tags": [], "inputModes": ["data"]},
        ],
    }
    card.update(extra)
    return json.dumps(card).encode()


@pytest.mark.parametrize(
    ("skill", "media_type", "accepted"),
    [
        ("echo", "text/plain", True),
        ("echo", "text/markdown", True),
        ("echo", "TEXT/PLAIN; charset=utf-8", True),
        ("echo", "application/json", False),
        ("json", "application/json", True),
        ("json", "application/ld+json", True),
        ("json", "text/plain", False),
        ("files", "application/pdf", True),
        ("files", "image/png", True),
        ("files", "text/plain", False),
        ("files", "application/json", False),
    ],
)
def test_the_bare_words_of_03_cards_name_kinds_of_part(
    skill: str, media_type: str, accepted: bool
) -> None:
    found = parse_card(card_03()).skill(skill)
    assert found is not None
    assert found.accepts(media_type) is accepted


def test_part_kinds() -> None:
    assert [part_kind(t) for t in ("text/csv", "application/json", "a/b+json", "image/png")] == [
        "text",
        "data",
        "data",
        "file",
    ]


@pytest.mark.parametrize(
    ("declared", "legacy", "spoken"),
    [
        ("1.0", False, "1.0"),
        ("1.1", False, "1.0"),
        ("", False, "1.0"),
        ("", True, "0.3"),
        ("0.3.0", True, "0.3"),
        ("0.3", False, "0.3"),
        ("0.2.5", True, "0.3"),
        ("0.1", True, ""),
        ("2.0", False, ""),
        ("x", False, ""),
    ],
)
def test_the_versions_spoken(declared: str, legacy: bool, spoken: str) -> None:
    assert spoken_version(declared, legacy_card=legacy) == spoken


def test_a_03_card_selects_a_03_interface_and_records_it() -> None:
    card = parse_card(card_03())
    chosen = select_interface(card, ["HTTP+JSON"])
    assert (chosen.binding, chosen.protocol_version, chosen.speaks) == (HTTP_JSON, "0.3.0", "0.3")
    assert guards.endpoint_of(chosen) == {
        "url": "http://127.0.0.1:9/a2a/rest",
        "binding": HTTP_JSON,
        "protocol_version": "0.3.0",
    }


def test_a_02_card_without_a_version_speaks_03() -> None:
    doc = json.loads(card_03())
    del doc["protocolVersion"]
    chosen = select_interface(parse_card(json.dumps(doc).encode()))
    assert (chosen.protocol_version, chosen.speaks) == ("", "0.3")
    assert guards.endpoint_of(chosen)["protocol_version"] == "0.3"


def test_a_card_in_a_version_not_spoken_is_refused_before_sending() -> None:
    card = parse_card(card_03(protocolVersion="2.0"), url="http://127.0.0.1:9/card")
    with pytest.raises(ProtocolUnsupportedError) as raised:
        select_interface(card)
    assert isinstance(raised.value, CardInvalidError)
    assert (raised.value.kind, raised.value.offered) == ("unsupported_protocol", ("2.0",))
    assert "no interface speaks an A2A version cardfence speaks" in str(raised.value)


def test_a_version_spoken_is_chosen_over_one_that_is_not() -> None:
    doc = {
        "name": "dual",
        "supportedInterfaces": [
            {
                "url": "http://127.0.0.1:9/v2",
                "protocolBinding": "JSONRPC",
                "protocolVersion": "2.0",
            },
            {
                "url": "http://127.0.0.1:9/v03",
                "protocolBinding": "JSONRPC",
                "protocolVersion": "0.3",
            },
        ],
    }
    chosen = select_interface(parse_card(json.dumps(doc).encode()))
    assert chosen.url == "http://127.0.0.1:9/v03"


# --- the recorded endpoint ------------------------------------------------------------------------


def test_an_endpoint_recorded_without_a_version_is_10_at_use() -> None:
    old = {"url": RPC_URL, "binding": JSONRPC}  # TaskSubmitted before versions were recorded
    assert guards.endpoint_version(old) == "1.0"
    assert guards.endpoint_dialect(old) == "1.0"
    assert guards.endpoint_dialect({**old, "protocol_version": "0.3.0"}) == "0.3"


def test_an_old_endpoint_on_an_unchanged_10_card_does_not_move() -> None:
    card = {
        "name": "a",
        "supportedInterfaces": [
            {"url": RPC_URL, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "skills": [{"id": "echo", "name": "e", "description": "e", "tags": []}],
    }
    parsed = parse_card(json.dumps(card).encode())
    task = {
        "endpoint": {"url": RPC_URL, "binding": JSONRPC},
        "skill": "echo",
        "skill_hash": parsed.compatibility_hash("echo"),
        "latest_card_revision": parsed.revision,
        "contract_hash": parsed.contract_hash,
    }
    plan = guards.resume_check(task, parsed, None, allow_insecure=True)
    assert plan.endpoint == task["endpoint"]
    assert plan.events == ()


def test_the_same_url_speaking_another_version_is_a_move() -> None:
    card = parse_card(card_03(url=RPC_URL, additionalInterfaces=[]))
    task = {
        "endpoint": {"url": RPC_URL, "binding": JSONRPC},  # recorded as 1.0
        "skill": "echo",
        "skill_hash": card.compatibility_hash("echo"),
        "latest_card_revision": card.revision,
        "contract_hash": card.contract_hash,
    }
    plan = guards.resume_check(task, card, None, allow_insecure=True)
    assert plan.endpoint == {"url": RPC_URL, "binding": JSONRPC, "protocol_version": "0.3.0"}
    assert [event.TYPE for event in plan.events] == ["EndpointMoved"]


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize("media_type", ["text", "data", "plain", "text/", "/json"])
def test_run_refuses_what_is_not_a_media_type(tmp_path: Path, media_type: str) -> None:
    db = tmp_path / "c.db"
    argv = ["run", "http://127.0.0.1:9", "--skill", "echo", "--text", "hi"]
    code = cli_run([*argv, "--media-type", media_type, "--db", f"sqlite:///{db}"])
    assert code == 2
    assert not db.exists()


@pytest.mark.parametrize(
    ("declared", "legacy_card", "dialect"),
    [
        ("1.0", False, "1.0"),
        ("1.2", False, "1.0"),
        ("", False, "1.0"),
        ("", True, "0.3"),
        ("0.3.0", False, "0.3"),
        (" 0.2 ", False, "0.3"),
        ("0.1", False, "0.3"),  # not spoken, yet any 0.x takes 0.3's shapes
        ("2.0", False, "1.0"),
    ],
)
def test_the_dialect_of_a_declared_version_is_the_interfaces_and_a_recorded_endpoints(
    declared: str, legacy_card: bool, dialect: str
) -> None:
    assert dialect_of(declared, legacy_card=legacy_card) == dialect
    assert Interface(RPC_URL, JSONRPC, declared, legacy_card).dialect == dialect
    if not legacy_card:
        assert guards.endpoint_dialect({"url": RPC_URL, "protocol_version": declared}) == dialect


# --------------------------------------------------------------------------------------------------
# engine/wire/_v03.py's translation functions called directly, for what the recorded exchanges of
# wire/test_v03.py do not reach: each 0.3 shape an answer or a push may take, each dialect's parts,
# the defaults of a request built from sparse params, and what is passed on unchanged for
# engine.remote to refuse. Pure: no transport, no agent.


STATUS = {"state": "working"}
REST_MESSAGE = {"messageId": "m-1", "role": "ROLE_AGENT", "content": [{"text": "hi"}]}
RPC_MESSAGE_wire03_translation = {
    "kind": "message",
    "messageId": "m-1",
    "parts": [{"kind": "text", "text": "hi"}],
}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- requests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rest", [False, True])
@pytest.mark.parametrize("operation", ["SendMessage", "SendStreamingMessage"])
def test_both_send_operations_translate_their_message(operation: str, rest: bool) -> None:
    params = {"message": {"messageId": "m", "parts": [{"text": "hi", "mediaType": "text/plain"}]}}
    out = wire03.request(operation, params, rest=rest)
    assert out["message"]["role"] == ("ROLE_USER" if rest else "user")
    parts = out["message"]["content" if rest else "parts"]
    assert parts == ([{"text": "hi"}] if rest else [{"kind": "text", "text": "hi"}])


@pytest.mark.parametrize("rest", [False, True])
def test_a_message_without_parts_is_sent_with_none(rest: bool) -> None:
    out = wire03.request("SendMessage", {"message": {"messageId": "m"}}, rest=rest)
    assert out["message"]["content" if rest else "parts"] == []


@pytest.mark.parametrize(
    ("configuration", "blocking"),
    [({}, True), ({"returnImmediately": False}, True), ({"returnImmediately": True}, False)],
)
def test_a_send_always_says_whether_it_blocks(
    configuration: dict[str, Any], blocking: bool
) -> None:
    params = {"message": {"parts": []}, "configuration": configuration}
    assert wire03.request("SendMessage", params, rest=True)["configuration"] == {
        "blocking": blocking
    }


def test_a_push_config_without_a_task_id_names_the_empty_task() -> None:
    params = {"id": "cfg", "url": "https://hook.test/webhook", "token": "t"}
    rpc = wire03.request("CreateTaskPushNotificationConfig", params, rest=False)
    assert rpc["taskId"] == ""
    rest = wire03.request("CreateTaskPushNotificationConfig", params, rest=True)
    assert rest["parent"] == "tasks/"
    assert rest["config"]["name"] == "tasks//pushNotificationConfigs/cfg"


def test_a_rest_cancel_without_an_id_names_the_empty_task() -> None:
    assert wire03.request("CancelTask", {}, rest=True) == {"name": "tasks/"}


def test_a_part_without_a_media_type_is_plain_text() -> None:
    out = wire03.request("SendMessage", {"message": {"parts": [{"text": "hi"}]}}, rest=False)
    assert out["message"]["parts"] == [{"kind": "text", "text": "hi"}]


@pytest.mark.parametrize("rest", [False, True])
def test_a_part_of_no_kind_it_knows_is_sent_as_it_is(rest: bool) -> None:
    part = {"mystery": "x", "mediaType": "application/pdf"}
    out = wire03.request("SendMessage", {"message": {"parts": [part]}}, rest=rest)
    assert out["message"]["content" if rest else "parts"] == [part]


_RAW = base64.b64encode(b"%PDF\x00\xff").decode()


@pytest.mark.parametrize(
    ("part", "rpc", "rest"),
    [
        (
            {"raw": _RAW, "filename": "a.pdf", "mediaType": "application/pdf"},
            {"kind": "file", "file": {"bytes": _RAW, "mimeType": "application/pdf",
                                      "name": "a.pdf"}},
            {"file": {"fileWithBytes": b64(_RAW), "mimeType": "application/pdf",
                      "name": "a.pdf"}},
        ),
        (
            {"url": "https://files.test/a.png", "filename": "a.png", "mediaType": "image/png"},
            {"kind": "file", "file": {"uri": "https://files.test/a.png", "mimeType": "image/png",
                                      "name": "a.png"}},
            {"file": {"fileWithUri": "https://files.test/a.png", "mimeType": "image/png",
                      "name": "a.png"}},
        ),
        (
            {"url": "https://files.test/b"},
            {"kind": "file", "file": {"uri": "https://files.test/b"}},
            {"file": {"fileWithUri": "https://files.test/b"}},
        ),
        (
            {"data": {"n": [1, 2]}, "mediaType": "application/json"},
            {"kind": "data", "data": {"n": [1, 2]}},
            {"data": {"data": {"n": [1, 2]}}},
        ),
    ],
)  # fmt: skip
def test_each_10_part_is_sent_as_its_03_part_in_either_binding(
    part: dict[str, Any], rpc: dict[str, Any], rest: dict[str, Any]
) -> None:
    params = {"message": {"parts": [part]}}
    assert wire03.request("SendMessage", params, rest=False)["message"]["parts"] == [rpc]
    assert wire03.request("SendMessage", params, rest=True)["message"]["content"] == [rest]


def test_the_rest_file_bytes_read_back_as_the_bytes_sent() -> None:
    part = {"raw": _RAW, "mediaType": "application/pdf"}
    (sent,) = wire03.request("SendMessage", {"message": {"parts": [part]}}, rest=True)["message"][
        "content"
    ]
    echoed = wire03.answer("stream", {"message": {"content": [sent]}}, rest=True)
    assert isinstance(echoed, dict)
    assert echoed["message"]["parts"] == [{"raw": _RAW, "mediaType": "application/pdf"}]


@pytest.mark.parametrize("rest", [False, True])
def test_metadata_and_accepted_output_modes_go_in_either_binding(rest: bool) -> None:
    params = {
        "message": {"parts": [], "metadata": {"skillId": "s", "k": 1}},
        "configuration": {"acceptedOutputModes": ["text/plain", "image/*"]},
    }
    out = wire03.request("SendMessage", params, rest=rest)
    assert out["message"]["metadata"] == {"skillId": "s", "k": 1}
    assert out["configuration"] == {
        "blocking": True,
        "acceptedOutputModes": ["text/plain", "image/*"],
    }


def test_referenced_tasks_go_by_jsonrpc_and_not_in_rest_whose_proto_lacks_them() -> None:
    params = {"message": {"parts": [], "referenceTaskIds": ["r-1", "r-2"]}}
    assert wire03.request("SendMessage", params, rest=False)["message"]["referenceTaskIds"] == [
        "r-1",
        "r-2",
    ]
    assert "referenceTaskIds" not in wire03.request("SendMessage", params, rest=True)["message"]


# --- answers -------------------------------------------------------------------------------------


def test_a_card_is_returned_as_it_is_whatever_its_shape() -> None:
    doc = {"kind": "task", "id": "t", "status": STATUS}
    assert wire03.answer("card", doc, rest=False) is doc


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"kind": "task", "id": "t", "status": STATUS}, "task"),
        ({"kind": "message", "messageId": "m"}, "message"),
        ({"kind": "status-update", "taskId": "t", "status": STATUS}, "statusUpdate"),
        ({"kind": "artifact-update", "taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"taskId": "t", "status": STATUS}, "statusUpdate"),
        ({"taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"id": "t", "status": STATUS}, "task"),
        ({"messageId": "m"}, "message"),
    ],
)
def test_a_json_rpc_stream_event_is_wrapped_by_its_kind_or_else_its_fields(
    doc: dict[str, Any], key: str
) -> None:
    assert wire03.answer("stream", doc, rest=False) == {key: doc}


@pytest.mark.parametrize(
    "doc",
    [
        {"kind": "push", "id": "t", "status": STATUS},  # a kind 0.3 has not: not told by fields
        {"kind": 7, "messageId": "m"},
        {"taskId": "t"},
        {"status": STATUS},
        {"id": "t"},
        {"artifact": {}},
        {"state": "working"},
    ],
)
def test_a_json_rpc_event_of_no_known_shape_is_passed_on_as_it_is(doc: dict[str, Any]) -> None:
    assert wire03.answer("stream", doc, rest=False) == doc


def test_a_json_rpc_event_already_wrapped_is_not_wrapped_again() -> None:
    doc = {"task": {"id": "t", "status": STATUS}, "kind": "message"}
    assert wire03.answer("stream", doc, rest=False) == doc


def test_a_rest_answer_is_never_told_by_its_fields() -> None:
    doc = {"messageId": "m", "content": []}
    assert wire03.answer("send", doc, rest=True) == doc


def test_a_send_answer_translates_its_message() -> None:
    assert wire03.answer("send", RPC_MESSAGE_wire03_translation, rest=False) == {
        "message": {"kind": "message", "messageId": "m-1", "parts": [{"text": "hi"}]}
    }


def test_a_send_answer_holds_a_task_or_a_message_only() -> None:
    """An update in a send answer is left untranslated (engine.remote refuses it)."""
    update = {
        "taskId": "t",
        "status": {"state": "working", "message": RPC_MESSAGE_wire03_translation},
    }
    assert wire03.answer("send", {"statusUpdate": update}, rest=False) == {"statusUpdate": update}
    streamed = wire03.answer("stream", {"statusUpdate": update}, rest=False)
    assert isinstance(streamed, dict)
    assert streamed["statusUpdate"]["status"]["message"]["parts"] == [{"text": "hi"}]


def test_a_rest_stream_translates_a_tasks_status_message_and_artifacts() -> None:
    task = {
        "id": "t",
        "status": {"state": "TASK_STATE_WORKING", "message": REST_MESSAGE},
        "artifacts": [{"artifactId": "a", "parts": [{"data": {"data": {"n": 1}}}]}, "odd"],
    }
    out = wire03.answer("stream", {"task": task}, rest=True)
    assert isinstance(out, dict)
    assert out["task"]["status"]["message"]["parts"] == [{"text": "hi"}]
    assert out["task"]["artifacts"] == [{"artifactId": "a", "parts": [{"data": {"n": 1}}]}, "odd"]


def test_a_rest_stream_translates_a_message() -> None:
    message = {**REST_MESSAGE, "content": [{"text": "hi"}, {"data": {"data": {"n": 1}}}]}
    out = wire03.answer("stream", {"message": message}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"text": "hi"}, {"data": {"n": 1}}]
    assert "content" not in out["message"]


def test_a_rest_message_with_parts_keeps_them_over_its_content() -> None:
    message = {**REST_MESSAGE, "parts": [{"text": "kept"}]}
    out = wire03.answer("stream", {"message": message}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"text": "kept"}]
    assert out["message"]["content"] == REST_MESSAGE["content"]


@pytest.mark.parametrize("rest", [False, True])
def test_an_artifact_update_translates_its_artifacts_parts(rest: bool) -> None:
    part = {"data": {"data": {"n": 1}}} if rest else {"kind": "data", "data": {"n": 1}}
    update = {"taskId": "t", "artifact": {"artifactId": "a", "parts": [part, "odd"]}}
    out = wire03.answer("stream", {"artifactUpdate": update}, rest=rest)
    assert out == {
        "artifactUpdate": {
            "taskId": "t",
            "artifact": {"artifactId": "a", "parts": [{"data": {"n": 1}}, "odd"]},
        }
    }


def test_an_artifact_update_without_an_artifact_is_passed_on() -> None:
    update = {"taskId": "t", "artifact": "odd"}
    assert wire03.answer("stream", {"artifactUpdate": update}, rest=False) == {
        "artifactUpdate": update
    }


# --- parts in -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "rest", "expected"),
    [
        ({"kind": "text", "text": "hi"}, False, {"text": "hi"}),
        ({"text": "hi"}, True, {"text": "hi"}),
        # a part's kind decides over its fields
        ({"kind": "data", "text": "hi", "data": {"n": 1}}, False, {"data": {"n": 1}}),
        ({"kind": "text", "data": {"n": 1}}, False, {"kind": "text", "data": {"n": 1}}),
        (
            {"kind": "file", "text": "hi", "file": {"uri": "u"}},
            False,
            {"url": "u"},
        ),
        (
            {"kind": "data", "file": {"uri": "u"}},
            False,
            {"kind": "data", "file": {"uri": "u"}},
        ),
        ({"kind": "file", "data": {"n": 1}}, False, {"kind": "file", "data": {"n": 1}}),
        # files: each dialect's fields, media type and name
        (
            {"kind": "file", "file": {"uri": "u", "mimeType": "image/png", "name": "a.png"}},
            False,
            {"url": "u", "mediaType": "image/png", "filename": "a.png"},
        ),
        ({"file": {"fileWithUri": "u"}}, True, {"url": "u"}),
        ({"kind": "file", "file": {"bytes": "aGk="}}, False, {"raw": "aGk="}),
        ({"file": {"fileWithBytes": b64("aGk=")}}, True, {"raw": "aGk="}),
        ({"file": {"name": "a"}}, True, {"file": {"name": "a"}}),
        # data: 0.3 proto JSON nests it once more; JSON-RPC does not
        ({"data": {"data": {"n": 1}}}, True, {"data": {"n": 1}}),
        ({"data": {}}, True, {"data": {}}),
        ({"kind": "data", "data": {"data": {"n": 1}}}, False, {"data": {"data": {"n": 1}}}),
        ({"data": {"data": 1, "more": 2}}, True, {"data": {"data": 1, "more": 2}}),
        ({"kind": "video"}, False, {"kind": "video"}),
    ],
)
def test_each_03_part_reads_as_its_10_part(
    part: dict[str, Any], rest: bool, expected: dict[str, Any]
) -> None:
    message = {"messageId": "m", ("content" if rest else "parts"): [part]}
    out = wire03.answer("stream", {"message": message}, rest=rest)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [expected]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b64("aGk="), "aGk="),  # base64 of base64: decoded once
        (b64("aGk=") + "!", b64("aGk=") + "!"),  # not base64: kept as received
        (b64("abcd!"), b64("abcd!")),  # decodes to text that is not base64: kept
        (base64.b64encode(b"\xff\xfe").decode(), base64.b64encode(b"\xff\xfe").decode()),
        (7, 7),
    ],
)
def test_rest_file_bytes_are_decoded_once_only_when_that_leaves_base64(
    value: object, expected: object
) -> None:
    part = {"file": {"fileWithBytes": value}}
    out = wire03.answer("stream", {"message": {"content": [part]}}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"raw": expected}]


# --- push configs in -----------------------------------------------------------------------------


def test_a_push_config_read_back_takes_its_first_scheme() -> None:
    doc = {
        "taskId": "t",
        "pushNotificationConfig": {
            "id": "cfg",
            "authentication": {"schemes": ["Bearer", "Basic"], "credentials": "c"},
        },
    }
    assert wire03.answer("push_config", doc, rest=False) == {
        "id": "cfg",
        "authentication": {"scheme": "Bearer", "credentials": "c"},
    }


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ({"schemes": []}, {}),
        ({"schemes": "Bearer"}, {}),
        ({"scheme": "Bearer", "schemes": ["Basic"]}, {"scheme": "Bearer", "schemes": ["Basic"]}),
    ],
)
def test_a_push_configs_authentication_is_flattened_only_from_a_list(
    auth: dict[str, Any], expected: dict[str, Any]
) -> None:
    doc = {
        "name": "tasks/t/pushNotificationConfigs/c",
        "pushNotificationConfig": {"authentication": auth},
    }
    assert wire03.answer("push_config", doc, rest=True) == {"authentication": expected}


# --- pushes --------------------------------------------------------------------------------------


def test_a_03_push_tagged_task_is_a_task_even_without_a_status() -> None:
    assert wire03.push_body({"kind": "task", "id": "t"}) == {"task": {"kind": "task", "id": "t"}}


@pytest.mark.parametrize("tag", [{"kind": "task"}, {}])
def test_a_03_push_is_read_in_the_json_rpc_dialect(tag: dict[str, str]) -> None:
    task = {**tag, "id": "t", "status": {"state": "working", "message": REST_MESSAGE}}
    out = wire03.push_body(task)
    assert isinstance(out, dict)
    assert out["task"]["status"]["message"] == REST_MESSAGE  # no proto ``content`` in a push


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"kind": "status-update", "taskId": "t", "id": "x", "status": STATUS}, "statusUpdate"),
        ({"kind": "artifact-update", "taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"kind": "message", "messageId": "m"}, "message"),
    ],
)
def test_a_03_push_of_another_kind_is_wrapped_by_it(doc: dict[str, Any], key: str) -> None:
    assert wire03.push_body(doc) == {key: doc}


def test_a_03_push_update_is_read_in_the_json_rpc_dialect() -> None:
    update = {
        "kind": "status-update",
        "taskId": "t",
        "status": {"state": "working", "message": REST_MESSAGE},
    }
    out = wire03.push_body(update)
    assert isinstance(out, dict)
    assert out["statusUpdate"]["status"]["message"] == REST_MESSAGE


@pytest.mark.parametrize(
    "doc",
    [{"status": STATUS}, {"id": "t"}, {"messageId": "m"}, {"foo": 1}, {"kind": 7, "id": "t"}],
)
def test_a_push_without_a_kind_or_a_tasks_fields_is_passed_on_as_it_is(
    doc: dict[str, Any],
) -> None:
    assert wire03.push_body(doc) == doc


# --- REST errors ---------------------------------------------------------------------------------


def test_a_rest_error_body_that_is_not_an_object_is_no_a2a_error() -> None:
    assert wire03.rest_error(409, ["task not cancelable"], "CancelTask") is None


def test_a_body_with_a_json_rpc_error_is_no_rest_error() -> None:
    doc = {"error": {"code": -32001}, "message": "task not found"}
    assert wire03.rest_error(404, doc, "GetTask") is None


def test_a_rest_errors_message_is_cut_to_200_characters() -> None:
    found = wire03.rest_error(409, {"message": "x" * 300}, "CancelTask")
    assert found == (-32002, "x" * 200)
