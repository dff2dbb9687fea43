"""Credentials for rule R15 (authorization follows the frozen contract): the pure core.

:mod:`engine.authorization` uses it to grant each task its credentials at creation and to put
them on every later request (with the token fetch, which is I/O); the command line reads the
file ``--credentials`` names with :func:`load_credentials`. What is here:

- the typed configuration: one secret per agent origin and security scheme name
  (:class:`ApiKey`, :class:`Bearer`, :class:`Basic`, :class:`OAuthClient`, :class:`MutualTls`),
  read from the TOML file docs/cli.md describes by :func:`load_credentials`, which refuses a file
  readable by group or others; a value ``"env:NAME"`` is read from the environment only when the
  secret is resolved (:meth:`ApiKey.resolve` and its siblings);
- :data:`CredentialsProvider`, the ``(origin, scheme name) -> secret`` hook a host application may
  plug its own secret store into (a :class:`CredentialsConfig` is one);
- :func:`effective_requirements` (skill-level requirements replace card-level ones) and
  :func:`choose`, which picks the first alternative whose schemes are ALL covered, and says why
  none was when none is;
- :func:`apply`, which turns a declared scheme and a secret into what a request must carry
  (headers, query parameters, cookies, a client certificate, or the note that an OAuth 2.0 /
  OpenID Connect token must be fetched first: that fetch is I/O and not here);
- :func:`fingerprint` (HMAC-SHA256 under a local key: what the log may record instead of a
  secret) and :func:`redact`.

No ``repr`` or ``str`` of anything here shows a secret or the ``env:`` reference it came from
(only the paths of a client certificate, which are not secret, are shown). Pure: no network;
the file is read by :func:`load_credentials` and the environment by ``resolve`` (which takes
the mapping to read, ``os.environ`` by default), nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import stat
import tomllib
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import httpx

from cardfence.engine.cards.fetch import card_urls
from cardfence.engine.cards.model import AgentCard, SecurityRequirement
from cardfence.engine.errors import CredentialsConfigError, DiscoveryError

__all__ = [
    "ENV_PREFIX",
    "AgentCredentials",
    "ApiKey",
    "Basic",
    "Bearer",
    "Choice",
    "CredentialsConfig",
    "CredentialsProvider",
    "Gap",
    "MutualTls",
    "OAuthClient",
    "RequestAuth",
    "Secret",
    "TokenNeeded",
    "apply",
    "choose",
    "effective_requirements",
    "fingerprint",
    "fits",
    "load_credentials",
    "normalise_origin",
    "redact",
]

ENV_PREFIX: Final = "env:"
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FINGERPRINT_PREFIX: Final = "hmac-sha256:"
# Characters that would let a secret break out of a header, cookie or request line.
_UNSAFE_IN_HEADER: Final = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_IN_COOKIE: Final = re.compile(r"[\x00-\x20\x7f\";,\\]")


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
        return card_urls(url)[0]
    except (DiscoveryError, httpx.InvalidURL) as error:
        raise ValueError(f"{url!r} is not an http(s) URL") from error


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
    try:
        url = httpx.URL(written)
        origin = normalise_origin(written)
    except (ValueError, httpx.InvalidURL):
        detail = f"agents key {written!r} is not an http(s) origin such as https://agent.example"
        raise CredentialsConfigError(where, detail) from None
    if url.userinfo or url.path not in ("", "/") or url.query or url.fragment:
        detail = (
            f"agents key {written!r} must be an origin (scheme://host[:port]), without user, "
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


# --- which requirement --------------------------------------------------------------------------


def effective_requirements(card: AgentCard, skill_id: str) -> tuple[SecurityRequirement, ...]:
    """The requirements a task of ``skill_id`` must satisfy: the skill's own when it declares
    any (they replace the card's), else the card's. A skill the card lacks gets the card's."""
    skill = card.skill(skill_id)
    if skill is not None and skill.security_requirements:
        return skill.security_requirements
    return card.security_requirements


@dataclass(frozen=True, slots=True)
class Gap:
    """Why one alternative is not covered: the schemes it names that are not configured, and
    those the card does not declare in ``securitySchemes`` (never coverable)."""

    alternative: tuple[str, ...]
    not_configured: tuple[str, ...]
    not_declared: tuple[str, ...]

    def __str__(self) -> str:
        parts = []
        if self.not_configured:
            parts.append(f"{', '.join(self.not_configured)} not configured")
        if self.not_declared:
            parts.append(f"{', '.join(self.not_declared)} not declared in securitySchemes")
        return f"[{' + '.join(self.alternative)}]: {'; '.join(parts)}"


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`choose` decided.

    ``required``: the requirements list is not empty. ``chosen``: the scheme names (sorted) of the
    first alternative fully covered, ``()`` for an empty alternative (the contract allows no
    credentials), None when none is covered. ``requirement``: that alternative, with its scopes.
    ``gaps``: why each alternative before the chosen one (every one, when none is) was not.
    """

    required: bool
    chosen: tuple[str, ...] | None
    requirement: SecurityRequirement | None
    gaps: tuple[Gap, ...]

    @property
    def refused(self) -> bool:
        """Security is required and no alternative is covered: nothing may be sent."""
        return self.required and self.chosen is None

    def reason(self) -> str:
        """One line: what each alternative lacks (for ``CredentialsMissingError``)."""
        return "; or ".join(str(gap) for gap in self.gaps)


def choose(
    requirements: Sequence[SecurityRequirement],
    schemes: Mapping[str, object],
    have: Callable[[str], bool],
) -> Choice:
    """The first alternative of ``requirements`` whose every scheme is declared in ``schemes``
    and configured (``have(name)``); a partly covered alternative is not covered.

    "First" is in the order given; the card model keeps requirements in canonical (sorted)
    order, since order carries no meaning in A2A, so the pick does not change when an agent
    re-publishes the same contract in another order. An empty list requires nothing.
    """
    gaps: list[Gap] = []
    for requirement in requirements:
        names = tuple(sorted({name for name, _ in requirement.schemes}))
        not_declared = tuple(name for name in names if name not in schemes)
        not_configured = tuple(name for name in names if name in schemes and not have(name))
        if not not_declared and not not_configured:
            return Choice(True, names, requirement, tuple(gaps))
        gaps.append(Gap(names, not_configured, not_declared))
    return Choice(bool(requirements), None if requirements else (), None, tuple(gaps))


# --- applying a secret ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenNeeded:
    """An OAuth 2.0 access token must be fetched before the request (I/O, not done here), then
    sent as ``Authorization: Bearer``. ``token_url`` for ``oauth2`` (client credentials flow);
    ``discovery_url`` for ``openIdConnect`` (its token endpoint comes from that document)."""

    kind: str  # "oauth2" | "openIdConnect"
    client: OAuthClient
    scopes: tuple[str, ...]
    token_url: str = ""
    discovery_url: str = ""


@dataclass(frozen=True, slots=True)
class RequestAuth:
    """What one scheme adds to a request. ``secrets`` holds every secret string it carries, raw
    and encoded, for :func:`redact`; repr shows names only."""

    headers: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    cookies: tuple[tuple[str, str], ...] = ()
    client_cert: tuple[str, str] | None = None  # (cert path, key path)
    token: TokenNeeded | None = None
    secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        def names(pairs: tuple[tuple[str, str], ...]) -> list[str]:
            return [name for name, _ in pairs]

        return (
            f"RequestAuth(headers={names(self.headers)}, params={names(self.params)}, "
            f"cookies={names(self.cookies)}, client_cert={self.client_cert!r}, "
            f"token={self.token!r})"
        )

    def merged(self, other: RequestAuth) -> RequestAuth:
        """Both schemes' additions (an alternative may need several)."""
        if self.client_cert and other.client_cert and self.client_cert != other.client_cert:
            raise ValueError("two different client certificates for one request")
        if self.token and other.token:
            raise ValueError("two OAuth tokens for one request")
        return RequestAuth(
            self.headers + other.headers,
            self.params + other.params,
            self.cookies + other.cookies,
            self.client_cert or other.client_cert,
            self.token or other.token,
            self.secrets + other.secrets,
        )


def _scheme_body(definition: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The 1.0 oneof key of a scheme (``apiKeySecurityScheme``, …) and its body."""
    for key, body in definition.items():
        if key.endswith("SecurityScheme") and isinstance(body, dict):
            return key, body
    return "", {}


def fits(definition: Mapping[str, Any], secret: Secret) -> str | None:
    """None when ``secret`` can satisfy the declared scheme, else why not (names only).

    ``definition`` is one entry of :meth:`AgentCard.security_schemes` (1.0 shape).
    """
    key, body = _scheme_body(definition)
    if key == "apiKeySecurityScheme":
        if not isinstance(secret, ApiKey):
            return f"the card's scheme is an API key, the configured secret is {_kind(secret)}"
        location = body.get("location")
        if location not in ("header", "query", "cookie"):
            return f"API key location {location!r} is none of header, query, cookie"
        if not isinstance(body.get("name"), str) or not body["name"]:
            return "the card's API key scheme names no parameter"
        return None
    if key == "httpAuthSecurityScheme":
        http = str(body.get("scheme", "")).lower()
        if http == "bearer":
            ok = isinstance(secret, Bearer)
        elif http == "basic":
            ok = isinstance(secret, Basic)
        else:
            return f"HTTP auth scheme {http!r} is neither bearer nor basic"
        return None if ok else f"the card's scheme is HTTP {http}, the secret is {_kind(secret)}"
    if key == "oauth2SecurityScheme":
        if not isinstance(secret, OAuthClient):
            return f"the card's scheme is OAuth 2.0, the configured secret is {_kind(secret)}"
        flows = body.get("flows")
        flow = flows.get("clientCredentials") if isinstance(flows, dict) else None
        if not isinstance(flow, dict) or not isinstance(flow.get("tokenUrl"), str):
            return "the card's OAuth 2.0 scheme offers no clientCredentials flow with a tokenUrl"
        return None
    if key == "openIdConnectSecurityScheme":
        if not isinstance(secret, OAuthClient):
            return f"the card's scheme is OpenID Connect, the configured secret is {_kind(secret)}"
        if not isinstance(body.get("openIdConnectUrl"), str) or not body["openIdConnectUrl"]:
            return "the card's OpenID Connect scheme has no openIdConnectUrl"
        return None
    if key == "mtlsSecurityScheme":
        if not isinstance(secret, MutualTls):
            return f"the card's scheme is mutual TLS, the configured secret is {_kind(secret)}"
        return None
    return "the card's scheme is of a kind cardfence does not know"


def apply(
    definition: Mapping[str, Any],
    secret: Secret,
    *,
    scopes: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    origin: str = "",
    scheme: str = "",
) -> RequestAuth:
    """What a request must carry to satisfy the declared scheme ``definition`` with ``secret``.

    ``secret`` is resolved first (``environ``, default ``os.environ``). ``scopes`` are the chosen
    requirement's for this scheme; an OAuth token is asked for with them and the configured ones.
    Raises :class:`CredentialsConfigError` (naming ``origin`` and ``scheme``, never a secret)
    when the secret does not fit the scheme, an env: variable is unset, or a value cannot go
    into a header or cookie.
    """

    def refuse(detail: str) -> CredentialsConfigError:
        return CredentialsConfigError("for this card", detail, origin=origin, scheme=scheme)

    problem = fits(definition, secret)
    if problem is not None:
        raise refuse(problem)
    secret = secret.resolve(environ, origin=origin, scheme=scheme)
    _, body = _scheme_body(definition)
    if isinstance(secret, ApiKey):
        value, name, location = secret.api_key, str(body["name"]), body["location"]
        if location == "header":
            _safe(value, _UNSAFE_IN_HEADER, "API key", refuse)
            return RequestAuth(headers=((name, value),), secrets=(value,))
        if location == "cookie":
            _safe(value, _UNSAFE_IN_COOKIE, "API key", refuse)
            return RequestAuth(cookies=((name, value),), secrets=(value,))
        return RequestAuth(params=((name, value),), secrets=(value,))
    if isinstance(secret, Bearer):
        _safe(secret.token, _UNSAFE_IN_HEADER, "token", refuse)
        header = f"Bearer {secret.token}"
        return RequestAuth(headers=(("Authorization", header),), secrets=(secret.token, header))
    if isinstance(secret, Basic):
        if ":" in secret.username:
            raise refuse("username contains ':', which HTTP basic cannot carry (RFC 7617)")
        encoded = base64.b64encode(f"{secret.username}:{secret.password}".encode()).decode()
        header = f"Basic {encoded}"
        return RequestAuth(
            headers=(("Authorization", header),), secrets=(secret.password, encoded, header)
        )
    if isinstance(secret, MutualTls):
        return RequestAuth(client_cert=(secret.cert, secret.key))
    wanted = tuple(sorted({*scopes, *secret.scopes}))
    if "oauth2SecurityScheme" in definition:
        token_url = str(body["flows"]["clientCredentials"]["tokenUrl"])
        needed = TokenNeeded("oauth2", secret, wanted, token_url=token_url)
    else:
        needed = TokenNeeded(
            "openIdConnect", secret, wanted, discovery_url=body["openIdConnectUrl"]
        )
    return RequestAuth(token=needed, secrets=(secret.client_secret,))


def _safe(
    value: str, unsafe: re.Pattern[str], what: str, refuse: Callable[[str], Exception]
) -> None:
    if unsafe.search(value):
        raise refuse(f"the {what} holds characters a request header or cookie cannot carry")


def _kind(secret: Secret) -> str:
    return {
        ApiKey: "an API key",
        Bearer: "a bearer token",
        Basic: "a user name and password",
        OAuthClient: "an OAuth client",
        MutualTls: "a client certificate",
    }[type(secret)]


# --- what the log may keep ------------------------------------------------------------------------


def fingerprint(secret_value: str, key: bytes) -> str:
    """``hmac-sha256:`` and the first 16 hex digits of HMAC-SHA256(key, secret): tells two secrets
    apart in the log without letting anyone who lacks ``key`` (local, at least 16 bytes) test a
    guess against it."""
    if len(key) < 16:
        raise ValueError("the fingerprint key must be at least 16 bytes")
    digest = hmac.new(key, secret_value.encode(), hashlib.sha256).hexdigest()
    return _FINGERPRINT_PREFIX + digest[:16]


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of every (non-empty) secret replaced by ``***``; longer
    secrets first, so one containing another is hidden whole."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
