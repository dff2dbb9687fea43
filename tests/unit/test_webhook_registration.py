"""Webhook registration (R4, R15, R16), the second of the two things card state may gate: what
is asked of the agent, what is recorded, and every way it ends with the task on polling -- a
URL that would carry the task in clear text, a card read that fails or says no push, the agent
refusing -- each with nothing registered and the task untouched."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.mocked import engine_on, rpc_error, rpc_result, submitted_task

from cardfence.engine.cards.model import parse_card
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import EndpointUnreachableError, UsageError
from cardfence.engine.wire import push as webhook
from cardfence.store.event_store import EventStore

HOOK = "https://hooks.example/w"
Answer = Callable[[dict[str, Any]], httpx.Response]


def _pushing(version: str = "1.0") -> dict[str, Any]:
    document = card_document()
    document["capabilities"]["pushNotifications"] = True
    document["supportedInterfaces"][0]["protocolVersion"] = version
    return document


def _submitted(call: dict[str, Any]) -> httpx.Response:
    """SendMessage answered with a new task, in the A2A version the call speaks."""
    if call["method"] == "message/send":  # A2A 0.3
        task = {"kind": "task", "id": "r-1", "contextId": "c-1", "status": {"state": "submitted"}}
        return rpc_result(call, task)
    return submitted_task(call)


def _stored(call: dict[str, Any]) -> httpx.Response:
    """The config echoed as the agent stored it."""
    return rpc_result(call, call["params"])


class Agent:
    """A mock agent: its card (a document, or an HTTP status for every read), the send answered
    by ``send``, a push config by ``push``; every JSON-RPC call listed, with its headers."""

    def __init__(
        self, card: dict[str, Any] | int, send: Answer = _submitted, push: Answer = _stored
    ) -> None:
        self.card, self.send, self.push = card, send, push
        self.calls: list[dict[str, Any]] = []
        self.card_reads = 0

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.method == "GET":
                self.card_reads += 1
                if isinstance(self.card, int):
                    return httpx.Response(self.card)
                return httpx.Response(200, json=self.card)
            call = json.loads(request.content)
            self.calls.append(call)
            if call["method"] in ("SendMessage", "message/send"):
                return self.send(call)
            return self.push(call)

        return httpx.MockTransport(handler)

    def methods(self) -> list[str]:
        return [call["method"] for call in self.calls]


async def _task(engine: Engine) -> str:
    return (await engine.start_task(ORIGIN, skill="echo", text="hi")).task


def _last(store: EventStore, key: str) -> Any:
    return store.read_stream(f"task:{key}")[-1]


# -- registered ------------------------------------------------------------------------------------


async def test_a_webhook_is_registered_with_a_token_and_a_bearer_secret_of_its_own(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        reads = agent.card_reads
        outcome = await engine.register_webhook(key, HOOK)
        state = await engine.records.state(key)
    assert agent.card_reads == reads + 1  # a read made for this registration (R4)
    assert (outcome.registered, outcome.reason, outcome.detail) == (True, "registered", "")
    assert outcome.config_id is not None
    assert re.fullmatch(r"cf-[0-9a-f]{16}", outcome.config_id)
    assert outcome.token is not None
    assert len(outcome.token) == 43  # 32 random bytes, URL-safe base64
    assert outcome.authorization is not None
    scheme, secret = outcome.authorization.split(" ")
    assert scheme == "Bearer"
    assert len(secret) == 43
    assert secret != outcome.token
    (asked,) = [c for c in agent.calls if c["method"] == "CreateTaskPushNotificationConfig"]
    assert asked["params"] == {
        "taskId": "r-1",
        "id": outcome.config_id,
        "url": HOOK,
        "token": outcome.token,
        "authentication": {"scheme": "Bearer", "credentials": secret},
    }
    registered = _last(store, key)
    assert registered.type == ev.WEBHOOK_REGISTERED
    assert registered.data == {
        "config_id": outcome.config_id,
        "url": HOOK,
        "token_sha256": webhook.digest(outcome.token),
        "auth_sha256": webhook.digest(outcome.authorization),
        "status": "provisional",
        "card_revision": parse_card(json.dumps(_pushing()).encode(), url=ORIGIN).revision,
    }
    assert state["webhook"]["status"] == "provisional"
    assert state["delivery_mode"] == "push"


async def test_a_webhook_registered_with_the_callers_token_and_authentication(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(
            key, HOOK, token="tok", auth_scheme="Basic", auth_credentials="dXNlcjpwdw=="
        )
    assert (outcome.token, outcome.authorization) == ("tok", "Basic dXNlcjpwdw==")
    asked = agent.calls[-1]["params"]
    assert (asked["token"], asked["authentication"]) == (
        "tok",
        {"scheme": "Basic", "credentials": "dXNlcjpwdw=="},
    )
    assert _last(store, key).data["auth_sha256"] == webhook.digest("Basic dXNlcjpwdw==")


async def test_a_webhook_with_a_scheme_and_no_credentials_is_checked_for_the_token_alone(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK, auth_scheme="Bearer")
    assert outcome.authorization is None
    assert agent.calls[-1]["params"]["authentication"] == {"scheme": "Bearer"}
    assert _last(store, key).data["auth_sha256"] is None


async def test_a_task_at_an_a2a_0_3_endpoint_registers_the_token_alone(store: EventStore) -> None:
    agent = Agent(_pushing("0.3"))
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK)
    assert outcome.registered
    assert outcome.authorization is None
    (asked,) = [c for c in agent.calls if c["method"] == "tasks/pushNotificationConfig/set"]
    config = asked["params"]["pushNotificationConfig"]
    assert (config["url"], config["token"]) == (HOOK, outcome.token)
    assert "authentication" not in config
    assert _last(store, key).data["auth_sha256"] is None


# -- not registered: the task goes on by polling ---------------------------------------------------


def _downgraded(store: EventStore, key: str, reason: str, detail: str) -> None:
    downgraded = _last(store, key)
    assert downgraded.type == ev.DELIVERY_DOWNGRADED
    assert downgraded.data == {
        "reason": reason,
        "detail": detail,
        "card_revision": None,
        "to": "polling",
    }


async def test_a_plain_http_webhook_off_loopback_is_not_registered_nor_the_card_read(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        reads, calls = agent.card_reads, len(agent.calls)
        outcome = await engine.register_webhook(key, "http://hooks.example/w")
        state = await engine.records.state(key)
    detail = (
        "webhook URL http://hooks.example/w: plain http to a non-loopback host refused "
        "(https required); nothing was registered"
    )
    assert (outcome.registered, outcome.reason, outcome.detail) == (False, "insecure_url", detail)
    assert (outcome.config_id, outcome.token, outcome.authorization) == (None, None, None)
    assert (agent.card_reads, len(agent.calls)) == (reads, calls)  # nothing asked of the agent
    _downgraded(store, key, "insecure_url", detail)
    assert state["delivery_mode"] == "polling"
    assert state["state"] == "submitted"  # the task itself untouched


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/w", "http://localhost/w"])
async def test_a_plain_http_webhook_on_loopback_is_registered(store: EventStore, url: str) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, url)
    assert outcome.registered
    assert agent.calls[-1]["params"]["url"] == url


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("https://hook:PASS@hooks.example/w", "it carries credentials (user:password@): a "
         "delivery is authenticated by the webhook's token (--webhook-token) instead"),
        ("https://hooks.example:99999/w", "its port is not a number from 1 to 65535"),
        ("http://[::1/w", "not a valid URL"),
        ("https://hooks.example/w#x", "it has a fragment (#...), which is never sent"),
    ],
)  # fmt: skip
async def test_a_webhook_url_that_cannot_be_used_is_a_usage_error_recording_and_sending_nothing(
    store: EventStore, url: str, fault: str
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        recorded, reads = len(store.read_stream(f"task:{key}")), agent.card_reads
        with pytest.raises(UsageError) as raised:
            await engine.register_webhook(key, url)
    shown = url.replace("hook:PASS@", "")
    assert str(raised.value) == (
        f"webhook URL {shown!r}: {fault}; nothing was recorded or registered"
    )
    assert len(store.read_stream(f"task:{key}")) == recorded
    assert (agent.methods(), agent.card_reads) == (["SendMessage"], reads)


async def test_an_engine_allowing_insecure_urls_registers_plain_http_anywhere(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    config = EngineConfig(card_limits=CardLimits(allow_insecure=True))
    async with engine_on(store, agent.transport(), config) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, "http://hooks.example/w")
    assert outcome.registered


async def test_a_card_that_says_no_push_registers_nothing(store: EventStore) -> None:
    document = card_document()
    agent = Agent(document)
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK)
    revision = parse_card(json.dumps(document).encode(), url=ORIGIN).revision
    detail = f"card {revision[:12]} says no push"
    assert (outcome.registered, outcome.reason, outcome.detail) == (
        False,
        "push_not_advertised",
        detail,
    )
    assert agent.methods() == ["SendMessage"]  # no registration request reached the agent
    _downgraded(store, key, "push_not_advertised", detail)


async def test_a_card_that_withdrew_push_since_creation_registers_nothing(
    store: EventStore,
) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        agent.card = card_document()  # read at creation with push; now without
        outcome = await engine.register_webhook(key, HOOK)
    assert (outcome.registered, outcome.reason) == (False, "push_not_advertised")
    assert agent.methods() == ["SendMessage"]


async def test_a_card_read_that_fails_registers_nothing_and_says_why(store: EventStore) -> None:
    agent = Agent(_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        agent.card = 503
        outcome = await engine.register_webhook(key, HOOK)
    assert (outcome.registered, outcome.reason, outcome.detail) == (
        False,
        "discovery_failed",
        f"GET {ORIGIN}/.well-known/agent-card.json -> 503",
    )
    assert agent.methods() == ["SendMessage"]
    _downgraded(store, key, "discovery_failed", outcome.detail)


async def test_an_agent_refusing_the_config_leaves_the_task_on_polling(
    store: EventStore,
) -> None:
    refused = functools.partial(
        rpc_error, code=-32003, message="Push Notification is not supported"
    )
    agent = Agent(_pushing(), push=refused)
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK)
        state = await engine.records.state(key)
    assert (outcome.registered, outcome.reason) == (False, "push_refused")
    assert "-32003" in outcome.detail
    assert "Push Notification is not supported" in outcome.detail
    _downgraded(store, key, "push_refused", outcome.detail)
    assert state["delivery_mode"] == "polling"
    assert "webhook" not in state or not state["webhook"]


async def test_an_agent_rejecting_the_credentials_records_the_refusal_then_polling(
    store: EventStore,
) -> None:
    agent = Agent(_pushing(), push=lambda call: httpx.Response(401))
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK)
    assert (outcome.registered, outcome.reason) == (False, "credentials_rejected")
    assert outcome.detail.endswith("; the task goes on by polling")
    refused, downgraded = store.read_stream(f"task:{key}")[-2:]
    assert refused.type == ev.AUTHORIZATION_FAILED
    assert (refused.data["during"], refused.data["status"]) == ("register", 401)
    assert downgraded.type == ev.DELIVERY_DOWNGRADED
    assert (downgraded.data["reason"], downgraded.data["detail"]) == (
        "credentials_rejected",
        outcome.detail,
    )


async def test_a_task_the_agent_has_not_named_yet_has_nothing_to_register_for(
    store: EventStore,
) -> None:
    agent = Agent(_pushing(), send=lambda call: httpx.Response(503))
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(EndpointUnreachableError):  # the send's outcome is unknown
            await _task(engine)
        (key,) = [s.removeprefix("task:") for s in _task_streams(store)]
        recorded = len(store.read_stream(f"task:{key}"))
        with pytest.raises(UsageError) as raised:
            await engine.register_webhook(key, HOOK)
    assert str(raised.value) == f"task {key} has no remote task id yet: nothing to register for"
    assert len(store.read_stream(f"task:{key}")) == recorded
    assert agent.methods() == ["SendMessage"]


def _task_streams(store: EventStore) -> list[str]:
    return [h.stream_id for h in store.streams(category=ev.TASK_CATEGORY)]
