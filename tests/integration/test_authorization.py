"""R15 end to end: the a2a-sdk agent behind real authentication middleware (`AuthPeer`), a real
OAuth 2.0 token server (`TokenServer`), HTTPS with client certificates, both bindings.

Each "never" of R15 has its test here: never downgrade (missing credentials: refused, nothing
reaches the agent), never leak (an endpoint moved to another origin gets no credential; only the
frozen contract's schemes are sent), never a transition from an authorization outcome (revoked
credentials: flagged, no cancel, the task completes once they are accepted again). The secret
scan (nothing secret in the database or the logs) is in ``test_secrets_never_stored.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import AuthPeer, TokenServer, make_tls
from support.auth_peer import (
    api_key_scheme,
    basic_scheme,
    bearer_scheme,
    mtls_scheme,
    oauth2_scheme,
    oidc_scheme,
    requirement,
)
from support.engine_fixtures import (
    FAST,
    assert_audit_ok,
    data_of,
    state_of,
    transitions,
    types,
)

from cardfence.engine.auth.config import (
    ApiKey,
    Basic,
    Bearer,
    CredentialsConfig,
    MutualTls,
    OAuthClient,
    Secret,
)
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.core.views import TaskView
from cardfence.engine.errors import (
    AuthorizationFailedError,
    ContractChangedError,
    CredentialsMissingError,
    DeadlineExceeded,
    TokenRequestError,
)

BINDINGS = ("JSONRPC", "HTTP+JSON")
SLOW = [("submitted", "working"), ("working", "completed")]


@pytest.fixture
def peer(auth_peer: AuthPeer) -> AuthPeer:
    return auth_peer


@pytest.fixture(scope="module")
def tokens() -> Iterator[TokenServer]:
    with TokenServer(expires_in=3600) as server:
        server.register("cf-client", "cf-client-secret", scopes=("a2a", "read"))
        yield server


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cardfence.db'}"


def config_for(
    peer: AuthPeer, schemes: dict[str, Secret], binding: str = "JSONRPC", **changes: Any
) -> EngineConfig:
    credentials = CredentialsConfig.of({peer.base_url: schemes}) if schemes else None
    return dataclasses.replace(FAST, credentials=credentials, prefer_bindings=(binding,), **changes)


@dataclasses.dataclass
class Engines:
    db: str
    opened: list[Engine] = dataclasses.field(default_factory=list)
    closing: contextlib.AsyncExitStack = dataclasses.field(
        default_factory=contextlib.AsyncExitStack
    )

    async def open(self, config: EngineConfig) -> Engine:
        engine = await self.closing.enter_async_context(Engine.connect(self.db, config=config))
        self.opened.append(engine)
        return engine


@pytest.fixture
async def engines(db: str) -> AsyncIterator[Engines]:
    """Engines on one store, closed and audited when the test is done."""
    made = Engines(db)
    async with made.closing:
        yield made
        for engine in made.opened:
            await engine.settle()
            assert_audit_ok(engine.store)


async def oauth_engine(peer: AuthPeer, engines: Engines, tokens: TokenServer) -> Engine:
    """An engine with the OAuth client, at an agent requiring the token server's tokens."""
    tokens.reset()
    peer.protect({"oauth": oauth2_scheme(tokens.token_url)}, [requirement("oauth")])
    peer.accept_oauth("oauth", tokens.check)
    return await engines.open(
        config_for(peer, {"oauth": OAuthClient("cf-client", "cf-client-secret")})
    )


def a2a_hits(peer: AuthPeer) -> list[Any]:
    return [hit for hit in peer.auth_log if hit.binding is not None]


# -- each scheme, end to end ----------------------------------------------------------------------

STATIC = {
    "api-key-header": (
        {"key": api_key_scheme("X-Agent-Key", "header")},
        {"key": ApiKey("k-header-1")},
        lambda p: p.accept_api_key("key", "k-header-1"),
        ("header:x-agent-key", "k-header-1"),
    ),
    "api-key-query": (
        {"key": api_key_scheme("agent_key", "query")},
        {"key": ApiKey("k-query-1")},
        lambda p: p.accept_api_key("key", "k-query-1"),
        ("query:agent_key", "k-query-1"),
    ),
    "api-key-cookie": (
        {"key": api_key_scheme("agent_key", "cookie")},
        {"key": ApiKey("k-cookie-1")},
        lambda p: p.accept_api_key("key", "k-cookie-1"),
        ("cookie:agent_key", "k-cookie-1"),
    ),
    "bearer": (
        {"bearer": bearer_scheme()},
        {"bearer": Bearer("t-bearer-1")},
        lambda p: p.accept_bearer("bearer", "t-bearer-1"),
        ("authorization", "Bearer t-bearer-1"),
    ),
    "basic": (
        {"basic": basic_scheme()},
        {"basic": Basic("svc", "pw-basic-1")},
        lambda p: p.accept_basic("basic", "svc", "pw-basic-1"),
        ("authorization", "Basic c3ZjOnB3LWJhc2ljLTE="),
    ),
}


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("scheme", sorted(STATIC))
async def test_a_task_runs_against_an_agent_requiring_each_static_scheme(
    peer: AuthPeer, engines: Engines, scheme: str, binding: str
) -> None:
    declared, configured, accept, (where, value) = STATIC[scheme]
    name = next(iter(declared))
    peer.protect(declared, [requirement(name)])
    accept(peer)
    engine = await engines.open(config_for(peer, configured, binding))

    view = await engine.start_task(peer.base_url, skill="ask", text="ask")
    asked = await engine.drive(view.task, until="interrupted", timeout=10)
    await engine.reply(view.task, "yes")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert asked.state == "input-required"
    assert done.state == "completed"
    hits = a2a_hits(peer)
    assert {hit.binding for hit in hits} == {"JSONRPC" if binding == "JSONRPC" else "REST"}
    assert all(hit.authorized for hit in hits)
    assert all(hit.credentials.get(where) == value for hit in hits)
    methods = {method for _, method in peer.calls}
    assert {"SendMessage", "GetTask"} <= methods
    submitted = data_of(engine.store, view.task, ev.TASK_SUBMITTED)[0]
    assert submitted["authorization"]["schemes"] == [name]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_runs_with_oauth2_client_credentials(
    peer: AuthPeer, engines: Engines, tokens: TokenServer, binding: str
) -> None:
    tokens.reset()
    peer.protect({"oauth": oauth2_scheme(tokens.token_url)}, [requirement(oauth=["a2a"])])
    peer.accept_oauth("oauth", tokens.check)
    client = OAuthClient("cf-client", "cf-client-secret")
    engine = await engines.open(config_for(peer, {"oauth": client}, binding))

    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert tokens.token_requests == 1  # one token, cached for every request of the task
    assert tokens.issued[-1].scopes == ("a2a",)
    live = {issued.access_token for issued in tokens.issued}
    hits = a2a_hits(peer)
    assert hits
    assert all(hit.credentials.get("authorization", "")[7:] in live for hit in hits)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_runs_with_openid_connect_and_records_the_discovery_document(
    peer: AuthPeer, engines: Engines, tokens: TokenServer, binding: str
) -> None:
    tokens.reset()
    peer.protect({"oidc": oidc_scheme(tokens.discovery_url)}, [requirement("oidc")])
    peer.accept_oauth("oidc", tokens.check)
    client = OAuthClient("cf-client", "cf-client-secret", ("read",))
    engine = await engines.open(config_for(peer, {"oidc": client}, binding))

    view = await engine.start_task(peer.base_url, skill="echo", text="echo hi")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert tokens.discovery_requests == 1
    assert tokens.issued[-1].scopes == ("read",)
    recorded = data_of(engine.store, view.task, ev.TASK_SUBMITTED)[0]["authorization"]
    assert recorded["discovery"]["oidc"]["url"] == tokens.discovery_url
    assert recorded["discovery"]["oidc"]["token_endpoint"] == tokens.token_url


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_runs_over_mutual_tls(engines: Engines, tmp_path: Path, binding: str) -> None:
    tls = make_tls(tmp_path)
    with AuthPeer(tls=tls) as peer:
        peer.protect({"mtls": mtls_scheme()}, [requirement("mtls")])
        peer.accept_bearer("unused", "-")  # nothing but the certificate is asked for
        cert = MutualTls(str(tls.client_cert), str(tls.client_key))
        config = config_for(peer, {"mtls": cert}, binding, ca_file=str(tls.ca))
        engine = await engines.open(config)

        view = await engine.start_task(peer.base_url, skill="echo", text="echo over tls")
        done = await engine.drive(view.task, until="terminal", timeout=10)

        assert done.state == "completed"
        hits = a2a_hits(peer)
        assert hits
        assert all(hit.authorized for hit in hits)
        assert all(tls.client_name in hit.credentials.get("client_cert", "") for hit in hits)
        card_reads = [hit for hit in peer.auth_log if hit.binding is None]
        assert card_reads
        assert all("client_cert" not in hit.credentials for hit in card_reads)


# -- never downgrade -------------------------------------------------------------------------------


@pytest.mark.parametrize("configured", ["none", "another scheme"])
async def test_missing_credentials_refuse_creation_and_nothing_reaches_the_agent(
    peer: AuthPeer, engines: Engines, configured: str
) -> None:
    peer.protect({"bearer": bearer_scheme()}, [requirement("bearer")])
    peer.accept_bearer("bearer", "t-1")
    schemes: dict[str, Secret] = {} if configured == "none" else {"other": Bearer("t-x")}
    engine = await engines.open(config_for(peer, schemes))

    with pytest.raises(CredentialsMissingError, match=r"\[bearer\]: bearer not configured"):
        await engine.start_task(peer.base_url, skill="echo", text="echo hi")

    assert a2a_hits(peer) == []
    assert peer.calls == []
    assert await engine.tasks() == []
    agent = engine.store.read_stream(f"agent:{peer.base_url}")
    assert agent[-1].type == ev.CREDENTIALS_MISSING
    assert agent[-1].data["reason"] == "credentials_missing"


async def test_a_token_endpoint_refusing_the_client_sends_nothing_to_the_agent(
    peer: AuthPeer, engines: Engines, tokens: TokenServer
) -> None:
    tokens.reset()
    peer.protect({"oauth": oauth2_scheme(tokens.token_url)}, [requirement("oauth")])
    peer.accept_oauth("oauth", tokens.check)
    wrong = OAuthClient("cf-client", "not-the-secret")
    engine = await engines.open(config_for(peer, {"oauth": wrong}))

    with pytest.raises(TokenRequestError, match="invalid_client"):
        await engine.start_task(peer.base_url, skill="echo", text="echo hi")

    assert a2a_hits(peer) == []
    assert await engine.tasks() == []


async def test_a_token_url_that_changed_is_a_contract_change_and_nothing_is_sent(
    peer: AuthPeer, engines: Engines, tokens: TokenServer
) -> None:
    engine = await oauth_engine(peer, engines, tokens)
    await engine.start_task(peer.base_url, skill="echo", text="echo pinned")
    elsewhere = tokens.token_url.replace("127.0.0.1", "localhost")
    peer.protect({"oauth": oauth2_scheme(elsewhere)}, [requirement("oauth")])
    mark, asked = len(a2a_hits(peer)), tokens.token_requests

    with pytest.raises(ContractChangedError, match="security_schemes"):
        await engine.start_task(peer.base_url, skill="echo", text="echo redirected")

    assert len(a2a_hits(peer)) == mark  # nothing reached the agent
    assert tokens.token_requests == asked  # and the client secret went to no token URL


# -- the frozen contract mid-task -----------------------------------------------------------------


async def test_a_contract_adding_a_required_scheme_mid_task_keeps_the_frozen_one(
    peer: AuthPeer, engines: Engines
) -> None:
    peer.protect({"bearer": bearer_scheme()}, [requirement("bearer")])
    peer.accept_bearer("bearer", "t-1")
    peer.accept_api_key("key", "k-1")
    configured = {"bearer": Bearer("t-1"), "key": ApiKey("k-1")}
    engine = await engines.open(config_for(peer, configured))
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.6")
    # The card now requires a key as well; the agent still honours the tasks it accepted.
    peer.set_enforced({"bearer": bearer_scheme()}, [requirement("bearer")])
    peer.protect(
        {"bearer": bearer_scheme(), "key": api_key_scheme("X-Agent-Key")},
        [requirement("bearer", "key")],
    )
    mark = len(peer.auth_log)

    done = await engine.drive(view.task, until="terminal", timeout=10)
    await engine.settle()

    assert done.state == "completed"
    assert data_of(engine.store, view.task, ev.CONTRACT_DIVERGED)
    later = [hit for hit in peer.auth_log[mark:] if hit.binding is not None]
    assert later
    assert all(hit.presented == ("bearer",) for hit in later)  # never the new scheme's key
    assert all("header:x-agent-key" not in hit.credentials for hit in later)


async def test_a_token_revoked_mid_task_is_refreshed_once_and_nothing_is_flagged(
    peer: AuthPeer, engines: Engines, tokens: TokenServer
) -> None:
    engine = await oauth_engine(peer, engines, tokens)
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.8")
    await engine.poll(view.task)
    assert tokens.token_requests == 1
    tokens.revoke_tokens()  # the issuer drops the token before it expires

    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    assert tokens.token_requests == 2  # one refresh after the 401, then the new token serves
    assert ev.AUTHORIZATION_FAILED not in types(engine.store, view.task)


async def test_a_token_expiring_mid_task_is_replaced_before_it_is_refused(
    peer: AuthPeer, engines: Engines, tokens: TokenServer
) -> None:
    tokens.reset()
    tokens.expires_in = 2
    peer.protect({"oauth": oauth2_scheme(tokens.token_url)}, [requirement("oauth")])
    peer.accept_oauth("oauth", tokens.check)
    engine = await engines.open(
        config_for(peer, {"oauth": OAuthClient("cf-client", "cf-client-secret")})
    )

    view = await engine.start_task(peer.base_url, skill="slow", text="slow 2.5")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    # A token lives two seconds and is replaced a tenth of that before it ends: one more.
    assert tokens.token_requests == 2
    assert ev.AUTHORIZATION_FAILED not in types(engine.store, view.task)
    assert transitions(engine.store, view.task) == SLOW


async def _working_then_revoked(peer: AuthPeer, engines: Engines) -> tuple[Engine, TaskView]:
    """A task working (held) at an agent requiring a bearer token, which it then revokes."""
    peer.protect({"bearer": bearer_scheme()}, [requirement("bearer")])
    peer.accept_bearer("bearer", "t-1")
    engine = await engines.open(config_for(peer, {"bearer": Bearer("t-1")}))
    peer.hold()
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.1")
    await engine.poll(view.task)
    peer.revoke("bearer")
    return engine, view


async def test_revoked_credentials_mid_task_flag_the_task_without_transition_or_cancel(
    peer: AuthPeer, engines: Engines
) -> None:
    engine, view = await _working_then_revoked(peer, engines)

    with pytest.raises((AuthorizationFailedError, DeadlineExceeded)):
        await engine.drive(view.task, until="terminal", timeout=1)
    flagged = await engine.task(view.task)
    failures = data_of(engine.store, view.task, ev.AUTHORIZATION_FAILED)
    peer.accept_bearer("bearer", "t-1")  # the operator restores the token
    peer.release()
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert flagged.state == "working"
    assert "credentials_rejected" in flagged.flags
    assert failures
    assert failures[0]["status"] == 401
    assert failures[0]["schemes"] == ["bearer"]
    assert failures[0]["during"] == "poll"
    assert ("JSONRPC", "CancelTask") not in peer.calls
    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW


async def test_polls_refused_alike_add_one_event_and_a_count_not_one_event_a_poll(
    peer: AuthPeer, engines: Engines
) -> None:
    engine, view = await _working_then_revoked(peer, engines)
    refused_before = sum(1 for hit in a2a_hits(peer) if hit.status == 401)

    for _ in range(6):
        with pytest.raises(AuthorizationFailedError):
            await engine.poll(view.task)
    refused = sum(1 for hit in a2a_hits(peer) if hit.status == 401) - refused_before
    peer.accept_bearer("bearer", "t-1")
    peer.release()
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert refused == 6  # every poll reached the agent and was refused
    assert len(data_of(engine.store, view.task, ev.AUTHORIZATION_FAILED)) == 1
    assert done.failures_repeated == 5  # carried by the task's next event
    assert done.state == "completed"
    assert transitions(engine.store, view.task) == SLOW


async def test_an_endpoint_moved_to_another_origin_is_sent_no_credential(
    peer: AuthPeer, engines: Engines
) -> None:
    if not peer.cross_origin_served:
        pytest.skip("127.0.0.2 cannot be bound here")
    peer.protect({"bearer": bearer_scheme()}, [requirement("bearer")])
    peer.accept_bearer("bearer", "t-moved-1")
    moved_origin = peer.base_url.replace("127.0.0.1", "127.0.0.2")
    secrets = {"bearer": Bearer("t-moved-1")}
    both = CredentialsConfig.of({peer.base_url: secrets, moved_origin: secrets})
    engine = await engines.open(dataclasses.replace(FAST, credentials=both))
    peer.hold()
    view = await engine.start_task(peer.base_url, skill="slow", text="slow 0.1")
    await engine.poll(view.task)
    elsewhere = peer.jsonrpc_url.replace("127.0.0.1", "127.0.0.2")

    def move(card: dict[str, Any]) -> None:
        card["supportedInterfaces"] = [
            {"url": elsewhere, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ]

    peer.mutate_card(move)
    peer.set_endpoint_gone(True, "JSONRPC")  # 404 at the old place: R9 follows the card
    peer.release()
    with pytest.raises((AuthorizationFailedError, DeadlineExceeded)):
        await engine.drive(view.task, until="terminal", timeout=2)

    moved = [hit for hit in peer.auth_log if hit.host.startswith("127.0.0.2")]
    assert state_of(engine, view.task)["endpoint"] == {
        "url": elsewhere,
        "binding": "JSONRPC",
        "protocol_version": "1.0",
    }
    assert moved, "the moved endpoint was never asked"
    assert all(hit.presented == () for hit in moved)
    assert all(not hit.credentials for hit in moved)
    assert data_of(engine.store, view.task, ev.AUTHORIZATION_FAILED)

    # The operator accepts the new origin: from then on the task's credentials go there. (One
    # server answers on both addresses: the old one's 404 must not stand in the new one's way.)
    peer.set_endpoint_gone(False)
    mark = len(peer.auth_log)
    await engine.resume(view.task, accept_contract=True)
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert done.state == "completed"
    [accepted] = data_of(engine.store, view.task, ev.CREDENTIALS_MOVED)
    assert accepted["new"] == moved_origin
    later = [hit for hit in peer.auth_log[mark:] if hit.binding is not None]
    assert later
    assert all(hit.credentials.get("authorization") == "Bearer t-moved-1" for hit in later)


# -- auth-required from the agent -----------------------------------------------------------------


async def test_auth_required_is_a_state_like_any_other_and_reply_answers_it(
    peer: AuthPeer, engines: Engines
) -> None:
    engine = await engines.open(config_for(peer, {}))

    view = await engine.start_task(peer.base_url, skill="authorize", text="authorize")
    waiting = await engine.drive(view.task, until="interrupted", timeout=10)
    await engine.reply(view.task, "signed in")
    done = await engine.drive(view.task, until="terminal", timeout=10)

    assert waiting.state == "auth-required"
    assert waiting.last_message == "Sign in at https://id.example/device"
    assert done.state == "completed"
    assert ev.AUTHORIZATION_FAILED not in types(engine.store, view.task)


async def test_many_tasks_share_one_token(
    peer: AuthPeer, engines: Engines, tokens: TokenServer
) -> None:
    engine = await oauth_engine(peer, engines, tokens)

    views = await asyncio.gather(
        *(engine.start_task(peer.base_url, skill="echo", text=f"echo {n}") for n in range(8))
    )
    done = [await engine.drive(v.task, until="terminal", timeout=10) for v in views]

    assert {d.state for d in done} == {"completed"}
    assert tokens.token_requests == 1
