"""The a2a-sdk 0.3.26 agent (`support.Peer03`) speaks A2A 0.3 as its official SDK does: plain
httpx against the subprocess, no cardfence engine. What these tests observed, for whoever teaches
cardfence's transport the 0.3 wire (``${task}`` below is a task id):

Card (GET /.well-known/agent-card.json, also /.well-known/agent.json; no ETag, no Cache-Control):
``{"protocolVersion": "0.3.0", "url": JSONRPC_URL, "preferredTransport": "JSONRPC",
"additionalInterfaces": [{"url": ..., "transport": "JSONRPC"}, {"url": REST_URL, "transport":
"HTTP+JSON"}], "capabilities": {"streaming": true, "pushNotifications": true},
"defaultInputModes": ["text/plain"], "skills": [{"id", "name", "description", "tags",
"examples", "inputModes", "outputModes"}]}``; skill ``ask`` declares the bare mode ``"text"``.

JSON-RPC 2.0, one POST URL (the card's ``url``); no header is needed (any or no Content-Type).
Methods: ``message/send``, ``message/stream``, ``tasks/get``, ``tasks/cancel``,
``tasks/resubscribe``, ``tasks/pushNotificationConfig/{set,get,list,delete}``,
``agent/getAuthenticatedExtendedCard``; anything else (``tasks/list``, v1.0 ``SendMessage``) is
``-32601 "Method not found"``. A message: ``{"kind": "message", "messageId", "role": "user",
"parts": [{"kind": "text", "text"}], "metadata": {...}, "taskId"?, "contextId"?}``
(messageId and role are required: else -32602 with pydantic details in ``error.data``).
``message/send`` blocks by default (``configuration.blocking: false`` returns the task at its first
event, "submitted"); it stops blocking at input-required / auth-required too. Its ``result`` is the
Task itself, with ``kind``::

    {"kind": "task", "id": "ceae...", "contextId": "c661...",
     "status": {"state": "completed", "timestamp": "2026-12-01T05:16:51.931841+00:00"},
     "artifacts": [{"artifactId": "bc9d...", "name": "echo",
                    "parts": [{"kind": "text", "text": "hi"}]}],
     "history": [{"kind": "message", "messageId": "m1", "role": "user", "taskId": "ceae...",
                  "contextId": "c661...", "parts": [...], "metadata": {"skillId": "echo"}}]}

States (lower-case, hyphenated): submitted, working, input-required, auth-required, completed,
canceled (one l), failed, rejected (and unknown). A status message sits in
``status.message`` (``role: "agent"``). ``tasks/get`` ``{"id"}`` and ``tasks/cancel`` ``{"id"}``
return the same Task shape. A reply continues a task: a message with ``taskId`` and ``contextId``.
Errors (HTTP 200, JSON-RPC error object): unknown task -32001 "Task not found" (a message naming an
unknown ``taskId``: -32001 "Task X was specified but does not exist"); cancelling a finished task
-32002 "Task cannot be canceled - current state: TaskState.completed"; a message to a finished
task -32602 "Task X is in terminal state: completed"; bad JSON -32700 (``id`` absent).

Streaming (``message/stream``, ``tasks/resubscribe`` ``{"id"}``): HTTP 200
``text/event-stream``, one ``data: {"jsonrpc": "2.0", "id": <request id>, "result": EVENT}`` per
event, events separated by CRLF CRLF. EVENT is a Task (``kind: "task"``, first), a
``{"kind": "status-update", "taskId", "contextId", "status": {...}, "final": bool}`` or a
``{"kind": "artifact-update", "taskId", "contextId", "artifact": {...}}``; the stream ends after
``final: true`` (the agent sets it on input-required / auth-required as 0.3 agents do). Errors come
in the stream, still HTTP 200: ``data: {"error": {"code": -32001, ...}, "id", "jsonrpc"}``;
resubscribing to a finished task is -32602 "Task X is in terminal state: completed".
Resubscribing carries only events after the call (no Task snapshot first).

Push (``tasks/pushNotificationConfig/set`` ``{"taskId", "pushNotificationConfig": {"url",
"token"?, "id"?}}`` -> ``{"taskId", "pushNotificationConfig": {"id", "url", "token"}}``; ``id``
defaults to the task id; ``get``/``delete`` take ``{"id": task, "pushNotificationConfigId"?}``,
``list`` ``{"id"}`` returns a list; ``delete`` answers ``"result": null``, i.e. no ``result``
member at all). Each delivery is a POST of the whole Task JSON (``kind: "task"``, with history
and artifacts), header ``X-A2A-Notification-Token: <token>`` when a token was set, sent after each
event the agent handles (so one push may show "working" after an artifact), e.g.::

    {"kind": "task", "id": "71c5...", "contextId": "94b5...",
     "status": {"state": "completed", "timestamp": "2026-12-01T05:17:06.003935+00:00"},
     "artifacts": [{"artifactId": "ff32...", "name": "slow",
                    "parts": [{"kind": "text", "text": "slept 1s"}]}],
     "history": [...]}

There is no status-update-shaped push body in 0.3: a "status-update" exists only in streams.

HTTP+JSON (the card's HTTP+JSON interface url as prefix; bodies are protobuf JSON of the 0.3
``a2a.v1`` proto, not the JSON-RPC shapes): ``POST /v1/message:send``, ``POST
/v1/message:stream``, ``GET /v1/tasks/${task}`` (``?historyLength=N``), ``POST
/v1/tasks/${task}:cancel``, ``GET /v1/tasks/${task}:subscribe`` (GET, not POST), ``POST|GET
/v1/tasks/${task}/pushNotificationConfigs``, ``GET /v1/tasks/${task}/pushNotificationConfigs/ID``.
Send body ``{"message": {"messageId", "role": "ROLE_USER", "content": [{"text": "echo hi"}],
"metadata"?, "taskId"?, "contextId"?}, "configuration": {"blocking": true}}`` -- note ``content``
(not ``parts``), no ``kind``, enum roles, and *non-blocking by default* (the proto bool defaults to
false: without ``blocking: true`` the answer is the task at "TASK_STATE_SUBMITTED"). Answer
``{"task": {"id", "contextId", "status": {"state": "TASK_STATE_COMPLETED", "message"?},
"artifacts": [{"artifactId", "name", "parts": [{"text": "hi"}]}], "history": [...]}}`` (or
``{"message": ...}``); ``GET /v1/tasks/ID`` and ``:cancel`` answer the bare task object. States:
TASK_STATE_SUBMITTED, _WORKING, _INPUT_REQUIRED, _AUTH_REQUIRED, _COMPLETED, _CANCELLED (two l),
_FAILED, _REJECTED. Timestamps are dropped on this binding. Errors are ``{"message": "..."}`` with
an HTTP status: unknown task 404, not cancelable 409, unknown path 404 ``{"detail": "Not
Found"}``; the push config list and ``GET /v1/tasks`` answer 500 (not implemented in 0.3.26).
Stream events are SSE whose ``data:`` lines hold *pretty-printed multi-line* JSON (join the lines
with newlines), each ``{"task"|"message"|"statusUpdate"|"artifactUpdate": {...}}``, status updates
with ``"final": true`` at the end. Push config set body: ``{"config": {"pushNotificationConfig":
{"url", "token"?}}}`` -> ``{"name": "tasks/ID/pushNotificationConfigs/", "pushNotificationConfig":
{...}}`` (0.3.26 drops ``configId`` here).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import Peer03

from cardfence.engine.demo.receiver import WebhookReceiver

TERMINAL = {"completed", "canceled", "failed", "rejected"}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15.0) as client:
        yield client


# -- helpers: the 0.3 wire ------------------------------------------------------------------------


def message(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "message",
        "messageId": uuid.uuid4().hex,
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
        **extra,
    }


def rpc(http: httpx.Client, peer: Peer03, method: str, params: dict[str, Any]) -> dict[str, Any]:
    request_id = uuid.uuid4().hex
    response = http.post(
        peer.jsonrpc_url,
        json={"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["jsonrpc"] == "2.0"
    assert body.get("id") == request_id
    return body


def result(http: httpx.Client, peer: Peer03, method: str, params: dict[str, Any]) -> Any:
    body = rpc(http, peer, method, params)
    assert "error" not in body, (body, peer.stderr_text())
    return body["result"]


def error(http: httpx.Client, peer: Peer03, method: str, params: dict[str, Any]) -> Any:
    body = rpc(http, peer, method, params)
    assert "result" not in body, body
    return body["error"]


def sse_events(response: httpx.Response) -> Iterator[Any]:
    """The JSON of each SSE event; multi-line ``data:`` fields are joined with newlines."""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))


def rest_message(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "content": [{"text": text}],
        **extra,
    }


def wait_for(predicate: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# -- the card -------------------------------------------------------------------------------------


def test_the_card_is_a_0_3_card_on_both_well_known_paths(
    peer03: Peer03, http: httpx.Client
) -> None:
    response = http.get(peer03.card_url)
    card = response.json()

    assert response.status_code == 200
    assert "etag" not in response.headers  # a2a-sdk 0.3 sends no validator
    assert card["protocolVersion"] == "0.3.0"
    assert card["url"] == peer03.jsonrpc_url
    assert card["preferredTransport"] == "JSONRPC"
    assert {"url": peer03.rest_url, "transport": "HTTP+JSON"} in card["additionalInterfaces"]
    assert {"url": peer03.jsonrpc_url, "transport": "JSONRPC"} in card["additionalInterfaces"]
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
    skills = {s["id"]: s for s in card["skills"]}
    assert list(skills) == ["echo", "ask", "authorize", "slow", "fail", "write"]
    assert skills["ask"]["inputModes"] == ["text"]  # a bare 0.3 word mode
    assert skills["echo"]["inputModes"] == ["text/plain"]
    assert "supportedInterfaces" not in card  # nothing of v1.0
    assert http.get(peer03.legacy_card_url).json() == card
    assert peer03.card_requests == 2
    assert [hit.path for hit in peer03.card_log] == [
        "/.well-known/agent-card.json",
        "/.well-known/agent.json",
    ]


def test_card_mutation_and_card_faults(peer03: Peer03, http: httpx.Client) -> None:
    peer03.mutate_card(lambda card: card.update(skills=card["skills"][:4]))  # fail dropped
    peer03.mutate_card(lambda card: card["capabilities"].update(pushNotifications=False))

    served = http.get(peer03.card_url).json()
    assert [s["id"] for s in served["skills"]] == ["echo", "ask", "authorize", "slow"]
    assert served["capabilities"]["pushNotifications"] is False
    assert peer03.skills()[-1][0] == "slow"
    # The handler keeps the card it was built with: fail still runs (incident 001's agent).
    task = result(http, peer03, "message/send", {"message": message("fail")})
    assert task["status"]["state"] == "failed"

    peer03.set_card_fault("503")
    unavailable = http.get(peer03.card_url)
    assert unavailable.status_code == 503
    assert unavailable.headers["retry-after"] == "1"
    peer03.set_card_fault("404")
    assert http.get(peer03.card_url).status_code == 404
    peer03.set_card_fault("invalid_json")
    assert http.get(peer03.card_url).content.startswith(b'{"name": "cardfence-peer03", "skills": [')
    with pytest.raises(json.JSONDecodeError):
        http.get(peer03.card_url).json()
    peer03.set_card_fault("huge")
    with http.stream("GET", peer03.card_url) as huge:
        assert "content-length" not in huge.headers  # chunked: the reader must cut it off
        assert sum(len(chunk) for chunk in huge.iter_bytes()) == 5 * 1024 * 1024
    peer03.set_card_fault("hang")
    with pytest.raises(httpx.ReadTimeout):
        http.get(peer03.card_url, timeout=0.3)
    with pytest.raises(ValueError, match="unknown card fault"):
        peer03.set_card_fault("teapot")
    peer03.reset()
    assert http.get(peer03.card_url).status_code == 200


# -- JSON-RPC -------------------------------------------------------------------------------------


def test_jsonrpc_echo_completes_with_an_artifact_and_tasks_get_reads_it(
    peer03: Peer03, http: httpx.Client
) -> None:
    sent = message("echo hi", metadata={"skillId": "echo"})

    task = result(http, peer03, "message/send", {"message": sent})

    assert task["kind"] == "task"
    assert task["status"]["state"] == "completed"
    assert task["status"]["timestamp"]
    assert task["artifacts"][0]["name"] == "echo"
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "hi"}]
    assert task["history"][0]["messageId"] == sent["messageId"]
    assert task["history"][0]["kind"] == "message"
    read = result(http, peer03, "tasks/get", {"id": task["id"]})
    assert read["kind"] == "task"
    assert read["id"] == task["id"]
    assert read["contextId"] == task["contextId"]
    assert read["status"]["state"] == "completed"
    assert read["artifacts"] == task["artifacts"]


def test_jsonrpc_errors(peer03: Peer03, http: httpx.Client) -> None:
    done = result(http, peer03, "message/send", {"message": message("echo x")})

    assert error(http, peer03, "tasks/get", {"id": "no-such-task"})["code"] == -32001
    not_cancelable = error(http, peer03, "tasks/cancel", {"id": done["id"]})
    assert not_cancelable["code"] == -32002
    assert "completed" in not_cancelable["message"]
    assert error(http, peer03, "SendMessage", {"message": message("echo")})["code"] == -32601
    assert error(http, peer03, "tasks/list", {})["code"] == -32601
    to_finished = message("again", taskId=done["id"], contextId=done["contextId"])
    assert error(http, peer03, "message/send", {"message": to_finished})["code"] == -32602
    unknown_task = message("again", taskId="no-such-task")
    assert error(http, peer03, "message/send", {"message": unknown_task})["code"] == -32001
    invalid = error(http, peer03, "message/send", {"message": {"parts": []}})
    assert invalid["code"] == -32602
    assert {tuple(d["loc"])[-1] for d in invalid["data"]} == {"messageId", "role"}


@pytest.mark.parametrize(
    ("script", "state"), [("ask", "input-required"), ("authorize", "auth-required")]
)
def test_jsonrpc_ask_and_authorize_pause_and_a_reply_completes(
    peer03: Peer03, http: httpx.Client, script: str, state: str
) -> None:
    task = result(
        http, peer03, "message/send", {"message": message(script, metadata={"skillId": script})}
    )

    assert task["status"]["state"] == state
    assert task["status"]["message"]["role"] == "agent"
    assert task["status"]["message"]["kind"] == "message"
    reply = message("42", taskId=task["id"], contextId=task["contextId"])
    done = result(http, peer03, "message/send", {"message": reply})
    assert done["id"] == task["id"]
    assert done["status"]["state"] == "completed"
    assert done["artifacts"][-1]["parts"] == [{"kind": "text", "text": "answer: 42"}]


def test_jsonrpc_slow_is_canceled(peer03: Peer03, http: httpx.Client) -> None:
    params = {"message": message("slow 30"), "configuration": {"blocking": False}}
    task = result(http, peer03, "message/send", params)
    assert task["status"]["state"] in ("submitted", "working")

    canceled = result(http, peer03, "tasks/cancel", {"id": task["id"]})

    assert canceled["kind"] == "task"
    assert canceled["status"]["state"] == "canceled"
    assert result(http, peer03, "tasks/get", {"id": task["id"]})["status"]["state"] == "canceled"


@pytest.mark.parametrize(
    ("text", "state", "diagnostic"),
    [
        ("fail", "failed", None),
        ("fail-diag boom", "failed", "scripted failure: boom"),
        ("reject", "rejected", "scripted rejection: reject"),
        ("hello there", "completed", None),  # no script named: echo
    ],
)
def test_jsonrpc_scripted_endings(
    peer03: Peer03, http: httpx.Client, text: str, state: str, diagnostic: str | None
) -> None:
    task = result(http, peer03, "message/send", {"message": message(text)})

    assert task["status"]["state"] == state
    said = task["status"].get("message")
    if diagnostic is None:
        assert said is None
    else:
        assert said["parts"] == [{"kind": "text", "text": diagnostic}]


def test_a_skill_id_naming_no_script_fails_the_task(peer03: Peer03, http: httpx.Client) -> None:
    sent = message("echo hi", metadata={"skillId": "translate"})

    task = result(http, peer03, "message/send", {"message": sent})

    assert task["status"]["state"] == "failed"


# -- streaming ------------------------------------------------------------------------------------


def test_message_stream_yields_events_ending_at_a_final_state(
    peer03: Peer03, http: httpx.Client
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": "s1",
        "method": "message/stream",
        "params": {"message": message("echo streamed")},
    }
    with http.stream("POST", peer03.jsonrpc_url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response))

    assert all(e["jsonrpc"] == "2.0" and e["id"] == "s1" for e in events)
    kinds = [e["result"]["kind"] for e in events]
    assert kinds == ["task", "artifact-update", "status-update"]
    first, artifact, last = (e["result"] for e in events)
    assert first["status"]["state"] == "submitted"
    assert artifact["artifact"]["parts"] == [{"kind": "text", "text": "streamed"}]
    assert artifact["taskId"] == first["id"]
    assert last["final"] is True
    assert last["status"]["state"] == "completed"


def test_message_stream_of_ask_ends_final_at_input_required(
    peer03: Peer03, http: httpx.Client
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "message/stream",
        "params": {"message": message("ask")},
    }
    with http.stream("POST", peer03.jsonrpc_url, json=body) as response:
        events = [e["result"] for e in sse_events(response)]

    assert [e["kind"] for e in events] == ["task", "status-update", "status-update"]
    assert [e["status"]["state"] for e in events] == ["submitted", "working", "input-required"]
    assert [e.get("final") for e in events[1:]] == [False, True]


def test_tasks_resubscribe_follows_a_live_task_to_its_end(
    peer03: Peer03, http: httpx.Client
) -> None:
    params = {"message": message("slow 1"), "configuration": {"blocking": False}}
    task = result(http, peer03, "message/send", params)
    body = {"jsonrpc": "2.0", "id": 8, "method": "tasks/resubscribe", "params": {"id": task["id"]}}

    with http.stream("POST", peer03.jsonrpc_url, json=body) as response:
        events = [e["result"] for e in sse_events(response)]

    assert [e["kind"] for e in events][-1] == "status-update"
    assert events[-1]["final"] is True
    assert events[-1]["status"]["state"] == "completed"
    assert "artifact-update" in [e["kind"] for e in events]
    with http.stream("POST", peer03.jsonrpc_url, json=body) as response:
        again = list(sse_events(response))
    assert response.status_code == 200
    assert again[0]["error"]["code"] == -32602  # terminal now: an error inside the stream


# -- HTTP+JSON ------------------------------------------------------------------------------------


def test_rest_send_get_and_its_protobuf_json(peer03: Peer03, http: httpx.Client) -> None:
    sent = {
        "message": rest_message("echo hi", metadata={"skillId": "echo"}),
        "configuration": {"blocking": True},
    }
    response = http.post(f"{peer03.rest_url}/v1/message:send", json=sent)

    assert response.status_code == 200
    task = response.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == [{"text": "hi"}]
    assert task["history"][0]["role"] == "ROLE_USER"
    assert "kind" not in task
    read = http.get(f"{peer03.rest_url}/v1/tasks/{task['id']}")
    assert read.status_code == 200
    assert read.json()["id"] == task["id"]
    assert read.json()["status"]["state"] == "TASK_STATE_COMPLETED"
    missing = http.get(f"{peer03.rest_url}/v1/tasks/no-such-task")
    assert missing.status_code == 404
    assert missing.json() == {"message": "Task not found"}


def test_rest_send_is_non_blocking_by_default_and_ask_takes_a_reply(
    peer03: Peer03, http: httpx.Client
) -> None:
    first = http.post(f"{peer03.rest_url}/v1/message:send", json={"message": rest_message("ask")})
    task = first.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"  # the proto's blocking=false
    url = f"{peer03.rest_url}/v1/tasks/{task['id']}"
    assert wait_for(lambda: http.get(url).json()["status"]["state"] != "TASK_STATE_SUBMITTED")
    paused = http.get(url).json()
    assert paused["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert paused["status"]["message"]["role"] == "ROLE_AGENT"

    reply = rest_message("42", taskId=task["id"], contextId=task["contextId"])
    done = http.post(
        f"{peer03.rest_url}/v1/message:send",
        json={"message": reply, "configuration": {"blocking": True}},
    ).json()["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][-1]["parts"] == [{"text": "answer: 42"}]


def test_rest_cancel_and_not_cancelable(peer03: Peer03, http: httpx.Client) -> None:
    task = http.post(
        f"{peer03.rest_url}/v1/message:send", json={"message": rest_message("slow 30")}
    ).json()["task"]

    canceled = http.post(f"{peer03.rest_url}/v1/tasks/{task['id']}:cancel")

    assert canceled.status_code == 200
    assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELLED"
    again = http.post(f"{peer03.rest_url}/v1/tasks/{task['id']}:cancel")
    assert again.status_code == 409
    assert "cannot be canceled" in again.json()["message"]


def test_rest_stream_sends_multi_line_protobuf_json_events(
    peer03: Peer03, http: httpx.Client
) -> None:
    sent = {"message": rest_message("echo streamed")}
    with http.stream("POST", f"{peer03.rest_url}/v1/message:stream", json=sent) as response:
        assert response.status_code == 200
        events = list(sse_events(response))

    assert [next(iter(e)) for e in events] == ["task", "artifactUpdate", "statusUpdate"]
    assert events[1]["artifactUpdate"]["artifact"]["parts"] == [{"text": "streamed"}]
    assert events[-1]["statusUpdate"]["final"] is True
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


# -- push notifications ---------------------------------------------------------------------------


def test_a_registered_webhook_receives_the_whole_task_with_its_token(
    peer03: Peer03, http: httpx.Client
) -> None:
    with WebhookReceiver() as hook:
        peer03.hold()
        params = {"message": message("slow 0"), "configuration": {"blocking": False}}
        task = result(http, peer03, "message/send", params)
        config = {"url": hook.url, "token": "tok-1"}
        registered = result(
            http,
            peer03,
            "tasks/pushNotificationConfig/set",
            {"taskId": task["id"], "pushNotificationConfig": config},
        )
        assert registered["taskId"] == task["id"]
        assert registered["pushNotificationConfig"] == {**config, "id": task["id"]}
        listed = result(http, peer03, "tasks/pushNotificationConfig/list", {"id": task["id"]})
        assert listed == [registered]
        peer03.release()

        def completed_pushes() -> list[tuple[dict[str, Any], dict[str, str]]]:
            pushes = [(json.loads(body), headers) for body, headers in hook.deliveries]
            return [(b, h) for b, h in pushes if b["status"]["state"] == "completed"]

        assert wait_for(lambda: bool(completed_pushes()))
        body, headers = completed_pushes()[0]

    assert headers["x-a2a-notification-token"] == "tok-1"
    assert headers["content-type"] == "application/json"
    assert body["kind"] == "task"
    assert body["id"] == task["id"]
    assert body["contextId"] == task["contextId"]
    assert body["artifacts"][0]["parts"] == [{"kind": "text", "text": "slept 0s"}]


def test_dropped_pushes_are_accepted_but_never_delivered(
    peer03: Peer03, http: httpx.Client
) -> None:
    peer03.set_push_dropped(True)
    assert peer03.push_dropped
    with WebhookReceiver() as hook:
        config = {"url": hook.url}
        params = {
            "message": message("echo quiet"),
            "configuration": {"pushNotificationConfig": config},
        }
        task = result(http, peer03, "message/send", params)
        assert task["status"]["state"] == "completed"
        assert wait_for(lambda: peer03.pushes_dropped > 0)
        time.sleep(0.2)
        assert hook.deliveries == []


# -- the test control surface ---------------------------------------------------------------------


def test_the_call_log_names_each_call_in_both_vocabularies(
    peer03: Peer03, http: httpx.Client
) -> None:
    task = result(http, peer03, "message/send", {"message": message("echo")})
    http.get(f"{peer03.rest_url}/v1/tasks/{task['id']}")
    rpc(http, peer03, "SendMessage", {})
    http.get(peer03.card_url)  # card reads are not A2A calls

    assert peer03.calls == [
        ("JSONRPC", "SendMessage"),
        ("REST", "GetTask"),
        ("JSONRPC", "unknown:SendMessage"),
    ]
    assert peer03.wire_calls == [
        ("JSONRPC", "message/send"),
        ("REST", f"GET /v1/tasks/{task['id']}"),
        ("JSONRPC", "SendMessage"),
    ]
    peer03.reset()
    assert peer03.calls == []


def test_a_gone_endpoint_answers_a_bare_404_and_is_still_logged(
    peer03: Peer03, http: httpx.Client
) -> None:
    peer03.set_endpoint_gone(True, "JSONRPC")
    assert peer03.gone_bindings == {"JSONRPC"}

    gone = http.post(peer03.jsonrpc_url, json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get"})
    assert gone.status_code == 404
    assert gone.text == "Not Found"
    assert http.get(f"{peer03.rest_url}/v1/tasks/x").json() == {"message": "Task not found"}
    assert http.get(peer03.card_url).status_code == 200

    peer03.set_endpoint_gone(True)
    assert http.get(f"{peer03.rest_url}/v1/tasks/x").status_code == 404
    assert peer03.calls == [("JSONRPC", "GetTask"), ("REST", "GetTask"), ("REST", "GetTask")]
    peer03.set_endpoint_gone(False)
    assert not peer03.endpoint_gone
    assert error(http, peer03, "tasks/get", {"id": "x"})["code"] == -32001


def test_held_slow_tasks_wait_for_release(peer03: Peer03, http: httpx.Client) -> None:
    peer03.hold()
    assert peer03.held
    params = {"message": message("slow 0"), "configuration": {"blocking": False}}
    task = result(http, peer03, "message/send", params)
    time.sleep(0.3)
    assert result(http, peer03, "tasks/get", {"id": task["id"]})["status"]["state"] == "working"

    peer03.release()

    assert wait_for(
        lambda: (
            result(http, peer03, "tasks/get", {"id": task["id"]})["status"]["state"] == "completed"
        )
    )
