"""Credentials for rule R15 (authorization follows the frozen contract): the configuration.

Which secret is configured for which agent and security scheme; :mod:`engine.auth.credentials`
decides
which of them a request carries, and how. What is here:

- the typed secrets, one per agent origin and security scheme name (:class:`ApiKey`,
  :class:`Bearer`, :class:`Basic`, :class:`OAuthClient`, :class:`MutualTls`); a value
  ``"env:NAME"`` is read from the environment only when the secret is resolved
  (:meth:`ApiKey.resolve` and its siblings);
- :class:`CredentialsConfig`, every agent's secrets (:class:`AgentCredentials`) by normalised
  origin (:func:`normalise_origin`): from Python (:meth:`CredentialsConfig.of`), or read from the
  TOML file docs/cli.md describes by :func:`load_credentials` (the file ``--credentials`` names),
  which refuses a file readable by group or others;
- :data:`CredentialsProvider`, the ``(origin, scheme name) -> secret`` hook a host application may
  plug its own secret store into (a :class:`CredentialsConfig` is one).

No ``repr`` or ``str`` of anything here shows a secret or the ``env:`` reference it came from
(only the paths of a client certificate, which are not secret, are shown). Pure: no network;
the file is read by :func:`load_credentials` and the environment by ``resolve`` (which takes
the mapping to read, ``os.environ`` by default), nothing else.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import httpx

from cardfence.engine.cards.urls import origin_of, without_userinfo
from cardfence.engine.errors import CredentialsConfigError

__all__ = [
    "ENV_PREFIX",
    "AgentCredentials",
    "ApiKey",
    "Basic",
    "Bearer",
    "CredentialsConfig",
    "CredentialsProvider",
    "MutualTls",
    "OAuthClient",
    "Secret",
    "load_credentials",
    "normalise_origin",
]

ENV_PREFIX: Final = "env:"
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- resolving env: values ------------------------------------------------------------------------


def _resolve_value(
    value: str, key: str, environ: Mapping[str, str] | None, origin: str, scheme: str
) -> str:
    """``value`` itself, or the environment variable an ``env:NAME`` value names."""
    if not value.startswith(ENV_PREFIX):
        return value
    name = value[len(ENV_PREFIX) :]
    found = (os.environ if environ is None else environ).get(name)
    if found is None:
        detail = f"{key}: environment variable {name} is not set"
        raise CredentialsConfigError("environment", detail, origin=origin, scheme=scheme)
    if not found:
        detail = f"{key}: environment variable {name} is empty"
        raise CredentialsConfigError("environment", detail, origin=origin, scheme=scheme)
    return found


# --- the secrets ----------------------------------------------------------------------------------
#
# Each is frozen; the secret fields are left out of repr (and so of str). ``resolved`` tells a
# secret whose env: values were read from one still holding the references; ``resolve`` returns
# the resolved copy (itself when already resolved), so a variable's value that happens to start
# with "env:" is never read as a reference again.


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An ``apiKeySecurityScheme`` key; where it goes (header, query, cookie) is the card's say."""

    api_key: str = field(repr=False)
    resolved: bool = field(default=False, repr=False, compare=False)

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, origin: str = "", scheme: str = ""
    ) -> ApiKey:
        if self.resolved:
            return self
        key = _resolve_value(self.api_key, "api_key", environ, origin, scheme)
        return ApiKey(key, resolved=True)

    def secret_values(self) -> tuple[str, ...]:
        return (self.api_key,)


@dataclass(frozen=True, slots=True)
class Bearer:
    """An HTTP ``bearer`` token (``httpAuthSecurityScheme`` with scheme ``bearer``)."""

    token: str = field(repr=False)
    resolved: bool = field(default=False, repr=False, compare=False)

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, origin: str = "", scheme: str = ""
    ) -> Bearer:
        if self.resolved:
            return self
        return Bearer(_resolve_value(self.token, "token", environ, origin, scheme), resolved=True)

    def secret_values(self) -> tuple[str, ...]:
        return (self.token,)


@dataclass(frozen=True, slots=True)
class Basic:
    """HTTP ``basic`` credentials."""

    username: str = field(repr=False)
    password: str = field(repr=False)
    resolved: bool = field(default=False, repr=False, compare=False)

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, origin: str = "", scheme: str = ""
    ) -> Basic:
        if self.resolved:
            return self
        return Basic(
            _resolve_value(self.username, "username", environ, origin, scheme),
            _resolve_value(self.password, "password", environ, origin, scheme),
            resolved=True,
        )

    def secret_values(self) -> tuple[str, ...]:
        return (self.password,)


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """OAuth 2.0 client credentials, for ``oauth2SecurityScheme`` (flow ``clientCredentials``)
    and ``openIdConnectSecurityScheme``. ``scopes`` are asked for on top of the requirement's."""

    client_id: str = field(repr=False)
    client_secret: str = field(repr=False)
    scopes: tuple[str, ...] = ()
    resolved: bool = field(default=False, repr=False, compare=False)

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, origin: str = "", scheme: str = ""
    ) -> OAuthClient:
        if self.resolved:
            return self
        return OAuthClient(
            _resolve_value(self.client_id, "client_id", environ, origin, scheme),
            _resolve_value(self.client_secret, "client_secret", environ, origin, scheme),
            self.scopes,
            resolved=True,
        )

    def secret_values(self) -> tuple[str, ...]:
        return (self.client_secret,)


@dataclass(frozen=True, slots=True)
class MutualTls:
    """A client certificate and its private key, as file paths (the paths are not secret)."""

    cert: str
    key: str
    resolved: bool = field(default=False, repr=False, compare=False)

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, origin: str = "", scheme: str = ""
    ) -> MutualTls:
        if self.resolved:
            return self
        return MutualTls(
            _resolve_value(self.cert, "cert", environ, origin, scheme),
            _resolve_value(self.key, "key", environ, origin, scheme),
            resolved=True,
        )

    def secret_values(self) -> tuple[str, ...]:
        return ()


Secret: TypeAlias = ApiKey | Bearer | Basic | OAuthClient | MutualTls

CredentialsProvider: TypeAlias = Callable[[str, str], Secret | None]
"""``(agent origin, security scheme name) -> secret or None``: where the engine will look for
credentials. The origin is normalised (:func:`normalise_origin`); the secret may still hold
``env:`` references (the caller resolves it at use)."""


# --- the configuration ----------------------------------------------------------------------------


def normalise_origin(url: str) -> str:
    """``scheme://host[:port]``, lower-case, default port dropped: the key cards are read under.

    Raises ``ValueError`` when ``url`` is not an http(s) URL.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ValueError(f"{url!r} is not an http(s) URL") from error
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http(s) URL")
    return origin_of(parsed)


@dataclass(frozen=True, slots=True)
class AgentCredentials:
    """The secrets configured for one agent origin, by security scheme name."""

    origin: str
    schemes: Mapping[str, Secret]

    def get(self, scheme: str) -> Secret | None:
        return self.schemes.get(scheme)


@dataclass(frozen=True, slots=True)
class CredentialsConfig:
    """Every agent's credentials by normalised origin. Calling it is a
    :data:`CredentialsProvider`: ``config(origin, scheme)``."""

    agents: Mapping[str, AgentCredentials] = field(
        default_factory=lambda: types.MappingProxyType({})
    )
    source: str = ""

    @classmethod
    def of(cls, agents: Mapping[str, Mapping[str, Secret]]) -> CredentialsConfig:
        """The configuration the credentials file would give, from Python: secrets by agent
        URL (any URL at the origin) and scheme name, e.g.
        ``CredentialsConfig.of({"https://agent.example": {"bearer": Bearer("env:TOKEN")}})``.
        Raises ``ValueError`` for a URL that is not http(s) or an origin given twice."""
        table: dict[str, AgentCredentials] = {}
        for url, schemes in agents.items():
            origin = normalise_origin(url)
            if origin in table:
                raise ValueError(f"origin {origin} given twice")
            table[origin] = AgentCredentials(origin, types.MappingProxyType(dict(schemes)))
        return cls(types.MappingProxyType(table), source="python")

    def __call__(self, origin: str, scheme: str) -> Secret | None:
        return self.secret(origin, scheme)

    def secret(self, origin: str, scheme: str) -> Secret | None:
        """The secret configured for ``scheme`` at the origin of ``origin`` (any URL there)."""
        try:
            key = normalise_origin(origin)
        except ValueError:
            return None
        agent = self.agents.get(key)
        return agent.get(scheme) if agent is not None else None


def load_credentials(path: Path) -> CredentialsConfig:
    """Read the credentials file (docs/cli.md, "The credentials file").

    Refused with :class:`CredentialsConfigError` (a usage error, exit 2) when the file is readable
    or writable by group or others (``chmod 600`` it), cannot be read, is not TOML, or an entry is
    malformed; each message names the origin, the scheme and what is wrong, never a value.
    ``env:`` values are not read here: see ``resolve``.
    """
    where = str(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise CredentialsConfigError(where, f"cannot be read ({error.strerror})") from None
    if mode & 0o077:
        raise CredentialsConfigError(
            where,
            f"mode {stat.S_IMODE(mode):04o} lets group or others access it; "
            f"refused, as ssh refuses such a key: chmod 600 {where}",
        )
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise CredentialsConfigError(where, f"cannot be read ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise CredentialsConfigError(where, f"not valid TOML: {error}") from None
    return _config(document, where)


def _config(document: dict[str, Any], where: str) -> CredentialsConfig:
    unknown = sorted(set(document) - {"agents"})
    if unknown:
        detail = f'unknown top-level key(s) {", ".join(unknown)}; expected only [agents."ORIGIN"]'
        raise CredentialsConfigError(where, detail)
    agents_table = document.get("agents", {})
    if not isinstance(agents_table, dict):
        raise CredentialsConfigError(where, "agents must be a table of origins")
    agents: dict[str, AgentCredentials] = {}
    for written, table in agents_table.items():
        origin = _origin_key(written, where)
        if origin in agents:
            detail = (
                f"origin written twice (as {agents[origin].origin!r} normalised and {written!r})"
            )
            raise CredentialsConfigError(where, detail, origin=origin)
        if not isinstance(table, dict):
            detail = "must be a table of security scheme names"
            raise CredentialsConfigError(where, detail, origin=origin)
        schemes = {name: _secret(entry, where, origin, name) for name, entry in table.items()}
        agents[origin] = AgentCredentials(origin, types.MappingProxyType(schemes))
    return CredentialsConfig(types.MappingProxyType(agents), source=where)


def _origin_key(written: str, where: str) -> str:
    shown = without_userinfo(written)  # a password written into the key is never repeated
    try:
        url = httpx.URL(written)
        origin = normalise_origin(written)
    except (ValueError, httpx.InvalidURL):
        detail = f"agents key {shown!r} is not an http(s) origin such as https://agent.example"
        raise CredentialsConfigError(where, detail) from None
    if url.userinfo or url.path not in ("", "/") or url.query or url.fragment:
        detail = (
            f"agents key {shown!r} must be an origin (scheme://host[:port]), without user, "
            "path, query or fragment"
        )
        raise CredentialsConfigError(where, detail)
    return origin


# The shape of each kind of entry: its required keys and its optional ones.
_SHAPES: Final[tuple[tuple[str, frozenset[str], frozenset[str]], ...]] = (
    ("apiKey", frozenset({"api_key"}), frozenset()),
    ("bearer", frozenset({"token"}), frozenset()),
    ("basic", frozenset({"username", "password"}), frozenset()),
    ("oauth", frozenset({"client_id", "client_secret"}), frozenset({"scopes"})),
    ("mtls", frozenset({"cert", "key"}), frozenset()),
)
_EXPECTED: Final = (
    "expected one of { api_key }, { token }, { username, password }, "
    "{ client_id, client_secret[, scopes] }, { cert, key }"
)


def _secret(entry: object, where: str, origin: str, scheme: str) -> Secret:
    def refuse(detail: str) -> CredentialsConfigError:
        return CredentialsConfigError(where, detail, origin=origin, scheme=scheme)

    if not isinstance(entry, dict):
        raise refuse(f"must be an inline table; {_EXPECTED}")
    keys = set(entry)
    kind = next(
        (kind for kind, needed, optional in _SHAPES if needed <= keys <= needed | optional), ""
    )
    if not kind:
        raise refuse(f"keys {', '.join(sorted(keys)) or '(none)'} fit no kind; {_EXPECTED}")
    values: dict[str, str] = {}
    for key, value in entry.items():
        if key == "scopes":
            continue
        if not isinstance(value, str) or not value:
            raise refuse(f"{key} must be a non-empty string")
        if value.startswith(ENV_PREFIX) and not _ENV_NAME.fullmatch(value[len(ENV_PREFIX) :]):
            raise refuse(f"{key}: env: must be followed by a variable name (letters, digits, _)")
        values[key] = value
    if kind == "apiKey":
        return ApiKey(values["api_key"])
    if kind == "bearer":
        return Bearer(values["token"])
    if kind == "basic":
        return Basic(values["username"], values["password"])
    if kind == "mtls":
        return MutualTls(values["cert"], values["key"])
    scopes = entry.get("scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) and s for s in scopes):
        raise refuse("scopes must be a list of non-empty strings")
    return OAuthClient(values["client_id"], values["client_secret"], tuple(scopes))
