"""Card discovery against real HTTP servers on 127.0.0.1, field by field (R2-R4, R14, R16).

Which URLs are asked and with which headers, where each refusal points and what it says, what is
recorded for every read and every failure, when the memo answers instead of the wire, and how
pinning decides. The servers are the raw HTTP/1.1 servers of ``tests/support/hostile.py``, told what
to answer per path; every test runs in well under a second."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import ECKey
from support.cards import card_document, skill
from support.hostile import Answer, Reply, Request, RoutedServer, SilentListener, closed_port
from support.slots import RecordedSlots

from cardfence.engine.cards.keys import CardKeys, parse_keys
from cardfence.engine.cards.model import AgentCard, Interface, parse_card
from cardfence.engine.cards.signature_policy import CardSignatures, SignaturePolicy
from cardfence.engine.cards.signatures import FORM_RFC8785, sign_card
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import initial_agent_state
from cardfence.engine.discovery._agent_stream import agent_head, append_agent_events
from cardfence.engine.discovery.card_read import CardRead, ContractCheck
from cardfence.engine.discovery.fetch import CardLimits, card_urls, extended_card_url, fetch_card
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.discovery.signature_files import read_key_file
from cardfence.engine.errors import (
    CardInvalidError,
    CardSignatureError,
    ContractChangedError,
    DiscoveryError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    RemoteRefusedError,
    UsageError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.pool import USER_AGENT
from cardfence.engine.wire.transport import A2ATransport
from cardfence.store.errors import ConcurrencyError, CorruptRecordError
from cardfence.store.event_store import EventStore
from cardfence.store.records import NewEvent, StreamRecord
from cardfence.store.schema import streams

CARD = "/.well-known/agent-card.json"
LEGACY = "/.well-known/agent.json"
JSON = {"Content-Type": "application/json"}
FAST = CardLimits(timeout=2.0, connect_timeout=1.0)
MODIFIED = "Tue, 01 Dec 2026 00:00:00 GMT"

# 0.0.0.0 reaching 127.0.0.1, and handshakes left unanswered once a listener's backlog is full.
LINUX = pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux's TCP/IP stack")


def document(**change: Any) -> dict[str, Any]:
    fields = {"name": "cards", "capabilities": {"pushNotifications": True}, **change}
    return card_document("http://127.0.0.1:1/rpc", **fields)


def body(**change: Any) -> bytes:
    return json.dumps(document(**change)).encode()


ROTATED = {
    "securitySchemes": {"m": {"mtlsSecurityScheme": {}}},
    "securityRequirements": [{"schemes": {"m": {"list": []}}}],
}


def card_reply(
    data: bytes | None = None, *, etag: str | None = None, modified: str | None = None
) -> Reply:
    headers = dict(JSON)
    if etag is not None:
        headers["ETag"] = etag
    if modified is not None:
        headers["Last-Modified"] = modified
    return Reply(body=body() if data is None else data, headers=headers)


def conditional(
    data: bytes | None = None, *, etag: str | None = None, modified: str | None = None
) -> Callable[[Request], Reply]:
    """A card that answers 304, without validators, to a request that sends one."""

    def answer(request: Request) -> Reply:
        if "if-none-match" in request.headers or "if-modified-since" in request.headers:
            return Reply(status=304, body=b"", headers={})
        return card_reply(data, etag=etag, modified=modified)

    return answer


def redirect(status: int, location: str | None) -> Reply:
    return Reply(status=status, headers={} if location is None else {"Location": location})


def events_of(store: EventStore, origin: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in store.read_stream(ev.agent_stream_id(origin))]


def unheld_revision_read(store: EventStore, origin: str, url: str) -> None:
    """Record a read of ``url`` (ETag ``"e1"``) whose revision this database does not hold."""
    fetched = {"url": url, "revision": "f" * 64, "etag": '"e1"', "status": 200}
    append_agent_events(store, origin, lambda _: [NewEvent(ev.CARD_FETCHED, fetched)])


# -- which URLs ------------------------------------------------------------------------------------


def test_an_agent_url_names_its_origin_and_the_two_well_known_card_paths_under_it() -> None:
    assert card_urls("http://a.test/agents/x/?q=1") == (
        "http://a.test",
        ("http://a.test/agents/x/.well-known/agent-card.json", "http://a.test/agents/x" + LEGACY),
    )
    assert card_urls("https://a.test") == (
        "https://a.test",
        ("https://a.test" + CARD, "https://a.test" + LEGACY),
    )
    assert card_urls("http://a.test/boX//")[1][0] == "http://a.test/boX" + CARD  # only "/" goes


def test_a_card_url_ending_in_json_is_the_only_url_tried() -> None:
    assert card_urls("https://a.test:8443/cards/me.json?v=2") == (
        "https://a.test:8443",
        ("https://a.test:8443/cards/me.json",),
    )


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://a.test:80/", "http://a.test"),
        ("https://a.test:443/", "https://a.test"),
        ("http://a.test:443/", "http://a.test:443"),
        ("http://a.test:81/", "http://a.test:81"),
        ("https://a.test:444/", "https://a.test:444"),
        ("https://a.test:80/", "https://a.test:80"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("https://[::1]/", "https://[::1]"),
    ],
)
def test_an_origin_leaves_out_the_default_port_only_and_brackets_ipv6(
    url: str, origin: str
) -> None:
    assert card_urls(url)[0] == origin


@pytest.mark.parametrize(
    ("url", "shown", "fault"),
    [
        ("ftp://a.test/card", "ftp://a.test/card", "not an http(s) URL with a host"),
        ("file:///tmp/card.json", "file:///tmp/card.json", "not an http(s) URL with a host"),
        ("http://", "http://", "not an http(s) URL with a host"),
        ("http://127.0.0.1:99999", "http://127.0.0.1:99999", "its port is not a number"),
        ("http://[::1", "http://[::1", "not a valid URL"),
        ("https://a.test/#top", "https://a.test/#top", "it has a fragment"),
        ("https://svc:PASS@a.test/x", "https://a.test/x", "it carries credentials"),
    ],
)
def test_an_agent_url_that_cannot_be_used_is_a_usage_error_shown_without_credentials(
    url: str, shown: str, fault: str
) -> None:
    with pytest.raises(UsageError) as refused:
        card_urls(url)
    assert str(refused.value).startswith(f"agent URL {shown!r}: {fault}")
    assert str(refused.value).endswith("; nothing was read or sent")
    assert "PASS" not in str(refused.value)


# -- one read on the wire --------------------------------------------------------------------------


async def test_a_read_asks_for_json_in_the_encodings_it_decodes_and_names_itself(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"', modified=MODIFIED)

    got = await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (got.url, got.status, got.body) == (server.url + CARD, 200, body())
    assert (got.etag, got.last_modified, got.location) == ('"e1"', MODIFIED, None)
    [request] = server.requests
    assert (request.method, request.path) == ("GET", CARD)
    assert request.headers["accept"] == "application/json"
    assert request.headers["accept-encoding"] == "gzip, deflate"
    assert request.headers["user-agent"] == USER_AGENT == "cardfence/0.1"
    assert set(request.headers) == {"host", "connection", "accept", "accept-encoding", "user-agent"}


async def test_a_conditional_read_sends_the_validators_stored_for_that_url_only(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = conditional()
    url = server.url + CARD

    got = await fetch_card(client, [url], validators={url: ('"e1"', MODIFIED)}, limits=FAST)
    assert (got.status, got.body, got.etag) == (304, b"", None)
    assert server.requests[-1].headers["if-none-match"] == '"e1"'
    assert server.requests[-1].headers["if-modified-since"] == MODIFIED

    await fetch_card(client, [url], validators={url: (None, MODIFIED)}, limits=FAST)
    assert "if-none-match" not in server.requests[-1].headers
    assert server.requests[-1].headers["if-modified-since"] == MODIFIED

    await fetch_card(client, [url], validators={url: ('"e2"', None)}, limits=FAST)
    assert server.requests[-1].headers["if-none-match"] == '"e2"'
    assert "if-modified-since" not in server.requests[-1].headers

    other = {server.url + LEGACY: ('"e3"', MODIFIED)}
    assert (await fetch_card(client, [url], validators=other, limits=FAST)).status == 200
    assert "if-none-match" not in server.requests[-1].headers


async def test_a_304_keeps_the_validators_it_carries(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(status=304, headers={"ETag": '"e9"', "Last-Modified": MODIFIED})

    got = await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (got.status, got.body, got.etag, got.last_modified) == (304, b"", '"e9"', MODIFIED)


async def test_a_404_at_the_first_path_tries_the_legacy_path_and_records_it(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[LEGACY] = card_reply()
    urls = card_urls(server.url)[1]

    got = await fetch_card(client, urls, limits=FAST)

    assert (got.url, got.status) == (server.url + LEGACY, 200)
    assert server.paths() == [CARD, LEGACY]


async def test_a_404_at_the_last_path_is_an_http_status_failure_naming_it(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    with pytest.raises(DiscoveryError) as failed:
        await fetch_card(client, card_urls(server.url)[1], limits=FAST)

    assert (failed.value.url, failed.value.kind, failed.value.detail) == (
        server.url + LEGACY,
        "http_status",
        "404",
    )
    assert server.paths() == [CARD, LEGACY]


async def test_any_other_status_at_the_first_path_fails_without_trying_the_next(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(status=503, body=b"busy", headers={"ETag": '"x"'})
    server.routes[LEGACY] = card_reply()

    with pytest.raises(DiscoveryError) as failed:
        await fetch_card(client, card_urls(server.url)[1], limits=FAST)

    assert (failed.value.url, failed.value.kind, failed.value.detail) == (
        server.url + CARD,
        "http_status",
        "503",
    )
    assert server.paths() == [CARD]


# -- redirects -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_same_origin_redirect_is_followed_and_recorded_under_the_url_asked(
    server: RoutedServer, client: httpx.AsyncClient, status: int
) -> None:
    server.routes[CARD] = redirect(status, "/cards/current.json")
    server.routes["/cards/current.json"] = card_reply(etag='"e1"')

    got = await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (got.url, got.status, got.body, got.etag) == (server.url + CARD, 200, body(), '"e1"')
    assert server.paths() == [CARD, "/cards/current.json"]
    assert server.requests[1].headers["user-agent"] == USER_AGENT


async def test_redirects_are_followed_up_to_the_limit_and_no_further(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = redirect(302, "/one")
    server.routes["/one"] = redirect(302, "/two")
    server.routes["/two"] = card_reply()
    two = CardLimits(timeout=2.0, max_redirects=2)

    assert (await fetch_card(client, [server.url + CARD], limits=two)).status == 200

    one = CardLimits(timeout=2.0, max_redirects=1)
    with pytest.raises(DiscoveryError) as refused:
        await fetch_card(client, [server.url + CARD], limits=one)
    assert (refused.value.url, refused.value.kind, refused.value.detail) == (
        server.url + CARD,
        "redirect",
        "more than 1 redirects",
    )
    assert server.paths()[-2:] == [CARD, "/one"]  # /two is not asked for


async def test_a_redirect_to_another_origin_is_refused_naming_the_target(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    elsewhere = f"http://localhost:{server.port}/card.json"  # another host: another origin
    server.routes[CARD] = redirect(301, "/moved")
    server.routes["/moved"] = redirect(307, elsewhere)

    with pytest.raises(DiscoveryError) as refused:
        await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (refused.value.url, refused.value.kind, refused.value.detail) == (
        server.url + "/moved",
        "redirect",
        f"redirect to {elsewhere} refused (another origin)",
    )


async def test_a_redirect_carrying_credentials_is_refused_unfollowed_and_never_names_them(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = redirect(302, server.url.replace("//", "//svc:PASS@") + "/card.json")
    server.routes["/card.json"] = card_reply()

    with pytest.raises(DiscoveryError) as refused:
        await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (refused.value.url, refused.value.kind) == (server.url + "/card.json", "insecure")
    assert refused.value.detail == "it carries credentials (user:password@)"
    assert server.paths() == [CARD]  # nothing sent there, Basic or otherwise


async def test_a_client_that_follows_redirects_still_has_another_origin_refused(
    server: RoutedServer,
) -> None:
    server.routes[CARD] = redirect(302, f"http://localhost:{server.port}/card.json")
    server.routes["/card.json"] = card_reply()

    async with httpx.AsyncClient(follow_redirects=True) as following:
        with pytest.raises(DiscoveryError) as refused:
            await fetch_card(following, [server.url + CARD], limits=FAST)

    assert refused.value.kind == "redirect"
    assert server.paths() == [CARD]


async def test_a_redirect_without_a_location_is_refused(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = redirect(302, None)

    with pytest.raises(DiscoveryError) as refused:
        await fetch_card(client, [server.url + CARD], limits=FAST)

    url = server.url + CARD
    assert (refused.value.url, refused.value.kind, refused.value.detail) == (
        url,
        "redirect",
        f"redirect to {url} refused (another origin)",
    )
    assert server.paths() == [CARD]


# -- what may be read, and for how long ------------------------------------------------------------


async def test_plain_http_to_a_host_that_is_not_loopback_is_refused_before_any_request(
    client: httpx.AsyncClient,
) -> None:
    url = "http://a.test" + CARD
    with pytest.raises(DiscoveryError) as refused:
        await fetch_card(client, [url], limits=FAST)
    assert (refused.value.url, refused.value.kind, refused.value.detail) == (
        url,
        "insecure",
        "plain http to a non-loopback host refused (https required)",
    )


@LINUX
async def test_allow_insecure_lets_plain_http_reach_a_host_that_is_not_loopback(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    # 0.0.0.0 is not a loopback address, yet on Linux a connection to it reaches 127.0.0.1.
    server.routes[CARD] = card_reply()
    url = f"http://0.0.0.0:{server.port}{CARD}"
    with pytest.raises(DiscoveryError, match="plain http"):
        await fetch_card(client, [url], limits=FAST)

    insecure = CardLimits(timeout=2.0, allow_insecure=True)
    assert (await fetch_card(client, [url], limits=insecure)).status == 200


async def test_a_read_with_no_time_left_is_not_sent(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    urls = card_urls(server.url)[1]
    for limits in (CardLimits(timeout=0.0), CardLimits(timeout=-1.0)):
        with pytest.raises(DiscoveryError) as failed:
            await fetch_card(client, urls, limits=limits)
        assert (failed.value.url, failed.value.kind, failed.value.detail) == (
            server.url + CARD,
            "timeout",
            "the deadline passed before the card was read",
        )
    with deadline.within(-1.0), pytest.raises(DiscoveryError, match="deadline passed"):
        await fetch_card(client, urls, limits=FAST)
    assert server.requests == []


async def test_a_card_that_never_finishes_fails_at_the_total_timeout_naming_the_url_it_was_on(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[LEGACY] = Reply(body=body(), drip=0.02)
    # Connecting to 127.0.0.1 takes far less than its bound, even on a loaded machine (at 0.2 s
    # it once timed out there); the bounds differ so that the one named is the total's.
    limits = CardLimits(timeout=0.9, connect_timeout=0.6)

    async with asyncio.timeout(5.0):  # the test's own bound, should the read have none
        with pytest.raises(DiscoveryError) as failed:
            await fetch_card(client, card_urls(server.url)[1], limits=limits)

    assert (failed.value.url, failed.value.kind, failed.value.detail) == (
        server.url + LEGACY,
        "timeout",
        "no complete answer within 0.9s",
    )


@LINUX
async def test_a_connection_that_cannot_be_made_in_time_is_a_timeout_of_the_client(
    client: httpx.AsyncClient,
) -> None:
    # A listener whose backlog is full: the kernel leaves further handshakes unanswered.
    backlog = socket.socket()
    backlog.bind(("127.0.0.1", 0))
    backlog.listen(0)
    port = backlog.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}{CARD}"
        with pytest.raises(DiscoveryError) as failed:
            await fetch_card(client, [url], limits=CardLimits(timeout=3.0, connect_timeout=0.2))
    finally:
        for filler in fillers:
            filler.close()
        backlog.close()
    assert (failed.value.url, failed.value.kind, failed.value.detail) == (
        url,
        "timeout",
        "timed out (ConnectTimeout)",
    )


async def test_a_silent_server_is_a_timeout_within_the_total_bound(
    client: httpx.AsyncClient,
) -> None:
    with SilentListener() as silent:
        url = f"http://127.0.0.1:{silent.port}{CARD}"
        with pytest.raises(DiscoveryError) as failed:
            await fetch_card(client, [url], limits=CardLimits(timeout=0.3))
    assert (failed.value.url, failed.value.kind) == (url, "timeout")


async def test_a_refused_connection_is_a_network_failure_with_its_cause(
    client: httpx.AsyncClient,
) -> None:
    url = f"http://127.0.0.1:{closed_port()}{CARD}"
    with pytest.raises(DiscoveryError) as failed:
        await fetch_card(client, [url], limits=FAST)
    assert (failed.value.url, failed.value.kind) == (url, "network")
    assert failed.value.detail == "network error: All connection attempts failed"


async def test_a_card_over_the_size_limit_is_refused_as_too_large(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(b"{" + b" " * 200 + b"}")

    with pytest.raises(CardInvalidError) as refused:
        await fetch_card(client, [server.url + CARD], limits=CardLimits(max_bytes=100))

    assert (refused.value.url, refused.value.kind) == (server.url + CARD, "too_large")
    assert refused.value.detail == "card body declared 202 bytes, over the limit of 100"


async def test_a_card_in_an_encoding_not_decoded_is_refused_as_invalid(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(body=body(), headers={**JSON, "Content-Encoding": "br"})

    with pytest.raises(CardInvalidError) as refused:
        await fetch_card(client, [server.url + CARD], limits=FAST)

    assert (refused.value.url, refused.value.kind) == (server.url + CARD, "invalid_card")
    assert (
        refused.value.detail == "card content encoding 'br' refused: only gzip, deflate are decoded"
    )


async def test_an_error_page_that_never_ends_is_drained_a_little_then_dropped(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    # 16 KiB at a time, forever: reading it all would end only at the timeout.
    server.routes[CARD] = Reply(status=503, body=b"busy", drip=0.0, chunk=16384)
    limits = CardLimits(timeout=2.0)

    with pytest.raises(DiscoveryError) as failed:
        await fetch_card(client, [server.url + CARD], limits=limits)

    assert (failed.value.kind, failed.value.detail) == ("http_status", "503")


# -- reading and recording -------------------------------------------------------------------------


async def test_a_first_read_records_every_field_and_stores_the_snapshot(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"', modified=MODIFIED)
    before = datetime.now(UTC)

    read = await Discovery(store, client, limits=FAST).read(server.url)

    origin = server.url
    assert (read.agent, read.url, read.status) == (origin, server.url + CARD, 200)
    assert (read.etag, read.last_modified, read.from_memo) == ('"e1"', MODIFIED, False)
    assert read.revision == read.card.revision == parse_card(body()).revision
    assert before <= read.fetched_at <= datetime.now(UTC)
    assert events_of(store, origin) == [
        (
            ev.CARD_FETCHED,
            {
                "url": server.url + CARD,
                "status": 200,
                "revision": read.revision,
                "version": "1.0.0",
                "etag": '"e1"',
                "last_modified": MODIFIED,
                "contract_hash": read.card.contract_hash,
                "push_notifications": True,
                "fetched_at": read.fetched_at.isoformat(),
            },
        )
    ]
    snapshot = store.get_snapshot(read.revision)
    assert snapshot is not None
    assert (snapshot.body, snapshot.source_url) == (
        read.card.canonical_bytes().decode(),
        server.url + CARD,
    )
    assert (snapshot.etag, snapshot.http_status) == ('"e1"', 200)
    assert snapshot.fetched_at == read.fetched_at
    state = await Discovery(store, client).agent_state(server.url + "/anything")
    assert (state["revision"], state["card_url"], state["reads"]) == (
        read.revision,
        server.url + CARD,
        1,
    )


async def test_an_agent_never_read_has_its_initial_state(store: EventStore) -> None:
    async with httpx.AsyncClient() as client:
        state = await Discovery(store, client).agent_state("http://127.0.0.1:9/x")
    assert state == initial_agent_state("http://127.0.0.1:9")


def _alter_projection(store: EventStore, stream_id: str, state: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(streams.update().where(streams.c.stream_id == stream_id).values(state=state))


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("[1]", "the stored text is an array, not a JSON object"),
        ("{}", "the stored agent lacks 15 of its fields (agent, card_url, contract_hash, etag, "
               "failures, …)"),
    ],
)  # fmt: skip
async def test_a_read_of_an_agent_whose_record_was_altered_fails_as_kind_record_unsent(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient, state: str, why: str
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"')
    discovery = Discovery(store, client, limits=FAST)
    await discovery.read(server.url)
    _alter_projection(store, ev.agent_stream_id(server.url), state)
    asked = len(server.requests)
    last = store.last_position()

    with pytest.raises(DiscoveryError) as failed:
        await discovery.read(server.url, fresh=True)
    with pytest.raises(CorruptRecordError) as direct:
        agent_head(store, server.url)

    error = failed.value
    assert (error.kind, error.url) == ("record", server.url + CARD)
    assert error.detail == f"the agent's record in the store cannot be read: {direct.value}"
    assert str(direct.value).startswith(
        f"stream 'agent:{server.url}', its projection: {why}: altered in the store?"
    )
    assert isinstance(error.__cause__, CorruptRecordError)
    assert (len(server.requests), store.last_position()) == (asked, last)  # not read, not recorded


def test_the_agent_head_is_its_version_and_projection_or_the_initial_state(
    store: EventStore,
) -> None:
    origin = "http://127.0.0.1:9"
    assert agent_head(store, origin) == (0, initial_agent_state(origin))
    append_agent_events(store, origin, lambda _state: [NewEvent(ev.TASK_CREATION_REFUSED, {})])
    version, state = agent_head(store, origin)
    assert (version, state["refusals"]) == (1, 1)


@pytest.mark.parametrize(
    ("etag", "modified", "sent"),
    [('"e1"', None, "if-none-match"), (None, MODIFIED, "if-modified-since")],
)
async def test_a_later_read_is_conditional_on_either_validator_and_a_304_keeps_the_stored_ones(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    etag: str | None,
    modified: str | None,
    sent: str,
) -> None:
    server.routes[CARD] = conditional(etag=etag, modified=modified)
    first = await Discovery(store, client, limits=FAST).read(server.url)

    again = await Discovery(store, client, limits=FAST).read(server.url)  # no memo: from the store

    assert sent in server.requests[-1].headers
    assert (again.status, again.revision, again.url) == (304, first.revision, server.url + CARD)
    assert (again.etag, again.last_modified) == (etag, modified)
    assert again.card == first.card
    assert again.card.source_url == server.url + CARD  # as read from the stored snapshot
    [_, (kind, data)] = events_of(store, server.url)
    assert (kind, data["status"], data["etag"], data["last_modified"]) == (
        ev.CARD_FETCHED,
        304,
        etag,
        modified,
    )
    assert store.snapshot_revisions() == [first.revision]


async def test_a_304_on_the_card_in_memory_is_not_parsed_again(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = conditional(etag='"e1"')
    discovery = Discovery(store, client, limits=FAST)
    first = await discovery.read(server.url)

    again = await discovery.read(server.url)

    assert again.status == 304
    assert again.card is first.card


async def test_a_304_for_a_revision_no_longer_held_is_read_again_whole(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = conditional(etag='"e2"')
    origin = server.url
    # An earlier read recorded a revision whose snapshot this database does not hold.
    unheld_revision_read(store, origin, server.url + CARD)

    read = await Discovery(store, client, limits=FAST).read(server.url)

    assert [r.headers.get("if-none-match") for r in server.requests] == ['"e1"', None]
    assert (read.status, read.etag, read.card.name) == (200, '"e2"', "cards")
    assert store.snapshot_revisions() == [read.revision]


async def test_a_read_and_the_whole_read_after_its_304_each_wait_for_a_request_slot(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = conditional(etag='"e2"')
    unheld_revision_read(store, server.url, server.url + CARD)
    slots = RecordedSlots()

    read = await Discovery(store, client, limits=FAST, slots=slots).read(server.url)

    assert read.status == 200
    assert len(server.requests) == 2
    assert slots.urls == [server.url + CARD, server.url + CARD]


async def test_a_304_to_a_read_without_validators_is_read_again_and_then_refused(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(status=304, headers={})

    with pytest.raises(CardInvalidError):
        await Discovery(store, client, limits=FAST).read(server.url)

    assert server.paths() == [CARD, CARD]
    [(kind, data)] = events_of(store, server.url)
    assert (kind, data["kind"], data["url"]) == (
        ev.DISCOVERY_FAILED,
        "invalid_card",
        server.url + CARD,
    )


async def test_a_200_after_a_conditional_read_keeps_only_its_own_validators(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"', modified=MODIFIED)
    discovery = Discovery(store, client, limits=FAST)
    await discovery.read(server.url)
    server.routes[CARD] = card_reply(body(version="2.0.0"))  # no validators, and a new card

    read = await discovery.read(server.url)

    assert server.requests[-1].headers["if-none-match"] == '"e1"'
    assert (read.status, read.card.version, read.etag, read.last_modified) == (
        200,
        "2.0.0",
        None,
        None,
    )
    assert len(store.snapshot_revisions()) == 2


async def test_validators_are_sent_only_to_the_url_they_came_from(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"')
    server.routes["/mine.json"] = card_reply(etag='"e1"')
    discovery = Discovery(store, client, limits=FAST)
    await discovery.read(server.url)

    read = await discovery.read(server.url + "/mine.json")

    assert "if-none-match" not in server.requests[-1].headers
    assert (read.status, read.url) == (200, server.url + "/mine.json")


async def test_a_failed_read_is_recorded_with_its_url_kind_detail_and_time(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(status=503, body=b"busy")
    before = datetime.now(UTC)

    with pytest.raises(DiscoveryError) as failed:
        await Discovery(store, client, limits=FAST).read(server.url)

    assert (failed.value.kind, failed.value.detail) == ("http_status", "503")
    [(kind, data)] = events_of(store, server.url)
    assert kind == ev.DISCOVERY_FAILED
    assert {k: v for k, v in data.items() if k != "at"} == {
        "url": server.url + CARD,
        "kind": "http_status",
        "detail": "503",
    }
    assert before <= datetime.fromisoformat(data["at"]) <= datetime.now(UTC)


# -- the memo --------------------------------------------------------------------------------------


async def test_a_memoised_read_is_served_from_memory_until_it_is_max_card_age_old(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(etag='"e1"', modified=MODIFIED)
    now = [1000.0]
    discovery = Discovery(store, client, limits=FAST, max_card_age=60.0, clock=lambda: now[0])
    first = await discovery.read(server.url, fresh=False)  # nothing in memory: from the wire
    assert first.status == 200

    now[0] += 59.5
    memo = await discovery.read(server.url, fresh=False)
    assert memo == CardRead(
        first.agent, first.card, first.url, 0, '"e1"', MODIFIED, first.fetched_at
    )
    assert memo.from_memo
    assert len(server.requests) == 1
    assert len(events_of(store, server.url)) == 1

    now[0] += 0.5  # exactly max_card_age: read again
    assert (await discovery.read(server.url, fresh=False)).status == 200
    assert len(server.requests) == 2


async def test_the_memo_is_kept_two_minutes_by_default(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    now = [0.0]
    discovery = Discovery(store, client, limits=FAST, clock=lambda: now[0])
    await discovery.read(server.url)
    now[0] = 119.9
    assert (await discovery.read(server.url, fresh=False)).from_memo
    now[0] = 120.0
    assert not (await discovery.read(server.url, fresh=False)).from_memo
    assert len(server.requests) == 2


async def test_a_fresh_read_always_goes_to_the_wire(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)
    await discovery.read(server.url)
    await discovery.read(server.url)
    assert len(server.requests) == 2


async def test_the_same_bytes_from_the_same_url_parse_once_of_the_last_sixteen(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    discovery = Discovery(store, client)
    url = "http://a.test" + CARD
    first = await discovery._parse(body(), url)
    assert await discovery._parse(body(), url) is first
    other_url = await discovery._parse(body(), url + "?")
    assert other_url is not first  # another URL: parsed again
    versions = [await discovery._parse(body(version=str(n)), url) for n in range(1, 15)]
    # 16 held. Used again, `first` becomes the most recent; a 17th card pushes out the least
    # recent, `other_url`, and nothing else.
    assert await discovery._parse(body(), url) is first
    await discovery._parse(body(version="15"), url)
    assert await discovery._parse(body(), url) is first
    assert await discovery._parse(body(version="1"), url) is versions[0]
    assert await discovery._parse(body(), url + "?") is not other_url


async def test_the_size_limit_given_applies_to_every_read_of_one_discovery(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    data = body(description="d" * 500)
    server.routes[CARD] = card_reply(data)
    limits = CardLimits(timeout=2.0, max_bytes=300)
    refusal = f"card body declared {len(data)} bytes, over the limit of 300"

    with pytest.raises(CardInvalidError) as refused:
        await Discovery(store, client, limits=limits).read(server.url)
    assert (refused.value.kind, refused.value.detail) == ("too_large", refusal)

    # The whole read that follows a 304 for a revision not held: the same limit.
    server.routes[CARD] = conditional(data)
    unheld_revision_read(store, server.url, server.url + CARD)
    with pytest.raises(CardInvalidError) as refused:
        await Discovery(store, client, limits=limits).read(server.url)
    assert (refused.value.kind, refused.value.detail) == ("too_large", refusal)
    assert server.requests[-2].headers["if-none-match"] == '"e1"'


async def test_a_card_over_a_megabyte_is_read_confirmed_and_compared_under_a_limit_that_allows_it(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    big = "d" * (1_200_000)  # over parse_card's default limit of 1 MiB
    server.routes[CARD] = conditional(body(description=big), etag='"e1"')
    limits = CardLimits(timeout=5.0, max_bytes=2_000_000)
    first = await Discovery(store, client, limits=limits).read(server.url)
    assert first.card.description == big
    await Discovery(store, client, limits=limits).check_contract(first)

    again = await Discovery(store, client, limits=limits).read(server.url)  # 304: from the store
    assert (again.status, again.card) == (304, first.card)

    server.routes[CARD] = card_reply(body(description=big, **ROTATED))
    discovery = Discovery(store, client, limits=limits)
    rotated = await discovery.read(server.url)
    with pytest.raises(ContractChangedError) as refused:
        await discovery.check_contract(rotated)
    assert refused.value.changes == "security_schemes, security_requirements"


async def test_one_read_and_the_whole_read_after_its_304_share_one_timeout(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    def slow_304_then_a_card_that_never_ends(request: Request) -> Reply:
        if "if-none-match" in request.headers:
            time.sleep(0.4)
            return Reply(status=304, headers={})
        return Reply(body=body(), drip=0.01, chunk=64)

    server.routes[CARD] = slow_304_then_a_card_that_never_ends
    unheld_revision_read(store, server.url, server.url + CARD)
    async with asyncio.timeout(3.0):  # the test's own bound, should the read have none
        with pytest.raises(DiscoveryError) as failed:
            await Discovery(store, client, limits=CardLimits(timeout=0.6)).read(server.url)

    # At most 0.2 s were left for the whole read (0.6 s in all, 0.4 s gone to the 304), none at
    # all on a machine slow enough.
    assert failed.value.kind == "timeout"
    detail = failed.value.detail
    left = re.fullmatch(r"no complete answer within ([0-9.e-]+)s", detail)
    assert detail == "the deadline passed before the card was read" or (
        left is not None and float(left[1]) < 0.3
    ), detail
    assert server.paths() == [CARD, CARD]


# -- reads in flight -------------------------------------------------------------------------------


async def test_shared_reads_of_one_agent_at_once_make_one_wire_read_and_get_the_same_read(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)

    first, second = await asyncio.gather(
        discovery.read(server.url, share=True), discovery.read(server.url, share=True)
    )

    assert first is second
    assert server.paths() == [CARD]
    assert discovery._in_flight == {}  # forgotten once done: the next read is its own
    await discovery.read(server.url, share=True)
    assert server.paths() == [CARD, CARD]


async def test_reads_are_their_own_unless_asked_to_share_even_with_one_in_flight(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)

    first, second = await asyncio.gather(discovery.read(server.url), discovery.read(server.url))

    assert first is not second
    assert server.paths() == [CARD, CARD]


async def test_a_card_in_memory_never_answers_a_fresh_read_shared_or_not(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)
    await discovery.read(server.url)  # the card is in memory, fresh for two minutes

    shared = await asyncio.gather(
        discovery.read(server.url, share=True), discovery.read(server.url, share=True)
    )
    assert shared[0] is shared[1]
    assert server.paths() == [CARD] * 2  # one wire read for both, none from memory

    own = await asyncio.gather(discovery.read(server.url), discovery.read(server.url))
    assert [read.status for read in own] == [200, 200]  # 0: served from memory
    assert server.paths() == [CARD] * 4


async def test_shared_reads_of_two_agents_at_once_are_not_shared(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    with RoutedServer() as other:
        server.routes[CARD] = card_reply()
        other.routes[CARD] = card_reply(body(name="other"))
        discovery = Discovery(store, client, limits=FAST)

        mine, theirs = await asyncio.gather(
            discovery.read(server.url, share=True), discovery.read(other.url, share=True)
        )

        assert (mine.agent, mine.card.name) == (server.url, "cards")
        assert (theirs.agent, theirs.card.name) == (other.url, "other")
        assert (server.paths(), other.paths()) == ([CARD], [CARD])


# -- contract pinning ------------------------------------------------------------------------------


async def test_the_first_use_pins_the_contract_and_the_same_contract_matches(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)
    read = await discovery.read(server.url)
    contract = read.card.contract_hash

    assert await discovery.check_contract(read) == ContractCheck("pinned", contract, None)
    assert await discovery.check_contract(read) == ContractCheck("matched", contract, contract)
    assert await discovery.check_contract(read, accept=True) == ContractCheck(
        "matched", contract, contract
    )
    assert events_of(store, server.url)[1:] == [
        (ev.CONTRACT_PINNED, {"contract_hash": contract, "revision": read.revision})
    ]


async def test_a_changed_contract_is_refused_naming_what_changed_unless_accepted(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)
    pinned = await discovery.read(server.url)
    await discovery.check_contract(pinned)
    server.routes[CARD] = card_reply(body(**ROTATED))
    rotated = await discovery.read(server.url)

    with pytest.raises(ContractChangedError) as refused:
        await discovery.check_contract(rotated)
    assert (refused.value.agent, refused.value.pinned, refused.value.fresh) == (
        server.url,
        pinned.card.contract_hash,
        rotated.card.contract_hash,
    )
    assert refused.value.changes == "security_schemes, security_requirements"

    accepted = await discovery.check_contract(rotated, accept=True)
    assert accepted == ContractCheck(
        "accepted", rotated.card.contract_hash, pinned.card.contract_hash
    )
    assert events_of(store, server.url)[-1] == (
        ev.CONTRACT_ACCEPTED,
        {
            "previous": pinned.card.contract_hash,
            "contract_hash": rotated.card.contract_hash,
            "revision": rotated.revision,
        },
    )
    assert await discovery.check_contract(rotated) == ContractCheck(
        "matched", rotated.card.contract_hash, rotated.card.contract_hash
    )


async def test_a_changed_contract_whose_pinned_card_is_not_held_says_only_that_it_differs(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply(body(**ROTATED))
    discovery = Discovery(store, client, limits=FAST)
    read = await discovery.read(server.url)
    for revision in ("e" * 64, None):
        append_agent_events(
            store,
            server.url,
            lambda _, r=revision: [
                NewEvent(ev.CONTRACT_PINNED, {"contract_hash": "c" * 64, "revision": r})
            ],
        )
        with pytest.raises(ContractChangedError) as refused:
            await discovery.check_contract(read)
        assert refused.value.changes == "contract hash differs"


async def test_a_contract_that_hashes_differently_in_no_named_part_says_it_differs(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = card_reply()
    discovery = Discovery(store, client, limits=FAST)
    read = await discovery.read(server.url)
    # The pin names this very card, under a contract hash it does not have.
    append_agent_events(
        store,
        server.url,
        lambda _: [
            NewEvent(ev.CONTRACT_PINNED, {"contract_hash": "c" * 64, "revision": read.revision})
        ],
    )
    with pytest.raises(ContractChangedError) as refused:
        await discovery.check_contract(read)
    assert refused.value.changes == "contract hash differs"


async def test_a_refused_creation_is_recorded_in_the_agent_stream(
    store: EventStore, client: httpx.AsyncClient
) -> None:
    refusal = ev.TaskCreationRefused(reason="skill_absent", detail="d", skill="x", at="t")
    await Discovery(store, client).record_refusal("http://127.0.0.1:9/agent/", refusal)
    assert events_of(store, "http://127.0.0.1:9") == [(refusal.TYPE, refusal.payload())]


# -- appending under concurrency -------------------------------------------------------------------


class HeadsRead:
    """The store, counting the reads of a stream's head (``stream``)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.heads = 0

    def stream(self, stream_id: str) -> StreamRecord | None:
        self.heads += 1
        return self.store.stream(stream_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_each_read_reads_its_agents_head_once_and_appends_on_that_head(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    counted = HeadsRead(store)
    discovery = Discovery(store, client, limits=FAST)
    discovery.store = counted  # type: ignore[assignment]

    server.routes[CARD] = card_reply(etag='"v1"')
    await discovery.read(server.url)  # an agent never read
    server.routes[CARD] = card_reply(body(version="2.0.0"), etag='"v2"')
    await discovery.read(server.url)  # a changed card
    server.routes[CARD] = conditional(etag='"v2"')
    await discovery.read(server.url)  # confirmed by a 304

    assert [e[1]["status"] for e in events_of(store, server.url)] == [200, 200, 304]
    assert counted.heads == 3  # none read again for the append: the head just read is used


def test_an_append_that_loses_a_race_decides_again_on_the_state_that_won(
    store: EventStore,
) -> None:
    origin = "http://a.test"
    append_agent_events(store, origin, lambda _: [NewEvent(ev.TASK_CREATION_REFUSED, {})])
    seen: list[int] = []

    def decide(state: dict[str, Any]) -> list[NewEvent]:
        seen.append(state["refusals"])
        return [NewEvent(ev.TASK_CREATION_REFUSED, {"n": len(seen)})]

    stale = (0, initial_agent_state(origin))
    append_agent_events(store, origin, decide, known=stale)

    assert seen == [0, 1]
    assert [d for _, d in events_of(store, origin)] == [{}, {"n": 2}]
    head = store.stream(ev.agent_stream_id(origin))
    assert head is not None
    assert head.state["refusals"] == 2


def test_an_append_that_loses_every_race_gives_up_after_twenty_tries_raising_the_last_conflict(
    store: EventStore,
) -> None:
    origin = "http://a.test"
    calls: list[int] = []

    def decide_while_another_writer_wins(state: dict[str, Any]) -> list[NewEvent]:
        calls.append(1)
        append_agent_events(store, origin, lambda _: [NewEvent(ev.DISCOVERY_FAILED, {})])
        return [NewEvent(ev.TASK_CREATION_REFUSED, {})]

    with pytest.raises(ConcurrencyError) as lost:
        append_agent_events(store, origin, decide_while_another_writer_wins)

    assert len(calls) == 20
    # The last race lost, as the store saw it: the 20th decision read version 19; the other
    # writer had moved the stream to 20 by the time the append was tried.
    assert (lost.value.stream_id, lost.value.expected_version, lost.value.actual_version) == (
        ev.agent_stream_id(origin),
        19,
        20,
    )
    assert "is at version 20, not 19" in str(lost.value)


def test_an_append_with_nothing_to_record_writes_nothing(store: EventStore) -> None:
    append_agent_events(store, "http://a.test", lambda _: [])
    assert store.stream(ev.agent_stream_id("http://a.test")) is None


def test_an_agent_stream_is_indexed_under_its_origin(store: EventStore) -> None:
    append_agent_events(store, "http://a.test", lambda _: [NewEvent(ev.TASK_CREATION_REFUSED, {})])
    head = store.stream(ev.agent_stream_id("http://a.test"))
    assert head is not None
    assert (head.category, head.alias, head.version) == (ev.AGENT_CATEGORY, "http://a.test", 1)
    assert head.state == {**initial_agent_state("http://a.test"), "refusals": 1}


# --------------------------------------------------------------------------------------------------
# The authenticated extended card (R15) read by :class:`Discovery`, field by field, against real
# HTTP servers on 127.0.0.1.
#
# Where ``GetExtendedAgentCard`` is asked on each binding and version, what a read records (every
# key of its ``CardFetched``) and stores, when the memo answers instead of the wire (per key, per
# agent, up to ``max_card_age`` and 64 reads), how a signed extended card is checked and its key set
# pinned apart from the public card's, what a failure records (a signature refusal) or leaves
# unrecorded (an answer that is not a card, whatever the transport raises), and when a signed public
# card may be confirmed by a 304. The agent is a raw HTTP/1.1 server of ``tests/support/hostile.py``
# answering per path; every test runs in well under a second.


RPC = "/rpc"
REST = "/rest"
REST03 = "/rest03"
JWKS = "/jwks.json"
PUBLIC_REVISION = "the-public-revision"


def public_document() -> dict[str, Any]:
    return card_document(
        "http://127.0.0.1:1/rpc",
        capabilities={"pushNotifications": True, "extendedAgentCard": True},
    )


def extended_document(*, version: str = "2.0.0", push: bool = False) -> dict[str, Any]:
    """The extended card: one more skill than the public card, its own version."""
    doc = public_document()
    doc["version"] = version
    doc["capabilities"]["pushNotifications"] = push
    doc["skills"].append(skill("vip"))
    return doc


def rpc_card(doc: object) -> Callable[[Request], Reply]:
    """A JSON-RPC answer to ``GetExtendedAgentCard`` whose result is ``doc``."""

    def answer(request: Request) -> Reply:
        rid = json.loads(request.body)["id"]
        payload = {"jsonrpc": "2.0", "id": rid, "result": doc}
        return Reply(body=json.dumps(payload).encode(), headers=dict(JSON))

    return answer


def rpc_error(code: int, message: str) -> Callable[[Request], Reply]:
    def answer(request: Request) -> Reply:
        rid = json.loads(request.body)["id"]
        payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
        return Reply(body=json.dumps(payload).encode(), headers=dict(JSON))

    return answer


def rest_card(doc: object) -> Reply:
    return Reply(body=json.dumps(doc).encode(), headers=dict(JSON))


def parsed(doc: dict[str, Any], url: str) -> AgentCard:
    """The card as Discovery parses what the transport hands it (keys sorted, compact)."""
    raw = json.dumps(doc, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    return parse_card(raw, url=url)


@pytest.fixture
def key() -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": "card-key"})


def rpc_transport(client: httpx.AsyncClient, server: RoutedServer) -> A2ATransport:
    return A2ATransport(client, Interface(server.url + RPC, JSONRPC, "1.0"), timeout=2.0)


def key_file(tmp_path: Path, key: ECKey) -> str:
    path = tmp_path / "agent.jwks.json"
    path.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    return str(path)


def signed_limits(server: RoutedServer, policy: SignaturePolicy) -> CardLimits:
    signatures = CardSignatures.of({server.url: policy})
    return CardLimits(timeout=2.0, connect_timeout=1.0, signatures=signatures)


def fetched(read: CardRead, binding: str, public_revision: str | None) -> dict[str, Any]:
    """The ``CardFetched`` of an extended read, every key."""
    return {
        "url": read.url,
        "status": 200,
        "revision": read.card.revision,
        "version": read.card.version,
        "etag": None,
        "last_modified": None,
        "contract_hash": read.card.contract_hash,
        "push_notifications": read.card.push_notifications,
        "fetched_at": read.fetched_at.isoformat(),
        "extended": True,
        "binding": binding,
        "public_revision": public_revision,
    }


def verified(keys: CardKeys, doc: dict[str, Any], policy: str, pin: str) -> dict[str, Any]:
    """The ``signature`` of a read verified with ``keys``, every key."""
    return {
        "policy": policy,
        "status": "verified",
        "form": FORM_RFC8785,
        "alg": "ES256",
        "kid": "card-key",
        "index": 0,
        "signatures": doc["signatures"],
        "keys": keys.record(),
        "pin": pin,
    }


def failure(store: EventStore, origin: str, before: datetime) -> tuple[str, dict[str, Any]]:
    """The one event of a refused read, but its time (checked: between ``before`` and now)."""
    [(kind, data)] = events_of(store, origin)
    assert before <= datetime.fromisoformat(data["at"]) <= datetime.now(UTC)
    return kind, {k: v for k, v in data.items() if k != "at"}


# -- where the extended card is asked --------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "0.3"])
@pytest.mark.parametrize("url", ["https://a.test/rpc", "https://a.test/agents/X/"])
def test_over_jsonrpc_the_extended_card_is_asked_at_the_interface_url_itself(
    url: str, version: str
) -> None:
    assert extended_card_url(Interface(url, JSONRPC, version)) == url


@pytest.mark.parametrize(
    ("url", "version", "legacy", "expected"),
    [
        ("https://a.test/rest", "1.0", False, "https://a.test/rest/extendedAgentCard"),
        ("https://a.test/agents/X/", "1.0", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/agents/X//", "1.1", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/agents/X/", "", False, "https://a.test/agents/X/extendedAgentCard"),
        ("https://a.test/rest", "0.3", False, "https://a.test/rest/v1/card"),
        ("https://a.test/agents/X/", "0.3.0", False, "https://a.test/agents/X/v1/card"),
        ("https://a.test/agents/X/", "0.2", False, "https://a.test/agents/X/v1/card"),
        ("https://a.test/agents/X/", "", True, "https://a.test/agents/X/v1/card"),
    ],
)
def test_over_http_json_the_extended_card_is_under_the_url_without_its_trailing_slash(
    url: str, version: str, legacy: bool, expected: str
) -> None:
    """1.0: ``{url}/extendedAgentCard``; the 0.3 dialect (0.2 too, and a 0.x card declaring no
    version): ``{url}/v1/card``. Trailing slashes go, nothing else (``X`` is kept)."""
    interface = Interface(url, HTTP_JSON, version, legacy_card=legacy)
    assert extended_card_url(interface) == expected


# -- one extended read on the wire -----------------------------------------------------------------


async def test_an_extended_read_over_jsonrpc_records_every_field_and_stores_its_own_snapshot(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    doc = extended_document()
    server.routes[RPC] = rpc_card(doc)
    discovery = Discovery(store, client, limits=FAST)
    before = datetime.now(UTC)

    read = await discovery.read_extended(
        server.url + "/agents/a/", rpc_transport(client, server), public_revision=PUBLIC_REVISION
    )

    url = server.url + RPC
    card = parsed(doc, url)
    assert (read.agent, read.url, read.status) == (server.url, url, 200)
    assert (read.etag, read.last_modified, read.from_memo) == (None, None, False)
    assert read.card == card
    assert read.revision == card.revision
    assert read.card.source_url == url
    assert [skill.id for skill in read.card.skills] == ["echo", "vip"]
    assert before <= read.fetched_at <= datetime.now(UTC)
    [request] = server.requests
    assert (request.method, request.path, request.rpc_method) == (
        "POST",
        RPC,
        "GetExtendedAgentCard",
    )
    assert events_of(store, server.url) == [
        (ev.CARD_FETCHED, fetched(read, "JSONRPC", PUBLIC_REVISION))
    ]
    assert events_of(store, server.url)[0][1]["version"] == "2.0.0"
    assert store.snapshot_revisions() == [read.revision]
    snapshot = store.get_snapshot(read.revision)
    assert snapshot is not None
    assert (snapshot.body, snapshot.source_url) == (card.canonical_bytes().decode(), url)
    assert (snapshot.etag, snapshot.http_status, snapshot.fetched_at) == (
        None,
        200,
        read.fetched_at,
    )
    # The public card's fields of the agent's projection are left alone.
    state = await discovery.agent_state(server.url)
    assert (state["revision"], state["card_url"], state["etag"]) == (None, None, None)


@pytest.mark.parametrize(
    ("prefix", "version", "path"),
    [(REST, "1.0", REST + "/extendedAgentCard"), (REST03, "0.3", REST03 + "/v1/card")],
    ids=["1.0", "0.3"],
)
async def test_an_extended_read_over_http_json_is_recorded_at_the_path_it_was_asked(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    prefix: str,
    version: str,
    path: str,
) -> None:
    """Without ``public_revision``, the record says None; the binding is the interface's."""
    doc = extended_document(push=True)
    server.routes[path] = rest_card(doc)
    transport = A2ATransport(client, Interface(server.url + prefix + "/", HTTP_JSON, version))

    read = await Discovery(store, client, limits=FAST).read_extended(server.url, transport)

    assert [(r.method, r.path) for r in server.requests] == [("GET", path)]
    assert (read.url, read.status) == (server.url + path, 200)
    assert read.card == parsed(doc, server.url + path)
    assert events_of(store, server.url) == [(ev.CARD_FETCHED, fetched(read, "HTTP+JSON", None))]
    assert events_of(store, server.url)[0][1]["push_notifications"] is True
    assert store.snapshot_revisions() == [read.revision]


# -- the memo --------------------------------------------------------------------------------------


async def test_an_extended_read_not_fresh_is_served_from_its_memo_until_max_card_age_old(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    now = [1000.0]
    discovery = Discovery(store, client, limits=FAST, max_card_age=60.0, clock=lambda: now[0])

    first = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert first.status == 200  # nothing kept yet: from the wire
    assert len(server.requests) == 1

    now[0] += 59.5
    memo = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert memo == dataclasses.replace(first, status=0)
    assert memo.from_memo
    assert (memo.fetched_at, memo.url, memo.agent) == (first.fetched_at, first.url, server.url)
    assert len(server.requests) == 1
    assert len(events_of(store, server.url)) == 1

    now[0] += 0.5  # exactly max_card_age old: read again, and kept from now on
    second = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert second.status == 200
    assert second.fetched_at > first.fetched_at
    assert len(server.requests) == 2
    assert len(events_of(store, server.url)) == 2

    now[0] += 59.9
    again = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert again == dataclasses.replace(second, status=0)
    assert len(server.requests) == 2


async def test_an_extended_read_is_fresh_by_default_and_refreshes_what_its_memo_keeps(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    first = await discovery.read_extended(server.url, transport, memo="alice")
    second = await discovery.read_extended(server.url, transport, memo="alice")
    third = await discovery.read_extended(server.url, transport, memo="alice", fresh=True)
    assert [r.status for r in (first, second, third)] == [200, 200, 200]
    assert len(server.requests) == 3
    assert len(events_of(store, server.url)) == 3

    kept = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert kept == dataclasses.replace(third, status=0)
    assert kept.fetched_at == third.fetched_at != first.fetched_at
    assert len(server.requests) == 3


async def test_an_extended_read_without_a_memo_key_is_never_served_from_memory(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    for _ in range(3):
        read = await discovery.read_extended(server.url, transport, fresh=False)
        assert read.status == 200
    assert len(server.requests) == 3
    assert len(events_of(store, server.url)) == 3


async def test_the_extended_memo_is_kept_apart_per_key_and_per_agent(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)
    other = f"http://localhost:{server.port}"  # another origin, the same agent behind it

    alice = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    bob = await discovery.read_extended(server.url, transport, memo="bob", fresh=False)
    elsewhere = await discovery.read_extended(other, transport, memo="alice", fresh=False)
    assert [r.status for r in (alice, bob, elsewhere)] == [200, 200, 200]
    assert (alice.agent, elsewhere.agent) == (server.url, other)
    assert len(server.requests) == 3

    assert await discovery.read_extended(
        server.url, transport, memo="alice", fresh=False
    ) == dataclasses.replace(alice, status=0)
    assert await discovery.read_extended(
        server.url, transport, memo="bob", fresh=False
    ) == dataclasses.replace(bob, status=0)
    assert await discovery.read_extended(
        other, transport, memo="alice", fresh=False
    ) == dataclasses.replace(elsewhere, status=0)
    assert len(server.requests) == 3
    assert [t for t, _ in events_of(store, server.url)] == [ev.CARD_FETCHED] * 2
    assert [t for t, _ in events_of(store, other)] == [ev.CARD_FETCHED]


async def test_the_extended_memo_keeps_the_last_64_reads_and_forgets_the_least_recently_used(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card(extended_document())
    transport = rpc_transport(client, server)
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)

    async def read(key: int, *, fresh: bool = False) -> bool:
        """Whether the read of memo key ``key`` went to the wire."""
        asked = len(server.requests)
        got = await discovery.read_extended(server.url, transport, memo=key, fresh=fresh)
        went = len(server.requests) > asked
        assert got.from_memo is not went
        return went

    assert all([await read(k) for k in range(64)])
    assert not any([await read(k) for k in range(64)])  # all 64 kept (the same order)
    assert not await read(0)  # served: now the most recently used
    assert await read(1, fresh=True)  # kept again: now the most recently used
    assert await read(64)  # the 65th: the least recently used (2) goes
    assert not await read(64)
    assert not any([await read(k) for k in (0, 1, 3, 63)])
    assert await read(2)
    assert len(server.requests) == 67


# -- a signed extended card ------------------------------------------------------------------------


async def test_a_signed_extended_card_is_verified_recorded_with_its_signature_and_key_set(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    keys_path = key_file(tmp_path, key)
    limits = signed_limits(server, SignaturePolicy("require", keys_path))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    url = server.url + RPC

    read = await discovery.read_extended(
        server.url, transport, public_revision=PUBLIC_REVISION, memo="alice"
    )
    again = await discovery.read_extended(server.url, transport, public_revision="p2")

    keys = read_key_file(keys_path, url, FAST.max_bytes)
    assert events_of(store, server.url) == [
        (
            ev.CARD_FETCHED,
            {
                **fetched(read, "JSONRPC", PUBLIC_REVISION),
                "signature": verified(keys, doc, "require", "pinned"),
            },
        ),
        (
            ev.CARD_FETCHED,
            {
                **fetched(again, "JSONRPC", "p2"),
                "signature": verified(keys, doc, "require", "matched"),
            },
        ),
    ]
    # The card is stored without its signatures, the key set as a snapshot of its own.
    assert set(store.snapshot_revisions()) == {read.revision, keys.revision}
    snapshot = store.get_snapshot(read.revision)
    assert snapshot is not None
    assert "signatures" not in json.loads(snapshot.body)
    stored_keys = store.get_snapshot(keys.revision)
    assert stored_keys is not None
    assert (stored_keys.body, stored_keys.source_url, stored_keys.etag) == (
        keys.body,
        keys.url,
        None,
    )
    assert (stored_keys.http_status, stored_keys.fetched_at) == (200, read.fetched_at)
    # A verified read is kept in its memo.
    kept = await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert kept == dataclasses.replace(read, status=0)
    assert len(server.requests) == 2


async def test_an_extended_card_failing_its_agents_policy_is_recorded_and_neither_stored_nor_kept(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    server.routes[RPC] = rpc_card(extended_document())  # unsigned
    key = ECKey.generate_key("P-256", parameters={"kid": "card-key"})
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    before = datetime.now(UTC)

    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url + "/a/", transport, memo="alice", fresh=False)

    reason = "the card is not signed, and its agent's policy requires a signature"
    assert (caught.value.url, caught.value.kind, caught.value.detail) == (
        server.url + RPC,
        "signature",
        reason,
    )
    assert failure(store, server.url, before) == (
        ev.DISCOVERY_FAILED,
        {"url": server.url + RPC, "kind": "signature", "detail": reason},
    )
    assert store.snapshot_revisions() == []
    with pytest.raises(CardSignatureError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.requests) == 2
    assert [t for t, _ in events_of(store, server.url)] == [ev.DISCOVERY_FAILED] * 2
    assert store.snapshot_revisions() == []


async def test_an_extended_cards_signatures_are_checked_for_its_agent_at_the_url_it_came_from(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
) -> None:
    """The policy is the agent's (by its origin, not the interface's path), and a refusal names
    the agent and the extended card's URL."""
    server.routes[REST + "/extendedAgentCard"] = rest_card(sign_card(extended_document(), key))
    limits = signed_limits(server, SignaturePolicy("require"))  # no keys, no jku
    discovery = Discovery(store, client, limits=limits)
    transport = A2ATransport(client, Interface(server.url + REST, HTTP_JSON, "1.0"))
    before = datetime.now(UTC)

    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url + "/agents/a/", transport)

    url = server.url + REST + "/extendedAgentCard"
    reason = (
        f"no keys to verify the card's signatures with: none are configured for {server.url}, "
        "and the signatures name no jku"
    )
    assert (caught.value.url, caught.value.detail) == (url, reason)
    assert failure(store, server.url, before) == (
        ev.DISCOVERY_FAILED,
        {"url": url, "kind": "signature", "detail": reason},
    )
    assert store.snapshot_revisions() == []


async def test_the_extended_cards_key_set_is_read_within_the_card_timeout(
    server: RoutedServer, store: EventStore, key: ECKey
) -> None:
    jwks = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    server.routes[JWKS] = Reply(body=jwks, headers=dict(JSON))
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    seen: list[tuple[str, float | None, float]] = []

    async def note(request: httpx.Request) -> None:
        seen.append((request.url.path, deadline.current(), time.monotonic()))

    limits = signed_limits(server, SignaturePolicy("require", server.url + JWKS))
    async with httpx.AsyncClient(event_hooks={"request": [note]}) as client:
        discovery = Discovery(store, client, limits=limits)
        read = await discovery.read_extended(server.url, rpc_transport(client, server))

    assert [path for path, *_ in seen] == [RPC, JWKS]
    [(_, bound, at)] = [entry for entry in seen if entry[0] == JWKS]
    assert bound is not None
    assert limits.timeout - 0.5 < bound - at <= limits.timeout
    keys = parse_keys(
        jwks, source="url", url=server.url + JWKS, card_url=read.url, max_bytes=FAST.max_bytes
    )
    [(_, data)] = events_of(store, server.url)
    assert data["signature"] == verified(keys, doc, "require", "pinned")
    assert data["signature"]["keys"]["source"] == "url"
    assert set(store.snapshot_revisions()) == {read.revision, keys.revision}


async def test_the_extended_cards_key_set_is_pinned_apart_from_the_public_cards(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    """The public card's pin does not count for the extended card: its first verified read pins
    its own, the next matches it, and an unsigned extended card after it is a downgrade, refused
    and recorded, neither stored nor kept."""
    server.routes[CARD] = Reply(body=json.dumps(sign_card(public_document(), key)).encode())
    doc = sign_card(extended_document(), key)
    server.routes[RPC] = rpc_card(doc)
    keys_path = key_file(tmp_path, key)
    limits = signed_limits(server, SignaturePolicy("prefer", keys_path))
    discovery = Discovery(store, client, limits=limits, clock=lambda: 0.0)
    transport = rpc_transport(client, server)
    url = server.url + RPC
    keys = read_key_file(keys_path, url, FAST.max_bytes)

    public = await discovery.read(server.url)
    first = await discovery.read_extended(server.url, transport, public_revision=public.revision)
    second = await discovery.read_extended(server.url, transport, public_revision=public.revision)
    pins = [d["signature"]["pin"] for _, d in events_of(store, server.url)]
    assert pins == ["pinned", "pinned", "matched"]
    assert events_of(store, server.url)[1:] == [
        (
            ev.CARD_FETCHED,
            {
                **fetched(read, "JSONRPC", public.revision),
                "signature": verified(keys, doc, "prefer", pin),
            },
        )
        for read, pin in ((first, "pinned"), (second, "matched"))
    ]
    stored = set(store.snapshot_revisions())

    server.routes[RPC] = rpc_card(extended_document(version="3.0.0"))  # unsigned
    before = datetime.now(UTC)
    with pytest.raises(CardSignatureError) as caught:
        await discovery.read_extended(server.url, transport, memo="alice")
    reason = (
        f"the card is unsigned, and key set {keys.key_set[:12]} is pinned for {server.url}: "
        "refused as a downgrade (accept_key_change accepts it)"
    )
    assert (caught.value.url, caught.value.detail) == (url, reason)
    (kind, data) = events_of(store, server.url)[-1]
    assert (kind, data["url"], data["kind"], data["detail"]) == (
        ev.DISCOVERY_FAILED,
        url,
        "signature",
        reason,
    )
    assert before <= datetime.fromisoformat(data["at"]) <= datetime.now(UTC)
    assert set(data) == {"url", "kind", "detail", "at"}
    assert set(store.snapshot_revisions()) == stored
    with pytest.raises(CardSignatureError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.paths()) == 5


# -- what is not a card, and what the transport raises ---------------------------------------------


async def test_an_answer_that_is_not_a_card_is_refused_as_invalid_and_nothing_is_recorded(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[RPC] = rpc_card({"name": "not a card"})
    discovery = Discovery(store, client, limits=FAST, clock=lambda: 0.0)
    transport = rpc_transport(client, server)

    with pytest.raises(CardInvalidError) as caught:
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)

    assert (caught.value.url, caught.value.kind) == (server.url + RPC, "invalid_card")
    assert events_of(store, server.url) == []
    assert store.snapshot_revisions() == []
    with pytest.raises(CardInvalidError):  # not kept: asked again
        await discovery.read_extended(server.url, transport, memo="alice", fresh=False)
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("route", "answer", "raised"),
    [
        (RPC, rpc_error(-32007, "Extended card not configured"), RemoteRefusedError),
        (RPC, rpc_card(["not", "an", "object"]), InvalidAgentResponseError),
        ("/elsewhere", rest_card({}), EndpointUnreachableError),  # the RPC path is a 404
    ],
    ids=["refused", "not-an-object", "unreachable"],
)
async def test_what_the_transport_raises_passes_through_and_nothing_is_recorded(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
    route: str,
    answer: Answer,
    raised: type[Exception],
) -> None:
    server.routes[route] = answer
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    discovery = Discovery(store, client, limits=limits)

    with pytest.raises(raised) as caught:
        await discovery.read_extended(server.url, rpc_transport(client, server), memo="alice")

    assert type(caught.value) is raised
    assert getattr(caught.value, "url", None) == server.url + RPC
    if isinstance(caught.value, RemoteRefusedError):
        assert caught.value.code == -32007
    assert events_of(store, server.url) == []
    assert store.snapshot_revisions() == []


# -- when a signed public card may be confirmed by a 304 -------------------------------------------


async def test_the_memo_holds_only_the_revision_last_read_from_that_origin(
    server: RoutedServer, store: EventStore, client: httpx.AsyncClient
) -> None:
    server.routes[CARD] = Reply(body=json.dumps(public_document()).encode())
    discovery = Discovery(store, client, limits=FAST)
    assert not discovery._memo_holds(server.url, None)
    assert not discovery._memo_holds(
        server.url, parse_card(json.dumps(public_document()).encode()).revision
    )

    read = await discovery.read(server.url)

    assert discovery._memo_holds(server.url, read.revision) is True
    assert discovery._memo_holds(server.url, "another-revision") is False
    assert discovery._memo_holds(server.url, None) is False
    assert discovery._memo_holds(f"http://localhost:{server.port}", read.revision) is False
    # An extended read is not the public card's memo.
    server.routes[RPC] = rpc_card(extended_document())
    extended = await discovery.read_extended(server.url, rpc_transport(client, server), memo="a")
    assert discovery._memo_holds(server.url, extended.revision) is False
    assert discovery._memo_holds(server.url, read.revision) is True


async def test_a_signed_card_is_confirmed_by_a_304_only_while_its_revision_is_in_memory(
    server: RoutedServer,
    store: EventStore,
    client: httpx.AsyncClient,
    key: ECKey,
    tmp_path: Path,
) -> None:
    """A 304 confirms a signed card only when its signatures are at hand: the revision the
    agent's stream names is the one in memory. Otherwise the card is read whole, no validator."""

    def served(doc: dict[str, Any], etag: str) -> Callable[[Request], Reply]:
        def answer(request: Request) -> Reply:
            if "if-none-match" in request.headers:
                return Reply(status=304, body=b"", headers={})
            return Reply(body=json.dumps(doc).encode(), headers={**JSON, "ETag": etag})

        return answer

    server.routes[CARD] = served(sign_card(public_document(), key), '"e1"')
    limits = signed_limits(server, SignaturePolicy("require", key_file(tmp_path, key)))
    holder = Discovery(store, client, limits=limits)
    first = await holder.read(server.url)
    assert first.status == 200
    assert "if-none-match" not in server.requests[-1].headers

    assert (await holder.read(server.url)).status == 304  # in memory: confirmed
    assert server.requests[-1].headers["if-none-match"] == '"e1"'

    other = Discovery(store, client, limits=limits)  # nothing in memory: read whole
    assert (await other.read(server.url)).status == 200
    assert "if-none-match" not in server.requests[-1].headers

    changed = public_document()
    changed["version"] = "1.1.0"
    server.routes[CARD] = served(sign_card(changed, key), '"e2"')
    newer = await Discovery(store, client, limits=limits).read(server.url)
    assert newer.revision != first.revision
    # The stream names the newer revision; the holder's memory has the older one: read whole.
    again = await holder.read(server.url)
    assert (again.status, again.revision) == (200, newer.revision)
    assert "if-none-match" not in server.requests[-1].headers
    assert len(server.requests) == 5
