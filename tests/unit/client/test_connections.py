"""The card a live task is compared with (R7's re-validation, R9's check on resume): the public
card, or for a task created under the authenticated extended card that card read again with the
task's own transport and credentials (R15), kept in memory per endpoint and grant, and the public
card standing in -- with why -- when it cannot be read.

The agent is a mock transport answering the public card, ``GetExtendedAgentCard`` (HTTP+JSON:
``GET {url}/extendedAgentCard``, which is not the endpoint's own URL) and ``SendMessage``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.mocked import engine_on

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.events import agent_stream_id
from cardfence.engine.errors import DiscoveryError
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


class ExtendedAgent:
    """An agent over HTTP+JSON with an authenticated extended card: ``extended`` is the card
    document its ``GetExtendedAgentCard`` answers, or an HTTP status; ``public`` the status its
    public card is answered with. Counts what it is asked."""

    def __init__(self, *, offers_extended: bool = True) -> None:
        self.offers_extended = offers_extended
        self.extended: dict[str, Any] | int = _extended()
        self.public = 200  # the status of a public card read
        self.asked: list[str] = []

    def count(self, what: str) -> int:
        return self.asked.count(what)

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            url = str(request.url)
            if url.endswith("/extendedAgentCard"):  # under a tenant's path too
                self.asked.append("extended")
                if isinstance(self.extended, int):
                    return httpx.Response(self.extended, json={"error": "refused"})
                return httpx.Response(200, json=self.extended)
            if request.method == "GET":
                self.asked.append("card")
                return httpx.Response(
                    self.public, json=_public(offers_extended=self.offers_extended)
                )
            self.asked.append("send")
            status = {"state": "TASK_STATE_SUBMITTED", "timestamp": "2026-01-01T00:00:00Z"}
            return httpx.Response(
                200, json={"task": {"id": "r-1", "contextId": "c-1", "status": status}}
            )

        return httpx.MockTransport(handler)


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
    agent = ExtendedAgent()
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
    agent = ExtendedAgent(offers_extended=False)
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
    agent = ExtendedAgent()
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
    agent = ExtendedAgent()
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
    agent = ExtendedAgent()
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
    agent = ExtendedAgent()
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
