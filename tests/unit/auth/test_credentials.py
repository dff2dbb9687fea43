"""The credentials core of R15 (engine/auth/config.py, engine/auth/credentials.py): the file,
env: values, the choice among alternatives, what each scheme adds to a request, fingerprints, and
no secret in any repr."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
from support.cards import agent_card, skill
from support.credentials import AGENT, Tokens, alternative
from support.credentials import card as card_credentials

from cardfence.engine.auth.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.auth.config import (
    ApiKey,
    Basic,
    Bearer,
    CredentialsConfig,
    CredentialsProvider,
    MutualTls,
    OAuthClient,
    Secret,
    load_credentials,
)
from cardfence.engine.auth.credentials import (
    Gap,
    RequestAuth,
    TokenNeeded,
    apply,
    choose,
    effective_requirements,
    fingerprint,
    fits,
    redact,
)
from cardfence.engine.cards.model import AgentCard, SecurityRequirement
from cardfence.engine.cli._app import exit_code_of
from cardfence.engine.errors import CredentialsConfigError, CredentialsMissingError, UsageError

SECRETS = ("s3cr3t-api-key", "s3cr3t-token", "s3cr3t-pw", "s3cr3t-client")
ENV = {
    "AGENT_API_KEY": SECRETS[0],
    "AGENT_TOKEN": SECRETS[1],
    "AGENT_PW": SECRETS[2],
    "AGENT_SECRET": SECRETS[3],
}
FILE = """
[agents."HTTPS://Agent.Example:443/"]
api    = { api_key = "env:AGENT_API_KEY" }
bearer = { token = "env:AGENT_TOKEN" }
basic  = { username = "svc", password = "env:AGENT_PW" }
oauth  = { client_id = "cli-1", client_secret = "env:AGENT_SECRET", scopes = ["a2a"] }
mtls   = { cert = "/etc/cardfence/client.pem", key = "/etc/cardfence/client.key" }

[agents."http://localhost:8080"]
literal = { token = "literal-token-value" }
"""
KEY = b"k" * 32


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "credentials.toml"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def req(*names: str, scopes: tuple[str, ...] = ()) -> SecurityRequirement:
    return SecurityRequirement(tuple(sorted((name, scopes) for name in names)))


# --- the file -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_file_others_can_read_is_refused_naming_the_mode_and_chmod(
    tmp_path: Path, mode: int
) -> None:
    path = write(tmp_path, FILE, mode)
    with pytest.raises(CredentialsConfigError) as caught:
        load_credentials(path)
    text = str(caught.value)
    assert f"{mode:04o}" in text
    assert "chmod 600" in text
    assert "\n" not in text
    assert isinstance(caught.value, UsageError)
    assert exit_code_of(CredentialsConfigError) == 2


def test_a_private_file_is_read_with_origins_normalised(tmp_path: Path) -> None:
    config = load_credentials(write(tmp_path, FILE, 0o600))
    assert set(config.agents) == {"https://agent.example", "http://localhost:8080"}
    assert config("https://agent.example", "bearer") == Bearer("env:AGENT_TOKEN")
    assert config("https://AGENT.example:443/some/path", "basic") == Basic("svc", "env:AGENT_PW")
    assert config("https://agent.example", "oauth") == OAuthClient(
        "cli-1", "env:AGENT_SECRET", ("a2a",)
    )
    assert config("https://agent.example", "mtls") == MutualTls(
        "/etc/cardfence/client.pem", "/etc/cardfence/client.key"
    )
    assert config("https://agent.example", "api") == ApiKey("env:AGENT_API_KEY")
    assert config("https://agent.example:8443", "bearer") is None  # another origin
    assert config("https://agent.example", "nope") is None
    assert config("not a url", "bearer") is None
    assert config("http://localhost:8080", "literal") == Bearer("literal-token-value")


def test_a_config_is_a_credentials_provider(tmp_path: Path) -> None:
    provider: CredentialsProvider = load_credentials(write(tmp_path, FILE))
    assert provider("https://agent.example/", "bearer") == Bearer("env:AGENT_TOKEN")
    assert CredentialsConfig()("https://agent.example", "bearer") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[agents."https://a.example"]\nx = { token = 3 }', "x: token must be a non-empty string"),
        ('[agents."https://a.example"]\nx = { token = "" }', "token must be a non-empty string"),
        ('[agents."https://a.example"]\nx = { pin = "1" }', "keys pin fit no kind"),
        ('[agents."https://a.example"]\nx = { token = "t", api_key = "k" }', "fit no kind"),
        ('[agents."https://a.example"]\nx = "t"', "must be an inline table"),
        ('[agents."https://a.example"]\nx = { token = "env:" }', "env: must be followed"),
        ('[agents."https://a.example"]\nx = { token = "env:A-B" }', "env: must be followed"),
        (
            '[agents."https://a.example"]\nx = { client_id = "c", client_secret = "s", '
            "scopes = [1] }",
            "scopes must be a list",
        ),
        ('[agents."ftp://a.example"]\nx = { token = "t" }', "not an http(s) origin"),
        ('[agents."https://a.example/path"]\nx = { token = "t" }', "must be an origin"),
        ('[agents."https://u:p@a.example"]\nx = { token = "t" }', "must be an origin"),
        (
            '[agents."https://a.example"]\nx = { token = "t" }\n'
            '[agents."https://A.example:443"]\ny = { token = "t" }',
            "origin written twice",
        ),
        ('[agent."https://a.example"]\nx = { token = "t" }', "unknown top-level key(s) agent"),
        ("agents = 3", "agents must be a table"),
        ('[agents]\n"https://a.example" = 3', "must be a table of security scheme names"),
        ("[agents\n", "not valid TOML"),
    ],
)
def test_a_malformed_file_is_refused_in_one_line_naming_what(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(CredentialsConfigError) as caught:
        load_credentials(write(tmp_path, text))
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert str(tmp_path) in message


def test_a_shape_error_names_origin_and_scheme_and_never_the_value(tmp_path: Path) -> None:
    text = '[agents."https://a.example"]\nbearer = { token = "hunter2-secret", extra = "x" }'
    with pytest.raises(CredentialsConfigError) as caught:
        load_credentials(write(tmp_path, text))
    error = caught.value
    assert (error.origin, error.scheme) == ("https://a.example", "bearer")
    assert '[agents."https://a.example"] bearer' in str(error)
    assert "hunter2" not in str(error)


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(CredentialsConfigError, match="cannot be read"):
        load_credentials(tmp_path / "absent.toml")


# --- env: values ----------------------------------------------------------------------------------


def test_env_values_are_read_at_resolve_not_at_load(tmp_path: Path) -> None:
    config = load_credentials(write(tmp_path, FILE))  # nothing set: loading does not read env
    bearer = config("https://agent.example", "bearer")
    assert bearer is not None
    assert bearer.resolve(ENV) == Bearer(SECRETS[1])
    basic = config("https://agent.example", "basic")
    assert basic is not None
    assert basic.resolve(ENV) == Basic("svc", SECRETS[2])
    resolved = Bearer("env:T").resolve({"T": "env:OTHER"})
    assert resolved.resolve({}) is resolved  # a value that looks like a reference is not read


def test_a_missing_variable_names_the_variable_and_no_value() -> None:
    with pytest.raises(CredentialsConfigError) as caught:
        Bearer("env:AGENT_TOKEN").resolve(
            {"OTHER": "unrelated-value"}, origin="https://a.example", scheme="bearer"
        )
    text = str(caught.value)
    assert "AGENT_TOKEN is not set" in text
    assert '[agents."https://a.example"] bearer' in text
    assert "unrelated-value" not in text
    with pytest.raises(CredentialsConfigError, match="AGENT_PW is empty"):
        Basic("svc", "env:AGENT_PW").resolve({"AGENT_PW": ""})


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARDFENCE_TEST_TOKEN", "from-env")
    assert Bearer("env:CARDFENCE_TEST_TOKEN").resolve() == Bearer("from-env")
    monkeypatch.delenv("CARDFENCE_TEST_TOKEN")
    with pytest.raises(CredentialsConfigError, match="CARDFENCE_TEST_TOKEN"):
        Bearer("env:CARDFENCE_TEST_TOKEN").resolve()


# --- applying each kind ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "field"), [("header", "headers"), ("query", "params"), ("cookie", "cookies")]
)
def test_an_api_key_goes_where_the_card_says(location: str, field: str) -> None:
    scheme = {"apiKeySecurityScheme": {"location": location, "name": "X-API-Key"}}
    auth = apply(scheme, ApiKey("env:AGENT_API_KEY"), environ=ENV)
    assert getattr(auth, field) == (("X-API-Key", SECRETS[0]),)
    others = {"headers", "params", "cookies"} - {field}
    assert all(getattr(auth, other) == () for other in others)
    assert auth.client_cert is None
    assert auth.token is None


def test_bearer_and_basic_set_authorization() -> None:
    bearer = apply({"httpAuthSecurityScheme": {"scheme": "Bearer"}}, Bearer("tok"))
    assert bearer.headers == (("Authorization", "Bearer tok"),)
    basic = apply({"httpAuthSecurityScheme": {"scheme": "basic"}}, Basic("svc", "pw"))
    assert basic.headers == (("Authorization", "Basic " + base64.b64encode(b"svc:pw").decode()),)
    assert redact(str(basic.headers), basic.secrets) == "(('Authorization', '***'),)"


def test_oauth_and_oidc_say_a_token_is_needed() -> None:
    client = OAuthClient("cli-1", "env:AGENT_SECRET", ("a2a",))
    oauth = {
        "oauth2SecurityScheme": {
            "flows": {"clientCredentials": {"tokenUrl": "https://idp/token", "scopes": {}}}
        }
    }
    auth = apply(oauth, client, scopes=("read",), environ=ENV)
    assert auth.token is not None
    assert auth.token.kind == "oauth2"
    assert auth.token.token_url == "https://idp/token"
    assert auth.token.scopes == ("a2a", "read")
    assert auth.token.client.client_secret == SECRETS[3]
    assert auth.headers == ()
    oidc = {"openIdConnectSecurityScheme": {"openIdConnectUrl": "https://idp/.well-known/x"}}
    auth = apply(oidc, client, environ=ENV)
    assert auth.token is not None
    assert auth.token.kind == "openIdConnect"
    assert auth.token.discovery_url == "https://idp/.well-known/x"
    assert SECRETS[3] not in repr(auth)


def test_mtls_hands_over_the_certificate_paths() -> None:
    auth = apply({"mtlsSecurityScheme": {}}, MutualTls("/c.pem", "/c.key"))
    assert auth.client_cert == ("/c.pem", "/c.key")
    assert (auth.headers, auth.params, auth.cookies, auth.token) == ((), (), (), None)


@pytest.mark.parametrize(
    ("scheme", "secret", "expected"),
    [
        ({"apiKeySecurityScheme": {"location": "header", "name": "X"}}, Bearer("t"), "API key"),
        ({"apiKeySecurityScheme": {"location": "body", "name": "X"}}, ApiKey("k"), "location"),
        ({"apiKeySecurityScheme": {"location": "header"}}, ApiKey("k"), "names no parameter"),
        ({"httpAuthSecurityScheme": {"scheme": "bearer"}}, Basic("u", "p"), "HTTP bearer"),
        ({"httpAuthSecurityScheme": {"scheme": "digest"}}, Basic("u", "p"), "neither"),
        (
            {"oauth2SecurityScheme": {"flows": {"authorizationCode": {}}}},
            OAuthClient("c", "s"),
            "no clientCredentials",
        ),
        ({"openIdConnectSecurityScheme": {}}, OAuthClient("c", "s"), "no openIdConnectUrl"),
        ({"mtlsSecurityScheme": {}}, Bearer("t"), "mutual TLS"),
        ({"someNewSecurityScheme": {}}, Bearer("t"), "does not know"),
    ],
)
def test_a_secret_that_does_not_fit_the_scheme_is_refused(
    scheme: dict[str, Any], secret: Any, expected: str
) -> None:
    assert expected in (fits(scheme, secret) or "")
    with pytest.raises(CredentialsConfigError, match=expected):
        apply(scheme, secret, origin="https://a.example", scheme="s")


def test_values_that_would_break_a_header_are_refused_without_echo() -> None:
    with pytest.raises(CredentialsConfigError) as caught:
        apply({"httpAuthSecurityScheme": {"scheme": "bearer"}}, Bearer("tok\r\nX-Evil: 1"))
    assert "Evil" not in str(caught.value)
    with pytest.raises(CredentialsConfigError, match="cookie"):
        apply({"apiKeySecurityScheme": {"location": "cookie", "name": "k"}}, ApiKey("a;b"))
    with pytest.raises(CredentialsConfigError, match="RFC 7617"):
        apply({"httpAuthSecurityScheme": {"scheme": "basic"}}, Basic("a:b", "p"))


def test_two_schemes_of_one_alternative_merge() -> None:
    merged = RequestAuth(headers=(("A", "1"),), secrets=("1",)).merged(
        RequestAuth(client_cert=("/c", "/k"))
    )
    assert merged.headers == (("A", "1"),)
    assert merged.client_cert == ("/c", "/k")
    with pytest.raises(ValueError, match="client certificates"):
        merged.merged(RequestAuth(client_cert=("/d", "/k")))


# --- choosing an alternative ----------------------------------------------------------------------

SCHEMES = {name: {"httpAuthSecurityScheme": {"scheme": "bearer"}} for name in ("a", "b", "c", "d")}


def test_the_first_fully_covered_alternative_wins() -> None:
    choice = choose([req("a", "b"), req("c"), req("d")], SCHEMES, {"b", "c", "d"}.__contains__)
    assert choice.required
    assert choice.chosen == ("c",)
    assert choice.requirement == req("c")
    assert [gap.not_configured for gap in choice.gaps] == [("a",)]
    assert not choice.refused


def test_partial_coverage_is_not_coverage() -> None:
    choice = choose([req("a", "b")], SCHEMES, {"a"}.__contains__)
    assert choice.chosen is None
    assert choice.refused
    assert choice.reason() == "[a + b]: b not configured"


def test_an_undeclared_scheme_makes_its_alternative_uncoverable() -> None:
    choice = choose([req("a", "ghost"), req("b")], SCHEMES, lambda name: True)
    assert choice.chosen == ("b",)
    none = choose([req("ghost")], SCHEMES, lambda name: True)
    assert none.refused
    assert none.reason() == "[ghost]: ghost not declared in securitySchemes"


def test_an_empty_list_requires_nothing_and_an_empty_alternative_allows_none() -> None:
    empty = choose([], SCHEMES, lambda name: False)
    assert (empty.required, empty.chosen, empty.refused) == (False, (), False)
    anonymous = choose([req(), req("a")], SCHEMES, lambda name: False)
    assert (anonymous.required, anonymous.chosen, anonymous.refused) == (True, (), False)


def card(skill_requirements: list[dict[str, Any]] | None = None) -> AgentCard:
    extra = {} if skill_requirements is None else {"securityRequirements": skill_requirements}
    return agent_card(
        "https://a.example/rpc",
        skills=[skill("echo", **extra)],
        securitySchemes={
            "bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}},
            "api": {"type": "apiKey", "in": "header", "name": "X-API-Key"},  # 0.3 shape
            "oauth": {
                "oauth2SecurityScheme": {
                    "flows": {"clientCredentials": {"tokenUrl": "https://idp/t", "scopes": {}}}
                }
            },
        },
        securityRequirements=[{"schemes": {"bearer": {"list": []}}}],
    )


def test_skill_level_requirements_replace_the_cards() -> None:
    own = card([{"schemes": {"oauth": {"list": ["write"]}}}])
    assert effective_requirements(own, "echo") == (req("oauth", scopes=("write",)),)
    inherits = card()
    assert effective_requirements(inherits, "echo") == (req("bearer"),)
    assert effective_requirements(inherits, "absent") == (req("bearer"),)
    schemes = own.security_schemes()
    assert schemes["api"] == {"apiKeySecurityScheme": {"name": "X-API-Key", "location": "header"}}
    have_bearer_only = choose(effective_requirements(own, "echo"), schemes, {"bearer"}.__contains__)
    assert have_bearer_only.refused  # the card-level bearer does not cover the skill


def test_a_refused_choice_becomes_a_creation_refusal() -> None:
    choice = choose([req("a", "b"), req("ghost")], SCHEMES, {"a"}.__contains__)
    error = CredentialsMissingError("https://a.example", "echo", choice.reason())
    text = str(error)
    assert "b not configured" in text
    assert "ghost not declared" in text
    assert "nothing was sent" in text
    assert "\n" not in text
    assert exit_code_of(CredentialsMissingError) == 3


# --- fingerprints, redaction, repr ----------------------------------------------------------------


def test_a_fingerprint_is_stable_keyed_and_hides_the_secret() -> None:
    first = fingerprint("s3cr3t-token", KEY)
    assert first == fingerprint("s3cr3t-token", KEY)
    assert first.startswith("hmac-sha256:")
    assert len(first) == len("hmac-sha256:") + 16
    assert "s3cr3t" not in first
    assert first != fingerprint("s3cr3t-token", b"other-key-of-16-bytes")
    assert first != fingerprint("s3cr3t-tokeN", KEY)
    with pytest.raises(ValueError, match="16 bytes"):
        fingerprint("x", b"short")


def test_redact_hides_every_occurrence_longest_first() -> None:
    text = "sent abc and abcdef then abc"
    assert redact(text, ["abc", "abcdef", ""]) == "sent *** and *** then ***"


def test_no_repr_or_str_shows_a_secret_or_its_variable(tmp_path: Path) -> None:
    config = load_credentials(write(tmp_path, FILE))
    resolved = [
        secret.resolve(ENV) for agent in config.agents.values() for secret in agent.schemes.values()
    ]
    shown = " ".join([repr(config), str(config), *map(repr, resolved), *map(str, resolved)])
    for secret in (*SECRETS, "literal-token-value", *ENV):
        assert secret not in shown
    assert "MutualTls(cert='/etc/cardfence/client.pem'" in shown
    auth = apply({"httpAuthSecurityScheme": {"scheme": "bearer"}}, Bearer(SECRETS[1]))
    assert SECRETS[1] not in repr(auth)
    assert "Authorization" in repr(auth)


# --------------------------------------------------------------------------------------------------
# R15's credentials word by word: every refusal (which entry, which scheme, what was wrong: never
# the secret), the secrets a request lists for redaction, how two schemes' additions merge, and what
# the authorizer passes on (its environment, the grant's origin, scheme and scopes, a refresh) when
# it prepares a request or a client certificate, or rebuilds a recorded grant.


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
    frozen = card_credentials([])
    assert Authorizer.regrant(frozen, {"origin": AGENT, "schemes": []}) == Grant(AGENT, ())
    assert Authorizer.regrant(frozen, {}) == Grant("", ())


def test_a_recorded_scheme_the_frozen_card_does_not_declare_gets_an_empty_definition() -> None:
    grant = Authorizer.regrant(card_credentials([]), {"origin": AGENT, "schemes": ["gone", "key"]})
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
        Authorizer(None, None).grant(
            card_credentials([alternative(key=[])]), "work", f"{AGENT}/rpc"
        )
    assert str(refused.value) == (
        f"{AGENT}: skill 'work' requires credentials that are not configured ([key]: key not "
        "configured); nothing was sent"
    )
