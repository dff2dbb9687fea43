"""The authenticating test agent (``tests/support/auth_peer.py``) proved with plain httpx: each kind
of security scheme lets the right credential through to the a2a-sdk agent and refuses a wrong or
missing one with a 401 before the agent sees it; the card declares what is enforced; HTTPS with
client certificates verified against a throwaway CA (``tests/support/tls.py``)."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import AuthPeer, TlsFiles, make_tls
from support.auth_peer import (
    api_key_scheme,
    basic_scheme,
    bearer_scheme,
    mtls_scheme,
    oauth2_scheme,
    oidc_scheme,
    requirement,
)
from support.engine_fixtures import restored

from cardfence.engine.auth.credentials import effective_requirements
from cardfence.engine.cards.model import SecurityRequirement, parse_card

V1 = {"A2A-Version": "1.0"}
SEND = ("JSONRPC", "SendMessage")


# -- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def peer(auth_peer: AuthPeer) -> AuthPeer:
    return auth_peer


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def shared_tls_peer(tls: TlsFiles) -> Iterator[AuthPeer]:
    with AuthPeer(tls=tls) as running:
        yield running


@pytest.fixture
def tls_peer(shared_tls_peer: AuthPeer) -> Iterator[AuthPeer]:
    with restored(shared_tls_peer):
        yield shared_tls_peer


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as client:
        yield client


def send_message(
    client: httpx.Client,
    peer: AuthPeer,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """A JSON-RPC SendMessage ("echo hi"), with extra headers and query parameters."""
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "echo hi"}]}
    body = {"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"message": message}}
    return client.post(
        peer.jsonrpc_url, json=body, headers={**V1, **(headers or {})}, params=params or {}
    )


def completed(response: httpx.Response) -> dict[str, Any]:
    """The task of a successful SendMessage answer, completed."""
    assert response.status_code == 200, response.text
    task: dict[str, Any] = response.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    return task


def assert_refused(response: httpx.Response, challenge: str) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == {"error": "unauthorized"}  # plain JSON, no A2A error body
    assert challenge in response.headers["www-authenticate"]


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- each kind of scheme ---------------------------------------------------------------------

# (scheme, how the peer is told what to accept, good credential, wrong one, challenge, where the
# credential shows in AuthHit.credentials). A credential: (headers, query parameters).
KINDS: dict[str, tuple[dict[str, Any], Any, Any, Any, str, str]] = {
    "api key in a header": (
        api_key_scheme("X-API-Key"),
        lambda p: p.accept_api_key("s", "k-123"),
        ({"X-API-Key": "k-123"}, {}),
        ({"X-API-Key": "k-999"}, {}),
        'ApiKey realm="cardfence-peer", in="header", name="X-API-Key"',
        "header:x-api-key",
    ),
    "api key in the query": (
        api_key_scheme("api_key", "query"),
        lambda p: p.accept_api_key("s", "k-123"),
        ({}, {"api_key": "k-123"}),
        ({}, {"api_key": "k-999"}),
        'in="query", name="api_key"',
        "query:api_key",
    ),
    "api key in a cookie": (
        api_key_scheme("session", "cookie"),
        lambda p: p.accept_api_key("s", "k-123"),
        ({"Cookie": "session=k-123"}, {}),
        ({"Cookie": "session=k-999"}, {}),
        'in="cookie", name="session"',
        "cookie:session",
    ),
    "http bearer": (
        bearer_scheme(),
        lambda p: p.accept_bearer("s", "t-123"),
        (bearer("t-123"), {}),
        (bearer("t-999"), {}),
        'Bearer realm="cardfence-peer"',
        "authorization",
    ),
    "http basic": (
        basic_scheme(),
        lambda p: p.accept_basic("s", "ada", "pw-123"),
        (basic("ada", "pw-123"), {}),
        (basic("ada", "pw-999"), {}),
        'Basic realm="cardfence-peer"',
        "authorization",
    ),
    "oauth2 (checked token)": (
        oauth2_scheme("http://127.0.0.1:1/token", {"read": "read tasks"}),
        lambda p: p.accept_oauth("s", lambda token: token == "t-123"),
        (bearer("t-123"), {}),
        (bearer("t-999"), {}),
        'Bearer realm="cardfence-peer"',
        "authorization",
    ),
    "openid connect (checked token)": (
        oidc_scheme("http://127.0.0.1:1/.well-known/openid-configuration"),
        lambda p: p.accept_oauth("s", lambda token: token == "t-123"),
        (bearer("t-123"), {}),
        (bearer("t-999"), {}),
        'Bearer realm="cardfence-peer"',
        "authorization",
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_lets_only_the_right_credential_reach_the_agent(
    peer: AuthPeer, client: httpx.Client, kind: str
) -> None:
    scheme, accept, good, wrong, challenge, logged_as = KINDS[kind]
    peer.protect({"s": scheme}, [requirement("s")])
    accept(peer)

    assert_refused(send_message(client, peer), challenge)
    assert_refused(send_message(client, peer, headers=wrong[0], params=wrong[1]), challenge)
    assert peer.calls == []  # neither refusal reached the agent

    completed(send_message(client, peer, headers=good[0], params=good[1]))
    assert peer.calls == [SEND]

    missing, refused, allowed = peer.auth_log
    assert [h.status for h in peer.auth_log] == [401, 401, 200]
    assert [h.authorized for h in peer.auth_log] == [False, False, True]
    assert all(h.binding == "JSONRPC" and h.path == "/a2a/jsonrpc" for h in peer.auth_log)
    assert (missing.presented, missing.credentials) == ((), {})
    assert (refused.presented, refused.accepted) == (("s",), ())
    assert (allowed.presented, allowed.accepted) == (("s",), ("s",))
    wrong_value = {**wrong[0], **wrong[1]}
    good_value = {**good[0], **good[1]}
    assert refused.credentials[logged_as] in {
        v.removeprefix("session=") for v in wrong_value.values()
    }
    assert allowed.credentials[logged_as] in {
        v.removeprefix("session=") for v in good_value.values()
    }


def test_a_scheme_with_nothing_accepted_refuses_every_credential(
    peer: AuthPeer, client: httpx.Client
) -> None:
    peer.protect({"never": api_key_scheme("X-Never")}, [requirement("never")])
    assert_refused(send_message(client, peer, headers={"X-Never": "anything"}), "ApiKey")
    assert peer.calls == []


def test_the_rest_binding_is_guarded_too(peer: AuthPeer, client: httpx.Client) -> None:
    peer.protect({"token": bearer_scheme()}, [requirement("token")])
    peer.accept_bearer("token", "t-1")
    assert_refused(client.get(f"{peer.rest_url}/tasks/t", headers=V1), "Bearer")
    assert peer.calls == []
    answer = client.get(f"{peer.rest_url}/tasks/t", headers={**V1, **bearer("t-1")})
    assert answer.status_code == 404  # the agent's own answer: no such task
    assert peer.calls == [("REST", "GetTask")]
    assert [(h.binding, h.status) for h in peer.auth_log] == [("REST", 401), ("REST", 404)]


# -- alternatives ------------------------------------------------------------------------------


def test_an_alternative_of_two_schemes_needs_both(peer: AuthPeer, client: httpx.Client) -> None:
    peer.protect(
        {"key": api_key_scheme("X-API-Key"), "token": bearer_scheme()},
        [requirement("key", "token")],
    )
    peer.accept_api_key("key", "k-1")
    peer.accept_bearer("token", "t-1")
    key, token = {"X-API-Key": "k-1"}, bearer("t-1")

    assert_refused(send_message(client, peer, headers=key), "Bearer")
    refused = send_message(client, peer, headers=token)
    assert_refused(refused, "ApiKey")
    assert peer.calls == []
    completed(send_message(client, peer, headers={**key, **token}))
    assert peer.calls == [SEND]
    assert peer.auth_log[-1].accepted == ("key", "token")


def test_any_one_alternative_is_enough(peer: AuthPeer, client: httpx.Client) -> None:
    peer.protect(
        {"key": api_key_scheme("X-API-Key"), "token": bearer_scheme()},
        [{"key": []}, {"token": []}],  # the 0.3 shorthand, published in 1.0 shape
    )
    peer.accept_api_key("key", "k-1")
    peer.accept_bearer("token", "t-1")
    completed(send_message(client, peer, headers={"X-API-Key": "k-1"}))
    completed(send_message(client, peer, headers=bearer("t-1")))
    challenge = send_message(client, peer).headers["www-authenticate"]
    assert "ApiKey" in challenge
    assert "Bearer" in challenge
    assert peer.calls == [SEND, SEND]


def test_no_requirement_or_an_empty_alternative_lets_everyone_in(
    peer: AuthPeer, client: httpx.Client
) -> None:
    peer.protect({"token": bearer_scheme()}, [])
    completed(send_message(client, peer))
    peer.protect({"token": bearer_scheme()}, [requirement("token"), requirement()])
    completed(send_message(client, peer))
    assert peer.calls == [SEND, SEND]


# -- revocation, scopes, enforcement that differs from the card ----------------------------------


def test_a_revoked_credential_is_refused_until_reset(peer: AuthPeer, client: httpx.Client) -> None:
    peer.protect({"token": bearer_scheme()}, [requirement("token")])
    peer.accept_bearer("token", "t-1")
    completed(send_message(client, peer, headers=bearer("t-1")))

    peer.revoke("token")
    refused = send_message(client, peer, headers=bearer("t-1"))
    assert_refused(refused, 'error="invalid_token"')
    assert peer.calls == [SEND]

    peer.reset()
    completed(send_message(client, peer, headers=bearer("t-1")))
    assert peer.auth_log[0].status == 200  # reset cleared the log


def test_a_new_credential_replaces_a_revoked_one(peer: AuthPeer, client: httpx.Client) -> None:
    peer.protect({"key": api_key_scheme("X-API-Key")}, [requirement("key")])
    peer.accept_api_key("key", "old")
    peer.revoke("key")
    peer.accept_api_key("key", "new")
    assert_refused(send_message(client, peer, headers={"X-API-Key": "old"}), "ApiKey")
    completed(send_message(client, peer, headers={"X-API-Key": "new"}))


def test_a_good_token_without_the_scope_gets_403(peer: AuthPeer, client: httpx.Client) -> None:
    scopes = {"read": "", "write": ""}
    peer.protect(
        {"oauth": oauth2_scheme("http://127.0.0.1:1/token", scopes)}, [requirement(oauth=["write"])]
    )
    granted = {"reader": ["read"], "writer": ["read", "write"]}
    peer.accept_oauth("oauth", granted.get)

    forbidden = send_message(client, peer, headers=bearer("reader"))
    assert forbidden.status_code == 403
    assert forbidden.json() == {"error": "insufficient_scope"}
    assert 'error="insufficient_scope", scope="write"' in forbidden.headers["www-authenticate"]
    assert_refused(send_message(client, peer, headers=bearer("nobody")), "invalid_token")
    completed(send_message(client, peer, headers=bearer("writer")))
    assert peer.calls == [SEND]


def test_enforcement_can_differ_from_the_card(peer: AuthPeer, client: httpx.Client) -> None:
    peer.set_enforced({"token": bearer_scheme()}, [requirement("token")])
    assert "securitySchemes" not in client.get(peer.card_url).json()
    assert_refused(send_message(client, peer), "Bearer")
    peer.reset()  # back to what the card says: nothing
    completed(send_message(client, peer))


def test_restoring_the_card_restores_enforcement(
    shared_auth_peer: AuthPeer, client: httpx.Client
) -> None:
    with restored(shared_auth_peer):
        shared_auth_peer.protect({"token": bearer_scheme()}, [requirement("token")])
        assert_refused(send_message(client, shared_auth_peer), "Bearer")
    completed(send_message(client, shared_auth_peer))


# -- the card ---------------------------------------------------------------------------------


def test_the_card_declares_what_is_enforced(peer: AuthPeer, client: httpx.Client) -> None:
    schemes = {
        "key": api_key_scheme("X-API-Key"),
        "token": bearer_scheme(),
        "login": basic_scheme(),
        "oauth": oauth2_scheme("http://127.0.0.1:1/token", {"read": "read tasks"}),
        "oidc": oidc_scheme("http://127.0.0.1:1/.well-known/openid-configuration"),
        "mtls": mtls_scheme(),
    }
    peer.protect(
        schemes,
        [requirement("key"), requirement("mtls", oauth=["read"])],
        skill_requirements={"slow": [requirement("login")]},
    )
    response = client.get(peer.card_url, headers=bearer("leaked?"))
    assert response.status_code == 200  # card reads are never refused...
    served = response.json()
    assert served["securitySchemes"] == schemes
    assert served["securityRequirements"] == [
        {"schemes": {"key": {"list": []}}},
        {"schemes": {"mtls": {"list": []}, "oauth": {"list": ["read"]}}},
    ]
    skills = {s["id"]: s for s in served["skills"]}
    assert skills["slow"]["securityRequirements"] == [{"schemes": {"login": {"list": []}}}]
    assert "securityRequirements" not in skills["echo"]

    card = parse_card(response.content, url=peer.card_url)  # the engine reads the same contract
    assert card.security_schemes() == schemes
    assert set(card.security_requirements) == {
        SecurityRequirement((("key", ()),)),
        SecurityRequirement((("mtls", ()), ("oauth", ("read",)))),
    }
    assert effective_requirements(card, "slow") == (SecurityRequirement((("login", ()),)),)

    (hit,) = peer.auth_log  # ...but logged with what they carried
    assert (hit.binding, hit.path, hit.authorized, hit.status) == (
        None,
        "/.well-known/agent-card.json",
        True,
        200,
    )
    assert hit.credentials == {"authorization": "Bearer leaked?"}
    assert hit.presented == ("oauth", "oidc", "token")  # a bearer fits each of these

    peer.unprotect()
    assert "securitySchemes" not in client.get(peer.card_url).json()


# -- HTTPS and mutual TLS ---------------------------------------------------------------------


def test_material_is_fresh_and_keys_are_private(tls: TlsFiles) -> None:
    for key in (tls.server_key, tls.client_key):
        assert key.stat().st_mode & 0o777 == 0o600
    assert b"BEGIN CERTIFICATE" in tls.ca.read_bytes()


def test_the_https_card_advertises_https(tls_peer: AuthPeer, tls: TlsFiles) -> None:
    assert tls_peer.base_url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=tls.client_context(with_cert=False)) as client:
        card = client.get(tls_peer.card_url).json()  # no client certificate needed for the card
    assert [i["url"] for i in card["supportedInterfaces"]] == [
        tls_peer.jsonrpc_url,
        tls_peer.rest_url,
    ]
    assert all(i["url"].startswith("https://") for i in card["supportedInterfaces"])


def test_mtls_lets_in_only_a_verified_client_certificate(tls_peer: AuthPeer, tls: TlsFiles) -> None:
    tls_peer.protect({"mtls": mtls_scheme()}, [requirement("mtls")])
    with httpx.Client(verify=tls.client_context(with_cert=False)) as anonymous:
        assert_refused(send_message(anonymous, tls_peer), 'MutualTLS realm="cardfence-peer"')
    assert tls_peer.calls == []

    with httpx.Client(verify=tls.client_context(with_cert=True)) as holder:
        task = completed(send_message(holder, tls_peer))
        answer = holder.get(f"{tls_peer.rest_url}/tasks/{task['id']}", headers=V1)
        assert answer.status_code == 200
    assert tls_peer.calls == [SEND, ("REST", "GetTask")]
    assert tls_peer.auth_log[-1].credentials == {"client_cert": f"CN={tls.client_name}"}
    assert tls_peer.auth_log[-1].accepted == ("mtls",)

    tls_peer.revoke("mtls")
    with httpx.Client(verify=tls.client_context(with_cert=True)) as holder:
        assert_refused(send_message(holder, tls_peer), "MutualTLS")
    assert len(tls_peer.calls) == 2


def test_a_certificate_from_another_ca_fails_the_handshake(
    tls_peer: AuthPeer, tls: TlsFiles, tmp_path: Path
) -> None:
    stranger = make_tls(tmp_path)
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.load_cert_chain(str(stranger.client_cert), str(stranger.client_key))
    with httpx.Client(verify=context) as client, pytest.raises(httpx.TransportError):
        send_message(client, tls_peer)
    # and the server's certificate is not trusted by a client that does not know its CA
    with (
        httpx.Client(verify=stranger.client_context(with_cert=False)) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.get(tls_peer.card_url)
    assert tls_peer.calls == []
    assert tls_peer.auth_log == []


def test_mtls_with_a_second_scheme(tls_peer: AuthPeer, tls: TlsFiles) -> None:
    tls_peer.protect(
        {"mtls": mtls_scheme(), "key": api_key_scheme("X-API-Key")},
        [requirement("mtls", "key")],
    )
    tls_peer.accept_api_key("key", "k-1")
    with httpx.Client(verify=tls.client_context(with_cert=False)) as anonymous:
        assert_refused(send_message(anonymous, tls_peer, headers={"X-API-Key": "k-1"}), "MutualTLS")
    with httpx.Client(verify=tls.client_context(with_cert=True)) as holder:
        assert_refused(send_message(holder, tls_peer), "ApiKey")
        completed(send_message(holder, tls_peer, headers={"X-API-Key": "k-1"}))
    assert tls_peer.calls == [SEND]


def test_client_certificate_required_at_the_handshake(tls: TlsFiles) -> None:
    with AuthPeer(tls=tls, require_client_cert=True) as strict:
        strict.protect({"mtls": mtls_scheme()}, [requirement("mtls")])
        with httpx.Client(verify=tls.client_context(with_cert=False)) as anonymous:
            with pytest.raises(httpx.TransportError):
                anonymous.get(strict.card_url)  # not even the card
            with pytest.raises(httpx.TransportError):
                send_message(anonymous, strict)
        assert strict.calls == []
        assert strict.auth_log == []
        with httpx.Client(verify=tls.client_context(with_cert=True)) as holder:
            card = holder.get(strict.card_url).json()
            completed(send_message(holder, strict))
        assert card["securityRequirements"] == [{"schemes": {"mtls": {"list": []}}}]
        assert strict.calls == [SEND]


def test_https_changes_only_the_scheme_of_the_card_urls(tls_peer: AuthPeer, peer: AuthPeer) -> None:
    """The served card, the handler's card and the URL attributes all say https; nothing else
    differs from the plain agent's card."""
    handler_urls = [i.url for i in tls_peer.agent_card.supported_interfaces]
    assert handler_urls == [tls_peer.jsonrpc_url, tls_peer.rest_url]
    assert tls_peer.card_url == tls_peer.base_url + "/.well-known/agent-card.json"
    assert tls_peer.card_url.startswith("https://")

    def without_urls(card: dict[str, Any]) -> dict[str, Any]:
        card = copy.deepcopy(card)
        for interface in card["supportedInterfaces"]:
            interface.pop("url")
        return card

    assert without_urls(tls_peer.card) == without_urls(peer.card)
    assert json.dumps(peer.card).count("https://") == 0
