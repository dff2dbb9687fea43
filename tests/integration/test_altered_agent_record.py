"""An agent's record altered in the store is card state that cannot be read: it may refuse a
creation (nothing sent), and never holds up a task -- against the a2a-sdk agent, both databases.

The agent's stream holds what the engine knows of its card (validators, the pinned contract, the
revision in force). A projection of it that is not what cardfence wrote is read like a card that
cannot be: a `DiscoveryError` of kind ``record`` at creation, a `DiscoveryUnavailable` annotation
mid-task (R8), and the task goes on. (A `failed` push on such an agent: ``test_ingress``; the
driver polling such an agent's tasks to their end: ``test_driver``.)
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import Peer
from support.engine_fixtures import FAST, calls, data_of, state_of

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.errors import DiscoveryError
from cardfence.store.event_store import EventStore


def _alter_agent(db_url: str, agent: str, state: str) -> None:
    with EventStore.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE streams SET state = :state WHERE stream_id = :id"),
            {"state": state, "id": ev.agent_stream_id(agent)},
        )


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("[1]", "the stored text is an array, not a JSON object"),
        ('{"agent": "x"}', "the stored agent lacks 14 of its fields (card_url, contract_hash,"),
    ],
)
async def test_a_creation_is_refused_with_nothing_sent_when_the_agents_record_was_altered(
    peer: Peer, db_url: str, state: str, why: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as engine:
        first = await engine.start_task(peer.base_url, skill="echo", text="echo one")
        agent = state_of(engine, first.task)["agent"]
        _alter_agent(db_url, agent, state)
        sent = calls(peer, "SendMessage")
        card_reads = peer.card_requests

        with pytest.raises(DiscoveryError) as refused:
            await engine.start_task(peer.base_url, skill="echo", text="echo two")

        assert refused.value.kind == "record"
        assert f"the agent's record in the store cannot be read: stream 'agent:{agent}'" in str(
            refused.value
        )
        assert why in str(refused.value)
        assert "nothing was sent" in str(refused.value)
        assert calls(peer, "SendMessage") == sent
        assert peer.card_requests == card_reads  # the card was not read either
        assert [v.task for v in await engine.tasks()] == [first.task]


async def test_resume_on_an_agent_whose_record_was_altered_goes_on_at_the_recorded_endpoint(
    peer: Peer, db_url: str
) -> None:
    async with Engine.connect(db_url, config=FAST) as engine:
        view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
        agent = state_of(engine, view.task)["agent"]
    _alter_agent(db_url, agent, "[1]")

    async with Engine.connect(db_url, config=FAST) as engine:
        resumed = await engine.resume(view.task)
        done = await engine.drive(resumed.task, until="terminal", timeout=10)

        assert done.state == "completed"
        # The resume's, then (a slow machine's drive outlasting max_card_age) re-validations'.
        unavailable = data_of(engine.store, view.task, ev.DISCOVERY_UNAVAILABLE)
        assert unavailable[0]["during"] == "resume"
        assert {u["during"] for u in unavailable[1:]} <= {"revalidation"}
        for annotation in unavailable:
            assert annotation["kind"] == "record"
            assert annotation["detail"].startswith(
                f"the agent's record in the store cannot be read: stream 'agent:{agent}'"
            )
        assert calls(peer, "CancelTask") == 0
