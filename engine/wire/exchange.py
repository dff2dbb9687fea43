"""One A2A request to one agent interface, and what its answer means (R11, R15, R16).

:class:`Exchange` is what :class:`~cardfence.engine.wire.transport.A2ATransport` stands on: a
request in
the interface's binding and A2A version (0.3's translated by :mod:`engine.wire._v03`), bounded --
within its timeout and by the deadline in force, its body capped once decoded -- and its answer
told apart (R11):

- an A2A error (a JSON-RPC ``error`` object, or a REST error whose google.rpc ``ErrorInfo`` names a
  ``reason``; 0.3: :func:`engine.wire._v03.rest_error`) -> :class:`RemoteRefusedError` with the
  JSON-RPC code (:class:`A2AErrorCode`); :class:`ProtocolMismatchError` when the error says the
  endpoint speaks another version than its card's (-32601 to a JSON-RPC method, -32009, or a
  1.0-only error body from an interface declared 0.3);
- HTTP 404 *without* such a body (a route that is not there), any other non-2xx without one, a
  network error or a timeout -> :class:`EndpointUnreachableError`: the endpoint could not be
  reached as an A2A agent, which changes nothing and prompts an R9 check — never TaskNotFound;
  a 429, or a 503 whose ``Retry-After`` says when to come back, is :class:`ThrottledError` (R5):
  the agent asked for time, which its ``Retry-After`` (seconds or an HTTP-date) says;
- a 2xx that is not valid JSON, not the expected shape, over the size cap, or a JSON-RPC envelope
  with a wrong id or without result/error, or whose content encoding is refused (stacked,
  unknown or corrupt) -> :class:`InvalidAgentResponseError`.

Credentials (R15) are asked for what each request must carry just before it is sent; a 401/403
is asked once more with refreshed ones when a token is involved, then raised as
:class:`AuthorizationFailedError`. Error messages never show what the credentials added.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import re
from collections.abc import Mapping
from contextlib import (
    nullcontext,
)
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, Final, Protocol
from urllib.parse import quote

import httpx

from cardfence.engine.auth.credentials import RequestAuth
from cardfence.engine.auth.redaction import Redaction, redaction
from cardfence.engine.cards.canonical import loads
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC, V03, V10
from cardfence.engine.core.answers import MAX_ANSWER_BYTES
from cardfence.engine.errors import (
    AuthorizationFailedError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    ProtocolMismatchError,
    RemoteRefusedError,
    ThrottledError,
    UsageError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import ACCEPT_ENCODING, BodyRefused, read_body
from cardfence.engine.http.pool import REPLAYABLE, USER_AGENT, RequestSlots
from cardfence.engine.wire import _v03 as wire03

__all__ = [
    "A2A_VERSION",
    "DEFAULT_MAX_BYTES",
    "A2AErrorCode",
    "Exchange",
    "RequestCredentials",
    "a2a_error",
    "answer_json",
    "hiding",
    "request_json",
    "retry_after_seconds",
    "with_auth",
]


A2A_VERSION: Final = "1.0"
# Defined in core, where the observation path keeps an answer's content whole up to it.
DEFAULT_MAX_BYTES: Final = MAX_ANSWER_BYTES
_MAX_DETAIL: Final = 200  # characters of a remote error message kept in ours
# R5: a Retry-After is read only this long (an HTTP-date is 29 characters), and asks for no more
# than a day; the engine caps it further (``max_retry_after``).
_RETRY_AFTER_CHARS: Final = 64
_RETRY_AFTER_BOUND: Final = 86_400.0
_DELAY_SECONDS: Final = re.compile(r"[0-9]{1,12}")


class A2AErrorCode(IntEnum):
    """JSON-RPC error codes; the member names are the REST ``ErrorInfo.reason`` values."""

    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOTIFICATION_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005
    INVALID_AGENT_RESPONSE = -32006
    EXTENDED_AGENT_CARD_NOT_CONFIGURED = -32007
    EXTENSION_SUPPORT_REQUIRED = -32008
    VERSION_NOT_SUPPORTED = -32009
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603


class RequestCredentials(Protocol):
    """What a transport asks for the credentials of each request (R15):
    :class:`cardfence.engine.auth.authorization.TaskCredentials` is one."""

    @property
    def schemes(self) -> tuple[str, ...]: ...

    @property
    def refreshable(self) -> bool: ...

    async def prepare(self, *, refresh: bool = False) -> RequestAuth: ...


_REFUSED_AUTH: Final = (401, 403)

# The operations that only read: safe to ask twice, so asked again when a kept-alive connection
# closes under them (engine.pool.REPLAYABLE). A send, cancel or registration is never repeated.
READS: Final = frozenset({"GetTask", "ListTasks", "GetExtendedAgentCard", "SubscribeToTask"})


class Exchange:
    """One interface's requests: sent, bounded, and their answers classified (see the module
    docstring). :class:`~cardfence.engine.wire.transport.A2ATransport` adds the operations."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        interface: Interface,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pages: int = 20,
        credentials: RequestCredentials | None = None,
        slots: RequestSlots | None = None,
        extensions: tuple[str, ...] = (),
    ) -> None:
        if interface.binding not in (JSONRPC, HTTP_JSON):
            raise UsageError(f"{interface.url}: binding {interface.binding!r} is not spoken")
        if timeout <= 0 or max_bytes <= 0 or max_pages <= 0:
            raise UsageError("timeout, max_bytes and max_pages must be positive")
        self.client = client
        self.interface = interface
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_pages = max_pages
        self.version = interface.dialect
        self.legacy = self.version == V03
        self._headers = httpx.Headers(headers or {})
        if self.legacy:  # 0.3 has no version header; a 1.0 server reads its absence as 0.3
            self._headers.pop("A2A-Version", None)
        else:
            self._headers["A2A-Version"] = A2A_VERSION
        self._headers["Content-Type"] = "application/json"
        self._headers["Accept"] = "application/json, application/a2a+json"
        self._headers["Accept-Encoding"] = ACCEPT_ENCODING  # what engine.bodies decodes
        self._headers.setdefault("User-Agent", USER_AGENT)
        if extensions:  # the extensions the task activated, named on every request of it
            name = "X-A2A-Extensions" if self.legacy else "A2A-Extensions"
            self._headers[name] = ", ".join(extensions)
        self._ids = itertools.count(1)
        self.credentials = credentials
        self._slots = slots

    @property
    def binding(self) -> str:
        return self.interface.binding

    # --- one request ----------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        params: dict[str, Any],
        verb: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        task: str = "",
        secrets: tuple[str, ...] = (),
    ) -> tuple[str, object]:
        """One operation on this binding; returns the URL asked and the decoded result.

        ``method``, ``params``, ``path`` and ``body`` are 1.0's; on a 0.3 interface they are
        translated here (:meth:`_dialect`), and the result by the caller (:meth:`_answer`).
        ``secrets``: what the request carries besides its credentials (a webhook's token and
        authorization), hidden from the answer as the credentials are
        (:mod:`engine.auth.redaction`).
        """
        operation = method
        replay = operation in READS
        method, params, path, body = self._dialect(method, params, path, body)
        if self.binding == JSONRPC:
            request_id = next(self._ids)
            envelope = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            url = self.interface.url
            sent = request_json(envelope)
            status, raw, wait = await self._exchange("POST", url, sent, None, task, replay, secrets)
            return url, self._jsonrpc_result(url, status, raw, request_id, task, operation, wait)
        url = self.interface.url.rstrip("/") + path
        content = None if body is None else request_json(body)
        status, raw, wait = await self._exchange(verb, url, content, query, task, replay, secrets)
        if 200 <= status < 300:
            return url, self._decode(url, raw)
        raise self._failure(url, status, raw, task, operation, wait)

    def _dialect(
        self, method: str, params: dict[str, Any], path: str, body: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any], str, Mapping[str, Any] | None]:
        """The request as this interface's version says it: 1.0's as it is (with the
        interface's tenant, if it names one), or its 0.3 form (:func:`engine.wire._v03.request`):
        method name, params, path and body."""
        if not self.legacy:
            tenant = self.interface.tenant
            if not tenant:
                return method, params, path, body
            # 1.0: the interface's tenant goes with every request (in JSON-RPC's params; as
            # the path's first segment over HTTP+JSON), as the card says to call it.
            return method, {**params, "tenant": tenant}, f"/{quote(tenant, safe='')}{path}", body
        rest = None if body is None else wire03.request(method, params, rest=True)
        return (
            wire03.METHODS.get(method, method),
            wire03.request(method, params, rest=False),
            wire03.rest_path(path),
            rest,
        )

    def _answer(self, kind: wire03.Answer, result: object) -> object:
        """A result in the shape :mod:`engine.wire.v10` reads: 0.3's translated to 1.0's."""
        if not self.legacy:
            return result
        return wire03.answer(kind, result, rest=self.binding == HTTP_JSON)

    def _refusal(
        self, url: str, code: int | str, message: str, task: str, operation: str
    ) -> RemoteRefusedError:
        """The agent's A2A error, or :class:`ProtocolMismatchError` when it says the endpoint
        speaks another version than its card declares: -32601 to a JSON-RPC method (the
        version's method names differ), or -32009 (VersionNotSupported)."""
        jsonrpc = self.binding == JSONRPC
        unknown_method = jsonrpc and code == A2AErrorCode.METHOD_NOT_FOUND
        if not unknown_method and code != A2AErrorCode.VERSION_NOT_SUPPORTED:
            return RemoteRefusedError(url, code, message, task=task)
        return self._mismatch(url, operation, task, code=code, answer=message)

    def _mismatch(
        self, url: str, operation: str, task: str, *, code: int | str, answer: str = ""
    ) -> ProtocolMismatchError:
        """The mismatch an answer to ``operation`` (1.0's name) shows: the method as sent, and
        its name in the other version (JSON-RPC; HTTP+JSON has no method names)."""
        if self.binding != JSONRPC:
            sent, other = operation, ""
        elif self.legacy:
            sent, other = wire03.METHODS.get(operation, operation), operation
        else:
            sent, other = operation, wire03.METHODS.get(operation, "")
        return ProtocolMismatchError(
            url,
            sent,
            declared=self.interface.protocol_version or self.version,
            spoken=V10 if self.legacy else V03,
            legacy=other,
            task=task,
            code=code,
            answer="" if code == A2AErrorCode.METHOD_NOT_FOUND else answer,
        )

    async def _exchange(
        self,
        verb: str,
        url: str,
        content: bytes | None,
        query: Mapping[str, str] | None,
        task: str,
        replay: bool,
        secrets: tuple[str, ...] = (),
    ) -> tuple[int, bytes | None, str | None]:
        """Status, body and ``Retry-After``; the body is ``None`` when it is over ``max_bytes``
        once decoded, or when the body of a non-2xx cannot be decoded (R16). ``replay``: the
        request is a read, asked again when a kept-alive connection closes under it
        (:mod:`engine.http.pool`). Every secret the request carried (``secrets`` and the
        credentials') is hidden from the body as it arrives, in whatever form the remote repeats
        it (:mod:`engine.auth.redaction`).

        With credentials, a 401/403 is asked once more with refreshed ones when a token is
        involved (R15: the token may have expired early or been revoked and reissued).
        """
        credentials = self.credentials
        ask = (verb, url, content, query, task, replay)
        if credentials is None:
            return await self._exchange_once(*ask, None, secrets)
        auth = await credentials.prepare()
        answer = await self._exchange_once(*ask, auth, secrets)
        if answer[0] in _REFUSED_AUTH and credentials.refreshable:
            auth = await credentials.prepare(refresh=True)
            answer = await self._exchange_once(*ask, auth, secrets)
        return answer

    async def _exchange_once(
        self,
        verb: str,
        url: str,
        content: bytes | None,
        query: Mapping[str, str] | None,
        task: str,
        replay: bool,
        auth: RequestAuth | None,
        secrets: tuple[str, ...],
    ) -> tuple[int, bytes | None, str | None]:
        """One request, with ``auth`` added. The whole exchange, body included, ends within
        ``timeout`` and by the deadline in force (:mod:`engine.http.deadline`): a body that drips is
        cut there."""
        headers, query = with_auth(self._headers, query, auth)
        hide = hiding(auth, secrets)
        budget = deadline.left(self.timeout)
        if budget <= 0:
            detail = "timeout: the deadline passed before the request could be sent (not sent)"
            raise EndpointUnreachableError(url, detail, task=task)
        timeout = httpx.Timeout(budget, connect=min(budget, 10.0))
        started = False
        try:
            async with (
                asyncio.timeout(budget),  # total: a slow drip cannot stall us
                self._slots.held(url) if self._slots else nullcontext(),
            ):
                started = True
                async with self.client.stream(
                    verb,
                    url,
                    content=content,
                    params=query,
                    headers=headers,
                    timeout=timeout,
                    follow_redirects=False,
                    extensions={REPLAYABLE: True} if replay else None,
                ) as response:
                    wait = response.headers.get("retry-after")  # R5: read on a 429/503
                    try:
                        body = await read_body(response, self.max_bytes)
                    except BodyRefused as refused:
                        ok = 200 <= response.status_code < 300
                        if ok and refused.kind != "too_large":
                            raise InvalidAgentResponseError(url, refused.detail) from None
                        return response.status_code, None, wait  # no body (R11: no A2A error)
                    return response.status_code, hide.body(body), wait
        except (TimeoutError, httpx.TimeoutException):
            cut = "" if budget == self.timeout else " (the deadline)"
            if not started:
                detail = (
                    f"timeout: the requests already in flight to this agent left no slot within "
                    f"{budget:.3g}s{cut} (not sent)"
                )
            else:
                detail = f"timeout: no complete answer within {budget:.3g}s{cut}"
            raise EndpointUnreachableError(url, detail, task=task) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            detail = hide.text(f"network error: {str(exc) or type(exc).__name__}")
            raise EndpointUnreachableError(url, detail, task=task) from None

    def _jsonrpc_result(
        self,
        url: str,
        status: int,
        raw: bytes | None,
        request_id: int,
        task: str,
        operation: str,
        retry_after: str | None = None,
    ) -> object:
        if not 200 <= status < 300:
            raise self._failure(url, status, raw, task, operation, retry_after)
        doc = self._decode(url, raw)
        if not isinstance(doc, dict) or doc.get("jsonrpc") != "2.0":
            raise InvalidAgentResponseError(url, "not a JSON-RPC 2.0 response object")
        has_result, error = "result" in doc, doc.get("error")
        if (error is None) == (not has_result):
            raise InvalidAgentResponseError(
                url, "JSON-RPC response needs exactly one of result, error"
            )
        got = doc.get("id")
        id_matches = isinstance(got, int) and not isinstance(got, bool) and got == request_id
        # A server that could not read the request id answers an error with id null.
        if not id_matches and not (error is not None and got is None):
            raise InvalidAgentResponseError(
                url, f"JSON-RPC id {str(got)[:40]!r} does not answer request id {request_id}"
            )
        if error is None:
            return doc["result"]
        refused = a2a_error(doc, jsonrpc=True)
        if refused is None:
            raise InvalidAgentResponseError(url, "JSON-RPC error needs an object with integer code")
        code, message = refused
        raise self._refusal(url, code, message, task, operation)

    def _failure(
        self,
        url: str,
        status: int,
        raw: bytes | None,
        task: str,
        operation: str,
        retry_after: str | None = None,
    ) -> Exception:
        """The error for a non-2xx answer: the agent's A2A error (or a protocol mismatch it
        shows), else unreachable (R11) -- throttled when it asked for time (R5: a 429, or a 503
        with a usable ``Retry-After``)."""
        doc = answer_json(raw)
        jsonrpc = self.binding == JSONRPC
        refused = a2a_error(doc, jsonrpc=jsonrpc)
        if self.legacy and not jsonrpc:
            error = doc.get("error") if isinstance(doc, dict) else None
            if refused is not None and isinstance(error, dict) and _reason(error):
                # A google.rpc ErrorInfo: only 1.0 answers so, never a 0.3 endpoint.
                return self._mismatch(url, operation, task, code=refused[0], answer=refused[1])
            refused = refused or wire03.rest_error(status, doc, operation)
        if refused is not None:
            code, message = refused
            return self._refusal(url, code, message, task, operation)
        if status in _REFUSED_AUTH:  # R15: an annotation mid-task, never a transition
            schemes = self.credentials.schemes if self.credentials is not None else ()
            return AuthorizationFailedError(url, status, task=task, schemes=schemes)
        asked = retry_after_seconds(retry_after)
        if status == 429 or (status == 503 and asked is not None):
            return ThrottledError(url, status, asked, task=task)
        if status == 404:  # R11: a missing route, not a missing task
            detail = "HTTP 404 without an A2A error body: endpoint gone or moved"
        else:
            detail = f"HTTP {status} without an A2A error body"
        return EndpointUnreachableError(url, detail, task=task, status=status)

    def _decode(self, url: str, raw: bytes | None) -> object:
        if raw is None:
            raise InvalidAgentResponseError(url, f"body over the limit of {self.max_bytes} bytes")
        try:
            return loads(raw)  # I-JSON: a duplicate member name is refused, never the last kept
        except FieldError as exc:
            raise InvalidAgentResponseError(url, str(exc)[:_MAX_DETAIL]) from None


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a ``Retry-After`` value asks for (RFC 9110: delay-seconds, or an HTTP-date,
    a date past counting as 0), at most :data:`_RETRY_AFTER_BOUND`; ``None`` when there is none
    or it is neither (an agent's garbage asks for nothing)."""
    if value is None or len(value) > _RETRY_AFTER_CHARS:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return min(float(value), _RETRY_AFTER_BOUND)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, said without a zone
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), _RETRY_AFTER_BOUND)


def a2a_error(doc: object, *, jsonrpc: bool) -> tuple[int | str, str] | None:
    """``(code, message)`` when ``doc`` is an A2A error body, else ``None`` (R11).

    JSON-RPC: a 2.0 envelope whose error has an integer code (authoritative). REST: a google.rpc
    error whose ``ErrorInfo.reason`` names the A2A error; its ``code`` is the HTTP status, so the
    reason is mapped to the JSON-RPC code (an unknown reason is kept as the code, a string).
    """
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    message = message[:_MAX_DETAIL] if isinstance(message, str) else ""
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = None
    if jsonrpc and doc.get("jsonrpc") == "2.0" and code is not None:
        return code, message
    reason = _reason(error)
    if reason:
        known = A2AErrorCode.__members__.get(reason)
        return (int(known) if known is not None else reason[:_MAX_DETAIL]), message
    if code is not None and -32768 <= code <= -32000:  # a JSON-RPC code in a REST error
        return code, message
    return None


def _reason(error: dict[str, Any]) -> str:
    """The first ``ErrorInfo.reason`` in ``details`` (REST) or ``data`` (JSON-RPC)."""
    for key in ("details", "data"):
        entries = error.get(key)
        if isinstance(entries, dict):
            entries = [entries]
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("reason"), str):
                return str(entry["reason"])
    return ""


def answer_json(raw: bytes | None) -> object:
    """An answer body's JSON; ``None`` for an empty body or one that is not I-JSON."""
    if not raw:
        return None
    try:
        return loads(raw)
    except FieldError:
        return None


def with_auth(
    base: httpx.Headers, query: Mapping[str, str] | None, auth: RequestAuth | None
) -> tuple[httpx.Headers, dict[str, str] | None]:
    """The headers and query of one request with what ``auth`` adds (R15); a copy of ``base``."""
    headers = base.copy()
    if auth is None:
        return headers, None if query is None else dict(query)
    for name, value in auth.headers:
        headers[name] = value
    if auth.cookies:
        headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in auth.cookies)
    if not auth.params:
        return headers, None if query is None else dict(query)
    return headers, {**(query or {}), **dict(auth.params)}


def hiding(auth: RequestAuth | None, secrets: tuple[str, ...] = ()) -> Redaction:
    """What hides every secret one request carries: its credentials' and ``secrets``."""
    return redaction(secrets if auth is None else (*auth.secrets, *secrets))


def request_json(payload: Mapping[str, Any]) -> bytes:
    """A request body, as sent; :class:`UsageError` for one that is not JSON."""
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:  # e.g. metadata that is not JSON
        raise UsageError(f"request is not JSON-serialisable: {exc}") from None
