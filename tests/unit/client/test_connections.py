"""The card a live task is compared with (R7's re-validation, R9's check on resume): the public
card, or for a task created under the authenticated extended card that card read again with the
task's own transport and credentials (R15), kept in memory per endpoint and grant, and the public
card standing in -- with why -- when it cannot be read.

The agent (``support.mocked.RestAgent``) answers the public card, ``GetExtendedAgentCard``
(HTTP+JSON: ``GET {url}/extendedAgentCard``, which is not the endpoint's own URL) and
``SendMessage``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import make_tls
from support.cards import ORIGIN, card_document
from support.mocked import RestAgent, ScriptedAgent, engine_on, rpc_result, task_answer

from cardfence.engine.auth.authorization import Authorizer
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import agent_stream_id
from cardfence.engine.errors import CredentialsConfigError, CredentialsMissingError, DiscoveryError
from cardfence.store.event_store import EventStore

ENDPOINT = f"{ORIGIN}/api"
EXTENDED_URL = f"{ENDPOINT}/extendedAgentCard"


def _public(*, offers_extended: bool = True) -> dict[str, Any]:
    card = card_document()
    card["supportedInterfaces"] = [
        {"url": ENDPOINT, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}
    ]
    card["capabilities"]["extendedAgentCard"] = offers_extended
    return card


def _extended() -> dict[str, Any]:
    card = _public()
    card["version"] = "1.1.0"  # the extended card's own
    card["skills"].append(
        {"id": "translate", "name": "Translate", "description": "Translates.", "tags": ["t"]}
    )
    return card


def _agent(*, offers_extended: bool = True) -> RestAgent:
    return RestAgent(_public(offers_extended=offers_extended), _extended())


async def _extended_task(engine: Engine) -> dict[str, Any]:
    """The state of a task created under the extended card (its skill is on no other card)."""
    view = await engine.start_task(ORIGIN, skill="translate", text="hi")
    state = await engine.records.state(view.task)
    assert state["extended"]
    return state


def _read_args(engine: Engine) -> list[tuple[str, bool, bool]]:
    """From now on, record the ``(agent_url, fresh, share)`` of each public card read."""
    asked: list[tuple[str, bool, bool]] = []
    real = engine.discovery.read

    async def read(agent_url: str, *, fresh: bool = True, share: bool = False) -> Any:
        asked.append((agent_url, fresh, share))
        return await real(agent_url, fresh=fresh, share=share)

    engine.discovery.read = read  # type: ignore[method-assign]
    return asked


async def test_an_extended_task_is_compared_with_the_extended_card_read_again(
    store: EventStore,
) -> None:
    agent = _agent()
    async with engine_on(store, agent.transport()) as engine:
        state = await _extended_task(engine)
        before = list(agent.asked)
        public_reads = _read_args(engine)
        card, failure, unread = await engine.connections.task_card(state, fresh=True)
    assert card is not None
    assert (card.version, failure, unread) == ("1.1.0", None, None)
    assert [skill.id for skill in card.skills] == ["echo", "translate"]
    assert agent.asked[len(before) :] == ["extended"]
    assert public_reads == []
    # The read is recorded as a read of the extended card the task's public card offered.
    read = store.read_stream(agent_stream_id(ORIGIN))[-1]
    assert (read.type, read.data["url"], read.data["revision"]) == (
        ev.CARD_FETCHED, EXTENDED_URL, card.revision
    )  # fmt: skip
    assert read.data["extended"] is True
    assert read.data["public_revision"] == state["public_revision"] != card.revision


async def test_a_task_of_the_public_card_is_compared_with_the_public_card_as_asked(
    store: EventStore,
) -> None:
    agent = _agent(offers_extended=False)
    async with engine_on(store, agent.transport()) as engine:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        state = await engine.records.state(key)
        assert not state.get("extended")
        public_reads = _read_args(engine)
        for fresh, share in ((True, False), (False, True)):
            card, failure, unread = await engine.connections.task_card(
                state, fresh=fresh, share=share
            )
            assert card is not None
            assert (card.version, failure, unread) == ("1.0.0", None, None)
        await engine.connections.task_card(state, fresh=False)  # not shared unless asked
    assert public_reads == [(ORIGIN, True, False), (ORIGIN, False, True), (ORIGIN, False, False)]
    assert agent.count("extended") == 0


async def test_an_extended_read_not_fresh_is_kept_per_endpoint_tenant_and_authorization(
    store: EventStore,
) -> None:
    agent = _agent()
    async with engine_on(store, agent.transport()) as engine:
        state = await _extended_task(engine)
        asked = agent.count("extended")
        await engine.connections.task_card(state, fresh=False)
        await engine.connections.task_card(dict(state), fresh=False)
        assert agent.count("extended") == asked + 1  # the second from memory

        # Another tenant, or another authorization recorded, is another reader: read again.
        for n, tenant in enumerate(("t-2", "t-3"), start=2):
            other = {**state, "endpoint": {**state["endpoint"], "tenant": tenant}}
            await engine.connections.task_card(other, fresh=False)
            assert agent.count("extended") == asked + n
        authorized = {**state, "authorization": {"schemes": [], "other": "grant"}}
        await engine.connections.task_card(authorized, fresh=False)
        assert agent.count("extended") == asked + 4

        # Asked fresh, it is read again whatever memory holds.
        await engine.connections.task_card(state, fresh=True)
        assert agent.count("extended") == asked + 5


@pytest.mark.parametrize(
    ("fresh", "share"), [(True, False), (False, True)], ids=["fresh", "shared"]
)
async def test_a_refused_extended_read_lets_the_public_card_stand_in_and_says_why(
    store: EventStore, fresh: bool, share: bool
) -> None:
    agent = _agent()
    async with engine_on(store, agent.transport()) as engine:
        state = await _extended_task(engine)
        agent.extended = 500
        public_reads = _read_args(engine)
        card, failure, unread = await engine.connections.task_card(state, fresh=fresh, share=share)
    assert card is not None
    assert (card.version, failure) == ("1.0.0", None)
    assert public_reads == [(ORIGIN, fresh, share)]
    assert isinstance(unread, DiscoveryError)
    assert (unread.url, unread.kind) == (EXTENDED_URL, "extended_card")
    assert unread.detail.startswith("EndpointUnreachableError: ")
    assert "HTTP 500" in unread.detail


async def test_an_extended_read_that_cannot_be_asked_names_the_tasks_endpoint(
    store: EventStore,
) -> None:
    agent = _agent()
    async with engine_on(store, agent.transport()) as engine:
        state = await _extended_task(engine)
        asked = len(agent.asked)
        # Credentials recorded for a frozen card the store no longer holds: the transport
        # refuses to choose them anew, before any request (the failure names no URL).
        lost = {**state, "authorization": {"schemes": ["key"]}, "card_revision": "0" * 64}
        card, failure, unread = await engine.connections.task_card(lost, fresh=True)
    assert card is not None
    assert (card.version, failure) == ("1.0.0", None)
    assert agent.asked[asked:] == ["card"]
    assert isinstance(unread, DiscoveryError)
    assert (unread.url, unread.kind) == (ENDPOINT, "extended_card")
    assert unread.detail.startswith("CredentialsMissingError: ")
    assert "is not in the store" in unread.detail


async def test_when_neither_card_can_be_read_both_failures_are_given(store: EventStore) -> None:
    agent = _agent()
    async with engine_on(store, agent.transport()) as engine:
        state = await _extended_task(engine)
        agent.extended, agent.public = 403, 503
        card, failure, unread = await engine.connections.task_card(state, fresh=True)
    assert card is None
    assert isinstance(failure, DiscoveryError)
    assert (failure.url, failure.detail) == (f"{ORIGIN}/.well-known/agent-card.json", "503")
    assert isinstance(unread, DiscoveryError)
    assert (unread.url, unread.kind) == (EXTENDED_URL, "extended_card")
    assert unread.detail.startswith("AuthorizationFailedError: ")


# --------------------------------------------------------------------------------------------------
# The transport each later request of a task goes by (polls, replies, cancels, the extended card
# read again): to its recorded endpoint, naming the extensions it activated at creation, and
# carrying only the credentials its frozen contract grants (R15) -- worked out once per frozen card
# and recorded grant, and never chosen anew when that card is gone from the store.


def _tracing_agent() -> ScriptedAgent:
    """The card of ``support.cards`` offering ``urn:ext:trace``; SendMessage creates ``r-1``,
    GetTask finds it working."""
    card = card_document()
    card["capabilities"]["extensions"] = [{"uri": "urn:ext:trace"}]
    return ScriptedAgent(lambda call: rpc_result(call, task_answer("working")), card=card)


async def _task(engine: Engine, **options: Any) -> dict[str, Any]:
    view = await engine.start_task(ORIGIN, skill="echo", text="hi", **options)
    return await engine.records.state(view.task)


async def test_every_later_request_of_a_task_names_the_extensions_it_activated(
    store: EventStore,
) -> None:
    agent = _tracing_agent()
    async with engine_on(store, agent.transport()) as engine:
        activated = await _task(engine, extensions=["urn:ext:trace"])
        plain = await _task(engine)
        await engine.poll(activated["task"])
        await engine.poll(plain["task"])
    sent = [
        (m, r.headers.get("A2A-Extensions"))
        for m, r in zip(agent.methods(), agent.requests, strict=True)
    ]
    assert sent == [
        ("SendMessage", "urn:ext:trace"),
        ("SendMessage", None),
        ("GetTask", "urn:ext:trace"),
        ("GetTask", None),
    ]


async def test_a_task_recorded_without_a_grant_is_asked_with_no_credentials(
    store: EventStore,
) -> None:
    async with engine_on(store, _tracing_agent().transport()) as engine:
        state = await _task(engine)
        for recorded in (None, {"origin": ORIGIN, "schemes": []}):
            transport = await engine.connections.task_transport(
                {**state, "authorization": recorded}
            )
            assert transport.credentials is None


async def test_the_grant_of_a_frozen_card_is_worked_out_once_per_recorded_grant(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    regranted: list[dict[str, Any]] = []
    real = Authorizer.regrant

    def counted(card: Any, recorded: dict[str, Any]) -> Any:
        regranted.append(recorded)
        return real(card, recorded)

    monkeypatch.setattr(Authorizer, "regrant", staticmethod(counted))
    async with engine_on(store, _tracing_agent().transport()) as engine:
        state = await _task(engine)
        one = {**state, "authorization": {"origin": ORIGIN, "schemes": ["a"], "scopes": {}}}
        other = {**state, "authorization": {"origin": ORIGIN, "schemes": ["b"], "scopes": {}}}
        first = await engine.connections.task_transport(one)
        again = await engine.connections.task_transport(one)
        another = await engine.connections.task_transport(other)
        extended = await engine.connections.task_transport({**one, "extensions": ["urn:ext:trace"]})
    assert regranted == [one["authorization"], other["authorization"]]
    assert extended.credentials is not None
    assert extended.credentials.grant is first.credentials.grant  # type: ignore[union-attr]
    assert extended._headers.get("A2A-Extensions") == "urn:ext:trace"
    assert first._headers.get("A2A-Extensions") is None
    assert first is again
    assert first.credentials is not None
    assert another.credentials is not None
    assert first.credentials.grant is not another.credentials.grant


async def test_credentials_are_never_chosen_anew_when_the_frozen_card_is_gone(
    store: EventStore,
) -> None:
    async with engine_on(store, _tracing_agent().transport()) as engine:
        state = await _task(engine)
        lost = {**state, "authorization": {"schemes": ["key"]}, "card_revision": "0" * 64}
        with pytest.raises(CredentialsMissingError) as refused:
            await engine.connections.task_transport(lost)
    assert (refused.value.agent, refused.value.skill) == (ORIGIN, "echo")
    assert refused.value.needs == f"the frozen card {'0' * 12} is not in the store"
    assert str(refused.value).endswith("; nothing was sent")


REST_ENDPOINT = {"url": f"{ORIGIN}/api", "binding": "HTTP+JSON", "protocol_version": "1.0"}


class _Grant:
    """Credentials as a transport sees them: their grant, and the client certificate it needs."""

    def __init__(self, cert: tuple[str, str] | None = None) -> None:
        self.grant = object()
        self._cert = cert

    def client_cert(self) -> tuple[str, str] | None:
        return self._cert


async def test_one_transport_is_kept_per_endpoint_tenant_and_grant(store: EventStore) -> None:
    config = EngineConfig(request_timeout=2.5)
    async with engine_on(store, _tracing_agent().transport(), config) as engine:
        plain = engine.connections.transport(REST_ENDPOINT)
        assert engine.connections.transport(dict(REST_ENDPOINT)) is plain
        tenant = engine.connections.transport({**REST_ENDPOINT, "tenant": "t-1"})
        one, other = _Grant(), _Grant()
        granted = engine.connections.transport(REST_ENDPOINT, one)  # type: ignore[arg-type]
        assert engine.connections.transport(REST_ENDPOINT, one) is granted  # type: ignore[arg-type]
        another = engine.connections.transport(REST_ENDPOINT, other)  # type: ignore[arg-type]
        passing = {**REST_ENDPOINT, "tenant": "once"}
        once = engine.connections.transport(passing, keep=False)  # for one request: not kept
        twice = engine.connections.transport(passing, keep=False)
    assert len({id(t) for t in (plain, tenant, granted, another, once, twice)}) == 6
    assert (plain.interface.tenant, tenant.interface.tenant) == ("", "t-1")
    assert (plain.credentials, granted.credentials, another.credentials) == (None, one, other)
    for transport in (plain, tenant, granted, once):
        assert transport.interface.url == f"{ORIGIN}/api"
        assert transport.timeout == 2.5
        assert transport.client is engine.client


async def test_every_transport_shares_the_engines_bound_on_requests_in_flight(
    store: EventStore,
) -> None:
    config = EngineConfig(requests_per_agent=1)
    in_flight, most = 0, 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        status = {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:01Z"}
        call = json.loads(request.content)
        return rpc_result(call, {"id": "r-1", "contextId": "c-1", "status": status})

    async with engine_on(store, httpx.MockTransport(handler), config) as engine:
        transports = [
            engine.connections.transport(
                {**REST_ENDPOINT, "binding": "JSONRPC", "tenant": f"t-{n}"}
            )
            for n in range(3)
        ]
        await asyncio.gather(*(t.get_task("r-1") for t in transports))
    assert most == 1


async def test_a_grant_that_needs_a_client_certificate_goes_by_a_client_presenting_it(
    store: EventStore, tmp_path: Path
) -> None:
    tls = make_tls(tmp_path)
    cert = (str(tls.client_cert), str(tls.client_key))
    config = EngineConfig(ca_file=str(tls.ca))
    async with engine_on(store, _tracing_agent().transport(), config) as engine:
        first = engine.connections.transport(REST_ENDPOINT, _Grant(cert))  # type: ignore[arg-type]
        again = engine.connections.transport({**REST_ENDPOINT, "tenant": "t"}, _Grant(cert))  # type: ignore[arg-type]
        assert first.client is again.client is not engine.client
        assert list(engine.connections.tls_clients) == [cert]
        # It trusts the configured authorities only, as the engine's own client does.
        context = first.client._transport._context  # type: ignore[attr-defined]
        authorities = [dict(item[0] for item in ca["subject"]) for ca in context.get_ca_certs()]
        assert [names["commonName"] for names in authorities] == ["cardfence test CA"]
        missing = (str(tmp_path / "none.pem"), str(tmp_path / "none.key"))
        with pytest.raises(CredentialsConfigError) as refused:
            engine.connections.transport(REST_ENDPOINT, _Grant(missing))  # type: ignore[arg-type]
    assert refused.value.where == "mtls"
    assert str(refused.value).startswith(f"credentials mtls: client certificate {missing[0]} ")
    assert list(engine.connections.tls_clients) == [cert]
