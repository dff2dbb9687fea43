"""The test agent behind real authentication: `AuthPeer` is `Peer` (the a2a-sdk 1.3 agent) with an
ASGI gate in front of its A2A endpoints that demands what its card's security contract says.

What is enforced
    By default the gate enforces the live card's own ``securitySchemes`` and card-level
    ``securityRequirements``, read at every request, so the agent demands exactly what it publishes
    (`AuthPeer.protect` writes both; a card edit, or the card restored by a test fixture, changes
    enforcement with it). `AuthPeer.set_enforced` makes it enforce something else than the card
    says (an agent whose card lies). A request is authorised when it satisfies every scheme of at
    least one alternative; no requirement (or an empty alternative) lets everyone in. Skill-level
    requirements go into the card only: a request names no skill, so they cannot be enforced.

Where
    Only the A2A endpoints (the JSON-RPC path and everything under the REST prefix, tenant
    prefixed too) are guarded. Card reads are never refused but are logged with the credentials
    they carried. The gate sits outside the agent's call log, so ``calls`` lists only requests
    that were let through.

Credentials, per scheme kind (1.0 proto-JSON oneof key of the scheme)
    ``apiKeySecurityScheme``: the value set by `accept_api_key`, read from the header, query
    parameter or cookie the scheme names. ``httpAuthSecurityScheme`` bearer: `accept_bearer`'s
    token; basic: `accept_basic`'s user and password. ``oauth2SecurityScheme`` and
    ``openIdConnectSecurityScheme``: a bearer token judged by the callable given to `accept_oauth`
    (returning True, False, or the token's scopes). ``mtlsSecurityScheme``: a client certificate
    the TLS handshake verified against the CA (see below). A scheme with nothing accepted refuses
    every credential; `revoke` refuses the scheme's current one until `accept_*` or `reset`.

Answers
    Refused: HTTP 401, ``{"error": "unauthorized"}`` (not an A2A error body) and a
    ``WWW-Authenticate`` challenge per required scheme (``Bearer``, ``Basic``, and for the kinds
    HTTP has no scheme for, ``ApiKey`` naming the parameter and ``MutualTLS``). A good bearer or
    OAuth token lacking a scope the requirement lists (and no alternative passing): HTTP 403,
    ``{"error": "insufficient_scope"}``, ``Bearer error="insufficient_scope"``. Scopes are checked
    for bearer, OAuth 2.0 and OpenID Connect schemes only.

Mutual TLS
    ``AuthPeer(tls=make_tls(tmp_path))`` serves HTTPS and asks every client for a certificate
    (``CERT_OPTIONAL``): one that does not chain to the CA fails the handshake; none at all is
    allowed, so the card stays readable, and ``mtlsSecurityScheme`` is then missing. The verified
    certificate reaches the gate through the ASGI TLS extension `ServerThread` adds under TLS.
    ``require_client_cert=True`` (``CERT_REQUIRED``) refuses a connection without one at the
    handshake, card reads included. `DemoAgent` builds its card before TLS is set, so AuthPeer
    rewrites the URLs to https (attributes, served card, the handler's card); `Peer`'s
    ``redirect_cross_origin`` card fault still points at http and is of no use under TLS.

`auth_log` holds one `AuthHit` per request to an A2A endpoint or card path.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cardfence.engine.demo.agent import JSONRPC_PATH, REST_PREFIX
from cardfence.engine.demo.server import ServerTls

from .peer import Peer
from .tls import TlsFiles

__all__ = [
    "REALM",
    "AuthHit",
    "AuthPeer",
    "BearerCheck",
    "api_key_scheme",
    "basic_scheme",
    "bearer_scheme",
    "mtls_scheme",
    "oauth2_scheme",
    "oidc_scheme",
    "requirement",
]

REALM = "cardfence-peer"

BearerCheck = Callable[[str], bool | Iterable[str] | None]
"""Judges an OAuth 2.0 / OpenID Connect access token: True (valid, every scope), False or None
(refused), or the scopes it grants (valid; a requirement's scopes must all be among them)."""


# --- scheme and requirement JSON (A2A v1.0 proto JSON, as the card carries it) -------------------


def api_key_scheme(name: str, location: str = "header") -> dict[str, Any]:
    """An ``apiKeySecurityScheme``; ``location`` is "header", "query" or "cookie"."""
    return {"apiKeySecurityScheme": {"location": location, "name": name}}


def bearer_scheme() -> dict[str, Any]:
    return {"httpAuthSecurityScheme": {"scheme": "bearer"}}


def basic_scheme() -> dict[str, Any]:
    return {"httpAuthSecurityScheme": {"scheme": "basic"}}


def oauth2_scheme(token_url: str, scopes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An ``oauth2SecurityScheme``, client-credentials flow; ``scopes``: name -> description."""
    flow = {"tokenUrl": token_url, "scopes": dict(scopes or {})}
    return {"oauth2SecurityScheme": {"flows": {"clientCredentials": flow}}}


def oidc_scheme(discovery_url: str) -> dict[str, Any]:
    return {"openIdConnectSecurityScheme": {"openIdConnectUrl": discovery_url}}


def mtls_scheme() -> dict[str, Any]:
    return {"mtlsSecurityScheme": {}}


def requirement(*names: str, **scoped: Iterable[str]) -> dict[str, Any]:
    """One alternative in 1.0 JSON: ``requirement("key", "mtls", oauth=["read"])`` is
    ``{"schemes": {"key": {"list": []}, "mtls": {"list": []}, "oauth": {"list": ["read"]}}}``."""
    schemes: dict[str, Any] = {name: {"list": []} for name in names}
    schemes.update({name: {"list": list(scopes)} for name, scopes in scoped.items()})
    return {"schemes": schemes}


def _normalised(requirements: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Alternatives in 1.0 JSON; the 0.3 shorthand ``{"oauth": ["read"]}`` is accepted too."""
    out: list[dict[str, Any]] = []
    for alternative in requirements:
        schemes = alternative.get("schemes")
        if set(alternative) == {"schemes"} and isinstance(schemes, Mapping):
            out.append(
                {"schemes": {n: {"list": list(s.get("list", []))} for n, s in schemes.items()}}
            )
        else:
            out.append(requirement(**{n: list(s) for n, s in alternative.items()}))
    return out


def _alternatives(requirements: object) -> list[dict[str, tuple[str, ...]]]:
    """Card-level 1.0 requirements as ``[{scheme: scopes}]``; anything malformed is skipped."""
    found: list[dict[str, tuple[str, ...]]] = []
    for item in requirements if isinstance(requirements, list) else []:
        schemes = item.get("schemes") if isinstance(item, dict) else None
        if not isinstance(schemes, dict):
            continue
        alternative: dict[str, tuple[str, ...]] = {}
        for name, body in schemes.items():
            scopes = body.get("list") if isinstance(body, dict) else None
            alternative[str(name)] = tuple(s for s in scopes or () if isinstance(s, str))
        found.append(alternative)
    return found


def _kind(definition: object) -> tuple[str, dict[str, Any]]:
    """The scheme's 1.0 oneof key and body (``("", {})`` when it has none)."""
    if isinstance(definition, dict):
        for key, body in definition.items():
            if isinstance(key, str) and key.endswith("SecurityScheme") and isinstance(body, dict):
                return key, body
    return "", {}


# --- the log ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthHit:
    """One request to an A2A endpoint or a card path, as the gate saw it.

    ``credentials`` holds the raw credential values the request carried, by where they were:
    ``"authorization"`` (the header, whatever its scheme), ``"header:<name>"`` (lower case),
    ``"query:<name>"`` and ``"cookie:<name>"`` for the API-key schemes enforced at the time, and
    ``"client_cert"`` (the verified certificate's subject). ``headers`` has every request header
    (lower-case names, the last one of repeated names) and ``query`` the raw query string.
    """

    path: str
    host: str  # the local address the connection reached
    method: str  # the HTTP verb
    binding: str | None  # "JSONRPC" or "REST" (as in `Peer.calls`); None for a card read
    presented: tuple[str, ...]  # enforced schemes (declared or required) whose kind of
    # credential was carried
    accepted: tuple[str, ...]  # those whose credential was good, scopes aside (card reads: ())
    credentials: dict[str, str]
    headers: dict[str, str]
    query: str
    authorized: bool  # let through to the agent (card reads always are)
    status: int  # what was answered: 401/403 from the gate, else the agent's status


# --- what is accepted -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Accepted:
    kind: str  # "apiKey" | "bearer" | "basic" | "oauth"
    value: str = ""  # api key or token
    user: str = ""
    password: str = ""
    scopes: frozenset[str] | None = None  # a bearer token's; None: all
    check: BearerCheck | None = None


@dataclass(frozen=True, slots=True)
class _Verdict:
    state: str  # "ok" | "missing" | "invalid" | "scope" | "unchecked" (card reads)
    presented: bool


@dataclass(frozen=True, slots=True)
class _Decision:
    status: int  # 0: authorised
    challenges: tuple[str, ...]
    presented: tuple[str, ...]
    accepted: tuple[str, ...]
    credentials: dict[str, str]


class _Seen:
    """What one request carries, read once."""

    def __init__(self, scope: Scope) -> None:
        request = Request(scope)
        self.headers = {k.lower(): v for k, v in request.headers.items()}
        self.query_params = request.query_params
        self.cookies = request.cookies
        self.query = scope.get("query_string", b"").decode("latin-1")
        tls = (scope.get("extensions") or {}).get("tls") or {}
        self.client_cert: str | None = None
        if tls.get("client_cert_chain"):
            self.client_cert = str(tls.get("client_cert_name") or "(no subject)")
        auth = self.headers.get("authorization", "")
        kind, _, rest = auth.partition(" ")
        self.auth_kind = kind.lower()
        self.auth_value = rest.strip()

    def api_key(self, location: str, name: str) -> tuple[str, str | None]:
        if location == "query":
            return f"query:{name}", self.query_params.get(name)
        if location == "cookie":
            return f"cookie:{name}", self.cookies.get(name)
        return f"header:{name.lower()}", self.headers.get(name.lower())


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


# --- the agent --------------------------------------------------------------------------------


class AuthPeer(Peer):
    """`Peer` whose A2A endpoints demand the credentials of its security contract.

    ``tls``: serve HTTPS with this material (card URLs become https), asking clients for a
    certificate signed by its CA; ``require_client_cert``: refuse a connection without one at the
    TLS handshake (card reads too) instead of only failing ``mtlsSecurityScheme``.

    Attributes beyond `Peer`'s: ``auth_log`` (one `AuthHit` per A2A or card request) and ``tls``.
    """

    def __init__(
        self,
        *,
        name: str = "cardfence-auth-peer",
        version: str = "1.0.0",
        tls: TlsFiles | None = None,
        require_client_cert: bool = False,
    ) -> None:
        super().__init__(name=name, version=version)
        self._auth_lock = threading.Lock()
        self._accepted: dict[str, _Accepted] = {}
        self._revoked: set[str] = set()
        self._enforced: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
        self.auth_log: list[AuthHit] = []
        self.tls = tls
        assert self._server.app is not None
        self._server.app = _AuthGate(self._server.app, self)
        if tls is not None:
            self._server.tls = ServerTls(
                certfile=str(tls.server_cert),
                keyfile=str(tls.server_key),
                ca_certs=str(tls.ca),
                cert_reqs=ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL,
            )
            self._move_to(self._server.base_url)

    def _move_to(self, base_url: str) -> None:
        """Point every URL (attributes, served card, the handler's card) at ``base_url``."""
        old = self.base_url
        self.base_url = base_url
        self.card_url = self.card_url.replace(old, base_url, 1)
        self.jsonrpc_url = self.jsonrpc_url.replace(old, base_url, 1)
        self.rest_url = self.rest_url.replace(old, base_url, 1)
        for interface in self.agent_card.supported_interfaces:
            interface.url = interface.url.replace(old, base_url, 1)

        def move(card: dict[str, Any]) -> None:
            for interface in card.get("supportedInterfaces", []):
                interface["url"] = str(interface["url"]).replace(old, base_url, 1)

        self.mutate_card(move)

    # -- the contract ------------------------------------------------------------------------

    def protect(
        self,
        schemes: Mapping[str, Mapping[str, Any]],
        requirements: Iterable[Mapping[str, Any]],
        *,
        skill_requirements: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
    ) -> None:
        """Publish ``securitySchemes`` and card-level ``securityRequirements`` (1.0 JSON; the
        0.3 shorthand ``{"name": [scopes]}`` is accepted per alternative), and per-skill
        ``securityRequirements`` for the skills named in ``skill_requirements`` (removed from the
        others). The gate enforces the card's, so this is also what is demanded."""
        schemes_json = {name: dict(body) for name, body in schemes.items()}
        card_level = _normalised(requirements)
        per_skill = {sid: _normalised(reqs) for sid, reqs in (skill_requirements or {}).items()}

        def publish(card: dict[str, Any]) -> None:
            card["securitySchemes"] = schemes_json
            card["securityRequirements"] = card_level
            for skill in card.get("skills", []):
                if skill.get("id") in per_skill:
                    skill["securityRequirements"] = per_skill[skill["id"]]
                else:
                    skill.pop("securityRequirements", None)

        self.mutate_card(publish)

    def unprotect(self) -> None:
        """Remove every security scheme and requirement from the card: an open agent again."""

        def strip(card: dict[str, Any]) -> None:
            card.pop("securitySchemes", None)
            card.pop("securityRequirements", None)
            for skill in card.get("skills", []):
                skill.pop("securityRequirements", None)

        self.mutate_card(strip)

    def set_enforced(
        self,
        schemes: Mapping[str, Mapping[str, Any]] | None,
        requirements: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Enforce this contract whatever the card says (the card is left alone); ``None``
        goes back to enforcing the card's. `reset` does that too."""
        with self._auth_lock:
            if schemes is None:
                self._enforced = None
            else:
                enforced = {name: dict(body) for name, body in schemes.items()}
                self._enforced = (enforced, _normalised(requirements))

    def _contract(self) -> tuple[dict[str, Any], list[dict[str, tuple[str, ...]]]]:
        with self._auth_lock:
            pinned = self._enforced
        if pinned is not None:
            return pinned[0], _alternatives(pinned[1])
        card = self._card_snapshot()
        schemes = card.get("securitySchemes")
        return (
            schemes if isinstance(schemes, dict) else {},
            _alternatives(card.get("securityRequirements")),
        )

    # -- what is accepted ----------------------------------------------------------------------

    def _accept(self, scheme: str, accepted: _Accepted) -> None:
        with self._auth_lock:
            self._accepted[scheme] = accepted
            self._revoked.discard(scheme)

    def accept_api_key(self, scheme: str, value: str) -> None:
        """Accept ``value`` for the API-key scheme ``scheme`` (replacing the one accepted)."""
        self._accept(scheme, _Accepted("apiKey", value=value))

    def accept_bearer(
        self, scheme: str, token: str, *, scopes: Iterable[str] | None = None
    ) -> None:
        """Accept ``token`` for the HTTP bearer scheme ``scheme``; ``scopes``: those it grants
        (None: every scope)."""
        granted = None if scopes is None else frozenset(scopes)
        self._accept(scheme, _Accepted("bearer", value=token, scopes=granted))

    def accept_basic(self, scheme: str, user: str, password: str) -> None:
        """Accept ``user``/``password`` for the HTTP basic scheme ``scheme``."""
        self._accept(scheme, _Accepted("basic", user=user, password=password))

    def accept_oauth(self, scheme: str, check: BearerCheck) -> None:
        """Judge bearer tokens for the OAuth 2.0 / OpenID Connect scheme ``scheme`` with
        ``check`` (see `BearerCheck`); called in the server's thread, once per request."""
        self._accept(scheme, _Accepted("oauth", check=check))

    def revoke(self, scheme: str) -> None:
        """Stop accepting the current credential of ``scheme`` (any token for an OAuth scheme,
        any client certificate for mTLS) until a new one is accepted or `reset`."""
        with self._auth_lock:
            self._revoked.add(scheme)

    def reset(self) -> None:
        """`Peer.reset`, and: the auth log cleared, revoked credentials accepted again, the card's
        contract enforced again (`set_enforced`). Accepted credentials and the card are kept."""
        super().reset()
        with self._auth_lock:
            self._revoked.clear()
            self._enforced = None
        self.auth_log.clear()

    # -- judging a request -------------------------------------------------------------------

    def _decide(self, seen: _Seen, enforce: bool) -> _Decision:
        schemes, alternatives = self._contract()
        with self._auth_lock:
            accepted = dict(self._accepted)
            revoked = set(self._revoked)
        credentials: dict[str, str] = {}
        if "authorization" in seen.headers:
            credentials["authorization"] = seen.headers["authorization"]
        if seen.client_cert is not None:
            credentials["client_cert"] = seen.client_cert
        for definition in schemes.values():
            key, body = _kind(definition)
            if key == "apiKeySecurityScheme":
                where, value = seen.api_key(str(body.get("location")), str(body.get("name")))
                if value is not None:
                    credentials[where] = value

        names = {name for alternative in alternatives for name in alternative}
        declared = names | set(schemes)
        verdicts: dict[tuple[str, tuple[str, ...]], _Verdict] = {}

        def verdict(name: str, scopes: tuple[str, ...]) -> _Verdict:
            if (name, scopes) not in verdicts:
                verdicts[name, scopes] = self._judge(
                    seen, schemes.get(name), scopes, accepted.get(name), name in revoked, enforce
                )
            return verdicts[name, scopes]

        states = [
            [verdict(name, scopes).state for name, scopes in alternative.items()]
            for alternative in alternatives
        ]
        presented = tuple(sorted(n for n in declared if verdict(n, ()).presented))
        good = tuple(sorted(n for n in declared if verdict(n, ()).state == "ok"))
        if not enforce or not alternatives or any(all(s == "ok" for s in a) for a in states):
            return _Decision(0, (), presented, good, credentials)
        if any(all(s in ("ok", "scope") for s in a) for a in states):
            missing = sorted(
                {
                    scope
                    for alternative in alternatives
                    for name, scopes in alternative.items()
                    if verdict(name, scopes).state == "scope"
                    for scope in scopes
                }
            )
            challenge = f'Bearer realm="{REALM}", error="insufficient_scope"'
            challenge += f', scope="{" ".join(missing)}"'
            return _Decision(403, (challenge,), presented, good, credentials)
        challenges: list[str] = []
        for name in sorted(names):
            challenge = self._challenge(schemes.get(name), verdict(name, ()))
            if challenge not in challenges:
                challenges.append(challenge)
        return _Decision(401, tuple(challenges), presented, good, credentials)

    @staticmethod
    def _judge(
        seen: _Seen,
        definition: object,
        scopes: tuple[str, ...],
        accepted: _Accepted | None,
        revoked: bool,
        check: bool,
    ) -> _Verdict:
        """Whether the request carries this scheme's kind of credential and, when ``check``
        (not for card reads: an OAuth check is not consulted for them), whether it is good."""
        key, body = _kind(definition)
        if key == "apiKeySecurityScheme":
            _, value = seen.api_key(str(body.get("location")), str(body.get("name")))
            if value is None:
                return _Verdict("missing", False)
            if not check:
                return _Verdict("unchecked", True)
            ok = accepted is not None and accepted.kind == "apiKey" and _same(value, accepted.value)
            return _Verdict("ok" if ok and not revoked else "invalid", True)
        if key == "mtlsSecurityScheme":
            if seen.client_cert is None:
                return _Verdict("missing", False)
            if not check:
                return _Verdict("unchecked", True)
            return _Verdict("invalid" if revoked else "ok", True)
        http = str(body.get("scheme", "")).lower() if key == "httpAuthSecurityScheme" else ""
        if http == "basic":
            if seen.auth_kind != "basic":
                return _Verdict("missing", False)
            if not check:
                return _Verdict("unchecked", True)
            try:
                decoded = base64.b64decode(seen.auth_value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return _Verdict("invalid", True)
            user, colon, password = decoded.partition(":")
            ok = (
                colon == ":"
                and accepted is not None
                and accepted.kind == "basic"
                and _same(user, accepted.user)
                and _same(password, accepted.password)
            )
            return _Verdict("ok" if ok and not revoked else "invalid", True)
        if http == "bearer" or key in ("oauth2SecurityScheme", "openIdConnectSecurityScheme"):
            if seen.auth_kind != "bearer" or not seen.auth_value:
                return _Verdict("missing", False)
            if not check:
                return _Verdict("unchecked", True)
            if revoked or accepted is None:
                return _Verdict("invalid", True)
            token = seen.auth_value
            granted: frozenset[str] | None
            if accepted.kind == "bearer":
                if not _same(token, accepted.value):
                    return _Verdict("invalid", True)
                granted = accepted.scopes
            elif accepted.kind == "oauth" and accepted.check is not None:
                judged = accepted.check(token)
                if judged is None or judged is False:
                    return _Verdict("invalid", True)
                granted = None if judged is True else frozenset(judged)
            else:
                return _Verdict("invalid", True)
            if granted is not None and not set(scopes) <= granted:
                return _Verdict("scope", True)
            return _Verdict("ok", True)
        return _Verdict("missing", False)  # undeclared, or a kind the gate does not know

    @staticmethod
    def _challenge(definition: object, verdict: _Verdict) -> str:
        key, body = _kind(definition)
        if key == "apiKeySecurityScheme":
            return f'ApiKey realm="{REALM}", in="{body.get("location")}", name="{body.get("name")}"'
        if key == "mtlsSecurityScheme":
            return f'MutualTLS realm="{REALM}"'
        if key == "httpAuthSecurityScheme" and str(body.get("scheme", "")).lower() == "basic":
            return f'Basic realm="{REALM}", charset="UTF-8"'
        if verdict.presented:
            return f'Bearer realm="{REALM}", error="invalid_token"'
        return f'Bearer realm="{REALM}"'


class _AuthGate:
    """Guards the A2A endpoints (see the module docstring) and logs them and the card reads."""

    def __init__(self, app: ASGIApp, peer: AuthPeer) -> None:
        self._app = app
        self._peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        binding = (
            "JSONRPC" if path == JSONRPC_PATH else "REST" if REST_PREFIX + "/" in path else None
        )
        if binding is None and path not in self._peer.card_paths:
            await self._app(scope, receive, send)
            return
        seen = _Seen(scope)
        decision = self._peer._decide(seen, enforce=binding is not None)
        server = scope.get("server") or ("", 0)

        def log(status: int) -> None:
            self._peer.auth_log.append(
                AuthHit(
                    path=path,
                    host=str(server[0]),
                    method=scope["method"],
                    binding=binding,
                    presented=decision.presented,
                    accepted=decision.accepted,
                    credentials=decision.credentials,
                    headers=seen.headers,
                    query=seen.query,
                    authorized=decision.status == 0,
                    status=status,
                )
            )

        if decision.status:
            log(decision.status)
            error = "unauthorized" if decision.status == 401 else "insufficient_scope"
            headers = {"WWW-Authenticate": ", ".join(decision.challenges)}
            response = JSONResponse({"error": error}, decision.status, headers=headers)
            await response(scope, receive, send)
            return

        logged = False

        async def logging_send(message: Message) -> None:
            nonlocal logged
            if message["type"] == "http.response.start" and not logged:
                logged = True
                log(int(message["status"]))
            await send(message)

        try:
            await self._app(scope, receive, logging_send)
        finally:
            if not logged:
                log(500)
