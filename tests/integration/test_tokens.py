"""OAuth 2.0 client credentials tokens (R15) against a real token server on 127.0.0.1
(``tests/support/oauth.py``: Authlib's server core), fetched with real httpx by
:class:`cardfence.engine.auth.tokens.TokenSource`: cached, shared, refreshed, bounded (R16), and
failing with a one-line cause that never shows a secret."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from support import TokenServer
from support.virtual_time import Clock

from cardfence.engine.auth import tokens
from cardfence.engine.auth.config import OAuthClient
from cardfence.engine.auth.credentials import TokenNeeded
from cardfence.engine.auth.tokens import AccessToken, TokenSource
from cardfence.engine.errors import AuthorizationFailedError, TokenRequestError
from cardfence.engine.http import deadline

SCHEME = "corp-oauth"


@pytest.fixture(scope="module")
def shared_server() -> Iterator[TokenServer]:
    with TokenServer() as running:
        yield running


@pytest.fixture
def server(shared_server: TokenServer) -> Iterator[TokenServer]:
    """The module's token server in normal service, counters zeroed."""
    shared_server.reset()
    yield shared_server
    shared_server.reset()  # ends a "hang" still holding a request


@pytest.fixture
def client(server: TokenServer) -> OAuthClient:
    """A client of its own for each test, allowed the scopes read and write."""
    registered = OAuthClient(f"client-{secrets.token_hex(4)}", secrets.token_urlsafe(24))
    server.register(registered.client_id, registered.client_secret, scopes=("read", "write"))
    return registered


def oauth2(server: TokenServer, client: OAuthClient, *scopes: str) -> TokenNeeded:
    return TokenNeeded("oauth2", client, scopes or ("read",), token_url=server.token_url)


def oidc(server: TokenServer, client: OAuthClient, *scopes: str) -> TokenNeeded:
    return TokenNeeded(
        "openIdConnect", client, scopes or ("read",), discovery_url=server.discovery_url
    )


async def refused(source: TokenSource, needed: TokenNeeded, **options: bool) -> TokenRequestError:
    with pytest.raises(TokenRequestError) as caught:
        await source.token(needed, scheme=SCHEME, **options)
    error = caught.value
    message = str(error)
    assert "\n" not in message
    assert needed.client.client_secret not in message
    assert needed.client.client_secret not in repr(error)
    return error


# -- fetched, cached, shared ----------------------------------------------------------------------


async def test_token_is_fetched_once_and_served_from_the_cache(
    server: TokenServer, client: OAuthClient
) -> None:
    async with TokenSource() as source:
        got = [await source.token(oauth2(server, client)) for _ in range(5)]

    assert len({token.value for token in got}) == 1
    assert (server.token_requests, source.requests) == (1, 1)
    token = got[0]
    assert (token.token_type, token.scopes, token.kid) == ("Bearer", ("read",), None)
    assert token.authorization() == f"Bearer {token.value}"
    assert server.check(token.value) == ("read",)
    assert token.value not in repr(token)
    assert token.value not in str(token)


async def test_concurrent_callers_share_one_request(
    server: TokenServer, client: OAuthClient
) -> None:
    async with TokenSource() as source:
        got = await asyncio.gather(*(source.token(oauth2(server, client)) for _ in range(20)))

    assert len({token.value for token in got}) == 1
    assert server.token_requests == 1


async def test_concurrent_callers_share_one_failure(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "500"
    async with TokenSource() as source:
        outcomes = await asyncio.gather(
            *(source.token(oauth2(server, client), scheme=SCHEME) for _ in range(5)),
            return_exceptions=True,
        )

    assert all(isinstance(outcome, TokenRequestError) for outcome in outcomes)
    assert server.token_requests == 1


async def test_each_scope_set_and_each_client_gets_its_own_token(
    server: TokenServer, client: OAuthClient
) -> None:
    other = OAuthClient("other-" + client.client_id, secrets.token_urlsafe(24))
    server.register(other.client_id, other.client_secret, scopes=("read",))
    async with TokenSource() as source:
        read = await source.token(oauth2(server, client, "read"))
        both = await source.token(oauth2(server, client, "write", "read"))
        same = await source.token(oauth2(server, client, "read", "write"))
        theirs = await source.token(oauth2(server, other, "read"))

    assert both == same
    assert len({read.value, both.value, theirs.value}) == 3
    assert server.check(both.value) == ("write", "read")
    assert server.token_requests == 3


async def test_granted_scopes_are_those_the_server_names(
    server: TokenServer, client: OAuthClient
) -> None:
    async with TokenSource() as source:
        token = await source.token(oauth2(server, client, "read", "admin"))

    assert token.scopes == ("read",)  # admin was not granted
    assert server.check(token.value) == ("read",)


# -- expiry and refresh ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expires_in", "renew_at"),
    [(100, 90.0), (3600, 3540.0)],
    ids=["ten-percent-of-a-short-lifetime", "sixty-seconds-of-a-long-one"],
)
async def test_token_is_fetched_anew_within_the_margin_before_it_expires(
    server: TokenServer, client: OAuthClient, expires_in: int, renew_at: float
) -> None:
    server.expires_in = expires_in
    clock = Clock()
    async with TokenSource(clock=clock) as source:
        first = await source.token(oauth2(server, client))
        assert first.expires_at == expires_in
        clock.now = renew_at - 0.1
        assert await source.token(oauth2(server, client)) == first
        clock.now = renew_at + 0.1
        second = await source.token(oauth2(server, client))
        assert await source.token(oauth2(server, client)) == second

    assert second.value != first.value
    assert second.expires_at == renew_at + 0.1 + expires_in
    assert server.token_requests == 2


async def test_token_without_a_lifetime_is_kept(server: TokenServer, client: OAuthClient) -> None:
    server.expires_in = 0  # the answer carries no expires_in
    clock = Clock()
    async with TokenSource(clock=clock) as source:
        first = await source.token(oauth2(server, client))
        clock.now = 1e9
        assert await source.token(oauth2(server, client)) == first

    assert first.expires_at is None
    assert server.token_requests == 1


async def test_short_lived_token_expires_on_the_server_and_is_replaced(
    server: TokenServer, client: OAuthClient
) -> None:
    server.expires_in = 1
    async with TokenSource() as source:
        first = await source.token(oauth2(server, client))
        await asyncio.sleep(1.05)
        second = await source.token(oauth2(server, client))

    assert server.check(first.value) is None
    assert server.check(second.value) == ("read",)
    assert server.token_requests == 2


async def test_refresh_makes_exactly_one_new_request_and_caches_its_token(
    server: TokenServer, client: OAuthClient
) -> None:
    async with TokenSource() as source:
        first = await source.token(oauth2(server, client))
        server.revoke_tokens()  # the agent would answer 401 to it
        fresh = await source.token(oauth2(server, client), refresh=True)
        again = await source.token(oauth2(server, client))

    assert fresh.value != first.value
    assert again == fresh
    assert server.check(fresh.value) == ("read",)
    assert server.token_requests == 2


async def test_forget_drops_the_cached_token(server: TokenServer, client: OAuthClient) -> None:
    async with TokenSource() as source:
        first = await source.token(oauth2(server, client))
        source.forget(oauth2(server, client))
        second = await source.token(oauth2(server, client))

    assert second.value != first.value
    assert server.token_requests == 2


# -- OpenID Connect -------------------------------------------------------------------------------


async def test_openid_connect_discovery_is_read_once_then_its_token_endpoint_is_used(
    server: TokenServer, client: OAuthClient
) -> None:
    recorded: list[tuple[str, bytes]] = []

    async def record(url: str, body: bytes) -> None:
        recorded.append((url, body))

    async with TokenSource(on_discovery=record) as source:
        first = await asyncio.gather(
            source.token(oidc(server, client, "read")),
            source.token(oidc(server, client, "write")),
            source.token(oidc(server, client, "read")),
        )
        later = await source.token(oidc(server, client, "read", "write"))

    assert server.discovery_requests == 1
    assert server.token_requests == 3  # read, write, read+write
    assert first[0] == first[2]
    assert server.check(later.value) == ("read", "write")
    [(url, body)] = recorded
    assert url == server.discovery_url
    document = json.loads(body)
    assert (document["issuer"], document["token_endpoint"]) == (server.issuer, server.token_url)


async def test_discovery_naming_a_plain_http_token_endpoint_elsewhere_is_refused(
    server: TokenServer, client: OAuthClient
) -> None:
    server.discovery_overrides = {"token_endpoint": "http://tokens.example/oauth/token"}
    recorded: list[str] = []

    async def record(url: str, body: bytes) -> None:
        recorded.append(url)

    async with TokenSource(on_discovery=record) as source:
        error = await refused(source, oidc(server, client))

    assert error.url == server.discovery_url
    assert "token_endpoint http://tokens.example/oauth/token refused" in error.token_detail
    assert "nothing sent" in error.token_detail
    assert (server.token_requests, source.requests, recorded) == (0, 0, [])


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        ({"token_endpoint": None}, "names no token_endpoint"),
        ({"token_endpoint": ["http://127.0.0.1/token"]}, "names no token_endpoint"),
    ],
)
async def test_discovery_document_without_a_token_endpoint_is_refused(
    server: TokenServer, client: OAuthClient, overrides: dict[str, object], cause: str
) -> None:
    server.discovery_overrides = overrides
    async with TokenSource() as source:
        error = await refused(source, oidc(server, client))

    assert cause in error.token_detail
    assert server.token_requests == 0


async def test_discovery_document_that_is_not_there_is_named_with_its_status(
    server: TokenServer, client: OAuthClient
) -> None:
    needed = TokenNeeded("openIdConnect", client, (), discovery_url=server.base_url + "/nope")
    async with TokenSource() as source:
        error = await refused(source, needed)

    assert (error.token_detail, error.status) == ("discovery document: HTTP 404", 404)
    assert server.token_requests == 0


# -- refusals -------------------------------------------------------------------------------------


async def test_wrong_secret_is_refused_as_invalid_client_without_showing_the_secret(
    server: TokenServer, client: OAuthClient
) -> None:
    wrong = OAuthClient(client.client_id, "not-" + client.client_secret)
    async with TokenSource() as source:
        error = await refused(source, oauth2(server, wrong))

    assert isinstance(error, AuthorizationFailedError)
    assert (error.status, error.scheme, error.url) == (401, SCHEME, server.token_url)
    assert error.token_detail.startswith("HTTP 401 invalid_client")
    assert SCHEME in str(error)


async def test_revoked_client_gets_no_token_and_its_tokens_stop_being_live(
    server: TokenServer, client: OAuthClient
) -> None:
    async with TokenSource() as source:
        token = await source.token(oauth2(server, client))
        server.revoke_client(client.client_id)
        error = await refused(source, oauth2(server, client), refresh=True)

    assert "invalid_client" in error.token_detail
    assert server.check(token.value) is None


async def test_secret_repeated_by_the_server_is_hidden_in_the_message(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "echo_secret"
    async with TokenSource() as source:
        error = await refused(source, oauth2(server, client))

    assert error.status == 401
    assert error.token_detail.startswith("HTTP 401 invalid_client: the client secret '***'")


async def test_neither_the_secret_nor_the_token_reaches_the_log(
    server: TokenServer, client: OAuthClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with TokenSource() as source:
        token = await source.token(oauth2(server, client))
        server.fault = "echo_secret"
        await refused(source, oauth2(server, client), refresh=True)

    # The server's own records (Authlib's server core logs what it issues) are not the client's.
    client_side = [r for r in caplog.records if not r.name.startswith("authlib.oauth2")]
    assert client_side  # httpx and httpcore did log the exchanges
    text = "\n".join(record.getMessage() for record in client_side)
    assert client.client_secret not in text
    assert token.value not in text


@pytest.mark.parametrize(
    ("fault", "status", "cause"),
    [
        ("not_json", 200, "HTTP 200: the answer is not a JSON object"),
        ("no_token", 200, "HTTP 200: the answer has no access_token"),
        ("500", 500, "HTTP 500"),
        ("not_bearer", 200, "HTTP 200: token_type 'mac' is not Bearer"),
        ("redirect", 307, "HTTP 307: redirect to http://127.0.0.1:"),
    ],
)
async def test_unusable_answer_fails_with_its_cause_in_one_line(
    server: TokenServer, client: OAuthClient, fault: str, status: int, cause: str
) -> None:
    server.fault = fault
    async with TokenSource() as source:
        error = await refused(source, oauth2(server, client))

    assert error.token_detail.startswith(cause)
    assert error.status == status
    assert server.token_requests == 1  # a redirect is not followed


async def test_huge_answer_is_cut_soon_after_the_limit(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "huge"
    async with TokenSource(max_bytes=64 * 1024) as source:
        error = await refused(source, oauth2(server, client))

    assert error.token_detail.startswith("HTTP 200: answer body over the limit of 65536 bytes")
    assert error.status == 200
    stopped = re.search(r"stopped reading at (\d+)", error.token_detail)
    assert stopped is not None
    assert int(stopped.group(1)) < 1024 * 1024
    await asyncio.sleep(0.2)  # the server notices the client went away
    assert server.huge_bytes_sent < 1024 * 1024  # of 5 MiB


async def test_compression_bomb_is_cut_at_the_decoded_limit(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "gzip_bomb"
    async with TokenSource(max_bytes=64 * 1024) as source:
        error = await refused(source, oauth2(server, client))

    assert error.token_detail.startswith("HTTP 200: answer body over the limit of 65536 bytes")
    assert "once decoded" in error.token_detail


async def test_compressed_answer_is_decoded(server: TokenServer, client: OAuthClient) -> None:
    server.compress = True
    async with TokenSource() as source:
        token = await source.token(oauth2(server, client))

    assert server.check(token.value) == ("read",)


async def test_plain_http_token_url_to_another_host_is_refused_with_nothing_sent(
    client: OAuthClient,
) -> None:
    needed = TokenNeeded("oauth2", client, ("read",), token_url="http://tokens.example/token")
    async with TokenSource() as source:
        error = await refused(source, needed)

    assert error.token_detail == (
        "token URL refused: plain http to a non-loopback host refused (https required) "
        "(nothing sent)"
    )
    assert source.requests == 0


async def test_unreachable_token_endpoint_is_named(client: OAuthClient) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    needed = TokenNeeded("oauth2", client, ("read",), token_url=f"http://127.0.0.1:{port}/token")
    async with TokenSource() as source:
        error = await refused(source, needed)

    assert error.token_detail.startswith("unreachable (")
    assert error.status is None


# -- time bounds ----------------------------------------------------------------------------------


async def test_deadline_in_force_bounds_a_hanging_token_request(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "hang"
    started = time.monotonic()
    async with TokenSource(timeout=10.0) as source:
        with deadline.within(0.5):
            error = await refused(source, oauth2(server, client))
    took = time.monotonic() - started

    assert error.token_detail.startswith("timeout")
    assert error.token_detail.endswith("(the deadline in force)")
    assert 0.4 < took < 2.0


async def test_timeout_bounds_a_hanging_token_request(
    server: TokenServer, client: OAuthClient
) -> None:
    server.fault = "hang"
    started = time.monotonic()
    async with TokenSource(timeout=0.3) as source:
        error = await refused(source, oauth2(server, client))

    assert error.token_detail.startswith("timeout")
    assert time.monotonic() - started < 1.5


async def test_passed_deadline_sends_nothing(server: TokenServer, client: OAuthClient) -> None:
    async with TokenSource() as source:
        with deadline.within(0):
            error = await refused(source, oauth2(server, client))

    assert "nothing sent" in error.token_detail
    assert server.token_requests == 0


# -- kid ------------------------------------------------------------------------------------------


async def test_kid_is_read_from_the_header_of_a_jwt_token(
    server: TokenServer, client: OAuthClient
) -> None:
    server.jwt = True
    async with TokenSource() as source:
        token = await source.token(oauth2(server, client))

    assert token.kid == server.kid
    assert token.value.count(".") == 2
    assert server.check(token.value) == ("read",)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("opaque-token", id="opaque"),
        pytest.param("a.b.c", id="header-not-base64-json"),
        pytest.param("e30.e30.sig", id="header-without-kid"),
        pytest.param("bm90IGpzb24.e30.sig", id="header-not-json"),
        pytest.param("W10.e30.sig", id="header-not-an-object"),
        pytest.param("eyJraWQiOjF9.e30.sig", id="kid-not-a-string"),
        pytest.param("!!.e30.sig", id="not-base64url"),
    ],
)
def test_kid_is_none_unless_a_jwt_header_names_one(value: str) -> None:
    assert tokens._kid(value) is None


# -- the pieces -----------------------------------------------------------------------------------


def test_authlib_client_is_an_httpx_client() -> None:
    """Authlib drives httpx2 when it is installed: the bounds here are httpx's."""
    assert issubclass(tokens.AsyncOAuth2Client, httpx.AsyncClient)


def test_access_token_repr_hides_the_value() -> None:
    token = AccessToken("s3cr3t-token", "Bearer", None, ("read",), "k1")
    assert "s3cr3t-token" not in repr(token)
    assert "k1" in repr(token)
