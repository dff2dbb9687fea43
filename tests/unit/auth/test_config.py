"""The credentials file and its secrets (engine/auth/config.py), field by field.

Every ``env:`` field of every kind of secret is resolved from the mapping given (not the process's),
named in the refusal with its entry, and the copy marked resolved so its values are never read as
references again; every refusal of the file names where, which entry and what, in words a test
compares whole."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cardfence.engine.auth.config import (
    ApiKey,
    Basic,
    Bearer,
    CredentialsConfig,
    MutualTls,
    OAuthClient,
    Secret,
    load_credentials,
    normalise_origin,
)
from cardfence.engine.errors import CredentialsConfigError

# Each kind of secret, every field an env: reference to a variable named after it.
KINDS: dict[str, tuple[Callable[..., Secret], tuple[str, ...]]] = {
    "api_key": (ApiKey, ("api_key",)),
    "bearer": (Bearer, ("token",)),
    "basic": (Basic, ("username", "password")),
    "oauth": (OAuthClient, ("client_id", "client_secret")),
    "mtls": (MutualTls, ("cert", "key")),
}
FIELDS = [(kind, name) for kind, (_, names) in KINDS.items() for name in names]


def _referring(kind: str) -> Secret:
    make, names = KINDS[kind]
    return make(*(f"env:CF_{name.upper()}" for name in names))


def _environ(kind: str) -> dict[str, str]:
    return {f"CF_{name.upper()}": f"value-of-{name}" for name in KINDS[kind][1]}


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_is_read_from_the_mapping_given_and_the_copy_is_resolved(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in KINDS[kind][1]:
        monkeypatch.delenv(f"CF_{name.upper()}", raising=False)  # only the mapping has them
    resolved = _referring(kind).resolve(_environ(kind))

    for name in KINDS[kind][1]:
        assert getattr(resolved, name) == f"value-of-{name}"
    assert resolved.resolved is True
    assert resolved.resolve({}) is resolved  # never read again, whatever its values look like


def test_the_scopes_of_an_oauth_client_are_kept_when_it_is_resolved() -> None:
    client = OAuthClient("env:CF_CLIENT_ID", "env:CF_CLIENT_SECRET", ("a2a", "read"))
    assert client.resolve(_environ("oauth")).scopes == ("a2a", "read")


@pytest.mark.parametrize(("kind", "name"), FIELDS)
def test_a_field_whose_variable_is_unset_is_refused_naming_the_field_and_the_entry(
    kind: str, name: str
) -> None:
    environ = _environ(kind)
    del environ[f"CF_{name.upper()}"]

    with pytest.raises(CredentialsConfigError) as named:
        _referring(kind).resolve(environ, origin="https://a.example", scheme="s1")
    with pytest.raises(CredentialsConfigError) as bare:
        _referring(kind).resolve(environ)

    detail = f"{name}: environment variable CF_{name.upper()} is not set"
    error = named.value
    assert (error.where, error.origin, error.scheme, error.detail) == (
        "environment", "https://a.example", "s1", detail,
    )  # fmt: skip
    assert str(error) == f'credentials environment [agents."https://a.example"] s1: {detail}'
    assert (bare.value.origin, bare.value.scheme) == ("", "")
    assert str(bare.value) == f"credentials environment: {detail}"


def test_an_empty_variable_is_refused_naming_the_entry() -> None:
    with pytest.raises(CredentialsConfigError) as caught:
        Bearer("env:CF_TOKEN").resolve({"CF_TOKEN": ""}, origin="https://a.example", scheme="b")
    assert str(caught.value) == (
        'credentials environment [agents."https://a.example"] b: token: environment variable '
        "CF_TOKEN is empty"
    )


# --- the file -------------------------------------------------------------------------------------


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "credentials.toml"
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def _refusal(tmp_path: Path, text: str) -> CredentialsConfigError:
    with pytest.raises(CredentialsConfigError) as caught:
        load_credentials(_file(tmp_path, text))
    assert caught.value.where == str(tmp_path / "credentials.toml")
    return caught.value


def test_a_file_that_cannot_be_stated_or_opened_names_itself(tmp_path: Path) -> None:
    absent = tmp_path / "absent.toml"
    with pytest.raises(CredentialsConfigError) as missing:
        load_credentials(absent)
    folder = tmp_path / "folder.toml"
    folder.mkdir(mode=0o700)
    with pytest.raises(CredentialsConfigError) as unopened:
        load_credentials(folder)

    assert (missing.value.where, missing.value.detail) == (
        str(absent), "cannot be read (No such file or directory)",
    )  # fmt: skip
    assert (unopened.value.where, unopened.value.detail) == (
        str(folder), "cannot be read (Is a directory)",
    )  # fmt: skip


def test_a_file_others_may_read_is_refused_naming_it(tmp_path: Path) -> None:
    path = _file(tmp_path, "")
    os.chmod(path, 0o640)
    with pytest.raises(CredentialsConfigError) as caught:
        load_credentials(path)
    assert caught.value.where == str(path)


def test_a_file_without_agents_is_an_empty_configuration_naming_its_source(
    tmp_path: Path,
) -> None:
    config = load_credentials(_file(tmp_path, "# nothing yet\n"))
    assert (dict(config.agents), config.source) == ({}, str(tmp_path / "credentials.toml"))


def test_each_entry_names_its_origin_and_an_oauth_client_without_scopes_has_none(
    tmp_path: Path,
) -> None:
    text = (
        '[agents."HTTPS://A.example:443"]\n'
        'o = { scopes = ["x"], client_id = "c", client_secret = "s" }\n'
        'p = { client_id = "c", client_secret = "s" }\n'
    )
    config = load_credentials(_file(tmp_path, text))
    agent = config.agents["https://a.example"]
    assert agent.origin == "https://a.example"
    assert agent.get("o") == OAuthClient("c", "s", ("x",))  # scopes first: the rest still read
    assert agent.get("p") == OAuthClient("c", "s", ())


@pytest.mark.parametrize(
    ("text", "origin", "detail"),
    [
        ("b = 1\na = 2\n", "", 'unknown top-level key(s) a, b; expected only [agents."ORIGIN"]'),
        ("agents = 1\n", "", "agents must be a table of origins"),
        (
            '[agents]\n"https://a.example" = 1\n',
            "https://a.example",
            "must be a table of security scheme names",
        ),
        (
            '[agents."https://a.example"]\n[agents."HTTPS://a.example:443"]\n',
            "https://a.example",
            "origin written twice (as 'https://a.example' normalised and 'HTTPS://a.example:443')",
        ),
        (
            '[agents."https://a.example?x=1"]\n',
            "",
            "agents key 'https://a.example?x=1' must be an origin (scheme://host[:port]), "
            "without user, path, query or fragment",
        ),
        (
            '[agents."https://svc:PASS@a.example"]\n',
            "",
            "agents key 'https://a.example' must be an origin (scheme://host[:port]), "
            "without user, path, query or fragment",
        ),
    ],
    ids=[
        "unknown-keys",
        "agents-not-a-table",
        "entry-not-a-table",
        "origin-twice",
        "query",
        "userinfo",
    ],
)
def test_a_file_of_the_wrong_shape_is_refused_naming_where_and_what(
    tmp_path: Path, text: str, origin: str, detail: str
) -> None:
    error = _refusal(tmp_path, text)
    assert (error.origin, error.detail) == (origin, detail)


@pytest.mark.parametrize(
    ("entry", "detail"),
    [
        ("{ }", "keys (none) fit no kind; "),
        ('{ a = "1", b = "2" }', "keys a, b fit no kind; "),
        (
            '{ client_id = "c", client_secret = "s", scopes = "a2a" }',
            "scopes must be a list of non-empty strings",
        ),
    ],
)
def test_an_entry_of_no_kind_is_refused_saying_which_keys(
    tmp_path: Path, entry: str, detail: str
) -> None:
    error = _refusal(tmp_path, f'[agents."https://a.example"]\ns = {entry}\n')
    assert (error.origin, error.scheme) == ("https://a.example", "s")
    assert error.detail.startswith(detail)


# --- configurations from Python -------------------------------------------------------------------


def test_a_configuration_from_python_names_its_origins_and_its_source() -> None:
    config = CredentialsConfig.of({"HTTPS://A.example:443/x": {"b": Bearer("t")}})
    assert config.source == "python"
    assert config.agents["https://a.example"].origin == "https://a.example"
    with pytest.raises(ValueError, match="given twice") as twice:
        CredentialsConfig.of({"https://a.example": {}, "https://A.example/": {}})
    assert str(twice.value) == "origin https://a.example given twice"


def test_a_url_that_is_not_http_names_itself() -> None:
    with pytest.raises(ValueError, match="http") as caught:
        normalise_origin("ftp://a.example")
    assert str(caught.value) == "'ftp://a.example' is not an http(s) URL"
