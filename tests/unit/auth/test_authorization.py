"""R15 at the edge (engine/auth/authorization.py): the grant chosen at creation, rebuilt from the
frozen card for later requests, never sent to another origin, applied per request."""

from __future__ import annotations

import json

import pytest
from support.credentials import AGENT, SCHEMES, Tokens, alternative, card

from cardfence.engine.auth.authorization import Authorizer, Grant
from cardfence.engine.auth.config import ApiKey, Bearer, CredentialsConfig, OAuthClient
from cardfence.engine.errors import CredentialsMissingError

CONFIG = CredentialsConfig.of(
    {
        AGENT: {
            "key": ApiKey("k-secret"),
            "bearer": Bearer("b-secret"),
            "oauth": OAuthClient("cid", "c-secret", ("extra",)),
        }
    }
)


def test_the_first_covered_alternative_is_granted_with_its_scopes() -> None:
    authorizer = Authorizer(CredentialsConfig.of({AGENT: {"bearer": Bearer("b")}}), Tokens())

    grant = authorizer.grant(card([alternative(key=[]), alternative(bearer=["read"])]), "work",
                             f"{AGENT}/rpc")  # fmt: skip

    assert grant.schemes == ("bearer",)
    assert grant.scopes == {"bearer": ("read",)}
    assert grant.origin == AGENT


def test_skill_requirements_replace_the_cards() -> None:
    authorizer = Authorizer(CONFIG, Tokens())

    grant = authorizer.grant(card([alternative(bearer=[])], [alternative(key=[])]), "work", AGENT)

    assert grant.schemes == ("key",)


def test_no_covered_alternative_is_refused_naming_what_is_missing() -> None:
    authorizer = Authorizer(CredentialsConfig.of({AGENT: {"bearer": Bearer("b")}}), Tokens())

    with pytest.raises(CredentialsMissingError, match=r"\[key\]: key not configured"):
        authorizer.grant(card([alternative(key=[])]), "work", AGENT)


def test_no_provider_and_a_required_contract_is_refused() -> None:
    with pytest.raises(CredentialsMissingError):
        Authorizer(None, None).grant(card([alternative(bearer=[])]), "work", AGENT)


def test_a_contract_requiring_nothing_grants_nothing_and_sends_nothing() -> None:
    authorizer = Authorizer(CONFIG, Tokens())
    grant = authorizer.grant(card([]), "work", AGENT)

    assert grant.schemes == ()
    assert authorizer.for_task(grant, f"{AGENT}/rpc") is None


def test_credentials_go_to_the_grant_origin_only() -> None:
    authorizer = Authorizer(CONFIG, Tokens())
    grant = authorizer.grant(card([alternative(bearer=[])]), "work", f"{AGENT}/rpc")

    assert authorizer.for_task(grant, f"{AGENT}/elsewhere/rpc") is not None
    assert authorizer.for_task(grant, "https://moved.test/rpc") is None
    assert authorizer.for_task(grant, "http://agent.test/rpc") is None  # another scheme: origin


async def test_each_request_carries_the_granted_schemes_and_nothing_else() -> None:
    authorizer = Authorizer(CONFIG, Tokens())
    grant = authorizer.grant(card([alternative(bearer=[], key=[])]), "work", AGENT)

    prepared = await authorizer.prepare(grant)

    assert prepared.headers == (("Authorization", "Bearer b-secret"),)
    assert prepared.params == (("k", "k-secret"),)
    assert prepared.cookies == ()
    assert {"b-secret", "k-secret"} <= set(prepared.secrets)


async def test_an_oauth_scheme_gets_a_token_and_a_refresh_asks_for_a_new_one() -> None:
    tokens = Tokens()
    authorizer = Authorizer(CONFIG, tokens)
    grant = authorizer.grant(card([alternative(oauth=["a2a"])]), "work", AGENT)
    credentials = authorizer.for_task(grant, AGENT)
    assert credentials is not None
    assert credentials.refreshable

    first = await credentials.prepare()
    second = await credentials.prepare(refresh=True)

    assert first.headers == (("Authorization", "Bearer tok-1"),)
    assert second.headers == (("Authorization", "Bearer tok-2"),)
    asked = [(needed.token_url, refresh) for needed, _, refresh in tokens.asked]
    assert asked == [("https://auth.test/token", False), ("https://auth.test/token", True)]
    assert "c-secret" in first.secrets
    assert "tok-1" in first.secrets


def test_the_record_holds_names_scopes_and_fingerprints_never_a_secret() -> None:
    authorizer = Authorizer(CONFIG, Tokens(), key=b"k" * 32)
    grant = authorizer.grant(card([alternative(bearer=["r"], key=[])]), "work", AGENT)

    record = grant.record(authorizer.fingerprints(grant))
    text = json.dumps(record)

    assert record["schemes"] == ["bearer", "key"]
    assert record["scopes"] == {"bearer": ["r"], "key": []}
    assert all(fp.startswith("hmac-sha256:") for fp in record["fingerprints"].values())
    assert "b-secret" not in text
    assert "k-secret" not in text


def test_regrant_rebuilds_the_recorded_grant_from_the_frozen_card_without_choosing_again() -> None:
    authorizer = Authorizer(CONFIG, Tokens())
    frozen = card([alternative(bearer=["r"])])
    grant = authorizer.grant(frozen, "work", AGENT)
    record = grant.record({})

    # The card in force now prefers another alternative: the task keeps its own.
    rebuilt = Authorizer.regrant(frozen, record)

    assert rebuilt == Grant(AGENT, ("bearer",), {"bearer": ("r",)}, rebuilt.definitions)
    assert rebuilt.definitions == {"bearer": SCHEMES["bearer"]}


async def test_a_secret_gone_from_the_provider_sends_nothing_rather_than_less() -> None:
    config = {"key": ApiKey("k"), "bearer": Bearer("b")}
    authorizer = Authorizer(lambda origin, name: config.get(name), Tokens())
    grant = authorizer.grant(card([alternative(bearer=[], key=[])]), "work", AGENT)
    del config["key"]

    with pytest.raises(CredentialsMissingError, match="key"):
        await authorizer.prepare(grant)
