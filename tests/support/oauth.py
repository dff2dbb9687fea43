"""A real OAuth 2.0 token server for tests: Authlib's server core (``AuthorizationServer`` and its
``ClientCredentialsGrant``) behind a minimal Starlette adapter, served on 127.0.0.1 by
`cardfence.engine.demo.server.ServerThread`.

`TokenServer` issues bearer tokens by the client credentials grant (RFC 6749 §4.4) to the clients
it was told of (`TokenServer.register`, client authentication ``client_secret_basic``), opaque or
as JWTs with a ``kid`` header (``jwt=True``), with a lifetime settable at run time
(`TokenServer.expires_in`). It publishes an OpenID Connect discovery document naming its token
endpoint, counts what it is asked, says which tokens are live (`TokenServer.check`, for an agent
that validates them), revokes clients and tokens, and misbehaves on demand (`TokenServer.fault`,
one of `FAULTS`).

Authlib has no Starlette server integration: `_StarletteAuthorizationServer` is the glue
(``create_oauth2_request`` from a request read beforehand, since Authlib's server core is
synchronous; ``handle_response`` to a Starlette response).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request
from authlib.oauth2.rfc6749.grants import ClientCredentialsGrant
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cardfence.engine.demo.server import ServerThread

__all__ = [
    "DISCOVERY_PATH",
    "FAULTS",
    "HUGE_BODY_BYTES",
    "TOKEN_PATH",
    "Issued",
    "TokenServer",
]

TOKEN_PATH = "/oauth/token"
DISCOVERY_PATH = "/.well-known/openid-configuration"
HUGE_BODY_BYTES = 5 * 1024 * 1024
_HUGE_CHUNK = 64 * 1024
_HUGE_PAUSE = 0.01  # between chunks: a client that stopped reading is noticed early

FAULTS = frozenset(
    {
        "huge",  # 5 MiB of valid JSON, chunked (no Content-Length), paced; see huge_bytes_sent
        "not_json",  # 200 with an HTML page
        "no_token",  # 200 with a JSON object lacking access_token
        "500",  # 500 with a plain text body
        "hang",  # no answer until the fault is cleared or the server stops
        "not_bearer",  # 200 with token_type "mac"
        "redirect",  # 307 back to the token endpoint
        "echo_secret",  # 401 invalid_client whose description repeats the client secret sent
        "gzip_bomb",  # 200, gzip: a few KiB that decode to 5 MiB of valid JSON
    }
)


@dataclass(frozen=True, slots=True)
class Issued:
    """A token the server issued. ``expires_at`` is on the server's ``time.monotonic`` clock
    (None: issued without a lifetime)."""

    access_token: str = field(repr=False)
    client_id: str
    scopes: tuple[str, ...]
    expires_at: float | None
    kid: str | None


@dataclass(slots=True)
class _Client(ClientMixin):
    """A registered confidential client, as Authlib's server core asks about it."""

    client_id: str
    client_secret: str = field(repr=False)
    scopes: tuple[str, ...]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str | None) -> str:
        """The requested scopes it may have (all of its scopes when none are asked for)."""
        if not scope:
            return " ".join(self.scopes)
        return " ".join(s for s in scope.split() if s in self.scopes)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return hmac.compare_digest(client_secret.encode(), self.client_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "client_secret_basic" and endpoint == "token"

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == ClientCredentialsGrant.GRANT_TYPE


@dataclass(frozen=True, slots=True)
class _Received:
    """A Starlette request, read (Authlib's server core is synchronous)."""

    method: str
    url: str
    headers: Mapping[str, str]
    form: dict[str, str]


class _StarletteAuthorizationServer(AuthorizationServer):
    def __init__(self, owner: TokenServer) -> None:
        super().__init__()
        self._owner = owner
        self.register_grant(ClientCredentialsGrant)
        self.register_token_generator(
            "default",
            BearerTokenGenerator(owner._new_token_value, expires_generator=owner._lifetime),
        )

    def query_client(self, client_id: str) -> _Client | None:
        return self._owner._live_client(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        self._owner._save(token, request.client)

    def create_oauth2_request(self, request: _Received) -> OAuth2Request:
        oauth = OAuth2Request(request.method, request.url, headers=request.headers)
        oauth.payload = BasicOAuth2Payload(request.form)
        return oauth

    def handle_response(
        self, status: int, body: Any, headers: Iterable[tuple[str, str]]
    ) -> Response:
        content = json.dumps(body) if isinstance(body, dict) else body
        return Response(content, status_code=status, headers=dict(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


class TokenServer:
    """An OAuth 2.0 token server on 127.0.0.1 for tests; use as ``with TokenServer() as server:``.

    Run-time settings: ``expires_in`` (seconds; 0 issues tokens without a lifetime), ``jwt``
    (issue JWTs whose header carries ``kid``), ``compress`` (gzip the token endpoint's answers),
    ``fault`` (None, or one of `FAULTS`), ``discovery_overrides`` (members replacing those of
    the discovery document).

    Counters: ``token_requests`` (every request to the token endpoint), ``discovery_requests``,
    ``issued`` (every token issued, in order), ``huge_bytes_sent`` (of the last "huge" body).
    """

    def __init__(
        self, *, expires_in: int = 3600, jwt: bool = False, kid: str = "cardfence-test-key-1"
    ) -> None:
        self.expires_in = expires_in
        self.jwt = jwt
        self.kid = kid
        self.compress = False
        self._fault: str | None = None
        self.discovery_overrides: dict[str, Any] = {}
        self.token_requests = 0
        self.discovery_requests = 0
        self.huge_bytes_sent = 0
        self.issued: list[Issued] = []
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._revoked_clients: set[str] = set()
        self._live: dict[str, Issued] = {}
        self._signing_key = secrets.token_bytes(32)
        self._stopping = threading.Event()
        self._authority = _StarletteAuthorizationServer(self)
        app = Starlette(
            routes=[
                Route(TOKEN_PATH, self._token_endpoint, methods=["GET", "POST"]),
                Route(DISCOVERY_PATH, self._discovery_endpoint, methods=["GET"]),
            ]
        )
        self._server = ServerThread(app, host="127.0.0.1", port=0)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TokenServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # a hanging request ends now
        self._server.stop()

    def __enter__(self) -> TokenServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def reset(self) -> None:
        """Normal service, default settings, counters zeroed; clients and tokens are kept."""
        self.fault = None
        self.expires_in = 3600
        self.jwt = False
        self.compress = False
        self.discovery_overrides = {}
        self.token_requests = self.discovery_requests = self.huge_bytes_sent = 0

    # --- addresses ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self._server.base_url

    @property
    def issuer(self) -> str:
        return self.base_url

    @property
    def token_url(self) -> str:
        return self.base_url + TOKEN_PATH

    @property
    def discovery_url(self) -> str:
        return self.base_url + DISCOVERY_PATH

    # --- clients and tokens -------------------------------------------------------------------

    @property
    def fault(self) -> str | None:
        return self._fault

    @fault.setter
    def fault(self, kind: str | None) -> None:
        if kind is not None and kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {sorted(FAULTS)}")
        self._fault = kind

    def register(self, client_id: str, client_secret: str, scopes: Iterable[str] = ()) -> None:
        """A confidential client that may ask for ``scopes`` (it gets those it asks for that it
        may have; all of them when it asks for none). Registering again replaces it (and lifts
        a revocation)."""
        with self._lock:
            self._clients[client_id] = _Client(client_id, client_secret, tuple(scopes))
            self._revoked_clients.discard(client_id)

    def check(self, token: str) -> tuple[str, ...] | None:
        """The scopes granted to ``token`` when it is live (issued here, unexpired, unrevoked,
        its client not revoked), else None."""
        with self._lock:
            issued = self._live.get(token)
            if issued is None or issued.client_id in self._revoked_clients:
                return None
        if issued.expires_at is not None and time.monotonic() >= issued.expires_at:
            return None
        return issued.scopes

    def revoke_client(self, client_id: str) -> None:
        """Its tokens stop being live, and it gets no new one (``invalid_client``)."""
        with self._lock:
            self._revoked_clients.add(client_id)

    def revoke_tokens(self) -> None:
        """Every token issued so far stops being live."""
        with self._lock:
            self._live.clear()

    # --- Authlib's callbacks ------------------------------------------------------------------

    def _live_client(self, client_id: str) -> _Client | None:
        with self._lock:
            if client_id in self._revoked_clients:
                return None
            return self._clients.get(client_id)

    def _lifetime(self, client: _Client, grant_type: str) -> int:
        return self.expires_in

    def _new_token_value(
        self, client: _Client, grant_type: str, user: object = None, scope: str | None = None
    ) -> str:
        if not self.jwt:
            return secrets.token_urlsafe(32)
        now = int(time.time())
        header = {"alg": "HS256", "typ": "JWT", "kid": self.kid}
        claims = {
            "iss": self.issuer,
            "sub": client.client_id,
            "scope": scope or "",
            "iat": now,
            "jti": secrets.token_hex(8),
            **({"exp": now + self.expires_in} if self.expires_in else {}),
        }
        signing_input = f"{_b64(json.dumps(header))}.{_b64(json.dumps(claims))}"
        signature = hmac.new(self._signing_key, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"

    def _save(self, token: dict[str, Any], client: _Client) -> None:
        lifetime = token.get("expires_in")
        issued = Issued(
            token["access_token"],
            client.client_id,
            tuple(str(token.get("scope", "")).split()),
            time.monotonic() + lifetime if lifetime else None,
            self.kid if self.jwt else None,
        )
        with self._lock:
            self.issued.append(issued)
            self._live[issued.access_token] = issued

    # --- endpoints ----------------------------------------------------------------------------

    async def _token_endpoint(self, request: Request) -> Response:
        self.token_requests += 1
        fault = self._fault
        if fault is not None:
            return await self._misbehave(fault, request)
        body = await request.body()
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        received = _Received(request.method, str(request.url), request.headers, form)
        response: Response = self._authority.create_token_response(received)
        if self.compress:
            response.body = gzip.compress(response.body)
            response.headers["content-encoding"] = "gzip"
            response.headers["content-length"] = str(len(response.body))
        return response

    async def _discovery_endpoint(self, request: Request) -> Response:
        self.discovery_requests += 1
        document = {
            "issuer": self.issuer,
            "token_endpoint": self.token_url,
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            **self.discovery_overrides,
        }
        return JSONResponse(document)

    async def _misbehave(self, fault: str, request: Request) -> Response:
        if fault == "huge":
            return _HugeResponse(self)
        if fault == "gzip_bomb":
            bomb = gzip.compress(b"".join(_huge_chunks()), compresslevel=9)
            headers = {"content-encoding": "gzip"}
            return Response(bomb, media_type="application/json", headers=headers)
        if fault == "not_json":
            return Response("<html><body>Sign in</body></html>", media_type="text/html")
        if fault == "no_token":
            return JSONResponse({"token_type": "Bearer", "expires_in": 3600})
        if fault == "500":
            return PlainTextResponse("Internal Server Error", status_code=500)
        if fault == "not_bearer":
            return JSONResponse({"access_token": secrets.token_urlsafe(16), "token_type": "mac"})
        if fault == "redirect":
            return RedirectResponse(self.token_url, status_code=307)
        if fault == "echo_secret":
            sent = _basic_secret(request.headers.get("authorization", ""))
            description = f"the client secret {sent!r} is not the one registered"
            answer = {"error": "invalid_client", "error_description": description}
            return JSONResponse(answer, status_code=401)
        while self._fault == "hang" and not self._stopping.is_set():  # "hang"
            await asyncio.sleep(0.02)
        return PlainTextResponse("Service Unavailable", status_code=503)


class _HugeResponse(Response):
    """5 MiB of valid JSON (an access token padded with a long member) in paced chunks without a
    Content-Length: only a size limit protects a client. Stops when the client goes away."""

    def __init__(self, server: TokenServer) -> None:
        super().__init__(status_code=200)
        self._server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self._server
        server.huge_bytes_sent = 0
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            start = {"type": "http.response.start", "status": 200}
            await send({**start, "headers": [(b"content-type", b"application/json")]})
            for chunk in _huge_chunks():
                if gone.is_set() or server._stopping.is_set():
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                server.huge_bytes_sent += len(chunk)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), _HUGE_PAUSE)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


def _huge_chunks() -> Iterator[bytes]:
    head = b'{"access_token": "huge", "token_type": "Bearer", "padding": "'
    tail = b'"}'
    yield head
    remaining = HUGE_BODY_BYTES - len(head) - len(tail)
    while remaining > 0:
        size = min(_HUGE_CHUNK, remaining)
        yield b"x" * size
        remaining -= size
    yield tail


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _basic_secret(header: str) -> str:
    """The password of an HTTP Basic ``Authorization`` header ("" when there is none)."""
    kind, _, encoded = header.partition(" ")
    if kind.lower() != "basic":
        return ""
    try:
        decoded = base64.b64decode(encoded).decode("latin-1")
    except ValueError:
        return ""
    return decoded.partition(":")[2]
