"""Credentials for rule R15 (authorization follows the frozen contract): what a request carries.

:mod:`engine.auth.authorization` uses it to grant each task its credentials at creation and to put
them on every later request (with the token fetch, which is I/O). The secrets, the
configuration and the file ``--credentials`` names are :mod:`engine.auth.config`. What is
here:

- :func:`effective_requirements` (skill-level requirements replace card-level ones) and
  :func:`choose`, which picks the first alternative whose schemes are ALL covered, and says why
  none was when none is;
- :func:`fits` and :func:`apply`, which turn a declared scheme and a secret into what a request
  must carry (headers, query parameters, cookies, a client certificate, or the note that an
  OAuth 2.0 / OpenID Connect token must be fetched first: that fetch is I/O and not here);
- :func:`fingerprint` (HMAC-SHA256 under a local key: what the log may record instead of a
  secret) and :func:`redact`.

No ``repr`` or ``str`` of anything here shows a secret (:class:`RequestAuth` shows names only).
Pure: no file, no network; the environment is read only when :func:`apply` resolves the secret
(from the mapping it is given, ``os.environ`` by default).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cardfence.engine.auth.config import (
    ApiKey,
    Basic,
    Bearer,
    MutualTls,
    OAuthClient,
    Secret,
)
from cardfence.engine.auth.redaction import redaction
from cardfence.engine.cards.model import AgentCard, SecurityRequirement
from cardfence.engine.errors import CredentialsConfigError

__all__ = [
    "Choice",
    "Gap",
    "RequestAuth",
    "TokenNeeded",
    "apply",
    "choose",
    "effective_requirements",
    "fingerprint",
    "fits",
    "redact",
]

_FINGERPRINT_PREFIX: Final = "hmac-sha256:"
# Characters that would let a secret break out of a header, cookie or request line.
_UNSAFE_IN_HEADER: Final = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_IN_COOKIE: Final = re.compile(r"[\x00-\x20\x7f\";,\\]")


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
    """``text`` with every form of every (non-empty) secret replaced by ``***`` (as sent,
    percent-encoded, JSON-escaped, base64: :mod:`engine.auth.redaction`); longer forms first, so one
    containing another is hidden whole."""
    return redaction(tuple(secrets)).text(text)
