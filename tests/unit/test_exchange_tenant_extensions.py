"""The tenant an A2A 1.0 interface names (``AgentInterface.tenant``): read from the card, sent
with each request as the official SDK's client sends it (JSON-RPC: ``params.tenant``;
HTTP+JSON: the path's first segment after the interface's URL, escaped), recorded with the
endpoint only when there is one, and a tenant change on the card is an endpoint move (R9).
The extensions a task activates are named on each request, in the header of the version the
interface speaks (1.0 ``A2A-Extensions``, 0.3 ``X-A2A-Extensions``). The requests are read as
they leave (httpx's MockTransport answers them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from support.cards import agent_card, interface, skill

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.errors import EndpointUnreachableError
from cardfence.engine.wire.transport import A2ATransport

TASK = {
    "id": "t-1",
    "contextId": "c-1",
    "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-12-03T10:00:00Z"},
}


def _answer(request: httpx.Request) -> httpx.Response:
    if request.method == "POST" and request.url.path.endswith("/rpc"):
        envelope = json.loads(request.content)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": envelope["id"], "result": TASK})
    return httpx.Response(200, json=TASK)


Make = Callable[[str, str], A2ATransport]


@pytest.fixture
async def seen() -> AsyncIterator[tuple[list[httpx.Request], Make]]:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return _answer(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:

        def make(binding: str, tenant: str) -> A2ATransport:
            url = "https://agent.test/rpc" if binding == JSONRPC else "https://agent.test/api"
            return A2ATransport(client, Interface(url, binding, "1.0", tenant=tenant))

        yield requests, make


async def test_jsonrpc_names_the_tenant_in_every_requests_params(
    seen: tuple[list[httpx.Request], Make],
) -> None:
    requests, make = seen
    await make(JSONRPC, "acme").get_task("t-1")

    (request,) = requests
    assert json.loads(request.content)["params"] == {
        "id": "t-1", "historyLength": 0, "tenant": "acme",
    }  # fmt: skip
    assert request.url == "https://agent.test/rpc"


async def test_http_json_puts_the_tenant_first_in_the_path_escaped(
    seen: tuple[list[httpx.Request], Make],
) -> None:
    requests, make = seen
    await make(HTTP_JSON, "acme").get_task("t-1")
    await make(HTTP_JSON, "a/b c").get_task("t-1")

    assert [r.url.raw_path.split(b"?")[0] for r in requests] == [
        b"/api/acme/tasks/t-1", b"/api/a%2Fb%20c/tasks/t-1",
    ]  # fmt: skip


async def test_no_tenant_leaves_every_request_as_it_was(
    seen: tuple[list[httpx.Request], Make],
) -> None:
    requests, make = seen
    await make(JSONRPC, "").get_task("t-1")
    await make(HTTP_JSON, "").get_task("t-1")

    assert "tenant" not in json.loads(requests[0].content)["params"]
    assert requests[1].url.path == "/api/tasks/t-1"


def _card(tenant: str | None) -> Any:
    extra = {} if tenant is None else {"tenant": tenant}
    return agent_card(
        supportedInterfaces=[interface("https://agent.test/rpc", **extra)], skills=[skill("s")]
    )


def test_the_cards_tenant_is_recorded_with_the_endpoint_and_none_is_not_recorded() -> None:
    (tenanted,) = _card("acme").interfaces
    (plain,) = _card(None).interfaces

    assert guards.endpoint_of(tenanted) == {
        "url": "https://agent.test/rpc", "binding": "JSONRPC", "protocol_version": "1.0",
        "tenant": "acme",
    }  # fmt: skip
    assert "tenant" not in guards.endpoint_of(plain)


def test_a_card_that_moves_the_task_to_another_tenant_moves_its_endpoint() -> None:
    (old,) = _card("acme").interfaces
    task = {"endpoint": guards.endpoint_of(old)}

    endpoint, moved = guards._endpoint_on(task["endpoint"], _card("acme-eu"), False)
    same, unmoved = guards._endpoint_on(task["endpoint"], _card("acme"), False)

    assert endpoint is not None
    assert endpoint["tenant"] == "acme-eu"
    assert [type_ for type_, _ in moved] == [ev.ENDPOINT_MOVED]
    assert (same, unmoved) == (task["endpoint"], ())


@pytest.mark.parametrize(("version", "header", "absent"), [
    ("1.0", "A2A-Extensions", "X-A2A-Extensions"),
    ("0.3.0", "X-A2A-Extensions", "A2A-Extensions"),
])  # fmt: skip
async def test_activated_extensions_are_named_in_the_header_of_the_version_spoken(
    version: str, header: str, absent: str
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(500)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        interface = Interface("https://agent.test/rpc", JSONRPC, version)
        uris = ("https://x.test/a", "https://x.test/b")
        named = A2ATransport(client, interface, extensions=uris)
        plain = A2ATransport(client, interface)
        for transport in (named, plain):
            with pytest.raises(EndpointUnreachableError):
                await transport.get_task("t-1")

    assert requests[0].headers[header] == "https://x.test/a, https://x.test/b"
    assert absent not in requests[0].headers
    assert header not in requests[1].headers
