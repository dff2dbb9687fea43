"""The test peer is a real a2a-sdk 1.3 agent: proved here with plain httpx, no A2A client."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from a2a.types import Message, Part
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support import Peer, ServerThread, card_etag, select_script
from support.peer import HUGE_CARD_BYTES, LEGACY_CARD_PATH, MOVED_CARD_PATH

V1 = {"A2A-Version": "1.0"}


# -- fixtures and helpers ------------------------------------------------------------------


class Receiver:
    """A tiny webhook receiver: records every POST to /hook."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.server = ServerThread(Starlette(routes=[Route("/hook", self._hook, methods=["POST"])]))
        self.url = self.server.base_url + "/hook"

    async def _hook(self, request: Request) -> Response:
        body = json.loads(await request.body())
        with self._lock:
            self.deliveries.append((dict(request.headers), body))
        return Response(status_code=204)

    def for_task(self, task_id: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
        with self._lock:
            return [(h, b) for h, b in self.deliveries if _task_id_of(b) == task_id]


def _task_id_of(body: dict[str, Any]) -> str | None:
    if "task" in body:
        return str(body["task"]["id"])
    for key in ("statusUpdate", "artifactUpdate"):
        if key in body:
            return str(body[key]["taskId"])
    return None


@pytest.fixture(scope="module")
def module_peer() -> Iterator[Peer]:
    with Peer() as peer:
        yield peer


@pytest.fixture
def peer(module_peer: Peer) -> Iterator[Peer]:
    original = json.loads(json.dumps(module_peer.card))
    module_peer.reset()
    yield module_peer
    module_peer.reset()
    module_peer.card = original


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.server.start()
    yield receiver
    receiver.server.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as client:
        yield client


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def message(text: str, **extra: Any) -> dict[str, Any]:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def rpc(
    client: httpx.Client,
    peer: Peer,
    method: str,
    params: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
    response = client.post(peer.jsonrpc_url, json=body, headers=V1 if headers is None else headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["id"] == body["id"]
    return answer


def send(
    client: httpx.Client, peer: Peer, text: str, *, immediately: bool = False, **extra: Any
) -> dict[str, Any]:
    params: dict[str, Any] = {"message": message(text, **extra)}
    if immediately:
        params["configuration"] = {"returnImmediately": True}
    answer = rpc(client, peer, "SendMessage", params)
    task: dict[str, Any] = answer["result"]["task"]
    return task


def get_task(client: httpx.Client, peer: Peer, task_id: str) -> dict[str, Any]:
    task: dict[str, Any] = rpc(client, peer, "GetTask", {"id": task_id})["result"]
    return task


def state_becomes(client: httpx.Client, peer: Peer, task_id: str, state: str) -> bool:
    return bool(wait_for(lambda: get_task(client, peer, task_id)["status"]["state"] == state))


# -- the card ------------------------------------------------------------------------------


def test_card_has_the_v1_shape_a2a_sdk_publishes(peer: Peer, client: httpx.Client) -> None:
    card = client.get(peer.card_url).json()
    assert [(i["protocolBinding"], i["protocolVersion"]) for i in card["supportedInterfaces"]] == [
        ("JSONRPC", "1.0"),
        ("HTTP+JSON", "1.0"),
    ]
    assert card["supportedInterfaces"][0]["url"] == peer.jsonrpc_url
    assert card["supportedInterfaces"][1]["url"] == peer.rest_url
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
    assert card["defaultInputModes"] == card["defaultOutputModes"] == ["text/plain"]
    skills = ["echo", "ask", "authorize", "slow", "fail", "write"]
    assert [s["id"] for s in card["skills"]] == skills
    assert all(s["inputModes"] == s["outputModes"] == ["text/plain"] for s in card["skills"])
    assert "securitySchemes" not in card
    assert "url" not in card  # no 0.3 compatibility fields
    assert card == peer.card


def test_card_revalidates_with_weak_etag_and_304(peer: Peer, client: httpx.Client) -> None:
    first = client.get(peer.card_url)
    etag = first.headers["etag"]
    assert etag.startswith('W/"')
    assert etag == card_etag(first.json()) == peer.card_etag
    assert first.headers["cache-control"] == "max-age=60"

    again = client.get(peer.card_url, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == etag
    assert again.headers["cache-control"] == "max-age=60"
    assert peer.card_requests == 2
    assert [hit.if_none_match for hit in peer.card_log] == [None, etag]


def test_mutated_card_is_served_with_a_new_etag(peer: Peer, client: httpx.Client) -> None:
    etag = client.get(peer.card_url).headers["etag"]

    def withdraw_push(card: dict[str, Any]) -> None:
        card["capabilities"]["pushNotifications"] = False

    peer.mutate_card(withdraw_push)
    changed = client.get(peer.card_url, headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.json()["capabilities"]["pushNotifications"] is False
    assert changed.json()["version"] == "1.0.0"  # nothing is bumped automatically
    assert changed.headers["etag"] != etag
    peer.card = {**peer.card, "version": "2.0.0"}  # assigning replaces the card whole
    assert client.get(peer.card_url).json()["version"] == "2.0.0"


def test_card_fault_503(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("503")
    response = client.get(peer.card_url)
    assert response.status_code == 503
    assert "etag" not in response.headers


def test_card_fault_hang_outlasts_the_client_timeout(peer: Peer) -> None:
    peer.set_card_fault("hang")
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(peer.card_url, timeout=0.3)
    assert peer.card_requests == 1


def test_hanging_card_request_does_not_delay_stop() -> None:
    with Peer() as peer:
        peer.set_card_fault("hang")
        outcome: list[int | str] = []

        def fetch() -> None:
            try:
                outcome.append(httpx.get(peer.card_url, timeout=30).status_code)
            except httpx.HTTPError as error:
                outcome.append(type(error).__name__)

        thread = threading.Thread(target=fetch)
        thread.start()
        assert wait_for(lambda: peer.card_requests == 1)
        started = time.monotonic()
    assert time.monotonic() - started < 3.0
    thread.join(5)
    assert outcome  # the hanging request ended when the peer stopped


def test_card_fault_invalid_json(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("invalid_json")
    response = client.get(peer.card_url)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_card_fault_huge_stops_when_the_client_disconnects(
    peer: Peer, client: httpx.Client
) -> None:
    peer.set_card_fault("huge")
    received = 0
    with client.stream("GET", peer.card_url) as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers
        assert response.headers["transfer-encoding"] == "chunked"
        for chunk in response.iter_bytes():
            received += len(chunk)
            if received >= 256 * 1024:
                break
    time.sleep(0.2)
    sent = peer.huge_bytes_sent
    assert received <= sent < 1024 * 1024  # stopped well before 5 MiB
    time.sleep(0.1)
    assert peer.huge_bytes_sent == sent


def test_card_fault_huge_body_is_a_valid_5_mib_card(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("huge")
    response = client.get(peer.card_url)
    assert len(response.content) == HUGE_CARD_BYTES == peer.huge_bytes_sent
    assert response.json()["name"] == peer.card["name"]


def test_card_fault_redirect_cross_origin(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("redirect_cross_origin")
    response = client.get(peer.card_url)
    assert response.status_code == 302
    target = f"http://127.0.0.2:{peer.port}/.well-known/agent-card.json"
    assert response.headers["location"] == target
    assert peer.cross_origin_requests == 0
    if not peer.cross_origin_served:
        pytest.skip("127.0.0.2 is not a usable loopback address here")
    followed = client.get(peer.card_url, follow_redirects=True)
    assert followed.status_code == 200  # the other origin serves the card...
    assert str(followed.url) == target
    assert peer.cross_origin_requests == 1  # ...and counts who followed


def test_card_fault_redirect_same_origin(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("redirect_same_origin")
    response = client.get(peer.card_url)
    assert response.status_code == 302
    assert response.headers["location"] == peer.base_url + MOVED_CARD_PATH
    followed = client.get(peer.card_url, follow_redirects=True)
    assert followed.json() == peer.card
    assert peer.card_requests == 3


def test_card_fault_not_found_new_path(peer: Peer, client: httpx.Client) -> None:
    assert client.get(peer.base_url + LEGACY_CARD_PATH).status_code == 404  # normally
    peer.set_card_fault("not_found_new_path")
    assert client.get(peer.card_url).status_code == 404
    legacy = client.get(peer.base_url + LEGACY_CARD_PATH)
    assert legacy.status_code == 200
    assert legacy.json() == peer.card


def test_card_fault_404(peer: Peer, client: httpx.Client) -> None:
    peer.set_card_fault("404")
    assert client.get(peer.card_url).status_code == 404
    assert client.get(peer.base_url + LEGACY_CARD_PATH).status_code == 404
    assert peer.card_requests == 2
    with pytest.raises(ValueError, match="unknown card fault"):
        peer.set_card_fault("teapot")


# -- A2A over JSON-RPC and REST ---------------------------------------------------------------


def test_echo_blocking_send_returns_completed_task(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "echo hello there")
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["status"]["timestamp"].endswith("Z")
    assert task["artifacts"][0]["parts"] == [{"text": "hello there"}]
    assert task["history"][0]["role"] == "ROLE_USER"


def test_echo_return_immediately_gives_first_snapshot(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "echo hi", immediately=True)
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert state_becomes(client, peer, task["id"], "TASK_STATE_COMPLETED")


def test_ask_reaches_input_required_and_reply_completes(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "ask")
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert task["status"]["message"]["role"] == "ROLE_AGENT"
    assert task["status"]["message"]["parts"][0]["text"].endswith("?")

    reply = send(client, peer, "forty-two", taskId=task["id"], contextId=task["contextId"])
    assert reply["id"] == task["id"]
    assert reply["contextId"] == task["contextId"]
    assert reply["status"]["state"] == "TASK_STATE_COMPLETED"
    assert reply["artifacts"][0]["parts"] == [{"text": "answer: forty-two"}]

    assert get_task(client, peer, task["id"])["status"]["state"] == "TASK_STATE_COMPLETED"
    rest = client.get(f"{peer.rest_url}/tasks/{task['id']}", headers=V1)
    assert rest.status_code == 200
    assert rest.headers["content-type"] == "application/a2a+json"
    assert rest.json()["status"] == reply["status"]


def test_get_task_not_found_on_both_bindings(peer: Peer, client: httpx.Client) -> None:
    error = rpc(client, peer, "GetTask", {"id": "no-such-task"})["error"]
    assert error["code"] == -32001
    assert error["data"][0]["reason"] == "TASK_NOT_FOUND"
    rest = client.get(f"{peer.rest_url}/tasks/no-such-task", headers=V1)
    assert rest.status_code == 404
    info = rest.json()["error"]["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == "TASK_NOT_FOUND"


def test_cancel_slow_task_then_second_cancel_is_refused(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "slow 5", immediately=True)
    assert state_becomes(client, peer, task["id"], "TASK_STATE_WORKING")
    canceled = rpc(client, peer, "CancelTask", {"id": task["id"]})["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"

    error = rpc(client, peer, "CancelTask", {"id": task["id"]})["error"]
    assert error["code"] == -32002
    assert error["data"][0]["reason"] == "TASK_NOT_CANCELABLE"
    rest = client.post(f"{peer.rest_url}/tasks/{task['id']}:cancel", headers=V1)
    assert rest.status_code == 400
    assert rest.json()["error"]["details"][0]["reason"] == "TASK_NOT_CANCELABLE"


def test_terminal_scripts(peer: Peer, client: httpx.Client) -> None:
    failed = send(client, peer, "fail")
    assert failed["status"]["state"] == "TASK_STATE_FAILED"
    assert "message" not in failed["status"]
    diagnosed = send(client, peer, "fail-diag disk full")
    assert diagnosed["status"]["state"] == "TASK_STATE_FAILED"
    assert "disk full" in diagnosed["status"]["message"]["parts"][0]["text"]
    rejected = send(client, peer, "reject")
    assert rejected["status"]["state"] == "TASK_STATE_REJECTED"
    assert rejected["status"]["message"]["parts"][0]["text"]


def test_skill_id_in_message_metadata_selects_the_script(peer: Peer, client: httpx.Client) -> None:
    asked = send(client, peer, "please decide", metadata={"skillId": "ask"})
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    unknown = send(client, peer, "hello", metadata={"skillId": "invoice.reconcile"})
    assert unknown["status"]["state"] == "TASK_STATE_FAILED"
    assert "message" not in unknown["status"]  # incident 002: failed, no diagnostic


def test_select_script_convention() -> None:
    def msg(text: str, skill: str | None = None) -> Message:
        m = Message(message_id="m", parts=[Part(text=text)])
        if skill is not None:
            m.metadata.update({"skillId": skill})
        return m

    assert select_script(msg("slow 2.5"), {}) == ("slow", "2.5")
    assert select_script(msg("hello world"), {}) == ("echo", "hello world")
    assert select_script(msg("2.5", "slow"), {}) == ("slow", "2.5")
    assert select_script(msg("slow 2.5", "slow"), {}) == ("slow", "2.5")
    assert select_script(msg("echo x"), {"skillId": "fail"}) == ("fail", "echo x")
    assert select_script(msg("x", "nope"), {}) == ("unknown", "x")


def test_missing_version_header_is_refused_on_both_bindings(
    peer: Peer, client: httpx.Client
) -> None:
    error = rpc(client, peer, "SendMessage", {"message": message("echo x")}, headers={})["error"]
    assert error["code"] == -32009
    assert error["data"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    rest = client.get(f"{peer.rest_url}/tasks/anything")
    assert rest.status_code == 400
    assert rest.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"


# -- push notifications -------------------------------------------------------------------------


def register_push(
    client: httpx.Client, peer: Peer, task_id: str, receiver: Receiver
) -> dict[str, Any]:
    config = {
        "taskId": task_id,
        "id": f"cfg-{uuid.uuid4().hex[:8]}",
        "url": receiver.url,
        "token": "tok-123",
        "authentication": {"scheme": "Bearer", "credentials": "s3cret"},
    }
    stored: dict[str, Any] = rpc(client, peer, "CreateTaskPushNotificationConfig", config)["result"]
    assert stored == config  # our own id is kept
    return stored


def test_push_delivery_reaches_a_real_webhook(
    peer: Peer, client: httpx.Client, receiver: Receiver
) -> None:
    task = send(client, peer, "slow 0.4", immediately=True)
    register_push(client, peer, task["id"], receiver)
    assert wait_for(
        lambda: any(
            b.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
            for _, b in receiver.for_task(task["id"])
        )
    )
    headers, body = receiver.for_task(task["id"])[-1]
    assert headers["x-a2a-notification-token"] == "tok-123"
    assert headers["authorization"] == "Bearer s3cret"
    assert headers["content-type"] == "application/json"
    assert set(body) == {"statusUpdate"}
    assert body["statusUpdate"]["taskId"] == task["id"]
    assert body["statusUpdate"]["contextId"] == task["contextId"]
    assert body["statusUpdate"]["status"]["timestamp"].endswith("Z")
    kinds = [next(iter(b)) for _, b in receiver.for_task(task["id"])]
    assert "artifactUpdate" in kinds


def test_push_dropped_accepts_registration_but_delivers_nothing(
    peer: Peer, client: httpx.Client, receiver: Receiver
) -> None:
    peer.set_push_dropped(True)
    task = send(client, peer, "slow 0.2", immediately=True)
    register_push(client, peer, task["id"], receiver)
    assert state_becomes(client, peer, task["id"], "TASK_STATE_COMPLETED")
    assert wait_for(lambda: peer.pushes_dropped >= 2)  # artifact + completed, at least
    time.sleep(0.1)
    assert receiver.for_task(task["id"]) == []


# -- endpoint gone and the call log ---------------------------------------------------------------


def test_endpoint_gone_answers_plain_404_without_a2a_body(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "echo before")
    peer.set_endpoint_gone(True)
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task["id"]}}
    gone = client.post(peer.jsonrpc_url, json=body, headers=V1)
    assert gone.status_code == 404
    assert gone.headers["content-type"].startswith("text/plain")
    assert gone.text == "Not Found"
    rest = client.get(f"{peer.rest_url}/tasks/{task['id']}", headers=V1)
    assert (rest.status_code, rest.text) == (404, "Not Found")
    assert client.get(peer.card_url).status_code == 200  # discovery still works
    peer.set_endpoint_gone(False)
    assert get_task(client, peer, task["id"])["status"]["state"] == "TASK_STATE_COMPLETED"


def test_calls_log_records_binding_and_method(peer: Peer, client: httpx.Client) -> None:
    task = send(client, peer, "echo logged")
    get_task(client, peer, task["id"])
    client.get(f"{peer.rest_url}/tasks/{task['id']}", headers=V1)
    client.post(f"{peer.rest_url}/tasks/{task['id']}:cancel", headers=V1)
    client.post(f"{peer.rest_url}/message:send", json={"message": message("echo r")}, headers=V1)
    client.get(f"{peer.base_url}/tenant-1/a2a/rest/tasks/{task['id']}", headers=V1)
    client.get(peer.card_url)  # not an A2A call
    assert peer.calls == [
        ("JSONRPC", "SendMessage"),
        ("JSONRPC", "GetTask"),
        ("REST", "GetTask"),
        ("REST", "CancelTask"),
        ("REST", "SendMessage"),
        ("REST", "GetTask"),
    ]
