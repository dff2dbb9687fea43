"""R15's credentials pinned down for their mutants (``scripts/mutation``): the exact words of
every refusal (which entry, which scheme, what was wrong: never the secret), the secrets a
request lists for redaction, how two schemes' additions merge, and what the authorizer passes
on (its environment, the grant's origin, scheme and scopes, a refresh) when it prepares a
request or a client certificate, or rebuilds a recorded grant."""

from __future__ import annotations

from typing import Any

import pytest
from support.credentials import AGENT, alternative, card

from cardfence.engine.auth.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.auth.config import (
    ApiKey,
    Basic,
    Bearer,
    CredentialsConfig,
    MutualTls,
    OAuthClient,
    Secret,
)
from cardfence.engine.auth.credentials import (
    Gap,
    RequestAuth,
    TokenNeeded,
    apply,
    choose,
    fingerprint,
)
from cardfence.engine.cards.model import SecurityRequirement
from cardfence.engine.errors import CredentialsConfigError, CredentialsMissingError

API_KEY_HEADER = {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
API_KEY_COOKIE = {"apiKeySecurityScheme": {"location": "cookie", "name": "key"}}
MTLS = {"mtlsSecurityScheme": {}}
OAUTH = {
    "oauth2SecurityScheme": {
        "flows": {"clientCredentials": {"tokenUrl": "https://auth.test/token", "scopes": {}}}
    }
}

# -- what a refusal says ---------------------------------------------------------------------------


def test_a_gap_names_the_schemes_not_configured_and_those_not_declared() -> None:
    gap = Gap(("a", "b", "c"), ("a", "b"), ("c",))
    assert str(gap) == "[a + b + c]: a, b not configured; c not declared in securitySchemes"
    assert str(Gap(("c", "d"), (), ("c", "d"))) == "[c + d]: c, d not declared in securitySchemes"


def test_a_refused_choice_gives_each_alternatives_gap_joined_by_or() -> None:
    choice = choose([_requirement("a"), _requirement("b")], {"a": {}}, lambda name: False)
    assert choice.refused
    assert choice.reason() == "[a]: a not configured; or [b]: b not declared in securitySchemes"


def _requirement(name: str) -> SecurityRequirement:
    return SecurityRequirement(((name, ()),))


@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        (ApiKey("k"), "an API key"),
        (Bearer("t"), "a bearer token"),
        (Basic("u", "p"), "a user name and password"),
        (OAuthClient("id", "s"), "an OAuth client"),
    ],
)
def test_a_secret_that_does_not_fit_is_refused_naming_its_entry_and_kind(
    secret: Secret, kind: str
) -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply(MTLS, secret, origin=AGENT, scheme="cert")
    assert str(refused.value) == (
        f'credentials for this card [agents."{AGENT}"] cert: the card\'s scheme is mutual TLS, '
        f"the configured secret is {kind}"
    )
    assert (refused.value.origin, refused.value.scheme) == (AGENT, "cert")


def test_a_client_certificate_for_an_api_key_scheme_is_named_as_such() -> None:
    with pytest.raises(
        CredentialsConfigError, match=r"the configured secret is a client certificate$"
    ):
        apply(API_KEY_HEADER, MutualTls("c.pem", "k.pem"))


def test_apply_names_no_entry_unless_told_one() -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply(MTLS, Bearer("t"))
    assert str(refused.value).startswith("credentials for this card: the card's scheme")


def test_an_unset_environment_variable_is_refused_naming_the_entry() -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply(API_KEY_HEADER, ApiKey("env:CARDFENCE_UNSET_KEY"), environ={}, origin=AGENT,
              scheme="key")  # fmt: skip
    assert str(refused.value) == (
        f'credentials environment [agents."{AGENT}"] key: api_key: environment variable '
        "CARDFENCE_UNSET_KEY is not set"
    )


@pytest.mark.parametrize(
    ("definition", "where"), [(API_KEY_HEADER, "header"), (API_KEY_COOKIE, "cookie")]
)
def test_an_api_key_that_would_break_out_of_its_header_or_cookie_is_refused(
    definition: dict[str, Any], where: str
) -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply(definition, ApiKey("k\r\nX-Evil: 1"), origin=AGENT, scheme="key")
    assert str(refused.value) == (
        f'credentials for this card [agents."{AGENT}"] key: the API key holds characters a '
        "request header or cookie cannot carry"
    )


@pytest.mark.parametrize(
    ("definition", "carried"),
    [(API_KEY_HEADER, "headers"), (API_KEY_COOKIE, "cookies")],
)
def test_an_api_key_is_listed_among_the_secrets_to_redact(
    definition: dict[str, Any], carried: str
) -> None:
    auth = apply(definition, ApiKey("the-key"))
    assert auth.secrets == ("the-key",)
    assert getattr(auth, carried)[0][1] == "the-key"


def test_a_fingerprint_key_shorter_than_sixteen_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^the fingerprint key must be at least 16 bytes$"):
        fingerprint("s", bytes(15))
    assert fingerprint("s", bytes(16)).startswith("hmac-sha256:")


# -- two schemes in one request --------------------------------------------------------------------


def test_two_different_client_certificates_cannot_share_a_request() -> None:
    one, other = (
        RequestAuth(client_cert=("a.pem", "a.key")),
        RequestAuth(client_cert=("b.pem", "b.key")),
    )
    with pytest.raises(ValueError, match=r"^two different client certificates for one request$"):
        one.merged(other)
    assert one.merged(one).client_cert == ("a.pem", "a.key")


def test_two_oauth_tokens_cannot_share_a_request_and_one_is_kept_whichever_side() -> None:
    needed = TokenNeeded("oauth2", OAuthClient("id", "s"), (), token_url="https://auth.test/t")
    token = RequestAuth(token=needed, secrets=("s",))
    header = RequestAuth(headers=(("X-Key", "k"),), secrets=("k",))
    with pytest.raises(ValueError, match=r"^two OAuth tokens for one request$"):
        token.merged(token)
    assert token.merged(header).token is needed
    assert header.merged(token).token is needed
    assert header.merged(token).secrets == ("k", "s")
    assert header.merged(header).token is None


# -- what the authorizer passes on -----------------------------------------------------------------


class Tokens:
    """A token source that records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[TokenNeeded, str, bool]] = []

    async def token(self, needed: TokenNeeded, *, scheme: str = "", refresh: bool = False) -> Any:
        self.asked.append((needed, scheme, refresh))
        return _Token(f"tok-{len(self.asked)}")


class _Token:
    def __init__(self, value: str) -> None:
        self.value = value

    def authorization(self) -> str:
        return f"Bearer {self.value}"


def _oauth_grant(scopes: tuple[str, ...] = ("read",)) -> Grant:
    return Grant(AGENT, ("oauth",), {"oauth": scopes}, {"oauth": OAUTH})


async def test_a_request_asks_the_token_source_with_its_scheme_scopes_and_refresh() -> None:
    tokens = Tokens()
    config = CredentialsConfig.of({AGENT: {"oauth": OAuthClient("id", "s", ("extra",))}})
    authorizer = Authorizer(config, tokens)
    first = await authorizer.prepare(_oauth_grant())
    await authorizer.prepare(_oauth_grant(), refresh=True)
    (needed, scheme, refresh), (_, _, again) = tokens.asked
    assert (scheme, refresh, again) == ("oauth", False, True)
    assert needed.scopes == ("extra", "read")
    assert first.headers == (("Authorization", "Bearer tok-1"),)
    assert set(first.secrets) == {"s", "tok-1", "Bearer tok-1"}


async def test_a_request_resolves_its_secrets_in_the_authorizers_environment() -> None:
    config = CredentialsConfig.of({AGENT: {"key": ApiKey("env:CARDFENCE_TEST_KEY")}})
    authorizer = Authorizer(config, None, environ={"CARDFENCE_TEST_KEY": "from-env"})
    grant = Grant(AGENT, ("key",), {}, {"key": API_KEY_HEADER})
    assert (await authorizer.prepare(grant)).headers == (("X-Key", "from-env"),)


async def test_a_secret_that_no_longer_fits_is_refused_naming_the_grants_entry() -> None:
    config = CredentialsConfig.of({AGENT: {"key": Bearer("t")}})
    grant = Grant(AGENT, ("key",), {}, {"key": API_KEY_HEADER})
    with pytest.raises(CredentialsConfigError) as refused:
        await Authorizer(config, None).prepare(grant)
    assert (refused.value.origin, refused.value.scheme) == (AGENT, "key")


async def test_a_secret_gone_from_the_configuration_sends_nothing_and_says_which() -> None:
    grant = Grant(AGENT, ("key",), {}, {"key": API_KEY_HEADER})
    with pytest.raises(CredentialsMissingError) as refused:
        await Authorizer(CredentialsConfig.of({}), None).prepare(grant)
    assert str(refused.value) == (
        f"{AGENT}: the task's requests require credentials that are not configured ([key]: not "
        "configured); nothing was sent"
    )
    assert refused.value.agent == AGENT


async def test_a_token_scheme_without_a_token_source_sends_nothing_and_says_which() -> None:
    config = CredentialsConfig.of({AGENT: {"oauth": OAuthClient("id", "s")}})
    with pytest.raises(CredentialsMissingError) as refused:
        await Authorizer(config, None).prepare(_oauth_grant())
    assert str(refused.value) == (
        f"{AGENT}: the task's requests require credentials that are not configured ([oauth]: no "
        "token source); nothing was sent"
    )
    assert refused.value.agent == AGENT


def test_has_asks_for_the_scheme_at_the_origin() -> None:
    authorizer = Authorizer(CredentialsConfig.of({AGENT: {"key": ApiKey("k")}}), None)
    assert authorizer.has(AGENT, "key")
    assert not authorizer.has(AGENT, "other")
    assert not authorizer.has("https://other.test", "key")
    assert not Authorizer(None, None).has(AGENT, "key")


def _credentials(secrets: dict[str, Secret], definitions: dict[str, Any],
                 environ: dict[str, str] | None = None) -> TaskCredentials:  # fmt: skip
    authorizer = Authorizer(CredentialsConfig.of({AGENT: secrets}), None, environ=environ)
    return TaskCredentials(authorizer, Grant(AGENT, tuple(secrets), {}, definitions))


def test_the_client_certificate_is_the_mutual_tls_schemes_resolved_in_the_environment() -> None:
    secrets: dict[str, Secret] = {"key": ApiKey("k"), "cert": MutualTls("env:CERT", "k.pem")}
    held = _credentials(secrets, {"key": API_KEY_HEADER, "cert": MTLS}, {"CERT": "c.pem"})
    assert held.client_cert() == ("c.pem", "k.pem")


def test_no_client_certificate_without_a_mutual_tls_scheme_or_its_secret() -> None:
    assert _credentials({"key": ApiKey("k")}, {"key": API_KEY_HEADER}).client_cert() is None
    no_secret = TaskCredentials(
        Authorizer(CredentialsConfig.of({}), None), Grant(AGENT, ("cert",), {}, {"cert": MTLS})
    )
    assert no_secret.client_cert() is None


def test_a_mutual_tls_secret_that_does_not_fit_is_refused_naming_the_grants_origin() -> None:
    held = _credentials({"cert": Bearer("t")}, {"cert": MTLS})
    with pytest.raises(CredentialsConfigError) as refused:
        held.client_cert()
    assert refused.value.origin == AGENT


# -- a recorded grant rebuilt ----------------------------------------------------------------------


def test_a_recorded_grant_of_no_schemes_keeps_its_origin() -> None:
    frozen = card([])
    assert Authorizer.regrant(frozen, {"origin": AGENT, "schemes": []}) == Grant(AGENT, ())
    assert Authorizer.regrant(frozen, {}) == Grant("", ())


def test_a_recorded_scheme_the_frozen_card_does_not_declare_gets_an_empty_definition() -> None:
    grant = Authorizer.regrant(card([]), {"origin": AGENT, "schemes": ["gone", "key"]})
    assert grant.definitions["gone"] == {}
    assert "apiKeySecurityScheme" in grant.definitions["key"]


# -- what does not fit, in the card's words --------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "secret", "problem"),
    [
        (
            {"apiKeySecurityScheme": {"location": "header", "name": ""}},
            ApiKey("k"),
            "the card's API key scheme names no parameter",
        ),
        (
            {"httpAuthSecurityScheme": {}},
            Bearer("t"),
            "HTTP auth scheme '' is neither bearer nor basic",
        ),
        (
            OAUTH,
            Bearer("t"),
            "the card's scheme is OAuth 2.0, the configured secret is a bearer token",
        ),
        (
            {"oauth2SecurityScheme": {"flows": {"authorizationCode": {}}}},
            OAuthClient("id", "s"),
            "the card's OAuth 2.0 scheme offers no clientCredentials flow with a tokenUrl",
        ),
        (
            {"oauth2SecurityScheme": {"flows": ["clientCredentials"]}},
            OAuthClient("id", "s"),
            "the card's OAuth 2.0 scheme offers no clientCredentials flow with a tokenUrl",
        ),
        (
            {"openIdConnectSecurityScheme": {"openIdConnectUrl": "https://id.test"}},
            ApiKey("k"),
            "the card's scheme is OpenID Connect, the configured secret is an API key",
        ),
        (
            {"openIdConnectSecurityScheme": {}},
            OAuthClient("id", "s"),
            "the card's OpenID Connect scheme has no openIdConnectUrl",
        ),
        (
            {"kerberosSecurityScheme": {}},
            Bearer("t"),
            "the card's scheme is of a kind cardfence does not know",
        ),
        (
            {"httpAuthSecurityScheme": {"scheme": "bearer"}},
            Bearer("t\n"),
            "the token holds characters a request header or cookie cannot carry",
        ),
    ],
)
def test_what_does_not_fit_is_said_in_the_cards_words(
    definition: dict[str, Any], secret: Secret, problem: str
) -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply(definition, secret)
    assert str(refused.value) == f"credentials for this card: {problem}"


def test_a_scheme_is_found_by_its_key_among_other_members() -> None:
    definition = {"description": {"text": "a table first"}, **API_KEY_HEADER}
    assert apply(definition, ApiKey("k")).headers == (("X-Key", "k"),)


def test_a_basic_user_name_holding_a_colon_is_refused() -> None:
    with pytest.raises(CredentialsConfigError) as refused:
        apply({"httpAuthSecurityScheme": {"scheme": "basic"}}, Basic("a:b", "p"))
    assert str(refused.value) == (
        "credentials for this card: username contains ':', which HTTP basic cannot carry (RFC 7617)"
    )


def test_an_openid_connect_scheme_needs_a_token_for_the_client_with_both_scopes() -> None:
    client = OAuthClient("id", "s", ("extra",))
    definition = {"openIdConnectSecurityScheme": {"openIdConnectUrl": "https://id.test/.wk"}}
    needed = apply(definition, client, scopes=("read",)).token
    assert needed == TokenNeeded(
        "openIdConnect", client, ("extra", "read"), discovery_url="https://id.test/.wk"
    )


async def test_a_token_scheme_granted_without_scopes_asks_for_the_configured_ones() -> None:
    tokens = Tokens()
    config = CredentialsConfig.of({AGENT: {"oauth": OAuthClient("id", "s", ("extra",))}})
    await Authorizer(config, tokens).prepare(Grant(AGENT, ("oauth",), {}, {"oauth": OAUTH}))
    ((needed, _, _),) = tokens.asked
    assert needed.scopes == ("extra",)


def test_a_granted_scheme_without_a_definition_needs_no_client_certificate() -> None:
    authorizer = Authorizer(CredentialsConfig.of({AGENT: {"gone": MutualTls("c", "k")}}), None)
    assert TaskCredentials(authorizer, Grant(AGENT, ("gone",))).client_cert() is None


# -- what the log keeps ----------------------------------------------------------------------------


def test_the_fingerprints_cover_each_configured_scheme_resolved_in_the_environment() -> None:
    secrets: dict[str, Secret] = {"cert": MutualTls("c", "k"), "key": ApiKey("env:KEY")}
    authorizer = Authorizer(
        CredentialsConfig.of({AGENT: secrets}), None, key=bytes(16), environ={"KEY": "value"}
    )
    grant = Grant(AGENT, ("absent", "cert", "key"))  # "absent": configured no more, skipped
    assert authorizer.fingerprints(grant) == {
        "cert": "certificate",
        "key": fingerprint("value", bytes(16)),
    }


def test_a_fingerprint_of_an_unset_variable_is_refused_naming_the_entry() -> None:
    config = CredentialsConfig.of({AGENT: {"key": ApiKey("env:KEY")}})
    with pytest.raises(CredentialsConfigError) as refused:
        Authorizer(config, None, environ={}).fingerprints(Grant(AGENT, ("key",)))
    assert (refused.value.origin, refused.value.scheme) == (AGENT, "key")


def test_a_grant_records_every_scheme_with_its_scopes_even_none() -> None:
    grant = Grant(AGENT, ("bearer", "key"), {"bearer": ("read",)})
    assert grant.record({"key": "hmac-sha256:00"}) == {
        "origin": AGENT,
        "schemes": ["bearer", "key"],
        "scopes": {"bearer": ["read"], "key": []},
        "fingerprints": {"key": "hmac-sha256:00"},
    }


def test_an_authorizer_given_no_key_makes_a_random_256_bit_one() -> None:
    one, other = Authorizer(None, None), Authorizer(None, None)
    assert len(one.key) == len(other.key) == 32
    assert one.key != other.key


def test_a_creation_no_alternative_covers_is_refused_naming_the_agent_and_skill() -> None:
    with pytest.raises(CredentialsMissingError) as refused:
        Authorizer(None, None).grant(card([alternative(key=[])]), "work", f"{AGENT}/rpc")
    assert str(refused.value) == (
        f"{AGENT}: skill 'work' requires credentials that are not configured ([key]: key not "
        "configured); nothing was sent"
    )
