"""A2A extensions a card requires (``capabilities.extensions``, ``required: true``): a client
must comply with such an extension to interact with the agent. The card gates creation: a task
is created only when the caller activates every extension the card requires (it complies with
them), and the extensions it activates are named on every request of the task
(``A2A-Extensions``; 0.3: ``X-A2A-Extensions``), frozen with it. The card never gates
continuation: a card that comes to require an extension mid-task changes nothing for the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.engine_fixtures import FAST, Agent, agent_events, data_of

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.errors import ExtensionRequiredError, UsageError

URI = "https://extensions.example/trace/v1"
SENDS = ("SendMessage", "message/send")


def _requiring(uri: str) -> Any:
    def edit(card: dict[str, Any]) -> None:
        card["capabilities"]["extensions"] = [
            {"uri": "https://extensions.example/optional", "required": False},
            {"uri": uri, "description": "every request is traced", "required": True},
        ]

    return edit


async def test_a_card_requiring_an_extension_not_activated_refuses_the_task_sending_nothing(
    agent: Agent, engine: Engine
) -> None:
    agent.mutate_card(_requiring(URI))
    before = len(agent.calls)

    with pytest.raises(ExtensionRequiredError) as refused:
        await engine.start_task(agent.base_url, skill="echo", text="echo hi")

    assert refused.value.uris == (URI,)
    assert str(refused.value).endswith("(nothing was sent)")
    assert not [call for _, call in agent.calls[before:] if call in SENDS]
    assert engine.log.all() == []  # no task
    refusals = [d for t, d in agent_events(engine.store, agent) if t == ev.TASK_CREATION_REFUSED]
    assert (refusals[-1]["reason"], refusals[-1]["detail"]) == ("extension_required", URI)


async def test_the_error_names_each_required_extension_whole_whatever_its_uri_holds(
    peer: Peer, engine: Engine
) -> None:
    odd = "https://extensions.example/a, b"  # a card may say anything; the error keeps it whole
    peer.mutate_card(_requiring(odd))

    with pytest.raises(ExtensionRequiredError) as refused:
        await engine.start_task(peer.base_url, skill="echo", text="echo hi")

    assert refused.value.uris == (odd,)


async def test_an_activated_extension_is_named_on_every_request_of_the_task(
    agent: Agent, engine: Engine
) -> None:
    agent.mutate_card(_requiring(URI))
    before = len(agent.calls)

    view = await engine.start_task(agent.base_url, skill="slow", text="slow 0.2", extensions=[URI])
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    asked = agent.calls[before:]
    assert "GetTask" in [method for _, method in asked]
    # The send and every poll name it (A2A-Extensions in 1.0, X-A2A-Extensions in 0.3), and the
    # agent's own SDK read it as activated.
    assert agent.extension_headers[before:] == [URI] * len(asked)
    if isinstance(agent, Peer):
        assert agent.executor.extensions[-1] == {URI}
    else:
        assert agent.executed_extensions[-1] == [URI]
    (submitted,) = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    assert submitted["extensions"] == [URI]


async def test_a_card_that_comes_to_require_an_extension_mid_task_never_stops_it(
    peer: Peer, engine: Engine
) -> None:
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.5")
    peer.mutate_card(_requiring(URI))

    await engine.resume(view.task)
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"  # continuation is never gated by the card
    assert not data_of(engine.store, view.task, ev.TASK_ORPHANED)


@pytest.mark.parametrize(
    "named",
    ["a, b", "", "https://x.example/a b", "https://x.example/\r\nX: y", "https://x.example/é"],
)
async def test_an_extension_not_named_by_a_uri_is_a_usage_error_before_anything_is_read(
    peer: Peer, tmp_path: Path, named: str
) -> None:
    before = (len(peer.calls), peer.card_requests)

    async with Engine.connect(f"sqlite:///{tmp_path / 'none.db'}", config=FAST) as engine:
        with pytest.raises(UsageError, match=r"is not a URI .*: nothing was sent"):
            await engine.start_task(peer.base_url, skill="echo", text="hi", extensions=[named])
        assert engine.log.all() == []

    assert (len(peer.calls), peer.card_requests) == before
