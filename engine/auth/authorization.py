"""Rule R15 at the edge: what credentials each request of a task carries.

A task's credentials follow its *frozen contract* -- the card it was created under -- never the
card in force: its security requirements (the skill's own replace the card's), its scheme
definitions (where an API key goes, which token URL), and the origin of the endpoint the task
was created at. At creation :meth:`Authorizer.grant` picks the first alternative the configured
credentials cover; none covered is a refusal before anything is sent
(:class:`CredentialsMissingError`, never a downgrade to an unauthenticated request). The grant is
recorded by scheme names and fingerprints (``TaskSubmitted.authorization``), never by secret.

Every later request of the task (poll, reply, cancel, registration, subscription, ``ListTasks``)
carries the same alternative, re-applied from the frozen card at each request (``env:`` values
are read at use; OAuth tokens come from a :class:`TokenSource` that caches them) -- and only to
the frozen origin: an endpoint moved elsewhere (R9) gets a request without credentials.

The pure parts (which alternative, what a scheme adds to a request) are in
:mod:`engine.auth.credentials`; this module adds the token fetch, which is I/O.
"""

from __future__ import annotations

import secrets as _secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cardfence.engine.auth.config import CredentialsProvider, Secret, normalise_origin
from cardfence.engine.auth.credentials import (
    RequestAuth,
    TokenNeeded,
    apply,
    choose,
    effective_requirements,
    fingerprint,
    fits,
)
from cardfence.engine.auth.tokens import AccessToken
from cardfence.engine.cards.model import AgentCard
from cardfence.engine.errors import CredentialsMissingError

__all__ = ["AccessTokens", "Authorizer", "Grant", "TaskCredentials"]


class AccessTokens(Protocol):
    """Where OAuth 2.0 access tokens come from
    (:class:`cardfence.engine.auth.tokens.TokenSource`)."""

    async def token(
        self, needed: TokenNeeded, *, scheme: str = "", refresh: bool = False
    ) -> AccessToken: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """What a task's requests may carry: the alternative chosen under its frozen contract.

    ``origin``: the only origin credentials go to. ``schemes``: the alternative's scheme names,
    sorted (``()``: the contract requires nothing, or no credentials were configured for an
    optional one). ``scopes``: each scheme's scopes in that alternative. ``definitions``: the
    frozen card's declarations of those schemes (1.0 shape).
    """

    origin: str
    schemes: tuple[str, ...]
    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    definitions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    def record(self, fingerprints: Mapping[str, str]) -> dict[str, Any]:
        """The ``authorization`` member of ``TaskSubmitted``: names, scopes and fingerprints,
        never a secret."""
        return {
            "origin": self.origin,
            "schemes": list(self.schemes),
            "scopes": {name: list(self.scopes.get(name, ())) for name in self.schemes},
            "fingerprints": dict(fingerprints),
        }


class Authorizer:
    """Grants (:meth:`grant`) and per-request credentials (:meth:`for_task`) for rule R15.

    ``provider`` answers ``(origin, scheme name) -> secret``; None configures no credentials (a
    contract that requires some is then refused). ``key`` keys the fingerprints the log keeps
    (at least 16 bytes; random per process when not given, so fingerprints then tell secrets
    apart within one process only).
    """

    def __init__(
        self,
        provider: CredentialsProvider | None,
        tokens: AccessTokens | None,
        *,
        key: bytes | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.provider = provider
        self.tokens = tokens
        self.key = key or _secrets.token_bytes(32)
        self._environ = environ

    def grant(self, card: AgentCard, skill: str, endpoint_url: str) -> Grant:
        """The alternative a new task of ``skill`` at ``endpoint_url`` will use (R15).

        Raises :class:`CredentialsMissingError` when the card requires security and no
        alternative is covered by configured credentials that fit its declared schemes.
        """
        origin = normalise_origin(endpoint_url)
        declared = card.security_schemes()
        requirements = effective_requirements(card, skill)

        def have(name: str) -> bool:
            secret = self._secret(origin, name)
            return secret is not None and fits(declared[name], secret) is None

        choice = choose(requirements, declared, have)
        if choice.refused:
            raise CredentialsMissingError(origin, skill, choice.reason())
        if choice.requirement is None or not choice.chosen:
            return Grant(origin, ())
        scopes = {name: tuple(sc) for name, sc in choice.requirement.schemes}
        definitions = {name: declared[name] for name in choice.chosen}
        return Grant(origin, choice.chosen, scopes, definitions)

    @staticmethod
    def regrant(card: AgentCard, recorded: Mapping[str, Any]) -> Grant:
        """The grant a task recorded at creation (``TaskSubmitted.authorization``), with the
        scheme definitions of its frozen ``card``: never chosen again (R3)."""
        names = tuple(str(name) for name in recorded.get("schemes") or ())
        origin = str(recorded.get("origin") or "")
        if not names:
            return Grant(origin, ())
        declared = card.security_schemes()
        recorded_scopes = recorded.get("scopes") or {}
        scopes = {name: tuple(recorded_scopes.get(name) or ()) for name in names}
        definitions = {name: declared.get(name, {}) for name in names}
        return Grant(origin, names, scopes, definitions)

    def fingerprints(self, grant: Grant) -> dict[str, str]:
        """Each granted scheme's secret as an HMAC under :attr:`key` (what the log keeps)."""
        out: dict[str, str] = {}
        for name in grant.schemes:
            secret = self._secret(grant.origin, name)
            if secret is None:
                continue
            resolved = secret.resolve(self._environ, origin=grant.origin, scheme=name)
            values = resolved.secret_values()
            out[name] = fingerprint(values[0], self.key) if values else "certificate"
        return out

    def for_task(self, grant: Grant, endpoint_url: str) -> TaskCredentials | None:
        """The credentials requests to ``endpoint_url`` carry under ``grant``: None when the
        grant holds none, or when ``endpoint_url`` is not at the grant's origin (never leak)."""
        if not grant.schemes:
            return None
        try:
            if normalise_origin(endpoint_url) != grant.origin:
                return None
        except ValueError:
            return None
        return TaskCredentials(self, grant)

    async def prepare(self, grant: Grant, *, refresh: bool = False) -> RequestAuth:
        """What one request must carry under ``grant``: each scheme applied, an OAuth token
        fetched (or taken from the cache; ``refresh`` asks for a new one)."""
        prepared = RequestAuth()
        for name in grant.schemes:
            secret = self._secret(grant.origin, name)
            if secret is None:  # the provider no longer has it: send nothing rather than less
                raise CredentialsMissingError(grant.origin, "", f"[{name}]: not configured")
            part = apply(
                grant.definitions[name],
                secret,
                scopes=grant.scopes.get(name, ()),
                environ=self._environ,
                origin=grant.origin,
                scheme=name,
            )
            if part.token is not None:
                if self.tokens is None:
                    raise CredentialsMissingError(grant.origin, "", f"[{name}]: no token source")
                token = await self.tokens.token(part.token, scheme=name, refresh=refresh)
                header = token.authorization()
                part = RequestAuth(
                    headers=(("Authorization", header),),
                    secrets=(*part.secrets, token.value, header),
                )
            prepared = prepared.merged(part)
        return prepared

    def has(self, origin: str, scheme: str) -> bool:
        """Whether a secret is configured for ``scheme`` at ``origin``."""
        return self._secret(origin, scheme) is not None

    def _secret(self, origin: str, scheme: str) -> Secret | None:
        return None if self.provider is None else self.provider(origin, scheme)


@dataclass(frozen=True, slots=True)
class TaskCredentials:
    """The credentials of one grant, as a transport uses them: :meth:`prepare` before each
    request; after a 401/403, :meth:`prepare` with ``refresh`` once when a token is involved."""

    authorizer: Authorizer
    grant: Grant

    @property
    def schemes(self) -> tuple[str, ...]:
        return self.grant.schemes

    @property
    def refreshable(self) -> bool:
        """Whether a new attempt could carry other credentials (an OAuth token)."""
        return any(
            "oauth2SecurityScheme" in d or "openIdConnectSecurityScheme" in d
            for d in self.grant.definitions.values()
        )

    def client_cert(self) -> tuple[str, str] | None:
        """The client certificate (cert and key paths) a mutual-TLS scheme of the grant needs:
        the connection, not the request, carries it."""
        for name in self.grant.schemes:
            definition = self.grant.definitions.get(name, {})
            secret = self.authorizer._secret(self.grant.origin, name)
            if "mtlsSecurityScheme" in definition and secret is not None:
                env = self.authorizer._environ
                return apply(definition, secret, environ=env, origin=self.grant.origin).client_cert
        return None

    async def prepare(self, *, refresh: bool = False) -> RequestAuth:
        return await self.authorizer.prepare(self.grant, refresh=refresh)
