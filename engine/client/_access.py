"""The engine's part that holds what R15 sends: the token source, the authorizer, the grant
each task's frozen contract makes, and what OpenID Connect discovery documents said.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cardfence.engine.auth.authorization import Authorizer, Grant, TaskCredentials
from cardfence.engine.auth.tokens import TokenSource
from cardfence.engine.cards.canonical import loads
from cardfence.engine.client._records import TaskRecords
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core.replay import State
from cardfence.engine.errors import CredentialsMissingError


class Access:
    """Credentials (R15): granted at creation, frozen with the task, carried by its requests."""

    def __init__(self, config: EngineConfig, records: TaskRecords) -> None:
        self.records = records
        self.oidc: dict[str, dict[str, Any]] = {}  # discovery URL -> what its document said
        self.tokens = TokenSource(
            timeout=config.request_timeout,
            allow_insecure=config.card_limits.allow_insecure,
            verify=config.ca_file or True,  # a context is made only when a token is fetched
            on_discovery=self.oidc_discovered,
        )
        self.authorizer = Authorizer(config.credentials, self.tokens, key=config.fingerprint_key)
        self.grants: dict[tuple[str, str], Grant] = {}  # (revision, recorded grant) -> grant

    async def oidc_discovered(self, url: str, body: bytes) -> None:
        """R15: an OpenID Connect discovery document was read (bounded, by the token source);
        the tasks it serves record its URL, digest and token endpoint."""
        document = loads(body)  # the token source read it as I-JSON already (R16)
        assert isinstance(document, dict)
        self.oidc[url] = {
            "url": url,
            "sha256": hashlib.sha256(body).hexdigest(),
            "token_endpoint": document.get("token_endpoint"),
        }

    def grant_record(self, grant: Grant) -> dict[str, Any]:
        """What ``TaskSubmitted`` keeps of the grant: names, scopes, fingerprints, and for an
        OpenID Connect scheme what its discovery document said (never a secret)."""
        record = grant.record(self.authorizer.fingerprints(grant))
        discovered = {}
        for name, definition in grant.definitions.items():
            body = definition.get("openIdConnectSecurityScheme") or {}
            seen = self.oidc.get(str(body.get("openIdConnectUrl", "")))
            if seen is not None:
                discovered[name] = seen
        if discovered:
            record["discovery"] = discovered
        return record

    async def task_credentials(
        self, state: State, *, at: str | None = None
    ) -> TaskCredentials | None:
        """What a request of the task ``state`` describes carries: the credentials its frozen
        contract grants (none when it asks for none), for its recorded endpoint (or the URL
        ``at``, a file an artifact names) -- none when that is no longer at the origin the task
        was created at (R15: never leak)."""
        recorded = state.get("authorization")
        if not recorded or not recorded.get("schemes"):
            return None
        revision = str(state["card_revision"])
        marker = (revision, repr(sorted(recorded.items())))
        grant = self.grants.get(marker)
        if grant is None:
            card = await self.records.calls.run(self.records.card, revision)
            if card is None:  # the frozen card is gone from the store: send nothing rather
                raise CredentialsMissingError(  # than credentials chosen anew
                    str(state.get("agent")), str(state["skill"]),
                    f"the frozen card {revision[:12]} is not in the store",
                )  # fmt: skip
            grant = self.grants[marker] = Authorizer.regrant(card, recorded)
        return self.authorizer.for_task(grant, at or str(state["endpoint"]["url"]))

    async def aclose(self) -> None:
        await self.tokens.aclose()
