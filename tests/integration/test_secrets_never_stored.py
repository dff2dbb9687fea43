"""R15, never persist a secret: tasks run with every kind of credential (API keys in a header, a
query and a cookie, bearer, basic, OAuth 2.0 tokens, a webhook's token and authorization), some
of them refused mid-task; then the raw database -- the SQLite file's bytes, a ``pg_dump`` of the
PostgreSQL schema -- and everything logged are searched for every secret used. None is there:
the log holds scheme names and HMAC fingerprints only."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import AuthPeer, TokenServer
from support.auth_peer import (
    api_key_scheme,
    basic_scheme,
    bearer_scheme,
    oauth2_scheme,
    requirement,
)
from support.engine_fixtures import FAST, assert_audit_ok, data_of, database_bytes

from cardfence.engine.auth.config import ApiKey, Basic, Bearer, CredentialsConfig, OAuthClient
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.errors import (
    AuthorizationFailedError,
    CardInvalidError,
    DeadlineExceeded,
    UsageError,
)

KEYS = {"header": "sk-header-7f3a9c", "query": "sk-query-51be02", "cookie": "sk-cookie-c0ffee"}
BEARER = "tok-bearer-9d8e7f6a"
PASSWORD = "pw-basic-4b5c6d"
CLIENT_SECRET = "oauth-client-secret-2e1f"
URL_PASSWORD = "pw-in-a-url-8a7b6c"


@pytest.fixture
def peer() -> Iterator[AuthPeer]:
    with AuthPeer() as running:
        yield running


@pytest.fixture
def tokens() -> Iterator[TokenServer]:
    with TokenServer(expires_in=3600) as server:
        server.register("scan-client", CLIENT_SECRET)
        yield server


def _skill_contracts(peer: AuthPeer, tokens: TokenServer) -> None:
    """One skill per kind of credential (skill-level requirements replace the card's)."""
    peer.protect(
        {
            "hkey": api_key_scheme("X-Agent-Key", "header"),
            "qkey": api_key_scheme("agent_key", "query"),
            "ckey": api_key_scheme("agent_key", "cookie"),
            "bearer": bearer_scheme(),
            "basic": basic_scheme(),
            "oauth": oauth2_scheme(tokens.token_url),
        },
        [requirement("bearer")],
        skill_requirements={
            "echo": [requirement("hkey", "qkey", "ckey")],
            "ask": [requirement("basic")],
            "slow": [requirement("oauth")],
        },
    )
    # The gate enforces card-level requirements: any of the kinds lets a request in.
    peer.set_enforced(
        {
            "hkey": api_key_scheme("X-Agent-Key", "header"),
            "bearer": bearer_scheme(),
            "basic": basic_scheme(),
            "oauth": oauth2_scheme(tokens.token_url),
        },
        [requirement("hkey"), requirement("bearer"), requirement("basic"), requirement("oauth")],
    )
    peer.accept_api_key("hkey", KEYS["header"])
    peer.accept_bearer("bearer", BEARER)
    peer.accept_basic("basic", "svc", PASSWORD)
    peer.accept_oauth("oauth", tokens.check)


async def _run_everything(url: str, peer: AuthPeer, tokens: TokenServer) -> list[str]:
    """Run tasks under each credential, one refused mid-task; returns every secret used."""
    _skill_contracts(peer, tokens)
    credentials = CredentialsConfig.of(
        {
            peer.base_url: {
                "hkey": ApiKey(KEYS["header"]),
                "qkey": ApiKey(KEYS["query"]),
                "ckey": ApiKey(KEYS["cookie"]),
                "bearer": Bearer(BEARER),
                "basic": Basic("svc", PASSWORD),
                "oauth": OAuthClient("scan-client", CLIENT_SECRET),
            }
        }
    )
    config = dataclasses.replace(FAST, credentials=credentials)
    secrets = [*KEYS.values(), BEARER, PASSWORD, CLIENT_SECRET]
    secrets.append(base64.b64encode(f"svc:{PASSWORD}".encode()).decode())
    async with Engine.connect(url, config=config) as engine:
        echo = await engine.start_task(peer.base_url, skill="echo", text="echo scanned")
        asked = await engine.start_task(peer.base_url, skill="ask", text="ask")
        slow = await engine.start_task(peer.base_url, skill="slow", text="slow 0.3")
        fail = await engine.start_task(peer.base_url, skill="fail", text="fail")
        hook = await engine.register_webhook(slow.task, "http://127.0.0.1:9/webhook")
        secrets += [str(hook.token), str(hook.authorization).split(" ", 1)[1]]
        await engine.drive(asked.task, until="interrupted", timeout=10)
        await engine.reply(asked.task, "yes")
        for view in (echo, asked, slow, fail):
            await engine.drive(view.task, until="terminal", timeout=10)
        # Refused mid-task: the refusal is recorded, with the scheme's name only.
        held = await engine.start_task(peer.base_url, skill="ask", text="ask again")
        await engine.drive(held.task, until="interrupted", timeout=10)
        peer.revoke("basic")
        with contextlib.suppress(AuthorizationFailedError):
            await engine.reply(held.task, "no")
        with contextlib.suppress(AuthorizationFailedError, DeadlineExceeded):
            await engine.drive(held.task, until="terminal", timeout=0.5)
        await engine.settle()
        assert data_of(engine.store, held.task, ev.AUTHORIZATION_FAILED)
        assert data_of(engine.store, echo.task, ev.TASK_SUBMITTED)[0]["authorization"][
            "fingerprints"
        ]
        assert_audit_ok(engine.store)
    secrets += [issued.access_token for issued in tokens.issued]
    assert len(tokens.issued) >= 1
    return secrets


async def test_no_secret_used_is_in_the_database_or_the_logs(
    db_url: str,
    peer: AuthPeer,
    tokens: TokenServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="cardfence")

    secrets = await _run_everything(db_url, peer, tokens)
    stored = database_bytes(db_url, tmp_path)
    logged = "\n".join(
        f"{r.getMessage()} {r.__dict__}" for r in caplog.records if r.name.startswith("cardfence")
    )

    found = [s for s in secrets if s.encode() in stored]
    assert found == [], "secrets in the database"
    assert b"hmac-sha256:" in stored  # fingerprints were recorded in their place
    assert [s for s in secrets if s in logged] == [], "secrets in the logs"


async def test_credentials_written_into_a_url_are_refused_and_never_stored_or_sent(
    db_url: str, peer: AuthPeer, tmp_path: Path
) -> None:
    def with_password(url: str) -> str:
        return url.replace("//", f"//svc:{URL_PASSWORD}@", 1)

    async with Engine.connect(db_url, config=FAST) as engine:
        with pytest.raises(UsageError, match="credentials file"):  # the agent's URL
            await engine.start_task(with_password(peer.base_url), skill="echo", text="echo")
        view = await engine.start_task(peer.base_url, skill="echo", text="echo")
        with pytest.raises(UsageError, match="webhook"):  # a webhook's
            await engine.register_webhook(view.task, with_password("http://127.0.0.1:9/hook"))
        peer.mutate_card(
            lambda c: [i.update(url=with_password(i["url"])) for i in c["supportedInterfaces"]]
        )
        with pytest.raises(CardInvalidError) as invalid:  # an interface the card names
            await engine.start_task(peer.base_url, skill="echo", text="echo")
        assert_audit_ok(engine.store)

    basic = base64.b64encode(f"svc:{URL_PASSWORD}".encode()).decode()  # as httpx would send it
    assert URL_PASSWORD not in str(invalid.value)
    stored = database_bytes(db_url, tmp_path)
    assert [s for s in (URL_PASSWORD, basic) if s.encode() in stored] == []
    assert [hit.path for hit in peer.auth_log if basic in repr(hit)] == []
