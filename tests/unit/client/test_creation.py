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
import sqlalchemy as sa
from support.cards import ORIGIN, card_document
from support.hostile import closed_port
from support.mocked import (
    Answer,
    RestAgent,
    ScriptedAgent,
    engine_on,
    rpc_error,
    rpc_result,
)

from cardfence.engine.auth.config import Bearer, CredentialsConfig, OAuthClient
from cardfence.engine.cards.model import parse_card
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.messages import recorded_parts, submitted_message
from cardfence.engine.core.parts import Data, File, Text
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CardInvalidError,
    ContractChangedError,
    CreationRefusedError,
    CredentialsMissingError,
    DiscoveryError,
    EndpointUnreachableError,
    ExtensionRequiredError,
    InvalidAgentResponseError,
    MessageTooLargeError,
    SkillUnavailableError,
    TokenRequestError,
    UsageError,
)
from cardfence.engine.wire import push as webhook
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent

ENDPOINT = f"{ORIGIN}/a2a"


def _first(store: EventStore, key: str) -> dict[str, Any]:
    return store.read_stream(f"task:{key}")[0].data


def _sent(store: EventStore, key: str) -> dict[str, Any]:
    """The task's first event with its message's content read back (R17): each part as it was
    given, without the size and digest its outline holds."""
    first = TaskLog(store).first_event(key)
    first["parts"] = [{k: v for k, v in p.items() if k not in ("size", "sha256")}
                      for p in first["parts"]]  # fmt: skip
    return first


async def test_a_task_is_frozen_with_its_card_contract_skill_and_endpoint_then_sent(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()
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
    [part] = data["parts"]  # R17: the message out of line, its one part outlined
    assert part == {"kind": "text", "media_type": "text/plain", "size": 5,
                    "sha256": part["sha256"]}  # fmt: skip
    [content] = store.contents("task:k-1").values()
    assert (content.digest, content.data) == (part["sha256"], {"text": "hello"})
    assert {k: data[k] for k in data if k not in ("message_id", "context_id", "submitted_at",
                                                 "authorization", "parts")} == {
        "task": "k-1",
        "agent": ORIGIN,
        "agent_url": ORIGIN,
        "card_url": f"{ORIGIN}/.well-known/agent-card.json",
        "skill": "echo",
        "card_revision": card.revision,
        "card_version": "1.0.0",
        "contract_hash": card.contract_hash,
        "skill_hash": card.compatibility_hash("echo"),
        "endpoint": {"url": ENDPOINT, "binding": "JSONRPC", "protocol_version": "1.0"},
    }  # fmt: skip
    assert "extensions" not in data
    assert (view.task, view.state, view.remote_task_id) == ("k-1", "submitted", "r-1")
    (sent,) = agent.requests
    assert str(sent.url) == ENDPOINT
    params = json.loads(sent.content)["params"]
    assert params["message"]["messageId"] == data["message_id"]
    assert params["message"]["contextId"] == data["context_id"]
    assert params["message"]["parts"] == [{"text": "hello", "mediaType": "text/plain"}]
    assert params["message"]["metadata"] == {"skillId": "echo"}
    assert params["configuration"]["returnImmediately"] is True


async def test_a_task_without_a_key_gets_a_fresh_one(store: EventStore) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        one = await engine.start_task(ORIGIN, skill="echo", text="a")
        two = await engine.start_task(ORIGIN, skill="echo", text="b")
    assert re.fullmatch(r"[0-9a-f]{32}", one.task)
    assert one.task != two.task


async def test_activated_extensions_are_frozen_stripped_once_each_in_their_order(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="hi", extensions=[" urn:b ", "urn:a", "urn:b"]
        )
    assert _first(store, view.task)["extensions"] == ["urn:b", "urn:a"]
    assert agent.requests[0].headers["a2a-extensions"] == "urn:b, urn:a"


@pytest.mark.parametrize("uri", ["", "  ", "urn:a b", "urn:a,b", "urn:é", "urn:\x7f"])
async def test_an_extension_that_is_not_a_uri_is_refused_and_nothing_sent(
    store: EventStore, uri: str
) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(UsageError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi", extensions=["urn:ok", uri])
    assert str(raised.value) == (
        f"extension {uri.strip()!r} is not a URI (printable ASCII, no spaces or commas): "
        "nothing was sent"
    )
    assert agent.requests == []
    assert store.streams(category=ev.TASK_CATEGORY) == []


@pytest.mark.parametrize("uri", ["urn:a!~", "https://x.example/ext/v1?q=1#f"])
async def test_every_printable_ascii_uri_is_an_extension(store: EventStore, uri: str) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi", extensions=[uri])
    assert _first(store, view.task)["extensions"] == [uri]


async def test_a_creation_answered_by_a_message_is_applied_as_the_sends_report(
    store: EventStore,
) -> None:
    def message(call: dict[str, Any]) -> httpx.Response:
        said = {"messageId": "m-r", "role": "ROLE_AGENT", "parts": [{"text": "done"}]}
        return rpc_result(call, {"message": said})

    async with engine_on(store, ScriptedAgent(send=message).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    changed = [e.data for e in store.read_stream(f"task:{view.task}") if e.type == ev.STATE_CHANGED]
    assert [(c["to"], c["source"]) for c in changed] == [("completed", "send")]


async def test_a_creation_the_agent_refuses_is_closed_as_never_created_in_both_streams(
    store: EventStore,
) -> None:
    refused = functools.partial(rpc_error, code=-32602, message="no such skill here")
    async with engine_on(store, ScriptedAgent(send=refused).transport()) as engine:
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
    agent = ScriptedAgent(send=lambda call: httpx.Response(403))
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
    async with engine_on(store, ScriptedAgent(send=answer).transport()) as engine:
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

    async with engine_on(store, ScriptedAgent(send=working).transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    changed = [e.data for e in store.read_stream(f"task:{view.task}") if e.type == ev.STATE_CHANGED]
    assert [(c["to"], c["source"]) for c in changed] == [("working", "send")]


async def test_the_media_type_asked_for_is_the_one_sent(store: EventStore) -> None:
    card = card_document()
    card["defaultInputModes"] = ["text/plain", "text/markdown"]
    agent = ScriptedAgent(card=card)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="# hi", media_type="text/markdown"
        )
    (part,) = json.loads(agent.requests[0].content)["params"]["message"]["parts"]
    assert part == {"text": "# hi", "mediaType": "text/markdown"}
    recorded = _first(store, view.task)
    [outline] = recorded["parts"]
    assert set(outline) == {"kind", "media_type", "size", "sha256"}  # R17: out of line
    assert _sent(store, view.task)["parts"] == [
        {"kind": "text", "media_type": "text/markdown", "text": "# hi"}
    ]
    assert "text" not in recorded
    assert "media_type" not in recorded


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


def _serving_extended(extended: Any) -> dict[str, Answer]:
    """GetExtendedAgentCard answered with ``extended`` (a card document, or an HTTP status)."""

    def answer(call: dict[str, Any]) -> httpx.Response:
        if isinstance(extended, int):
            return httpx.Response(extended)
        return rpc_result(call, extended)

    return {"GetExtendedAgentCard": answer}


async def test_a_skill_of_the_extended_card_is_created_frozen_under_that_card(
    store: EventStore,
) -> None:
    public = _offering_extended()
    agent = ScriptedAgent(card=public, answers=_serving_extended(_extended_card()))
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="translate", text="hi")
    assert agent.methods() == ["GetExtendedAgentCard", "SendMessage"]
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
    agent = ScriptedAgent(card=public, answers=_serving_extended(503))
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
    agent = ScriptedAgent(card=public, answers=_serving_extended(_extended_card()))
    async with engine_on(store, agent.transport()) as engine:
        await engine.start_task(ORIGIN, skill="echo", text="hi")  # the contract pinned
        changed = _offering_extended()
        # Another security scheme defined (none required): another contract (R3).
        changed["securitySchemes"] = {
            "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
        }
        agent.card = changed
        agent.requests.clear()
        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(ORIGIN, skill="translate", text="hi")
        assert agent.requests == []  # no extended read: it would carry credentials
        assert str(refused.value) == (
            f"{ORIGIN}: skill 'translate' is absent from the card (offered: echo); the extended "
            "card could not be read (the contract changed and is not accepted: no credentials "
            "were sent) (nothing was sent)"
        )
        view = await engine.start_task(ORIGIN, skill="translate", text="hi", accept_contract=True)
    assert agent.methods() == ["GetExtendedAgentCard", "SendMessage"]
    assert _first(store, view.task)["extended"] is True


async def test_an_engine_allowing_plain_http_reads_the_extended_card_over_it_too(
    store: EventStore,
) -> None:
    plain = "http://agent.example"
    public, extended = _offering_extended(), _extended_card()
    for card in (public, extended):
        card["supportedInterfaces"][0]["url"] = f"{plain}/a2a"
    agent = ScriptedAgent(card=public, answers=_serving_extended(extended))
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
    agent = ScriptedAgent(card=public, answers=_serving_extended(extended))
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"bearer": Bearer("tok")}}))
    async with engine_on(store, agent.transport(), config) as engine:
        view = await engine.start_task(ORIGIN, skill="translate", text="hi")
    asked = agent.requests[0]
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
    agent = RestAgent(public, extended)
    config = EngineConfig(prefer_bindings=("HTTP+JSON",))
    async with engine_on(store, agent.transport(), config) as engine:
        await engine.start_task(ORIGIN, skill="translate", text="hi")
    assert agent.paths[1:] == ["GET /rest/extendedAgentCard", "POST /rest/message:send"]


async def test_the_extended_read_is_recorded_naming_the_public_card_and_its_transport_let_go(
    store: EventStore,
) -> None:
    public, extended = _secured(_offering_extended()), _secured(_extended_card())
    agent = ScriptedAgent(card=public, answers=_serving_extended(extended))
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
    agent = ScriptedAgent(card=public, answers=_serving_extended(_extended_card()))
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError) as refused:
            await engine.start_task(ORIGIN, skill="summarise", text="hi")
    assert str(refused.value) == (
        f"{ORIGIN}: skill 'summarise' is absent from the card (offered: echo, translate) "
        "(nothing was sent)"
    )


async def test_a_task_started_without_a_media_type_is_plain_text(store: EventStore) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
    assert _first(store, view.task)["parts"][0]["media_type"] == "text/plain"
    (part,) = json.loads(agent.requests[0].content)["params"]["message"]["parts"]
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


# --------------------------------------------------------------------------------------------------
# A creation refused (R2, R3, R15) is recorded in the agent's stream -- why, the skill asked for,
# when, and for a re-send the task -- and nothing is sent. When the agent's record cannot take the
# refusal (altered in the store, an agent URL that is no URL), the caller gets the refusal it was
# going to get all the same.


def _unanswered(call: dict[str, Any]) -> httpx.Response:
    raise AssertionError(f"nothing may be sent: {call['method']}")


def _agent_events(store: EventStore) -> list[RecordedEvent]:
    return store.read_stream(ev.agent_stream_id(ORIGIN))


async def test_a_refused_creation_records_why_the_skill_and_when_and_sends_nothing(
    store: EventStore,
) -> None:
    before = datetime.now(UTC)
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError):
            await engine.start_task(ORIGIN, skill="translate", text="hi")
    after = datetime.now(UTC)
    refused = _agent_events(store)[-1]
    assert refused.type == ev.TASK_CREATION_REFUSED
    assert set(refused.data) == {"reason", "detail", "skill", "at"}  # no task: none was made
    assert (refused.data["reason"], refused.data["skill"]) == ("skill_absent", "translate")
    assert refused.data["detail"] == "is absent from the card (offered: echo)"
    assert before <= datetime.fromisoformat(refused.data["at"]) <= after
    assert agent.methods() == []


async def test_a_refused_resend_names_the_task_it_would_have_sent(store: EventStore) -> None:
    refusing = ScriptedAgent(lambda call: httpx.Response(503)).transport()
    async with engine_on(store, refusing) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        state = await engine.records.state(view.task)
    withdrawn = card_document()
    withdrawn["skills"][0]["id"] = "translate"
    agent = ScriptedAgent(card=withdrawn)
    async with engine_on(store, agent.transport()) as engine:
        message = submitted_message(TaskLog(store).first_event(view.task))
        assert message.parts == (Text("hi"),)
        with pytest.raises(SkillUnavailableError):
            await engine.creation.resend_gate(view.task, state, message)
    refused = _agent_events(store)[-1]
    assert refused.type == ev.TASK_CREATION_REFUSED
    assert (refused.data["task"], refused.data["skill"]) == (view.task, "echo")
    assert agent.methods() == []


async def test_a_creation_no_credential_covers_is_recorded_as_credentials_missing(
    store: EventStore,
) -> None:
    secured = card_document()
    secured["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    secured["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    agent = ScriptedAgent(card=secured)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(CredentialsMissingError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    missing = _agent_events(store)[-1]
    assert missing.type == ev.CREDENTIALS_MISSING
    assert (missing.data["reason"], missing.data["skill"]) == ("credentials_missing", "echo")
    assert missing.data["detail"] == str(raised.value)
    assert agent.methods() == []


async def test_a_creation_whose_token_cannot_be_had_is_refused_before_anything_is_sent(
    store: EventStore,
) -> None:
    token_url = f"http://127.0.0.1:{closed_port()}/token"
    secured = card_document()
    flows = {"clientCredentials": {"tokenUrl": token_url, "scopes": {}}}
    secured["securitySchemes"] = {"oauth": {"oauth2SecurityScheme": {"flows": flows}}}
    secured["securityRequirements"] = [{"schemes": {"oauth": {"list": []}}}]
    client = OAuthClient("cf-client", "cf-client-secret")
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"oauth": client}}))
    agent = ScriptedAgent(card=secured)
    async with engine_on(store, agent.transport(), config) as engine:
        with pytest.raises(TokenRequestError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    assert raised.value.url == token_url
    unusable = _agent_events(store)[-1]
    assert unusable.type == ev.TASK_CREATION_REFUSED
    assert {k: unusable.data[k] for k in ("reason", "detail", "skill")} == {
        "reason": "credentials_unusable",
        "detail": str(raised.value),
        "skill": "echo",
    }
    assert agent.methods() == []  # no send without its token
    assert store.streams(category=ev.TASK_CATEGORY) == []


async def test_a_refusal_the_agents_altered_record_cannot_take_still_refuses_as_it_would(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent(_unanswered).transport()) as engine:
        with pytest.raises(SkillUnavailableError):  # the record is made by this first read
            await engine.start_task(ORIGIN, skill="translate", text="hi")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :s"),
            {"s": ev.agent_stream_id(ORIGIN)},
        )
    async with engine_on(store, ScriptedAgent(_unanswered).transport()) as engine:
        with pytest.raises(DiscoveryError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    assert raised.value.kind == "record"
    assert raised.value.consequence == "nothing was sent"


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("ftp://agent.example", "not an http(s) URL with a host"),
        ("https://agent.example:99999", "its port is not a number from 1 to 65535"),
        ("https://svc:PASS@agent.example", "it carries credentials (user:password@): give them "
         "in the credentials file instead"),
    ],
)  # fmt: skip
async def test_an_agent_url_that_is_no_url_is_a_usage_error_and_nothing_recorded_or_sent(
    store: EventStore, url: str, fault: str
) -> None:
    async with engine_on(store, ScriptedAgent(_unanswered).transport()) as engine:
        with pytest.raises(UsageError) as raised:
            await engine.start_task(url, skill="echo", text="hi")
    shown = url.replace("svc:PASS@", "")
    assert str(raised.value).startswith(f"agent URL {shown!r}: {fault}")
    assert store.streams() == []


async def test_a_creation_whose_card_cannot_be_read_is_refused_naming_the_read(
    store: EventStore,
) -> None:
    def unavailable(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503 if request.method == "GET" else 500)

    async with engine_on(store, httpx.MockTransport(unavailable)) as engine:
        with pytest.raises(DiscoveryError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    refused = _agent_events(store)[-1]
    assert refused.type == ev.TASK_CREATION_REFUSED
    assert {k: refused.data[k] for k in ("reason", "detail", "skill")} == {
        "reason": "discovery_failed",
        "detail": str(raised.value),
        "skill": "echo",
    }
    assert raised.value.consequence == "nothing was sent"


async def test_a_card_requiring_an_extension_not_activated_refuses_naming_it(
    store: EventStore,
) -> None:
    requiring = card_document()
    requiring["capabilities"]["extensions"] = [
        {"uri": "urn:ext:needed", "required": True},
        {"uri": "urn:ext:optional"},
    ]
    agent = ScriptedAgent(card=requiring)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(ExtensionRequiredError) as raised:
            await engine.start_task(
                ORIGIN, skill="echo", text="hi", extensions=["urn:ext:optional"]
            )
    assert (raised.value.agent, raised.value.uris) == (ORIGIN, ("urn:ext:needed",))
    refused = _agent_events(store)[-1]
    assert (refused.data["reason"], refused.data["detail"]) == (
        "extension_required",
        "urn:ext:needed",
    )
    assert agent.methods() == []


async def test_a_card_requiring_an_extension_activated_creates_the_task(store: EventStore) -> None:
    requiring = card_document()
    requiring["capabilities"]["extensions"] = [{"uri": "urn:ext:needed", "required": True}]
    agent = ScriptedAgent(card=requiring)
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="hi", extensions=["urn:ext:needed"]
        )
    assert view.remote_task_id == "r-1"
    assert agent.methods() == ["SendMessage"]


async def test_a_card_with_no_interface_the_engine_speaks_is_refused_and_recorded(
    store: EventStore,
) -> None:
    foreign = card_document()
    foreign["supportedInterfaces"] = [
        {"url": f"{ORIGIN}/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    ]
    agent = ScriptedAgent(card=foreign)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(CardInvalidError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    assert raised.value.consequence == "nothing was sent"
    assert str(raised.value).endswith("(nothing was sent)")
    refused = _agent_events(store)[-1]
    assert {k: refused.data[k] for k in ("reason", "detail", "skill")} == {
        "reason": "CardInvalidError",
        "detail": str(raised.value),
        "skill": "echo",
    }
    assert agent.methods() == []


async def test_a_contract_changed_and_not_accepted_is_refused_and_recorded(
    store: EventStore,
) -> None:
    async with engine_on(
        store, ScriptedAgent(lambda call: httpx.Response(503)).transport()
    ) as engine:
        await engine.start_task(ORIGIN, skill="echo", text="hi")  # pins the contract
    changed = card_document()
    changed["securitySchemes"] = {
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
    }
    agent = ScriptedAgent(card=changed)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(ContractChangedError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    refused = _agent_events(store)[-1]
    assert {k: refused.data[k] for k in ("reason", "detail", "skill")} == {
        "reason": "ContractChangedError",
        "detail": str(raised.value),
        "skill": "echo",
    }
    assert agent.methods() == []


# --------------------------------------------------------------------------------------------------
# Webhook registration (R4, R15, R16), the second of the two things card state may gate: what is
# asked of the agent, what is recorded, and every way it ends with the task on polling -- a URL that
# would carry the task in clear text, a card read that fails or says no push, the agent refusing --
# each with nothing registered and the task untouched.


HOOK = "https://hooks.example/w"


def _pushing(version: str = "1.0") -> dict[str, Any]:
    document = card_document()
    document["capabilities"]["pushNotifications"] = True
    document["supportedInterfaces"][0]["protocolVersion"] = version
    return document


async def _task(engine: Engine) -> str:
    return (await engine.start_task(ORIGIN, skill="echo", text="hi")).task


def _last(store: EventStore, key: str) -> Any:
    return store.read_stream(f"task:{key}")[-1]


# -- registered ------------------------------------------------------------------------------------


async def test_a_webhook_is_registered_with_a_token_and_a_bearer_secret_of_its_own(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(card=_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        reads = agent.count("card")
        outcome = await engine.register_webhook(key, HOOK)
        state = await engine.records.state(key)
    assert agent.count("card") == reads + 1  # a read made for this registration (R4)
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
    agent = ScriptedAgent(card=_pushing())
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
    agent = ScriptedAgent(card=_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, HOOK, auth_scheme="Bearer")
    assert outcome.authorization is None
    assert agent.calls[-1]["params"]["authentication"] == {"scheme": "Bearer"}
    assert _last(store, key).data["auth_sha256"] is None


async def test_a_task_at_an_a2a_0_3_endpoint_registers_the_token_alone(store: EventStore) -> None:
    agent = ScriptedAgent(card=_pushing("0.3"))
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
    agent = ScriptedAgent(card=_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        reads, calls = agent.count("card"), len(agent.calls)
        outcome = await engine.register_webhook(key, "http://hooks.example/w")
        state = await engine.records.state(key)
    detail = (
        "webhook URL http://hooks.example/w: plain http to a non-loopback host refused "
        "(https required); nothing was registered"
    )
    assert (outcome.registered, outcome.reason, outcome.detail) == (False, "insecure_url", detail)
    assert (outcome.config_id, outcome.token, outcome.authorization) == (None, None, None)
    assert (agent.count("card"), len(agent.calls)) == (reads, calls)  # nothing asked of the agent
    _downgraded(store, key, "insecure_url", detail)
    assert state["delivery_mode"] == "polling"
    assert state["state"] == "submitted"  # the task itself untouched


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/w", "http://localhost/w"])
async def test_a_plain_http_webhook_on_loopback_is_registered(store: EventStore, url: str) -> None:
    agent = ScriptedAgent(card=_pushing())
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
    agent = ScriptedAgent(card=_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        recorded, reads = len(store.read_stream(f"task:{key}")), agent.count("card")
        with pytest.raises(UsageError) as raised:
            await engine.register_webhook(key, url)
    shown = url.replace("hook:PASS@", "")
    assert str(raised.value) == (
        f"webhook URL {shown!r}: {fault}; nothing was recorded or registered"
    )
    assert len(store.read_stream(f"task:{key}")) == recorded
    assert (agent.methods(), agent.count("card")) == (["SendMessage"], reads)


async def test_an_engine_allowing_insecure_urls_registers_plain_http_anywhere(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(card=_pushing())
    config = EngineConfig(card_limits=CardLimits(allow_insecure=True))
    async with engine_on(store, agent.transport(), config) as engine:
        key = await _task(engine)
        outcome = await engine.register_webhook(key, "http://hooks.example/w")
    assert outcome.registered


async def test_a_card_that_says_no_push_registers_nothing(store: EventStore) -> None:
    document = card_document()
    agent = ScriptedAgent(card=document)
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
    agent = ScriptedAgent(card=_pushing())
    async with engine_on(store, agent.transport()) as engine:
        key = await _task(engine)
        agent.card = card_document()  # read at creation with push; now without
        outcome = await engine.register_webhook(key, HOOK)
    assert (outcome.registered, outcome.reason) == (False, "push_not_advertised")
    assert agent.methods() == ["SendMessage"]


async def test_a_card_read_that_fails_registers_nothing_and_says_why(store: EventStore) -> None:
    agent = ScriptedAgent(card=_pushing())
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
    agent = ScriptedAgent(card=_pushing(), push=refused)
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
    agent = ScriptedAgent(card=_pushing(), push=lambda call: httpx.Response(401))
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
    agent = ScriptedAgent(card=_pushing(), send=lambda call: httpx.Response(503))
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


# --------------------------------------------------------------------------------------------------
# A message of any parts (R2 on each), its metadata, a conversation continued, referenced tasks,
# the output modes accepted, a skill left out, and the bound on a message.

PDF = File(data=b"%PDF-1.7\x00\xff", filename="a.pdf")
FORM = Data({"answer": "yes"})


def _open_card(**skill_fields: Any) -> dict[str, Any]:
    """The card with its one skill taking any input (``*/*``), ``skill_fields`` added."""
    card = card_document()
    card["skills"][0].update(inputModes=["*/*"], **skill_fields)
    return card


async def test_a_message_of_parts_is_recorded_out_of_line_and_sent_in_order_with_its_metadata(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(card=_open_card())
    async with engine_on(store, agent.transport()) as engine:
        view = await engine.start_task(
            ORIGIN, text="read this", parts=[PDF, FORM], metadata={"trace": "t-1"}, key="k-1"
        )
    stored = _first(store, "k-1")
    assert "metadata" not in stored  # R17: the message's metadata is content, out of line
    assert all(set(p) == {"kind", "media_type", "size", "sha256"} for p in stored["parts"])
    data = _sent(store, "k-1")
    assert data["parts"] == recorded_parts([Text("read this"), PDF, FORM])
    assert data["metadata"] == {"trace": "t-1"}
    assert "text" not in data
    assert "media_type" not in data
    assert not {"references", "referenced_tasks", "accepted_output_modes"} & set(data)
    assert (view.skill, view.references) == ("echo", ())  # the card's one skill
    message = agent.calls[0]["params"]["message"]
    assert message["parts"] == [
        {"text": "read this", "mediaType": "text/plain"},
        {"raw": "JVBERi0xLjcA/w==", "filename": "a.pdf", "mediaType": "application/pdf"},
        {"data": {"answer": "yes"}, "mediaType": "application/json"},
    ]
    assert message["metadata"] == {"trace": "t-1", "skillId": "echo"}
    assert "referenceTaskIds" not in message
    assert "acceptedOutputModes" not in agent.calls[0]["params"]["configuration"]


async def test_a_part_the_skill_does_not_take_refuses_the_creation_recording_only_the_refusal(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()  # its skill takes text/plain only
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError, match="does not accept application/pdf"):
            await engine.start_task(ORIGIN, skill="echo", text="read this", parts=[PDF])
    assert agent.methods() == []
    assert [s for s in store.stream_ids() if s.startswith("task:")] == []
    refused = _agent_events(store)[-1]
    assert (refused.type, refused.data["reason"]) == (
        ev.TASK_CREATION_REFUSED,
        "media_type_not_accepted",
    )


async def test_accepted_output_modes_the_skill_produces_none_of_refuse_the_creation(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()  # its skill produces text/plain
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError, match="produces none of image/png"):
            await engine.start_task(ORIGIN, skill="echo", text="hi", accept=["image/png"])
        refused = _agent_events(store)[-1]
        view = await engine.start_task(ORIGIN, text="hi", accept=["text/*", "image/png"])
    assert (refused.type, refused.data["reason"]) == (
        ev.TASK_CREATION_REFUSED,
        "output_mode_not_accepted",
    )
    (call,) = agent.calls
    assert call["params"]["configuration"]["acceptedOutputModes"] == ["text/*", "image/png"]
    assert _first(store, view.task)["accepted_output_modes"] == ["text/*", "image/png"]


@pytest.mark.parametrize("mode", ["image", "", "text/plain x", "/png"])
async def test_an_accepted_mode_that_is_no_media_range_is_the_callers_error(
    store: EventStore, mode: str
) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(UsageError, match="is not a media type or range"):
            await engine.start_task(ORIGIN, text="hi", accept=[mode])
    assert (agent.asked, store.stream_ids()) == ([], [])


async def test_a_skill_left_out_of_a_card_offering_several_is_refused_naming_them(
    store: EventStore,
) -> None:
    card = card_document()
    card["skills"].append(dict(card["skills"][0], id="ask"))
    agent = ScriptedAgent(card=card)
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(SkillUnavailableError, match="was not named, and the card offers 2"):
            await engine.start_task(ORIGIN, text="hi")
    refused = _agent_events(store)[-1]
    assert (refused.data["reason"], refused.data["skill"]) == ("skill_absent", "")
    assert agent.methods() == []


async def test_a_message_without_parts_or_over_the_bound_is_refused_before_anything_is_read(
    store: EventStore,
) -> None:
    agent = ScriptedAgent(card=_open_card())
    config = EngineConfig(max_message_bytes=1000)
    async with engine_on(store, agent.transport(), config) as engine:
        with pytest.raises(UsageError, match="at least one part"):
            await engine.start_task(ORIGIN, skill="echo")
        with pytest.raises(MessageTooLargeError, match="over the bound of 1000"):
            await engine.start_task(ORIGIN, skill="echo", parts=[File(data=b"x" * 800)])
        with pytest.raises(UsageError, match="the metadata must be a JSON object"):
            await engine.start_task(ORIGIN, text="hi", metadata=["x"])  # type: ignore[arg-type]
        await engine.start_task(ORIGIN, skill="echo", parts=[File(data=b"x" * 500)])
    assert agent.asked == ["card", "SendMessage"]  # the last one only


async def test_a_task_continues_the_conversation_of_an_earlier_one_in_its_context(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        first = await engine.start_task(ORIGIN, text="one", key="k-1")
        second = await engine.start_task(ORIGIN, text="two", context="k-1", key="k-2")
    one, two = (call["params"]["message"] for call in agent.calls)
    assert first.context_id == "c-1"  # the context the agent bound the first task to
    assert two["contextId"] == "c-1"
    assert _first(store, "k-2")["context_id"] == "c-1"
    assert _first(store, "k-2")["context_task"] == "k-1"
    assert one["contextId"] != "c-1"
    assert second.context_id == "c-1"


async def test_a_context_at_another_agent_is_the_callers_error_nothing_recorded_or_sent(
    store: EventStore,
) -> None:
    agent = ScriptedAgent()
    async with engine_on(store, agent.transport()) as engine:
        await engine.start_task(ORIGIN, text="one", key="k-1")
        before = store.last_position()
        with pytest.raises(UsageError, match="a conversation goes on at one agent"):
            await engine.start_task("https://other.example", text="two", context="k-1")
        with pytest.raises(UsageError):
            await engine.start_task(ORIGIN, text="two", context="no-such-task")
    assert store.last_position() == before
    assert agent.methods() == ["SendMessage"]


async def test_referenced_tasks_are_sent_by_their_remote_ids_and_kept_by_their_keys(
    db_url: str,
) -> None:
    with EventStore.open(db_url) as store:
        async with engine_on(store, ScriptedAgent().transport()) as engine:
            await engine.start_task(ORIGIN, text="one", key="k-1")  # bound to r-1
        refused = ScriptedAgent(send=lambda call: httpx.Response(500))
        async with engine_on(store, refused.transport()) as engine:
            with pytest.raises(EndpointUnreachableError):
                await engine.start_task(ORIGIN, text="lost", key="k-0")  # no remote id
        agent = ScriptedAgent()
        async with engine_on(store, agent.transport()) as engine:
            before = store.last_position()
            with pytest.raises(UsageError, match="k-0 has no remote task id yet"):
                await engine.start_task(ORIGIN, text="two", references=["k-1", "k-0"])
            assert store.last_position() == before
            view = await engine.start_task(ORIGIN, text="two", references=["k-1", "k-1"])
        data = _first(store, view.task)
    assert agent.calls[0]["params"]["message"]["referenceTaskIds"] == ["r-1"]
    assert (data["references"], data["referenced_tasks"]) == (["r-1"], ["k-1"])
    assert view.references == ("k-1",)
    assert view.to_json()["references"] == ["k-1"]


async def test_resume_sends_again_the_same_parts_metadata_references_and_modes(
    store: EventStore,
) -> None:
    async with engine_on(store, ScriptedAgent().transport()) as engine:
        await engine.start_task(ORIGIN, text="one", key="k-0")  # bound to r-1
    agent, sent = _lost_creation()  # the send's answer lost, nothing found in its context
    agent.card = _open_card()
    async with engine_on(store, agent.transport()) as engine:
        with pytest.raises(EndpointUnreachableError):
            await engine.start_task(
                ORIGIN, parts=[PDF, FORM], metadata={"m": 1}, references=["k-0"],
                accept=["text/plain"], key="k-1",
            )  # fmt: skip
        resumed = await engine.resume("k-1")
    first, again = sent
    assert resumed.remote_task_id == "r-2"
    assert again == first  # the same messageId, parts, metadata and references
    assert first["referenceTaskIds"] == ["r-1"]
    assert [p.get("filename") for p in first["parts"]] == ["a.pdf", None]
    sends = [call for call in agent.calls if call["method"] == "SendMessage"]
    assert [c["params"]["configuration"]["acceptedOutputModes"] for c in sends] == [
        ["text/plain"],
        ["text/plain"],
    ]
