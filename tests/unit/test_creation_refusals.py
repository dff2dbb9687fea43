"""A creation refused (R2, R3, R15) is recorded in the agent's stream -- why, the skill asked for,
when, and for a re-send the task -- and nothing is sent. When the agent's record cannot take the
refusal (altered in the store, an agent URL that is no URL), the caller gets the refusal it was
going to get all the same."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from support.cards import ORIGIN, card_document
from support.mocked import engine_on, submitted_task, task_agent

from cardfence.engine.auth.config import CredentialsConfig, OAuthClient
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core import events as ev
from cardfence.engine.errors import (
    CardInvalidError,
    ContractChangedError,
    CredentialsMissingError,
    DiscoveryError,
    ExtensionRequiredError,
    SkillUnavailableError,
    TokenRequestError,
    UsageError,
)
from cardfence.store.event_store import EventStore
from cardfence.store.records import RecordedEvent


def _unanswered(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"nothing may be sent: {request.method} {request.url}")


def _agent_events(store: EventStore) -> list[RecordedEvent]:
    return store.read_stream(ev.agent_stream_id(ORIGIN))


def _card_only(
    document: dict[str, Any], sent: list[str], *, created: bool = False
) -> httpx.MockTransport:
    """An agent serving ``document`` as its card; any other request is listed in ``sent`` and
    answered 500 (``created``: a send answered with a new task ``r-1``)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=document)
        call = json.loads(request.content)
        sent.append(call["method"])
        return submitted_task(call) if created else httpx.Response(500)

    return httpx.MockTransport(handler)


async def test_a_refused_creation_records_why_the_skill_and_when_and_sends_nothing(
    store: EventStore,
) -> None:
    sent: list[str] = []
    before = datetime.now(UTC)
    async with engine_on(store, _card_only(card_document(), sent)) as engine:
        with pytest.raises(SkillUnavailableError):
            await engine.start_task(ORIGIN, skill="translate", text="hi")
    after = datetime.now(UTC)
    refused = _agent_events(store)[-1]
    assert refused.type == ev.TASK_CREATION_REFUSED
    assert set(refused.data) == {"reason", "detail", "skill", "at"}  # no task: none was made
    assert (refused.data["reason"], refused.data["skill"]) == ("skill_absent", "translate")
    assert refused.data["detail"] == "is absent from the card (offered: echo)"
    assert before <= datetime.fromisoformat(refused.data["at"]) <= after
    assert sent == []


async def test_a_refused_resend_names_the_task_it_would_have_sent(store: EventStore) -> None:
    refusing = task_agent(lambda r: httpx.Response(503))
    async with engine_on(store, refusing) as engine:
        view = await engine.start_task(ORIGIN, skill="echo", text="hi")
        state = await engine.records.state(view.task)
    withdrawn = card_document()
    withdrawn["skills"][0]["id"] = "translate"
    sent: list[str] = []
    async with engine_on(store, _card_only(withdrawn, sent)) as engine:
        with pytest.raises(SkillUnavailableError):
            await engine.creation.resend_gate(view.task, state)
    refused = _agent_events(store)[-1]
    assert refused.type == ev.TASK_CREATION_REFUSED
    assert (refused.data["task"], refused.data["skill"]) == (view.task, "echo")
    assert sent == []


async def test_a_creation_no_credential_covers_is_recorded_as_credentials_missing(
    store: EventStore,
) -> None:
    secured = card_document()
    secured["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}}
    secured["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    sent: list[str] = []
    async with engine_on(store, _card_only(secured, sent)) as engine:
        with pytest.raises(CredentialsMissingError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    missing = _agent_events(store)[-1]
    assert missing.type == ev.CREDENTIALS_MISSING
    assert (missing.data["reason"], missing.data["skill"]) == ("credentials_missing", "echo")
    assert missing.data["detail"] == str(raised.value)
    assert sent == []


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_creation_whose_token_cannot_be_had_is_refused_before_anything_is_sent(
    store: EventStore,
) -> None:
    token_url = f"http://127.0.0.1:{_closed_port()}/token"
    secured = card_document()
    flows = {"clientCredentials": {"tokenUrl": token_url, "scopes": {}}}
    secured["securitySchemes"] = {"oauth": {"oauth2SecurityScheme": {"flows": flows}}}
    secured["securityRequirements"] = [{"schemes": {"oauth": {"list": []}}}]
    client = OAuthClient("cf-client", "cf-client-secret")
    config = EngineConfig(credentials=CredentialsConfig.of({ORIGIN: {"oauth": client}}))
    sent: list[str] = []
    async with engine_on(store, _card_only(secured, sent), config) as engine:
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
    assert sent == []  # no send without its token
    assert store.streams(category=ev.TASK_CATEGORY) == []


async def test_a_refusal_the_agents_altered_record_cannot_take_still_refuses_as_it_would(
    store: EventStore,
) -> None:
    async with engine_on(store, task_agent(_unanswered)) as engine:
        with pytest.raises(SkillUnavailableError):  # the record is made by this first read
            await engine.start_task(ORIGIN, skill="translate", text="hi")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = '[1]' WHERE stream_id = :s"),
            {"s": ev.agent_stream_id(ORIGIN)},
        )
    async with engine_on(store, task_agent(_unanswered)) as engine:
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
    async with engine_on(store, task_agent(_unanswered)) as engine:
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
    sent: list[str] = []
    async with engine_on(store, _card_only(requiring, sent)) as engine:
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
    assert sent == []


async def test_a_card_requiring_an_extension_activated_creates_the_task(store: EventStore) -> None:
    requiring = card_document()
    requiring["capabilities"]["extensions"] = [{"uri": "urn:ext:needed", "required": True}]
    sent: list[str] = []
    async with engine_on(store, _card_only(requiring, sent, created=True)) as engine:
        view = await engine.start_task(
            ORIGIN, skill="echo", text="hi", extensions=["urn:ext:needed"]
        )
    assert view.remote_task_id == "r-1"
    assert sent == ["SendMessage"]


async def test_a_card_with_no_interface_the_engine_speaks_is_refused_and_recorded(
    store: EventStore,
) -> None:
    foreign = card_document()
    foreign["supportedInterfaces"] = [
        {"url": f"{ORIGIN}/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    ]
    sent: list[str] = []
    async with engine_on(store, _card_only(foreign, sent)) as engine:
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
    assert sent == []


async def test_a_contract_changed_and_not_accepted_is_refused_and_recorded(
    store: EventStore,
) -> None:
    async with engine_on(store, task_agent(lambda r: httpx.Response(503))) as engine:
        await engine.start_task(ORIGIN, skill="echo", text="hi")  # pins the contract
    changed = card_document()
    changed["securitySchemes"] = {
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
    }
    sent: list[str] = []
    async with engine_on(store, _card_only(changed, sent)) as engine:
        with pytest.raises(ContractChangedError) as raised:
            await engine.start_task(ORIGIN, skill="echo", text="hi")
    refused = _agent_events(store)[-1]
    assert {k: refused.data[k] for k in ("reason", "detail", "skill")} == {
        "reason": "ContractChangedError",
        "detail": str(raised.value),
        "skill": "echo",
    }
    assert sent == []
