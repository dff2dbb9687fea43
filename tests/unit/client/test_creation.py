"""Task creation (R2, R3, R15): what the engine freezes in ``TaskSubmitted``, what it sends, the
extensions a caller activates, and how each answer to the creation's send is recorded -- a task,
a message, a refusal, a request the agent did not authorize, an agent not reached."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.mocked import ScriptedAgent, engine_on, rpc_error, rpc_result, submitted_task

from cardfence.engine.auth.config import Bearer, CredentialsConfig, OAuthClient
from cardfence.engine.cards.model import parse_card
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CreationRefusedError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    SkillUnavailableError,
    UsageError,
)
from cardfence.store.event_store import EventStore

ENDPOINT = f"{ORIGIN}/a2a"


class Agent:
    """The card of ``support.cards`` (or ``card``), and ``send`` answering the creation."""

    def __init__(self, send: Any = submitted_task, card: dict[str, Any] | None = None) -> None:
        self.send, self.card = send, card or card_document()
        self.sent: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.method == "GET":
                return httpx.Response(200, json=self.card)
            self.sent.append(request)
            return self.send(json.loads(request.content))  # type: ignore[no-any-return]

        return httpx.MockTransport(handler)


def _first(store: EventStore, key: str) -> dict[str, Any]:
    return store.read_stream(f"task:{key}")[0].data


async def test_a_task_is_frozen_with_its_card_contract_skill_and_endpoint_then_sent(
    store: EventStore,
) -> None:
    agent = Agent()
    before = datetime.now(UTC)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="hello", media_type="text/plain", key="k-1"
        )
    after = datetime.now(UTC)
    card = parse_card(json.dumps(card_document()).encode(), url=ORIGIN)
    submitted = store.read_stream("task:k-1")[0]
    assert submitted.type == ev.TASK_SUBMITTED
    data = submitted.data
    assert re.fullmatch(r"m-[0-9a-f]{32}", data["message_id"])
    assert re.fullmatch(r"c-[0-9a-f]{32}", data["context_id"])
    assert before <= datetime.fromisoformat(data["submitted_at"]) <= after
    assert {k: data[k] for k in data if k not in ("message_id", "context_id", "submitted_at",
                                                 "authorization")} == {
        "task": "k-1",
        "agent": ORIGIN,
        "agent_url": ORIGIN,
        "card_url": f"{ORIGIN}/.well-known/agent-card.json",
        "skill": "echo",
        "text": "hello",
        "media_type": "text/plain",
        "card_revision": card.revision,
        "card_version": "1.0.0",
        "contract_hash": card.contract_hash,
        "skill_hash": card.compatibility_hash("echo"),
        "endpoint": {"url": ENDPOINT, "binding": "JSONRPC", "protocol_version": "1.0"},
    }  # fmt: skip
    assert "extensions" not in data
    assert (view.task, view.state, view.remote_task_id) == ("k-1", "submitted", "r-1")
    (sent,) = agent.sent
    assert str(sent.url) == ENDPOINT
    params = json.loads(sent.content)["params"]
    assert params["message"]["messageId"] == data["message_id"]
    assert params["message"]["contextId"] == data["context_id"]
    assert params["message"]["parts"] == [{"text": "hello", "mediaType": "text/plain"}]
    assert params["message"]["metadata"] == {"skillId": "echo"}
    assert params["configuration"]["returnImmediately"] is True


async def test_a_task_without_a_key_gets_a_fresh_one(store: EventStore) -> None:
    async with engine_on(store, Agent().transport()) as engine:
        one = await engine.start_task(ORIGIN, skill="echo", text="a")
        two = await engine.start_task(ORIGIN, skill="echo", text="b")
    assert re.fullmatch(r"[0-9a-f]{32}", one.task)
    assert one.task != two.task


async def test_activated_extensions_are_frozen_stripped_once_each_in_their_order(
    store: EventStore,
) -> None:
    agent = Agent()
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="hi", extensions=[" urn:b ", "urn:a", "urn:b"]
        )
    assert _first(store, view.task)["extensions"] == ["urn:b", "urn:a"]
    assert agent.sent[0].headers["a2a-extensions"] == "urn:b, urn:a"


@pytest.mark.parametrize("uri", ["", "  ", "urn:a b", "urn:a,b", "urn:é", "urn:\x7f"])
async def test_an_extension_that_is_not_a_uri_is_refused_and_nothing_sent(
    store: EventStore, uri: str
) -> None:
    agent = Agent()
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(UsageError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi", extensions=["urn:ok", uri])
    assert str(raised.value) == (
        f"extension {uri.strip()!r} is not a URI (printable ASCII, no spaces or commas): "
        "nothing was sent"
    )
    assert agent.sent == []
    assert store.streams(category=ev.TASK_CATEGORY) == []


@pytest.mark.parametrize("uri", ["urn:a!~", "https://x.example/ext/v1?q=1#f"])
async def test_every_printable_ascii_uri_is_an_extension(store: EventStore, uri: str) -> None:
    async with engine_on(store, Agent().transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi", extensions=[uri])
    assert _first(store, view.task)["extensions"] == [uri]


async def test_a_creation_answered_by_a_message_is_applied_as_the_sends_report(
    store: EventStore,
) -> None:
    def message(call: dict[str, Any]) -> httpx.Response:
        said = {"messageId": "m-r", "role": "ROLE_AGENT", "parts": [{"text": "done"}]}
        return rpc_result(call, {"message": said})

    async with engine_on(store, Agent(message).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    changed = [e.data for e in store.read_stream(f"task:{view.task}") if e.type == ev.STATE_CHANGED]
    assert [(c["to"], c["source"]) for c in changed] == [("completed", "send")]


async def test_a_creation_the_agent_refuses_is_closed_as_never_created_in_both_streams(
    store: EventStore,
) -> None:
    refused = functools.partial(rpc_error, code=-32602, message="no such skill here")
    async with engine_on(store, Agent(refused).transport()) as engine:
        with pytest.raises(CreationRefusedError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
        state = await engine.records.state("k-1")
    assert (raised.value.task, raised.value.url) == ("k-1", ENDPOINT)
    assert (raised.value.code, raised.value.detail) == (-32602, "no such skill here")
    last = store.read_stream("task:k-1")[-1]
    assert last.type == ev.TASK_CREATION_REFUSED
    assert last.data == {
        "reason": "remote_refused",
        "code": -32602,
        "message": "no such skill here",
        "url": ENDPOINT,
    }
    assert guards.never_created(state)
    refusal = store.read_stream(ev.agent_stream_id(ORIGIN))[-1]
    assert refusal.type == ev.TASK_CREATION_REFUSED
    assert (refusal.data["reason"], refusal.data["skill"]) == ("remote_refused", "echo")
    assert "no such skill here" in refusal.data["detail"]


async def test_a_creation_the_agent_does_not_authorize_is_recorded_during_send(
    store: EventStore,
) -> None:
    agent = Agent(lambda call: httpx.Response(403))
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(AuthorizationFailedError):
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
    last = store.read_stream("task:k-1")[-1]
    assert last.type == ev.AUTHORIZATION_FAILED
    assert (last.data["during"], last.data["status"], last.data["url"]) == ("send", 403, ENDPOINT)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (lambda call: httpx.Response(503), EndpointUnreachableError),
        (
            lambda call: httpx.Response(
                200, json={"jsonrpc": "2.0", "id": call["id"], "result": 7}
            ),
            InvalidAgentResponseError,
        ),
    ],
    ids=["5xx", "unusable"],
)
async def test_a_creation_whose_outcome_is_unknown_is_recorded_as_unreachable_during_send(
    store: EventStore, answer: Any, error: type[Exception]
) -> None:
    async with engine_on(store, Agent(answer).transport()) as engine:
        with pytest.raises(error):
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
        state = await engine.records.state("k-1")
    last = store.read_stream("task:k-1")[-1]
    assert last.type == ev.ENDPOINT_UNREACHABLE
    assert (last.data["during"], last.data["url"]) == ("send", ENDPOINT)
    assert state["state"] == "submitted"  # not refused: `resume` finds out what happened
    assert not state.get("remote_task_id")


async def test_the_grant_recorded_names_the_openid_connect_discovery_its_token_came_from(
    store: EventStore,
) -> None:
    discovery_url = "https://id.example/.well-known/openid-configuration"
    document = card_document()
    document["securitySchemes"] = {
        "oidc": {"openIdConnectSecurityScheme": {"openIdConnectUrl": discovery_url}},
        "other": {"openIdConnectSecurityScheme": {"openIdConnectUrl": "https://else.example/"}},
    }
    document["securityRequirements"] = [{"schemes": {"oidc": {"list": ["read"]}}}]
    card = parse_card(json.dumps(document).encode(), url=ORIGIN)
    client = OAuthClient("cf-client", "cf-client-secret", ("read",))
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"oidc": client}}))
    body = json.dumps({"token_endpoint": "https://id.example/token"}).encode()
    async with engine_on(store, None, config) as engine:
        grant = engine.authorizer.grant(card, "echo", ENDPOINT)
        assert "discovery" not in engine.access.grant_record(grant)  # no token fetched yet
        await engine.access.oidc_discovered(discovery_url, body)
        record = engine.access.grant_record(grant)
    assert record["schemes"] == ["oidc"]
    assert record["discovery"] == {
        "oidc": {
            "url": discovery_url,
            "sha256": hashlib.sha256(body).hexdigest(),
            "token_endpoint": "https://id.example/token",
        }
    }


async def test_a_creation_answered_by_a_task_is_applied_as_the_sends_report(
    store: EventStore,
) -> None:
    def working(call: dict[str, Any]) -> httpx.Response:
        status = {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:00Z"}
        return rpc_result(call, {"task": {"id": "r-1", "contextId": "c-1", "status": status}})

    async with engine_on(store, Agent(working).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    changed = [e.data for e in store.read_stream(f"task:{view.task}") if e.type == ev.STATE_CHANGED]
    assert [(c["to"], c["source"]) for c in changed] == [("working", "send")]


async def test_the_media_type_asked_for_is_the_one_sent(store: EventStore) -> None:
    card = card_document()
    card["defaultInputModes"] = ["text/plain", "text/markdown"]
    agent = Agent(card=card)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="# hi", media_type="text/markdown"
        )
    (part,) = json.loads(agent.sent[0].content)["params"]["message"]["parts"]
    assert part == {"text": "# hi", "mediaType": "text/markdown"}
    assert _first(store, view.task)["media_type"] == "text/markdown"


# -- R15: the authenticated extended card at creation ---------------------------------------------


def _offering_extended() -> dict[str, Any]:
    card = card_document()
    card["capabilities"]["extendedAgentCard"] = True
    return card


def _extended_card() -> dict[str, Any]:
    card = _offering_extended()
    card["version"] = "1.1.0"  # the extended card's own
    # A scheme the public card does not define (none required): a contract of its own.
    card["securitySchemes"] = {
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
    }
    card["skills"].append(
        {"id": "translate", "name": "Translate", "description": "Translates.", "tags": ["t"]}
    )
    return card


def _serving_extended(card: dict[str, Any], extended: Any) -> Any:
    """A send answer that also answers GetExtendedAgentCard with ``extended`` (a card document,
    or an HTTP status)."""

    def answer(call: dict[str, Any]) -> httpx.Response:
        if call["method"] != "GetExtendedAgentCard":
            return submitted_task(call)
        if isinstance(extended, int):
            return httpx.Response(extended)
        return rpc_result(call, extended)

    return answer


def _methods(agent: Agent) -> list[str]:
    return [json.loads(r.content)["method"] for r in agent.sent]


async def test_a_skill_of_the_extended_card_is_created_frozen_under_that_card(
    store: EventStore,
) -> None:
    public = _offering_extended()
    agent = Agent(_serving_extended(public, _extended_card()), card=public)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="translate", text="hi")
    assert _methods(agent) == ["GetExtendedAgentCard", "SendMessage"]
    extended = parse_card(json.dumps(_extended_card()).encode(), url=ORIGIN)
    public_card = parse_card(json.dumps(public).encode(), url=ORIGIN)
    frozen = _first(store, view.task)
    assert {k: frozen[k] for k in ("extended", "card_revision", "card_version",
                                   "public_revision", "skill_hash", "contract_hash",
                                   "public_contract_hash")} == {
        "extended": True,
        "card_revision": extended.revision,
        "card_version": "1.1.0",
        "public_revision": public_card.revision,
        "skill_hash": extended.compatibility_hash("translate"),
        "contract_hash": extended.contract_hash,
        "public_contract_hash": public_card.contract_hash,
    }  # fmt: skip


async def test_an_extended_card_not_read_leaves_the_public_card_to_decide_and_says_so(
    store: EventStore,
) -> None:
    public = _offering_extended()
    agent = Agent(_serving_extended(public, 503), card=public)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        with pytest.raises(SkillUnavailableError):
            await engine.start_task(ORIGIN, skill="translate", text="hi")
    frozen = _first(store, view.task)
    assert "extended" not in frozen
    assert frozen["extended_unread"].startswith("EndpointUnreachableError: ")
    refusal = store.read_stream(ev.agent_stream_id(ORIGIN))[-1]
    assert refusal.type == ev.TASK_CREATION_REFUSED
    assert refusal.data["detail"].endswith(
        f"; the extended card could not be read ({frozen['extended_unread']})"
    )


async def test_no_credentials_go_to_an_extended_card_under_a_contract_not_accepted(
    store: EventStore,
) -> None:
    public = _offering_extended()
    agent = Agent(_serving_extended(public, _extended_card()), card=public)
    async with engine_on(store, agent.transport()) as engine:
        await engine.start_task(ORIGIN, skill="echo", text="hi")  # the contract pinned
        changed = _offering_extended()
        # Another security scheme defined (none required): another contract (R3).
        changed["securitySchemes"] = {
            "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
        }
        agent.card = changed
        agent.sent.clear()
        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(ORIGIN, skill="translate", text="hi")
        assert agent.sent == []  # no extended read: it would carry credentials
        assert str(refused.value) == (
            f"{ORIGIN}: skill 'translate' is absent from the card (offered: echo); the extended "
            "card could not be read (the contract changed and is not accepted: no credentials "
            "were sent) (nothing was sent)"
        )
        view = await engine.start_task(ORIGIN, skill="translate", text="hi", accept_contract=True)
    assert _methods(agent) == ["GetExtendedAgentCard", "SendMessage"]
    assert _first(store, view.task)["extended"] is True


async def test_an_engine_allowing_plain_http_reads_the_extended_card_over_it_too(
    store: EventStore,
) -> None:
    plain = "http://agent.example"
    public, extended = _offering_extended(), _extended_card()
    for card in (public, extended):
        card["supportedInterfaces"][0]["url"] = f"{plain}/a2a"
    agent = Agent(_serving_extended(public, extended), card=public)
    config = EngineConfig(card_limits=CardLimits(allow_insecure=True))
    async with engine_on(store, agent.transport(), config) as engine:
        view = await engine.start_task(plain, skill="translate", text="hi")
    assert _first(store, view.task)["extended"] is True


def _secured(card: dict[str, Any]) -> dict[str, Any]:
    card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card


async def test_the_extended_card_is_asked_for_with_the_credentials_the_card_requires(
    store: EventStore,
) -> None:
    public, extended = _secured(_offering_extended()), _secured(_extended_card())
    agent = Agent(_serving_extended(public, extended), card=public)
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"bearer": Bearer("tok")}}))
    async with engine_on(store, agent.transport(), config) as engine:
        view = await engine.start_task(ORIGIN, skill="translate", text="hi")
    asked = agent.sent[0]
    assert json.loads(asked.content)["method"] == "GetExtendedAgentCard"
    assert asked.headers["authorization"] == "Bearer tok"
    assert _first(store, view.task)["extended"] is True


async def test_the_extended_card_is_read_over_the_interface_the_task_would_use(
    store: EventStore,
) -> None:
    public, extended = _offering_extended(), _extended_card()
    for card in (public, extended):
        card["supportedInterfaces"].append(
            {"url": f"{ORIGIN}/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}
        )
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        if request.url.path == "/rest/extendedAgentCard":
            return httpx.Response(200, json=extended)
        if request.method == "GET":
            return httpx.Response(200, json=public)
        status = {"state": "TASK_STATE_SUBMITTED", "timestamp": "2026-01-01T00:00:00Z"}
        return httpx.Response(
            200, json={"task": {"id": "r-1", "contextId": "c-1", "status": status}}
        )

    config = EngineConfig(prefer_bindings=("HTTP+JSON",))
    async with engine_on(store, httpx.MockTransport(handler), config) as engine:
        await engine.start_task(ORIGIN, skill="translate", text="hi")
    assert asked[1:] == ["GET /rest/extendedAgentCard", "POST /rest/message:send"]


async def test_the_extended_read_is_recorded_naming_the_public_card_and_its_transport_let_go(
    store: EventStore,
) -> None:
    public, extended = _secured(_offering_extended()), _secured(_extended_card())
    agent = Agent(_serving_extended(public, extended), card=public)
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"bearer": Bearer("tok")}}))
    async with engine_on(store, agent.transport(), config) as engine:
        await engine.start_task(ORIGIN, skill="translate", text="hi")
        kept = list(engine.connections.transports)
    public_revision = parse_card(json.dumps(public).encode(), url=ORIGIN).revision
    (read,) = [
        e.data
        for e in store.read_stream(ev.agent_stream_id(ORIGIN))
        if e.type == ev.CARD_FETCHED and e.data.get("extended")
    ]
    assert read["public_revision"] == public_revision
    assert len(kept) == 1  # the task's own; the one for the extended read was not kept


async def test_a_skill_on_neither_card_is_refused_without_blaming_the_extended_read(
    store: EventStore,
) -> None:
    public = _offering_extended()
    agent = Agent(_serving_extended(public, _extended_card()), card=public)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(ORIGIN, skill="summarise", text="hi")
    assert str(refused.value) == (
        f"{ORIGIN}: skill 'summarise' is absent from the card (offered: echo, translate) "
        "(nothing was sent)"
    )


async def test_a_task_started_without_a_media_type_is_plain_text(store: EventStore) -> None:
    agent = Agent()
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    assert _first(store, view.task)["media_type"] == "text/plain"
    (part,) = json.loads(agent.sent[0].content)["params"]["message"]["parts"]
    assert part["mediaType"] == "text/plain"


# -- R3: resume looks for a creation whose outcome is unknown ------------------------------------


def _lost_creation(*listed: tuple[str, bool]) -> tuple[ScriptedAgent, list[dict[str, Any]]]:
    """An agent the creation reached, its answer lost (a 500: the outcome unknown); every later
    send is answered by task ``r-2``. ListTasks lists, in the creation's context, each
    ``(remote id, whether its history holds the creation's messageId)``; GetTask answers the
    task asked for. Returns the agent and the messages sent to it."""
    sent: list[dict[str, Any]] = []

    def task(remote_id: str, *history: str) -> dict[str, Any]:
        status = {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:01Z"}
        said = [{"messageId": m, "role": "ROLE_USER", "parts": [{"text": "hi"}]} for m in history]
        return {"id": remote_id, "contextId": sent[0]["contextId"], "status": status,
                "history": said}  # fmt: skip

    def send(call: dict[str, Any]) -> httpx.Response:
        sent.append(call["params"]["message"])
        return httpx.Response(500) if len(sent) == 1 else rpc_result(call, {"task": task("r-2")})

    def get(call: dict[str, Any]) -> httpx.Response:
        if call["method"] != "ListTasks":
            return rpc_result(call, task(call["params"]["id"]))
        ours = sent[0]["messageId"]
        found = [task(r, "m-theirs", ours) if held else task(r, "m-theirs") for r, held in listed]
        return rpc_result(call, {"tasks": found})

    return ScriptedAgent(get, send=send), sent


async def test_resume_binds_the_task_of_the_context_whose_history_holds_the_creations_message_id(
    store: EventStore,
) -> None:
    agent, sent = _lost_creation(("r-9", False), ("r-1", True))  # another's first, then ours
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(EndpointUnreachableError):
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
        resumed = await engine.resume("k-1")

    assert resumed.remote_task_id == "r-1"
    assert len(sent) == 1  # found: not sent again
    assert agent.asked[-2:] == ["ListTasks", "GetTask"]


async def test_resume_sends_again_when_the_task_found_is_bound_to_another_task_of_the_store(
    db_url: str,
) -> None:
    agent, sent = _lost_creation(("r-1", True))
    with EventStore.open(db_url) as store:
        async with engine_on(store, ScriptedAgent().transport()) as engine:
            await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-0")  # bound to r-1
        async with engine_on(store, agent.transport()) as engine:
            with pytest.raises(EndpointUnreachableError):
                await engine.start_task(ORIGIN, skill="echo", text="hi", key="k-1")
            resumed = await engine.resume("k-1")
            other = await engine.records.state("k-0")

    assert (resumed.remote_task_id, other["remote_task_id"]) == ("r-2", "r-1")
    first, again = sent
    assert again["messageId"] == first["messageId"]  # nothing found: the same send, again
    assert "GetTask" not in agent.asked
