"""OAuth 2.0 access tokens for rule R15 (authorization follows the frozen contract).

When the contract asks for ``oauth2`` (flow ``clientCredentials``) or ``openIdConnect``,
:func:`cardfence.engine.auth.credentials.apply` says so with a :class:`TokenNeeded`; a
:class:`TokenSource` turns it into an :class:`AccessToken` with the client credentials grant
(RFC 6749 §4.4), sent by Authlib's httpx client, for the engine to send on as
``Authorization: Bearer``:

- a token is cached in memory per token endpoint, client and scopes, and fetched anew shortly
  before it expires (min(60 s, 10 % of its lifetime)) or when the caller asks (after a 401);
  concurrent callers for one token share one request;
- ``openIdConnect``: the discovery document naming the token endpoint is read once per URL;
- bounded (R16): https only (plain http to loopback hosts, unless ``allow_insecure``), no
  redirect followed, each answer at most ``max_bytes`` once decoded and cut while it streams in,
  and the whole exchange within ``timeout`` and the deadline in force (:mod:`engine.http.deadline`);
- every failure is a :class:`TokenRequestError` whose one-line detail says what was wrong and
  never holds the client secret or a token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import math
import os
import re
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar
from urllib.parse import quote_plus

import authlib.deprecate
import httpx

from cardfence.engine.auth.config import OAuthClient
from cardfence.engine.auth.credentials import TokenNeeded, redact
from cardfence.engine.auth.redaction import redaction
from cardfence.engine.cards.canonical import loads
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.cards.urls import url_refusal
from cardfence.engine.errors import TokenRequestError
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import ACCEPT_ENCODING, BodyRefused, BoundedDecoder, read_body
from cardfence.engine.http.pool import USER_AGENT

with warnings.catch_warnings():
    # Recent Authlib warns on import that it would rather drive the httpx2 fork; it still drives
    # httpx, which is what cardfence uses everywhere.
    warnings.simplefilter("ignore", authlib.deprecate.AuthlibDeprecationWarning)
    from authlib.integrations.httpx_client import AsyncOAuth2Client

__all__ = ["AccessToken", "TokenSource"]

_REFRESH_MARGIN: Final = 60.0  # seconds; or 10 % of the token's lifetime when that is shorter
_TEXT_LIMIT: Final = 100  # characters of remote text (an error description) a message may quote
_UNSAFE_IN_HEADER: Final = re.compile(r"[\x00-\x1f\x7f]")
_JWT: Final = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AccessToken:
    """A bearer token. ``expires_at`` is on the clock of the :class:`TokenSource` that got it
    (None: the token endpoint gave no lifetime); ``scopes`` are the granted ones (the requested
    ones when the answer names none); ``kid`` is the key id in the header of a JWT token, read
    without verifying anything, for the log (None for opaque tokens). repr never shows the value.
    """

    value: str = field(repr=False)
    token_type: str
    expires_at: float | None
    scopes: tuple[str, ...]
    kid: str | None = None

    def authorization(self) -> str:
        """The ``Authorization`` header value."""
        return f"Bearer {self.value}"


class _Failure(Exception):
    """Why a shared request failed, before each waiting caller names its own scheme."""

    def __init__(self, url: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.url = url
        self.detail = detail
        self.status = status


@dataclass(frozen=True, slots=True)
class _Cached:
    token: AccessToken
    renew_at: float | None  # when to fetch a new one (None: never on its own)


class _SingleFlight(Generic[T]):
    """One task per key at a time: callers of a key already in flight wait for its result.

    A caller that stops waiting (its deadline, a cancel) leaves the task running for the others.
    """

    def __init__(self) -> None:
        self._tasks: dict[Hashable, asyncio.Task[T]] = {}

    async def run(self, key: Hashable, start: Callable[[], Coroutine[Any, Any, T]]) -> T:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.create_task(start())  # in the caller's context: its deadline applies
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._landed, key))
        return await asyncio.shield(task)

    def _landed(self, key: Hashable, task: asyncio.Task[T]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody still waits for is not logged

    async def cancel(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class TokenSource:
    """Access tokens for :class:`TokenNeeded` notes, cached, shared and bounded (module doc).

    ``clock`` (default ``time.monotonic``) dates tokens; the network bounds use the real
    monotonic clock. ``verify`` is httpx's (a CA bundle path is read into an SSL context).
    ``on_discovery(url, body)`` is awaited with each OpenID Connect discovery document read and
    found usable, so the caller can record it. A request shared by several callers runs under the
    deadline of the caller that started it; each caller stops waiting at its own.
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        max_bytes: int = 64 * 1024,
        allow_insecure: bool = False,
        clock: Callable[[], float] = time.monotonic,
        verify: ssl.SSLContext | str | bool = True,
        on_discovery: Callable[[str, bytes], Awaitable[None]] | None = None,
    ) -> None:
        if timeout <= 0 or max_bytes <= 0:
            raise ValueError("timeout and max_bytes must be positive")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.allow_insecure = allow_insecure
        self._clock = clock
        self._verify = verify
        self._ssl: ssl.SSLContext | None = verify if isinstance(verify, ssl.SSLContext) else None
        self._on_discovery = on_discovery
        self._cache: dict[Hashable, _Cached] = {}
        self._endpoints: dict[str, str] = {}  # discovery URL -> the token endpoint it names
        self._token_flights: _SingleFlight[AccessToken] = _SingleFlight()
        self._discovery_flights: _SingleFlight[str] = _SingleFlight()
        self._requests = 0

    @property
    def requests(self) -> int:
        """Token requests sent so far (discovery reads not counted)."""
        return self._requests

    async def token(
        self, needed: TokenNeeded, *, scheme: str = "", refresh: bool = False
    ) -> AccessToken:
        """A live token for ``needed``: the cached one unless it is near its expiry or
        ``refresh`` (the agent refused it) asks for a new one.

        Raises :class:`TokenRequestError` (naming ``scheme``) when none can be had in time.
        """
        key = _cache_key(needed)
        cached = None if refresh else self._cache.get(key)
        if cached is not None and (cached.renew_at is None or self._clock() < cached.renew_at):
            return cached.token
        where = _first_url(needed)
        budget = deadline.left(self.timeout)
        if budget <= 0:
            detail = "timeout: the deadline passed before the token was asked for (nothing sent)"
            raise TokenRequestError(where, detail, scheme=scheme)
        try:
            async with asyncio.timeout(budget):
                return await self._token_flights.run(key, lambda: self._obtain(needed, key))
        except TimeoutError:
            detail = f"timeout: no token within {budget:.3g}s{_cut_by(budget, self.timeout)}"
            raise TokenRequestError(where, detail, scheme=scheme) from None
        except _Failure as failure:
            raise TokenRequestError(
                failure.url, failure.detail, scheme=scheme, status=failure.status
            ) from None

    def forget(self, needed: TokenNeeded) -> None:
        """Drop the cached token for ``needed`` (the next :meth:`token` asks for a new one)."""
        self._cache.pop(_cache_key(needed), None)

    async def aclose(self) -> None:
        """Cancel the requests in flight; the cache is kept."""
        await self._token_flights.cancel()
        await self._discovery_flights.cancel()

    async def __aenter__(self) -> TokenSource:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # --- one shared request -------------------------------------------------------------------

    async def _obtain(self, needed: TokenNeeded, key: Hashable) -> AccessToken:
        """Discovery when needed, then the token request; all within one budget."""
        where = _first_url(needed)
        budget = deadline.left(self.timeout)
        try:
            async with asyncio.timeout(budget):
                if needed.kind == "oauth2":
                    token_url = needed.token_url
                elif needed.kind == "openIdConnect":
                    token_url = await self._token_endpoint(needed.discovery_url, budget)
                else:
                    raise _Failure(where, f"unknown kind {needed.kind!r} (nothing sent)")
                where = token_url
                got = await self._request(token_url, needed.client, needed.scopes, budget)
        except TimeoutError:
            detail = f"timeout: no answer within {budget:.3g}s{_cut_by(budget, self.timeout)}"
            raise _Failure(where, detail) from None
        self._cache[key] = got
        return got.token

    async def _token_endpoint(self, url: str, budget: float) -> str:
        known = self._endpoints.get(url)
        if known is not None:
            return known
        return await self._discovery_flights.run(url, lambda: self._discover(url, budget))

    async def _discover(self, url: str, budget: float) -> str:
        """GET the OpenID Connect discovery document; its ``token_endpoint``."""
        refusal = url_refusal(url, allow_insecure=self.allow_insecure)
        if refusal is not None:
            raise _Failure(url, f"discovery URL refused: {refusal} (nothing sent)")
        headers = {"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
        async with httpx.AsyncClient(**self._options(budget)) as client:
            try:
                async with client.stream("GET", url, headers=headers) as response:
                    status = response.status_code
                    if status != 200:
                        raise _Failure(url, f"discovery document: {_status(response)}", status)
                    body = await read_body(response, self.max_bytes)
            except BodyRefused as refused:
                raise _Failure(url, f"discovery document refused: {refused.detail}") from None
            except httpx.TimeoutException as exc:
                raise _Failure(url, f"timeout ({_name(exc)})") from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise _Failure(url, f"unreachable ({_one_line(str(exc) or _name(exc))})") from None
        document = _json_object(body)
        if isinstance(document, str):
            raise _Failure(url, f"discovery document {document}", status)
        endpoint = document.get("token_endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            raise _Failure(url, "discovery document names no token_endpoint", status)
        refusal = url_refusal(endpoint, allow_insecure=self.allow_insecure)
        if refusal is not None:
            shown = _one_line(endpoint, 200)
            raise _Failure(url, f"token_endpoint {shown} refused: {refusal} (nothing sent)")
        if self._on_discovery is not None:
            await self._on_discovery(url, body)
        self._endpoints[url] = endpoint
        return endpoint

    async def _request(
        self, url: str, client: OAuthClient, scopes: tuple[str, ...], budget: float
    ) -> _Cached:
        """The client credentials grant at ``url``: Authlib builds and sends the request (client
        authentication ``client_secret_basic``); :func:`_check_answer` vets the answer first."""
        refusal = url_refusal(url, allow_insecure=self.allow_insecure)
        if refusal is not None:
            raise _Failure(url, f"token URL refused: {refusal} (nothing sent)")
        secrets = _secrets_of(client)
        scope = {"scope": " ".join(scopes)} if scopes else {}
        bounded = {"response": [self._bound]}
        options = self._options(budget)
        async with AsyncOAuth2Client(
            client.client_id, client.client_secret, event_hooks=bounded, **options
        ) as oauth:
            oauth.register_compliance_hook(
                "access_token_response", functools.partial(_check_answer, url, secrets)
            )
            self._requests += 1
            try:
                answer = await oauth.fetch_token(url, grant_type="client_credentials", **scope)
            except httpx.TimeoutException as exc:
                raise _Failure(url, f"timeout ({_name(exc)})") from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                detail = redact(_one_line(str(exc) or _name(exc)), secrets)
                raise _Failure(url, f"unreachable ({detail})") from None
        now = self._clock()
        value = str(answer["access_token"])
        lifetime = _seconds(answer.get("expires_in"))  # None: no lifetime given
        if lifetime is not None:
            lifetime = max(lifetime, 0.0)  # 0 or less: already expired, used once
        granted = answer.get("scope")
        token = AccessToken(
            value,
            "Bearer",
            None if lifetime is None else now + lifetime,
            tuple(granted.split()) if isinstance(granted, str) else scopes,
            _kid(value),
        )
        if lifetime is None:
            return _Cached(token, None)
        return _Cached(token, now + lifetime - min(_REFRESH_MARGIN, 0.1 * lifetime))

    def _options(self, budget: float) -> dict[str, Any]:
        """The httpx client settings of one exchange: no redirects, timeouts within ``budget``."""
        return {
            "timeout": httpx.Timeout(budget),
            "follow_redirects": False,
            "verify": self._ssl_context(),
            "headers": {"User-Agent": USER_AGENT, "Accept-Encoding": ACCEPT_ENCODING},
        }

    def _ssl_context(self) -> ssl.SSLContext:
        """One SSL context for every exchange (built on first use: loading CAs takes a while)."""
        if self._ssl is None:
            verify = self._verify
            if isinstance(verify, str) and os.path.isdir(verify):
                self._ssl = ssl.create_default_context(capath=verify)
            elif isinstance(verify, str):
                self._ssl = ssl.create_default_context(cafile=verify)
            else:
                self._ssl = httpx.create_ssl_context(verify=verify)
        return self._ssl

    async def _bound(self, response: httpx.Response) -> None:
        """httpx response hook: the body will be read through a :class:`BoundedDecoder`, so
        Authlib (which reads it whole) never holds more than ``max_bytes`` of it."""
        refused = functools.partial(_refused, str(response.request.url), response.status_code)
        try:
            decoder = BoundedDecoder(response.headers.get("content-encoding"), self.max_bytes)
        except BodyRefused as refusal:
            raise refused(refusal) from None
        declared = response.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > decoder.raw_limit:
            detail = f"body declared {declared} bytes, over the limit of {decoder.raw_limit}"
            raise refused(BodyRefused("too_large", detail))
        raw = response.stream
        assert isinstance(raw, httpx.AsyncByteStream)
        response.stream = _DecodedStream(raw, decoder, refused)
        response.headers.pop("content-encoding", None)  # decoded here: httpx must not decode it


def _refused(url: str, status: int, refusal: BodyRefused) -> _Failure:
    return _Failure(url, f"HTTP {status}: answer {refusal.detail}", status)


class _DecodedStream(httpx.AsyncByteStream):
    """A response body decoded and bounded while it streams in."""

    def __init__(
        self,
        raw: httpx.AsyncByteStream,
        decoder: BoundedDecoder,
        refused: Callable[[BodyRefused], _Failure],
    ) -> None:
        self._raw = raw
        self._decoder = decoder
        self._refused = refused

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._raw:
                for piece in self._decoder.feed(chunk):
                    yield piece
            for piece in self._decoder.flush():
                yield piece
        except BodyRefused as refusal:
            raise self._refused(refusal) from None

    async def aclose(self) -> None:
        await self._raw.aclose()


# --- the answer ---------------------------------------------------------------------------------


def _check_answer(url: str, secrets: tuple[str, ...], response: httpx.Response) -> httpx.Response:
    """Authlib's ``access_token_response`` hook: refuse an answer that is not a usable bearer
    token before Authlib reads it (its reading raises stray errors on hostile values)."""
    status = response.status_code
    # What the endpoint repeats of the client's secret is hidden before any of it is read or cut.
    document = _json_object(redaction(secrets).body(response.content))
    if not 200 <= status < 300:
        said = None if isinstance(document, str) else document
        raise _Failure(url, redact(_status(response, said), secrets), status)
    if isinstance(document, str):
        raise _Failure(url, redact(f"HTTP {status}: the answer {document}", secrets), status)
    if "error" in document:
        raise _Failure(url, redact(_status(response, document), secrets), status)
    value = document.get("access_token")
    if not isinstance(value, str) or not value:
        raise _Failure(url, f"HTTP {status}: the answer has no access_token", status)
    if _UNSAFE_IN_HEADER.search(value):
        detail = f"HTTP {status}: the access_token holds characters a header cannot carry"
        raise _Failure(url, detail, status)
    token_type = document.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        shown = _one_line(repr(token_type), 40)
        raise _Failure(url, f"HTTP {status}: token_type {shown} is not Bearer", status)
    for name in ("expires_in", "expires_at"):
        if document.get(name) is not None and _seconds(document[name]) is None:
            raise _Failure(url, f"HTTP {status}: {name} is not a number", status)
    if "scope" in document and not isinstance(document["scope"], str):
        raise _Failure(url, f"HTTP {status}: scope is not a string", status)
    return response


def _status(response: httpx.Response, document: dict[str, Any] | None = None) -> str:
    """``HTTP 401 invalid_client: <description, cut>``, or for a redirect where it pointed."""
    status = response.status_code
    if 300 <= status < 400:
        target = _one_line(response.headers.get("location", "(no location)"), 200)
        return f"HTTP {status}: redirect to {target} not followed"
    if document is None:
        return f"HTTP {status}"
    code, description = document.get("error"), document.get("error_description")
    text = f"HTTP {status}"
    if isinstance(code, str) and code:
        text += f" {_one_line(code, 64)}"
    if isinstance(description, str) and description:
        text += f": {_one_line(description, _TEXT_LIMIT)}"
    return text


def _json_object(body: bytes) -> dict[str, Any] | str:
    """The JSON object ``body`` holds, else why not (``is not a JSON object``). Read as I-JSON
    (R16): Authlib reads the answer again keeping a repeated member's last value, so a repeated
    member must be refused here, before it does."""
    try:
        document = loads(body)
    except FieldError as exc:
        return f"is not a JSON object ({_one_line(str(exc), _TEXT_LIMIT)})"
    return document if isinstance(document, dict) else "is not a JSON object"


def _seconds(value: object) -> float | None:
    """A finite number (JSON number, or a string of digits as some servers send), else None."""
    if isinstance(value, str):
        return float(value) if value.isascii() and value.isdigit() else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _kid(token: str) -> str | None:
    """The ``kid`` in the header of a JWT (not verified: for the log only), else None."""
    if not _JWT.fullmatch(token):
        return None
    head = token.split(".", 1)[0]
    try:
        header = loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (FieldError, binascii.Error):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


def _cache_key(needed: TokenNeeded) -> Hashable:
    """Token endpoint (for ``openIdConnect``: the discovery document naming it), client and
    scopes. The secret is in only as a digest, so a client whose secret changes gets its own."""
    secret = hashlib.sha256(needed.client.client_secret.encode()).hexdigest()
    scopes = tuple(sorted(set(needed.scopes)))
    return (needed.kind, _first_url(needed), needed.client.client_id, secret, scopes)


def _first_url(needed: TokenNeeded) -> str:
    """Where a token request begins: the token endpoint, or the discovery document naming it."""
    return needed.token_url if needed.kind == "oauth2" else needed.discovery_url


def _secrets_of(client: OAuthClient) -> tuple[str, ...]:
    """What a message must never show: the secret, and the Basic credentials carrying it (as
    sent, and form-encoded first as RFC 6749 section 2.3.1 says; :mod:`engine.auth.redaction` adds
    the other forms each may take)."""
    pairs = (
        f"{client.client_id}:{client.client_secret}",
        f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}",
    )
    encoded = (base64.b64encode(p.encode("latin-1", "replace")).decode() for p in pairs)
    return (client.client_secret, *dict.fromkeys(encoded))


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(_UNSAFE_IN_HEADER.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _cut_by(budget: float, timeout: float) -> str:
    return "" if budget >= timeout else " (the deadline in force)"


def _name(exc: BaseException) -> str:
    return type(exc).__name__
