"""OAuth tokens (engine/auth/tokens.py) word by word: the one-line messages a token failure gives
(cut, flattened, naming the right URL and status), the answers refused before Authlib reads them,
the numbers and key ids read from an answer, and the OpenID Connect discovery read: https only, the
headers it sends, each way it can fail, and two providers' documents read at once. The token
exchanges themselves are tested against a real token server in tests/integration/test_tokens.py."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from support import TlsFiles, TokenServer, make_tls
from support.hostile import Reply, RoutedServer
from support.keepalive import OkServer

from cardfence.engine.auth import tokens
from cardfence.engine.auth.config import OAuthClient
from cardfence.engine.auth.credentials import TokenNeeded
from cardfence.engine.auth.tokens import TokenSource
from cardfence.engine.errors import TokenRequestError
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import BodyRefused

URL = "https://auth.test/token"
DISCOVERY = "/.well-known/openid-configuration"

# -- one line --------------------------------------------------------------------------------------


def test_one_line_flattens_control_characters_and_runs_of_space() -> None:
    assert tokens._one_line("a\r\n\tb   c\x7fd") == "a b c d"


def test_one_line_keeps_up_to_its_limit_and_cuts_past_it_with_an_ellipsis() -> None:
    assert tokens._one_line("x" * 300) == "x" * 300  # the default limit: 300
    assert tokens._one_line("x" * 301) == "x" * 299 + "…"
    assert tokens._one_line("abcdef", 5) == "abcd…"
    assert tokens._one_line("abcde", 5) == "abcde"


def test_a_timeout_says_when_the_deadline_in_force_cut_it() -> None:
    assert tokens._cut_by(10.0, 10.0) == ""
    assert tokens._cut_by(10.5, 10.0) == ""
    assert tokens._cut_by(9.5, 10.0) == " (the deadline in force)"


def test_a_failure_reads_as_its_detail() -> None:
    failure = tokens._Failure(URL, "the detail", 401)
    assert (str(failure), failure.url, failure.status) == ("the detail", URL, 401)


def test_an_answer_refused_while_it_streams_names_the_url_and_status() -> None:
    failure = tokens._refused(URL, 200, BodyRefused("too_large", "over the limit"))
    assert (failure.url, failure.detail, failure.status) == (
        URL,
        "HTTP 200: answer over the limit",
        200,
    )


# -- numbers and key ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 30.0),
        ("3.5", None),
        ("abc", None),
        ("", None),
        ("٣", None),  # a digit, but not an ASCII one
        (30, 30.0),
        (2.5, 2.5),
        (True, None),
        (float("inf"), None),
    ],
)
def test_a_lifetime_is_a_finite_number_or_a_string_of_ascii_digits(
    value: object, seconds: float | None
) -> None:
    assert tokens._seconds(value) == seconds


@pytest.mark.parametrize("length", range(14))
def test_the_key_id_of_a_jwt_is_read_whatever_its_headers_padding(length: int) -> None:
    head = base64.urlsafe_b64encode(json.dumps({"kid": "k" * length}).encode()).decode()
    assert tokens._kid(f"{head.rstrip('=')}.eyJzdWIiOiJ4In0.c2ln") == "k" * length


# -- what an answer says ---------------------------------------------------------------------------


def _response(
    status: int, body: Any = None, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = b"" if body is None else json.dumps(body).encode()
    return httpx.Response(
        status, headers=headers, content=content, request=httpx.Request("POST", URL)
    )


@pytest.mark.parametrize("status", [300, 302, 399])
def test_a_redirect_is_named_with_where_it_pointed(status: int) -> None:
    response = _response(status, headers={"Location": "https://elsewhere.test/" + "p" * 300})
    target = ("https://elsewhere.test/" + "p" * 300)[:199] + "…"
    assert tokens._status(response) == f"HTTP {status}: redirect to {target} not followed"


def test_a_redirect_without_a_location_says_so() -> None:
    assert tokens._status(_response(302)) == "HTTP 302: redirect to (no location) not followed"


def test_an_error_answer_gives_its_code_and_description_cut() -> None:
    document = {"error": "c" * 70, "error_description": "d" * 150}
    assert tokens._status(_response(400), document) == (f"HTTP 400 {'c' * 63}…: {'d' * 99}…")


@pytest.mark.parametrize(
    ("document", "text"),
    [
        ({"error": "", "error_description": "why"}, "HTTP 400: why"),
        ({"error": 5, "error_description": ""}, "HTTP 400"),
        ({"error": "invalid_client", "error_description": 7}, "HTTP 400 invalid_client"),
        (None, "HTTP 400"),
    ],
)
def test_an_error_answer_shows_only_the_text_it_has(document: Any, text: str) -> None:
    assert tokens._status(_response(400), document) == text


GOOD = {"access_token": "tok", "token_type": "Bearer", "expires_in": 60}


def _oauth2(url: str, secret: str = "s") -> TokenNeeded:
    """A client credentials token of client ``id`` at ``url``, no scopes asked."""
    return TokenNeeded("oauth2", OAuthClient("id", secret), (), token_url=url)


def test_a_redirect_carrying_a_token_is_still_refused() -> None:
    with pytest.raises(tokens._Failure) as refused:
        tokens._check_answer(URL, (), _response(300, GOOD, {"Location": "https://x.test/"}))
    assert refused.value.detail == "HTTP 300: redirect to https://x.test/ not followed"


def test_an_answer_that_is_not_a_json_object_is_refused_naming_the_url() -> None:
    response = httpx.Response(200, content=b"<html/>", request=httpx.Request("POST", URL))
    with pytest.raises(tokens._Failure) as refused:
        tokens._check_answer(URL, (), response)
    assert (refused.value.url, refused.value.status) == (URL, 200)
    assert refused.value.detail == (
        "HTTP 200: the answer is not a JSON object (body is not JSON (Expecting value at line 1))"
    )


def test_a_200_answer_naming_an_error_is_refused_even_with_a_token() -> None:
    with pytest.raises(tokens._Failure) as refused:
        tokens._check_answer(URL, (), _response(200, {**GOOD, "error": "invalid_scope"}))
    assert (refused.value.url, refused.value.detail, refused.value.status) == (
        URL,
        "HTTP 200 invalid_scope",
        200,
    )


def test_forgetting_a_token_never_fetched_is_harmless() -> None:
    needed = _oauth2(URL)
    TokenSource().forget(needed)


# -- OpenID Connect discovery ----------------------------------------------------------------------


def _oidc(url: str) -> TokenNeeded:
    return TokenNeeded("openIdConnect", OAuthClient("id", "s"), ("read",), discovery_url=url)


async def _refusal(server: RoutedServer, reply: Reply, **options: Any) -> TokenRequestError:
    server.routes[DISCOVERY] = reply
    async with TokenSource(**options) as source:
        with pytest.raises(TokenRequestError) as refused:
            await source.token(_oidc(server.url + DISCOVERY), scheme="oidc")
    assert (refused.value.url, refused.value.scheme) == (server.url + DISCOVERY, "oidc")
    return refused.value


@pytest.fixture
def discovery() -> Iterator[RoutedServer]:
    with RoutedServer() as server:
        yield server


async def test_a_plain_http_discovery_url_elsewhere_is_refused_before_anything_is_sent() -> None:
    url = "http://id.invalid/.well-known/openid-configuration"
    async with TokenSource() as source:
        with pytest.raises(TokenRequestError) as refused:
            await source.token(_oidc(url), scheme="oidc")
    assert refused.value.url == url
    assert refused.value.token_detail == (
        "discovery URL refused: plain http to a non-loopback host refused (https required) "
        "(nothing sent)"
    )


async def test_allow_insecure_reaches_both_discovery_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, bool]] = []

    def refusal(url: str, *, allow_insecure: bool = False) -> str | None:
        seen.append((url, allow_insecure))
        return None

    monkeypatch.setattr(tokens, "url_refusal", refusal)
    with RoutedServer() as server:
        server.routes[DISCOVERY] = Reply(
            body=json.dumps({"token_endpoint": "http://t.invalid/t"}).encode()
        )
        async with TokenSource(allow_insecure=True) as source:
            source._request = _no_request  # type: ignore[method-assign]
            with pytest.raises(TokenRequestError):
                await source.token(_oidc(server.url + DISCOVERY))
    assert seen[:2] == [(server.url + DISCOVERY, True), ("http://t.invalid/t", True)]


async def _no_request(*_: object) -> Any:
    raise tokens._Failure("http://t.invalid/t", "not sent here")


async def test_the_discovery_read_asks_for_json_in_any_encoding_we_decode(
    discovery: RoutedServer,
) -> None:
    await _refusal(discovery, Reply(status=500, body=b"down"))
    (request,) = discovery.requests
    assert request.method == "GET"
    assert request.headers["accept"] == "application/json"
    assert request.headers["accept-encoding"] == tokens.ACCEPT_ENCODING
    assert set(request.headers) == {"host", "accept", "accept-encoding", "connection", "user-agent"}


@pytest.mark.parametrize(
    ("reply", "detail", "status"),
    [
        (Reply(status=503, body=b"down"), "discovery document: HTTP 503", 503),
        (Reply(body=b"[1, 2]"), "discovery document is not a JSON object", 200),
        (Reply(body=b'{"issuer": "x"}'), "discovery document names no token_endpoint", 200),
        (
            Reply(body=b'{"token_endpoint": "ftp://t.test/" }'),
            "token_endpoint ftp://t.test/ refused: not an http(s) URL with a host (nothing sent)",
            None,
        ),
    ],
)
async def test_each_unusable_discovery_document_is_refused_in_its_own_words(
    discovery: RoutedServer, reply: Reply, detail: str, status: int | None
) -> None:
    refused = await _refusal(discovery, reply)
    assert refused.token_detail == detail
    assert refused.status == status


async def test_a_long_token_endpoint_is_named_cut_to_two_hundred_characters(
    discovery: RoutedServer,
) -> None:
    endpoint = "ftp://t.test/" + "p" * 300
    refused = await _refusal(
        discovery, Reply(body=json.dumps({"token_endpoint": endpoint}).encode())
    )
    assert refused.token_detail == (
        f"token_endpoint {endpoint[:199]}… refused: not an http(s) URL with a host (nothing sent)"
    )


async def test_a_discovery_document_over_the_limit_is_refused(discovery: RoutedServer) -> None:
    body = json.dumps({"token_endpoint": "https://t.test/t", "pad": "x" * 5000}).encode()
    refused = await _refusal(discovery, Reply(body=body), max_bytes=1024)
    assert refused.token_detail.startswith("discovery document refused: ")


async def test_an_unreachable_discovery_document_is_named_so() -> None:
    with RoutedServer() as server:
        url = server.url + DISCOVERY
    async with TokenSource() as source:  # the server is gone: its port refuses
        with pytest.raises(TokenRequestError) as refused:
            await source.token(_oidc(url))
    assert refused.value.url == url
    assert refused.value.token_detail == "unreachable (All connection attempts failed)"


async def test_two_providers_discovered_at_once_each_give_their_own_endpoint() -> None:
    with TokenServer() as one, TokenServer() as two:
        client_one, client_two = OAuthClient("one", "secret-1"), OAuthClient("two", "secret-2")
        one.register("one", "secret-1", scopes=("read",))
        two.register("two", "secret-2", scopes=("read",))
        needs = [
            TokenNeeded("openIdConnect", client_one, ("read",), discovery_url=one.discovery_url),
            TokenNeeded("openIdConnect", client_two, ("read",), discovery_url=two.discovery_url),
        ]
        async with TokenSource() as source:
            await asyncio.gather(*(source.token(needed) for needed in needs))
        assert (one.token_requests, two.token_requests) == (1, 1)
        assert (one.discovery_requests, two.discovery_requests) == (1, 1)


@pytest.mark.parametrize(
    ("status", "document", "detail"),
    [
        (401, {"error": "invalid_client"}, "HTTP 401 invalid_client"),
        (200, {**GOOD, "access_token": 5}, "HTTP 200: the answer has no access_token"),
        (
            200,
            {**GOOD, "access_token": "tok\nX-Evil: 1"},
            "HTTP 200: the access_token holds characters a header cannot carry",
        ),
        (200, {**GOOD, "token_type": "m" * 60}, f"HTTP 200: token_type '{'m' * 38}… is not Bearer"),
        (200, {**GOOD, "expires_in": "soon"}, "HTTP 200: expires_in is not a number"),
        (200, {**GOOD, "expires_at": [1]}, "HTTP 200: expires_at is not a number"),
        (200, {**GOOD, "scope": ["read"]}, "HTTP 200: scope is not a string"),
    ],
)
def test_an_unusable_answer_is_refused_in_its_own_words_naming_url_and_status(
    status: int, document: dict[str, Any], detail: str
) -> None:
    with pytest.raises(tokens._Failure) as refused:
        tokens._check_answer(URL, (), _response(status, document))
    assert (refused.value.url, refused.value.detail, refused.value.status) == (URL, detail, status)


# -- a token answer's size, declared or encoded ----------------------------------------------------


def _token_body(size: int) -> bytes:
    """A usable token answer padded to exactly ``size`` bytes."""
    body = json.dumps({**GOOD, "pad": ""}).encode()
    return json.dumps({**GOOD, "pad": "x" * (size - len(body))}).encode()


async def _token_from(reply: Reply, max_bytes: int = 1024) -> tuple[str, Any]:
    with RoutedServer() as server:
        server.routes["/token"] = reply
        url = server.url + "/token"
        needed = _oauth2(url)
        async with TokenSource(max_bytes=max_bytes) as source:
            try:
                return url, await source.token(needed)
            except TokenRequestError as refused:
                return url, refused


async def test_an_answer_declared_over_the_limit_is_refused_unread() -> None:
    url, refused = await _token_from(Reply(body=_token_body(1025)))
    assert isinstance(refused, TokenRequestError)
    assert refused.url == url
    assert refused.token_detail == (
        "HTTP 200: answer body declared 1025 bytes, over the limit of 1024"
    )


async def test_an_answer_declared_at_the_limit_is_read() -> None:
    _, token = await _token_from(Reply(body=_token_body(1024)))
    assert token.value == "tok"


async def test_an_answer_in_an_encoding_we_do_not_decode_is_refused_naming_its_url() -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "x-unknown"}
    url, refused = await _token_from(Reply(body=_token_body(100), headers=headers))
    assert isinstance(refused, TokenRequestError)
    assert refused.url == url
    assert refused.token_detail.startswith("HTTP 200: answer ")


def test_a_client_secret_beyond_latin_1_is_still_hidden_in_its_basic_credentials() -> None:
    hidden = tokens._secrets_of(OAuthClient("id", "s€"))
    form_encoded = base64.b64encode(b"id:s%E2%82%AC").decode()  # RFC 6749 section 2.3.1
    assert hidden == ("s€", base64.b64encode(b"id:s?").decode(), form_encoded)


# -- the token request -----------------------------------------------------------------------------


async def test_a_plain_http_token_url_elsewhere_is_refused_before_anything_is_sent() -> None:
    url = "http://t.invalid/token"
    needed = _oauth2(url)
    async with TokenSource() as source:
        with pytest.raises(TokenRequestError) as refused:
            await source.token(needed)
    assert (refused.value.url, source.requests) == (url, 0)
    assert refused.value.token_detail == (
        "token URL refused: plain http to a non-loopback host refused (https required) "
        "(nothing sent)"
    )


async def test_allow_insecure_reaches_the_token_url_check(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []

    def refusal(url: str, *, allow_insecure: bool = False) -> str | None:
        seen.append((url, allow_insecure))
        return "refused here"

    monkeypatch.setattr(tokens, "url_refusal", refusal)
    needed = _oauth2("http://t.invalid/t")
    async with TokenSource(allow_insecure=True) as source:
        with pytest.raises(TokenRequestError, match=r"token URL refused: refused here \(nothing"):
            await source.token(needed)
    assert seen == [("http://t.invalid/t", True)]


@pytest.mark.parametrize(("scopes", "asked"), [((), None), (("a", "b"), "a b")])
async def test_the_token_request_is_a_client_credentials_grant_asking_the_scopes_given(
    scopes: tuple[str, ...], asked: str | None
) -> None:
    with RoutedServer() as server:
        server.routes["/token"] = Reply(body=json.dumps(GOOD).encode())
        needed = TokenNeeded(
            "oauth2", OAuthClient("id", "s"), scopes, token_url=server.url + "/token"
        )
        async with TokenSource() as source:
            await source.token(needed)
            await source.token(needed, refresh=True)
            assert source.requests == 2
        form = parse_qs(server.requests[0].body.decode(), keep_blank_values=True)
        assert form["grant_type"] == ["client_credentials"]
        assert form.get("scope") == (None if asked is None else [asked])
        assert server.requests[0].headers["user-agent"] == tokens.USER_AGENT


async def test_an_unreachable_token_endpoint_is_named_so() -> None:
    with RoutedServer() as server:
        url = server.url + "/token"
    needed = _oauth2(url, "a-client-secret")
    async with TokenSource() as source:
        with pytest.raises(TokenRequestError) as refused:
            await source.token(needed)
    assert refused.value.url == url
    assert refused.value.token_detail == "unreachable (All connection attempts failed)"


# -- TLS to the token endpoint ---------------------------------------------------------------------


def _https_token_answer() -> bytes:
    body = json.dumps(GOOD).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    return head % len(body) + b"Connection: close\r\n\r\n" + body


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("token-tls"))


def _ca_directory(tls: TlsFiles, where: Path) -> str:
    """A directory of CA certificates as OpenSSL looks them up (hashed names)."""
    where.mkdir()
    shutil.copy(tls.ca, where / "ca.pem")
    subprocess.run(["openssl", "rehash", str(where)], check=True, capture_output=True)
    return str(where)


async def _https_token(tls: TlsFiles, **options: Any) -> str:
    """A token from an HTTPS token endpoint whose certificate ``tls``'s CA signed, asked for by
    a :class:`TokenSource` made with ``options``."""
    server = OkServer(close_after=True, tls=tls.server_context(), answer=_https_token_answer())
    async with server, TokenSource(**options) as source:
        return (await source.token(_oauth2(server.url, "a-secret"))).value


async def test_the_token_endpoint_is_verified_against_the_ca_file_given(
    tls_files: TlsFiles,
) -> None:
    assert await _https_token(tls_files, verify=str(tls_files.ca)) == "tok"


async def test_the_token_endpoint_is_verified_against_the_ca_directory_given(
    tls_files: TlsFiles, tmp_path: Path
) -> None:
    assert await _https_token(tls_files, verify=_ca_directory(tls_files, tmp_path / "cas")) == "tok"


async def test_the_token_endpoint_is_verified_against_the_context_given(
    tls_files: TlsFiles,
) -> None:
    context = ssl.create_default_context(cafile=str(tls_files.ca))
    assert await _https_token(tls_files, verify=context) == "tok"


async def test_the_system_trust_store_refuses_a_token_endpoint_it_does_not_know(
    tls_files: TlsFiles,
) -> None:
    with pytest.raises(TokenRequestError, match="CERTIFICATE_VERIFY_FAILED"):
        await _https_token(tls_files, verify=True)


async def test_verification_turned_off_takes_any_certificate(tls_files: TlsFiles) -> None:
    assert await _https_token(tls_files, verify=False) == "tok"


# -- when a token is asked for ---------------------------------------------------------------------


async def test_a_token_asked_for_after_the_deadline_is_refused_unsent() -> None:
    needed = _oauth2(URL)
    async with TokenSource() as source:
        with deadline.within(0.0), pytest.raises(TokenRequestError) as refused:
            await source.token(needed, scheme="corp")
    assert (refused.value.url, refused.value.scheme, source.requests) == (URL, "corp", 0)
    assert refused.value.token_detail == (
        "timeout: the deadline passed before the token was asked for (nothing sent)"
    )


async def test_a_cached_token_is_renewed_at_its_renewal_moment_exactly() -> None:
    now = [0.0]
    with RoutedServer() as server:
        server.routes["/token"] = Reply(body=json.dumps({**GOOD, "expires_in": 100}).encode())
        needed = _oauth2(server.url + "/token")
        async with TokenSource(clock=lambda: now[0]) as source:
            await source.token(needed)
            now[0] = 89.999  # renewed 10 s before its end (10 % of 100 s)
            await source.token(needed)
            assert source.requests == 1
            now[0] = 90.0
            await source.token(needed)
            assert source.requests == 2


async def test_a_token_of_a_kind_we_do_not_know_is_refused_unsent() -> None:
    needed = TokenNeeded("saml", OAuthClient("id", "s"), (), token_url=URL)
    async with TokenSource() as source:
        with pytest.raises(TokenRequestError) as refused:
            await source.token(needed)
    assert (refused.value.url, refused.value.scheme, source.requests) == ("", "", 0)
    assert refused.value.token_detail == "unknown kind 'saml' (nothing sent)"


async def test_the_deadline_message_names_where_the_token_request_would_begin() -> None:
    needed = _oidc("https://id.test/.well-known/openid-configuration")
    async with TokenSource() as source:
        with deadline.within(0.0), pytest.raises(TokenRequestError) as refused:
            await source.token(needed)
    assert refused.value.url == "https://id.test/.well-known/openid-configuration"


async def test_a_client_whose_secret_changed_gets_a_token_of_its_own() -> None:
    with RoutedServer() as server:
        server.routes["/token"] = Reply(body=json.dumps(GOOD).encode())
        url = server.url + "/token"
        async with TokenSource() as source:
            for secret in ("old-secret", "new-secret", "old-secret"):
                await source.token(_oauth2(url, secret))
            assert source.requests == 2  # the old secret's token is still cached


async def test_the_token_endpoint_is_verified_by_default(tls_files: TlsFiles) -> None:
    with pytest.raises(TokenRequestError, match="CERTIFICATE_VERIFY_FAILED"):
        await _https_token(tls_files)


@pytest.mark.parametrize(("timeout", "max_bytes"), [(0.0, 1), (-1.0, 1), (1.0, 0), (1.0, -1)])
def test_a_token_source_refuses_bounds_that_are_not_positive(
    timeout: float, max_bytes: int
) -> None:
    with pytest.raises(ValueError, match=r"^timeout and max_bytes must be positive$"):
        TokenSource(timeout=timeout, max_bytes=max_bytes)


def test_the_least_bounds_a_token_source_takes() -> None:
    source = TokenSource(timeout=0.001, max_bytes=1)
    assert (source.timeout, source.max_bytes) == (0.001, 1)


def test_a_token_source_waits_ten_seconds_and_reads_64_kib_by_default() -> None:
    source = TokenSource()
    assert (source.timeout, source.max_bytes) == (10.0, 64 * 1024)


async def test_closing_a_token_source_ends_its_requests_in_flight_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RoutedServer() as server:
        server.routes["/token"] = Reply(end="hang", chunks=[])
        needed = _oauth2(server.url + "/token")
        source = TokenSource()
        waiting = asyncio.ensure_future(source.token(needed))
        while not server.requests:
            await asyncio.sleep(0.01)
        (flight,) = source._token_flights._tasks.values()
        await source.aclose()
        assert flight.done()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_token_endpoint_that_never_answers_ends_at_the_timeout() -> None:
    with RoutedServer() as server:
        server.routes["/token"] = Reply(end="hang", chunks=[])
        url = server.url + "/token"
        needed = _oauth2(url)
        async with TokenSource(timeout=0.3) as source:
            with pytest.raises(TokenRequestError) as refused:
                await source.token(needed, scheme="corp")
    assert (refused.value.url, refused.value.scheme) == (url, "corp")
    assert refused.value.token_detail == "timeout: no token within 0.3s"


@pytest.mark.parametrize("expires_in", [0, -5])
async def test_a_token_given_no_time_to_live_is_used_once(expires_in: int) -> None:
    with RoutedServer() as server:
        server.routes["/token"] = Reply(
            body=json.dumps({**GOOD, "expires_in": expires_in}).encode()
        )
        needed = _oauth2(server.url + "/token")
        async with TokenSource(clock=lambda: 50.0) as source:
            first = await source.token(needed)
            await source.token(needed)
            assert source.requests == 2
    assert first.expires_at == 50.0
