"""A2A 1.0 interfaces that name a tenant (``AgentInterface.tenant``), as multi-tenant agents
publish them: every request to such an interface is for that tenant -- in JSON-RPC's params, as
the first segment of an HTTP+JSON path -- as the official SDK's client sends it. The tenant is
part of where the task lives: recorded with its endpoint, and a card that moves the task's
interface to another tenant moves the task on resume (R9), like another URL.

The official a2a-sdk 1.3 agent reads the JSON-RPC tenant into each request's context (its
executor sees it). Its HTTP+JSON routes put the tenant before their own prefix, not after the
interface's URL as its client does, so the HTTP+JSON shape is proved on the request itself
(tests/unit/wire/test_transport.py); docs/wire.md.
"""

from __future__ import annotations

from typing import Any

from support import Peer
from support.engine_fixtures import data_of

from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev


def _for_tenant(tenant: str) -> Any:
    def edit(card: dict[str, Any]) -> None:
        for interface in card["supportedInterfaces"]:
            interface["tenant"] = tenant

    return edit


async def test_every_request_to_an_interface_naming_a_tenant_is_for_that_tenant(
    peer: Peer, engine: Engine
) -> None:
    peer.mutate_card(_for_tenant("acme"))
    before = len(peer.calls)

    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.2")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    asked = peer.calls[before:]
    assert ("JSONRPC", "SendMessage") in asked
    assert ("JSONRPC", "GetTask") in asked
    assert peer.tenants[before:] == ["acme"] * len(asked)  # the send and every poll
    assert peer.executor.tenants[-1] == "acme"  # the agent ran the task for that tenant
    (submitted,) = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    assert submitted["endpoint"]["tenant"] == "acme"


async def test_an_interface_naming_no_tenant_is_asked_for_none(peer: Peer, engine: Engine) -> None:
    before = len(peer.calls)

    view = await engine.start_task(peer.base_url, skill="echo", text="echo hi")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert set(peer.tenants[before:]) == {""}
    (submitted,) = data_of(engine.store, view.task, ev.TASK_SUBMITTED)
    assert "tenant" not in submitted["endpoint"]  # recorded exactly as before


async def test_a_task_whose_interface_moved_to_another_tenant_follows_it_on_resume(
    peer: Peer, engine: Engine
) -> None:
    peer.mutate_card(_for_tenant("acme"))
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
    peer.mutate_card(_for_tenant("acme-eu"))

    await engine.resume(view.task)
    before = len(peer.calls)
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    (moved,) = data_of(engine.store, view.task, ev.ENDPOINT_MOVED)
    assert (moved["old"]["tenant"], moved["new"]["tenant"]) == ("acme", "acme-eu")
    assert moved["old"]["url"] == moved["new"]["url"]  # the same URL: only the tenant moved
    assert set(peer.tenants[before:]) == {"acme-eu"}
