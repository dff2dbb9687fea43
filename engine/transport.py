"""A2A requests to one agent interface, over an injected ``httpx.AsyncClient``.

One :class:`A2ATransport` per card :class:`Interface` (binding ``JSONRPC`` or ``HTTP+JSON``,
docs/wire.md), speaking the A2A version the interface declares: 1.0, where every request carries
``A2A-Version: 1.0`` (a 1.0 server refuses requests without it), or 0.3 (and 0.2), whose methods,
paths and shapes :mod:`engine.wire03` translates to and from 1.0's, so that every answer is read
into the same values whatever the version. Every request is bounded (R16): each request ends
within its timeout and by the deadline in force (:mod:`engine.deadline`), and its body is capped
once decoded, while it streams in (:mod:`engine.bodies`). What comes back is told apart (R11):

- an A2A error (a JSON-RPC ``error`` object, or a REST error whose google.rpc ``ErrorInfo`` names a
  ``reason``; 0.3: :func:`engine.wire03.rest_error`) -> :class:`RemoteRefusedError` with the
  JSON-RPC code (:class:`A2AErrorCode`); :class:`ProtocolMismatchError` when the error says the
  endpoint speaks another version than its card's (-32601 to a JSON-RPC method, -32009, or a
  1.0-only error body from an interface declared 0.3);
- HTTP 404 *without* such a body (a route that is not there), any other non-2xx without one, a
  network error or a timeout -> :class:`EndpointUnreachableError`: the endpoint could not be
  reached as an A2A agent, which changes nothing and prompts an R9 check — never TaskNotFound;
- a 2xx that is not valid JSON, not the expected shape, over the size cap, or a JSON-RPC envelope
  with a wrong id or without result/error, or whose content encoding is refused (stacked,
  unknown or corrupt) -> :class:`InvalidAgentResponseError`.

Event streams (:meth:`A2ATransport.subscribe`, :meth:`A2ATransport.send_streaming_message`) are
read with httpx-sse, bounded the same way: the answer that opens one within the timeout and the
deadline, each event within ``max_bytes``, each read within an idle timeout and the deadline; a
stream that ends early is a :class:`StreamDroppedError`, the caller's cue to poll (docs/wire.md).

Credentials (R15): a transport made with ``credentials`` asks them for what each request must
carry (headers, query parameters, cookies) just before sending it, so tokens are fresh and
``env:`` values are read at use; a 401/403 is retried once with refreshed credentials when a
token is involved, then raised as :class:`AuthorizationFailedError`. Error messages never show
what the credentials added (a query-string API key included): it is redacted.

Answers are parsed by :mod:`engine.remote`; the transport keeps no state beyond the JSON-RPC id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    aclosing,
    asynccontextmanager,
    nullcontext,
)
from enum import IntEnum
from typing import Any, Final, Protocol
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, aconnect_sse

from cardfence.engine import deadline, wire03
from cardfence.engine.bodies import ACCEPT_ENCODING, BodyRefused, read_body
from cardfence.engine.cards.model import HTTP_JSON, JSONRPC, V03, V10, Interface
from cardfence.engine.credentials import RequestAuth, redact
from cardfence.engine.errors import (
    AuthorizationFailedError,
    EndpointUnreachableError,
    InvalidAgentResponseError,
    OperationUnsupportedError,
    ProtocolMismatchError,
    RemoteRefusedError,
    StreamDroppedError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.eventstream import EVENT_STREAM, BoundedEvents
from cardfence.engine.pool import RequestSlots
from cardfence.engine.remote import (
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    PushConfig,
    RemoteMessage,
    RemoteTask,
    StreamUpdate,
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
    parse_task_page,
)
from cardfence.engine.remote import loads as remote_loads

__all__ = [
    "A2A_VERSION",
    "DEFAULT_MAX_BYTES",
    "A2AErrorCode",
    "A2ATransport",
    "RequestCredentials",
]

A2A_VERSION: Final = "1.0"
DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024
_USER_AGENT: Final = "cardfence/0.1"
_MAX_DETAIL: Final = 200  # characters of a remote error message kept in ours
# After one of these a stream has nothing more to say about its task (a2a-sdk stops there too).
_FINAL_STATES: Final = TERMINAL_STATES | INTERRUPTED_STATES


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
    :class:`cardfence.engine.authorization.TaskCredentials` is one."""

    @property
    def schemes(self) -> tuple[str, ...]: ...

    @property
    def refreshable(self) -> bool: ...

    async def prepare(self, *, refresh: bool = False) -> RequestAuth: ...


_REFUSED_AUTH: Final = (401, 403)


class A2ATransport:
    """The A2A operations the engine uses, on one interface of one agent.

    ``headers`` are sent with every request; ``A2A-Version`` (1.0 only) and ``Content-Type``
    are always ours. :attr:`version` is what is spoken: 0.3 when the interface declares 0.x
    (or is of a 0.x card that declares nothing), else 1.0. ``credentials`` add what the task's
    frozen contract requires, per request (R15). ``timeout`` bounds each request as a whole, a
    blocking ``SendMessage`` included. ``max_pages`` bounds ``list_tasks``. ``slots``, when given,
    bounds the requests in flight (streams aside) across every transport sharing it.
    """

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
        self._headers.setdefault("User-Agent", _USER_AGENT)
        self._ids = itertools.count(1)
        self.credentials = credentials
        self._slots = slots

    @property
    def binding(self) -> str:
        return self.interface.binding

    # --- operations ---------------------------------------------------------------------------

    async def send_message(
        self,
        *,
        text: str,
        message_id: str,
        context_id: str | None,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        return_immediately: bool = True,
        push_config: PushConfig | None = None,
        media_type: str = "text/plain",
    ) -> RemoteTask | RemoteMessage:
        """SendMessage with one text part from the user.

        With ``task_id`` the ``context_id`` is required: a2a-sdk 1.3 would otherwise mint a new
        context for the reply and every later update (docs/wire.md).
        """
        params = _message_params(
            text=text,
            message_id=message_id,
            context_id=context_id,
            task_id=task_id,
            metadata=metadata,
            return_immediately=return_immediately,
            push_config=push_config,
            media_type=media_type,
        )
        url, result = await self._call(
            "SendMessage", params, "POST", "/message:send", body=params, task=task_id or ""
        )
        answer = parse_send_response(self._answer("send", result), url=url)
        if task_id and isinstance(answer, RemoteTask):
            _same_task(url, task_id, answer)
        return answer

    async def get_task(self, task_id: str, *, history_length: int = 0) -> RemoteTask:
        """GetTask; ``history_length`` 0 leaves the history out."""
        url, result = await self._call(
            "GetTask",
            {"id": task_id, "historyLength": history_length},
            "GET",
            f"/tasks/{_segment(task_id)}",
            query={"historyLength": str(history_length)},
            task=task_id,
        )
        return _same_task(url, task_id, parse_task(self._answer("task", result), url=url))

    async def cancel_task(self, task_id: str) -> RemoteTask:
        """CancelTask; the answer's state is what the remote says, not necessarily ``canceled``."""
        url, result = await self._call(
            "CancelTask",
            {"id": task_id},
            "POST",
            f"/tasks/{_segment(task_id)}:cancel",
            body={},
            task=task_id,
        )
        return _same_task(url, task_id, parse_task(self._answer("task", result), url=url))

    async def create_push_config(self, task_id: str, config: PushConfig) -> PushConfig:
        """CreateTaskPushNotificationConfig; returns the config as the agent stored it."""
        body = config.to_json()
        url, result = await self._call(
            "CreateTaskPushNotificationConfig",
            {"taskId": task_id, **body},
            "POST",
            f"/tasks/{_segment(task_id)}/pushNotificationConfigs",
            body=body,
            task=task_id,
        )
        return parse_push_config(self._answer("push_config", result), url=url)

    async def list_tasks(self, *, context_id: str, page_size: int = 50) -> tuple[RemoteTask, ...]:
        """ListTasks of one context, following ``nextPageToken`` for at most ``max_pages`` pages
        (a deliberate bound: what lies beyond is not returned).

        A2A 0.3 has no ListTasks: :class:`OperationUnsupportedError`, nothing sent.
        """
        if self.legacy:
            raise OperationUnsupportedError(self.interface.url, "ListTasks", version=self.version)
        tasks: list[RemoteTask] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(self.max_pages):
            params: dict[str, Any] = {"contextId": context_id, "pageSize": page_size}
            if token:
                params["pageToken"] = token
            url, result = await self._call(
                "ListTasks",
                params,
                "GET",
                "/tasks",
                query={k: str(v) for k, v in params.items()},
            )
            page, token = parse_task_page(result, url=url)
            tasks.extend(page)
            if token is None:
                break
            if token in seen:
                raise InvalidAgentResponseError(url, f"nextPageToken {token[:40]!r} repeats")
            seen.add(token)
        return tuple(tasks)

    async def get_extended_card(self) -> bytes:
        """GetExtendedAgentCard: the authenticated extended Agent Card, as the JSON bytes of the
        card object (JSON-RPC: its ``result``; HTTP+JSON: ``GET {url}/extendedAgentCard``; 0.3:
        ``agent/getAuthenticatedExtendedCard``, ``GET {url}/v1/card``),
        re-encoded with sorted keys. Parse them with
        :func:`cardfence.engine.cards.model.parse_card`: nothing is validated here but that the
        answer is a JSON object within ``max_bytes``.

        Raises as any request does: :class:`RemoteRefusedError` for an A2A error (-32007
        ExtendedAgentCardNotConfigured, -32004 when the agent offers no extended card),
        :class:`AuthorizationFailedError` on a 401/403 without one,
        :class:`EndpointUnreachableError`, :class:`InvalidAgentResponseError`.
        """
        url, result = await self._call("GetExtendedAgentCard", {}, "GET", "/extendedAgentCard")
        if not isinstance(result, dict):
            raise InvalidAgentResponseError(url, "the extended Agent Card is not a JSON object")
        encoded = json.dumps(result, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return encoded.encode()

    # --- event streams --------------------------------------------------------------------------

    def subscribe(
        self, task_id: str, *, idle_timeout: float | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamUpdate]]:
        """SubscribeToTask: the task's updates as they happen, over one event stream.

        An async context manager; entering it opens the stream, iterating what it gives reads
        it, leaving it closes it (a ``break`` included)::

            try:
                async with transport.subscribe(task_id, idle_timeout=60) as updates:
                    async for update in updates:
                        observe(from_update(update, "stream"))
            except StreamDroppedError:  # before EndpointUnreachableError, its base
                ...  # poll, and subscribe again while the task is live
            except RemoteRefusedError as refused:
                ...  # -32001 TASK_NOT_FOUND; -32004 UNSUPPORTED_OPERATION: already terminal

        Entering raises what a request raises (:meth:`get_task`): :class:`RemoteRefusedError`
        for an A2A error (an unknown task, a terminal one, which a2a-sdk refuses to stream),
        :class:`ProtocolMismatchError` for a -32601, :class:`EndpointUnreachableError` when
        the stream cannot be opened within ``timeout`` and the deadline in force, or the answer
        is a non-2xx without an A2A error; :class:`InvalidAgentResponseError` for a 2xx that is
        not ``text/event-stream``.

        Iterating yields one :class:`StreamUpdate` per event, in order: the first is the task as
        it stands (a2a-sdk sends it; A2A requires it), then its status and artifact updates. The
        iteration ends normally only after an update that is final -- a terminal or interrupted
        state, or a bare message -- and stops reading there: a2a-sdk keeps the stream of a task
        waiting for input open. Every other end raises:

        - :class:`StreamDroppedError` (``reason`` ``cut``, ``closed``, ``idle``, ``deadline``)
          when the stream ends before a final update: the connection broke or was closed, no
          byte came within ``idle_timeout`` (default: ``timeout``; keep-alive comments count,
          a2a-sdk sends one every 15 s), or the deadline in force passed (the deadline bounds
          the whole stream, as it bounds every request);
        - :class:`WrongTaskAnswerError` for an event about another task: nothing of it is
          yielded;
        - :class:`InvalidAgentResponseError` for an event over ``max_bytes`` (reading stops at
          most two pieces of 64 KiB past it) or one that is not a valid ``StreamResponse``;
        - :class:`RemoteRefusedError` for an A2A error sent as an event (``event: error``).
        """
        return self._stream(
            "SubscribeToTask",
            {"id": task_id},
            "GET",
            f"/tasks/{_segment(task_id)}:subscribe",
            body=None,
            task=task_id,
            idle_timeout=idle_timeout,
        )

    def send_streaming_message(
        self,
        *,
        text: str,
        message_id: str,
        context_id: str | None,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idle_timeout: float | None = None,
        media_type: str = "text/plain",
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamUpdate]]:
        """SendStreamingMessage: :meth:`send_message`, answered by an event stream.

        Used as :meth:`subscribe` is, with the same errors. Entering sends the message. The
        first event names the task (a new one: a2a-sdk sends it ``submitted``); every later
        one must be about it, and with ``task_id`` (a reply), every one must be about that
        task. A bare message is the whole answer: the agent made no task.
        """
        params = _message_params(
            text=text,
            message_id=message_id,
            context_id=context_id,
            task_id=task_id,
            metadata=metadata,
            return_immediately=False,
            push_config=None,
            media_type=media_type,
        )
        return self._stream(
            "SendStreamingMessage",
            params,
            "POST",
            "/message:stream",
            body=params,
            task=task_id or "",
            idle_timeout=idle_timeout,
        )

    @asynccontextmanager
    async def _stream(
        self,
        method: str,
        params: dict[str, Any],
        verb: str,
        path: str,
        *,
        body: Mapping[str, Any] | None,
        task: str,
        idle_timeout: float | None,
    ) -> AsyncIterator[AsyncIterator[StreamUpdate]]:
        """Open one event stream; yields its updates (see :meth:`subscribe`)."""
        idle = self.timeout if idle_timeout is None else idle_timeout
        if idle <= 0:
            raise UsageError("idle_timeout must be positive")
        request_id: int | None = None
        content: bytes | None = None
        sent, params, path, body = self._dialect(method, params, path, body)
        if self.binding == JSONRPC:
            request_id = next(self._ids)
            envelope = {"jsonrpc": "2.0", "id": request_id, "method": sent, "params": params}
            url, content, verb = self.interface.url, _encode(envelope), "POST"
        else:
            url = self.interface.url.rstrip("/") + path
            if body is not None:
                content = _encode(body)
        budget = deadline.left(self.timeout)
        if budget <= 0:
            detail = "timeout: the deadline passed before the request could be sent (not sent)"
            raise EndpointUnreachableError(url, detail, task=task)
        # The opening answer is bounded by ``budget`` (asyncio.timeout below); each read of the
        # stream after it by ``idle`` and the deadline (BoundedEvents). httpx's own read timeout
        # is only a backstop behind both.
        timeout = httpx.Timeout(budget, connect=min(budget, 10.0), read=max(budget, idle))
        auth = await self.credentials.prepare() if self.credentials is not None else None
        headers, query = _with_auth(self._headers, None, auth)
        async with AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(budget):
                    source = await stack.enter_async_context(
                        aconnect_sse(
                            self.client,
                            verb,
                            url,
                            content=content,
                            params=query,
                            headers=headers,  # a copy: aconnect_sse sets Accept on it
                            timeout=timeout,
                            follow_redirects=False,
                        )
                    )
                    await self._open(source.response, url, method, request_id, task)
            except (TimeoutError, httpx.TimeoutException):
                cut = "" if budget == self.timeout else " (the deadline)"
                detail = f"timeout: the event stream did not open within {budget:.3g}s{cut}"
                raise EndpointUnreachableError(url, detail, task=task) from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                detail = _redacted(f"network error: {str(exc) or type(exc).__name__}", auth)
                raise EndpointUnreachableError(url, detail, task=task) from None
            updates = self._updates(
                source.response, url, request_id, task=task, idle=idle, operation=method
            )
            async with aclosing(updates):
                yield updates

    async def _open(
        self, response: httpx.Response, url: str, method: str, request_id: int | None, task: str
    ) -> None:
        """Returns when ``response`` opens an event stream; raises the error it is otherwise."""
        status = response.status_code
        ok = 200 <= status < 300
        media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if ok and media_type == EVENT_STREAM:
            return
        try:
            raw: bytes | None = await read_body(response, self.max_bytes)
        except BodyRefused:
            raw = None  # no A2A error to read in it
        jsonrpc = self.binding == JSONRPC
        if not ok:
            raise self._failure(url, status, raw, task, method)
        # JSON-RPC refuses with HTTP 200 and a JSON error object, a stream's opening too.
        refused = _a2a_error(_loads(raw), jsonrpc=True) if jsonrpc else None
        if refused is None:
            got = media_type[:60] or "no content type"
            detail = f"answered {got}, not an event stream (not read)"
            raise InvalidAgentResponseError(url, detail)
        raise self._refusal(url, *refused, task, method)

    async def _updates(
        self,
        response: httpx.Response,
        url: str,
        request_id: int | None,
        *,
        task: str,
        idle: float,
        operation: str,
    ) -> AsyncGenerator[StreamUpdate, None]:
        """The stream's updates, until a final one (see :meth:`subscribe`)."""
        body = BoundedEvents(response, self.max_bytes, idle, url, task)
        expected = task or None  # SendStreamingMessage: the first event names the task
        events = EventSource(body.as_response()).aiter_sse()
        async with aclosing(events):
            async for event in events:
                if event.event not in ("message", "error") or not event.data:
                    continue  # another event type, or no data: not an A2A event (SSE ignores it)
                raw = event.data.encode()
                if len(raw) > self.max_bytes:
                    raise InvalidAgentResponseError(
                        url,
                        f"stream event over the limit of {self.max_bytes} bytes ({len(raw)}); "
                        "the stream was closed",
                    )
                update = self._stream_update(url, raw, request_id, task, operation)
                if event.event == "error":
                    raise InvalidAgentResponseError(url, "an error event that is not an A2A error")
                if update.task_id is not None:
                    if expected is None:
                        expected = update.task_id
                    elif update.task_id != expected:
                        raise WrongTaskAnswerError(url, expected, update.task_id, update.state)
                yield update
                if update.kind == "message" or update.state in _FINAL_STATES:
                    return
        raise StreamDroppedError(url, *body.ended(), task=expected or "")

    def _stream_update(
        self, url: str, raw: bytes, request_id: int | None, task: str, operation: str
    ) -> StreamUpdate:
        """One event's data: a JSON-RPC response whose result is a StreamResponse, or (REST)
        the bare StreamResponse; an A2A error in either is raised as the agent's refusal."""
        if request_id is not None:
            result = self._jsonrpc_result(url, 200, raw, request_id, task, operation)
            return parse_stream_response(self._answer("stream", result), url=url)
        doc = self._decode(url, raw)
        refused = _a2a_error(doc, jsonrpc=False)
        if refused is not None:
            code, message = refused
            raise RemoteRefusedError(url, code, message, task=task)
        return parse_stream_response(self._answer("stream", doc), url=url)

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
    ) -> tuple[str, object]:
        """One operation on this binding; returns the URL asked and the decoded result.

        ``method``, ``params``, ``path`` and ``body`` are 1.0's; on a 0.3 interface they are
        translated here (:meth:`_dialect`), and the result by the caller (:meth:`_answer`).
        """
        operation = method
        method, params, path, body = self._dialect(method, params, path, body)
        if self.binding == JSONRPC:
            request_id = next(self._ids)
            envelope = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            url = self.interface.url
            status, raw = await self._exchange("POST", url, _encode(envelope), None, task)
            return url, self._jsonrpc_result(url, status, raw, request_id, task, operation)
        url = self.interface.url.rstrip("/") + path
        content = None if body is None else _encode(body)
        status, raw = await self._exchange(verb, url, content, query, task)
        if 200 <= status < 300:
            return url, self._decode(url, raw)
        raise self._failure(url, status, raw, task, operation)

    def _dialect(
        self, method: str, params: dict[str, Any], path: str, body: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any], str, Mapping[str, Any] | None]:
        """The request as this interface's version says it: 1.0's as it is, or its 0.3 form
        (:func:`engine.wire03.request`): method name, params, path and body."""
        if not self.legacy:
            return method, params, path, body
        rest = None if body is None else wire03.request(method, params, rest=True)
        return (
            wire03.METHODS.get(method, method),
            wire03.request(method, params, rest=False),
            wire03.rest_path(path),
            rest,
        )

    def _answer(self, kind: wire03.Answer, result: object) -> object:
        """A result in the shape :mod:`engine.remote` reads: 0.3's translated to 1.0's."""
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
    ) -> tuple[int, bytes | None]:
        """Status and body; the body is ``None`` when it is over ``max_bytes`` once decoded, or
        when the body of a non-2xx cannot be decoded (R16).

        With credentials, a 401/403 is asked once more with refreshed ones when a token is
        involved (R15: the token may have expired early or been revoked and reissued).
        """
        credentials = self.credentials
        if credentials is None:
            return await self._exchange_once(verb, url, content, query, task, None)
        auth = await credentials.prepare()
        status, body = await self._exchange_once(verb, url, content, query, task, auth)
        if status in _REFUSED_AUTH and credentials.refreshable:
            auth = await credentials.prepare(refresh=True)
            status, body = await self._exchange_once(verb, url, content, query, task, auth)
        return status, body

    async def _exchange_once(
        self,
        verb: str,
        url: str,
        content: bytes | None,
        query: Mapping[str, str] | None,
        task: str,
        auth: RequestAuth | None,
    ) -> tuple[int, bytes | None]:
        """One request, with ``auth`` added. The whole exchange, body included, ends within
        ``timeout`` and by the deadline in force (:mod:`engine.deadline`): a body that drips is
        cut there."""
        headers, query = _with_auth(self._headers, query, auth)
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
                ) as response:
                    try:
                        body = await read_body(response, self.max_bytes)
                    except BodyRefused as refused:
                        ok = 200 <= response.status_code < 300
                        if ok and refused.kind != "too_large":
                            raise InvalidAgentResponseError(url, refused.detail) from None
                        return response.status_code, None  # no body (R11: no A2A error)
                    return response.status_code, body
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
            detail = _redacted(f"network error: {str(exc) or type(exc).__name__}", auth)
            raise EndpointUnreachableError(url, detail, task=task) from None

    def _jsonrpc_result(
        self,
        url: str,
        status: int,
        raw: bytes | None,
        request_id: int,
        task: str,
        operation: str,
    ) -> object:
        if not 200 <= status < 300:
            raise self._failure(url, status, raw, task, operation)
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
        refused = _a2a_error(doc, jsonrpc=True)
        if refused is None:
            raise InvalidAgentResponseError(url, "JSON-RPC error needs an object with integer code")
        code, message = refused
        raise self._refusal(url, code, message, task, operation)

    def _failure(
        self, url: str, status: int, raw: bytes | None, task: str, operation: str
    ) -> Exception:
        """The error for a non-2xx answer: the agent's A2A error (or a protocol mismatch it
        shows), else unreachable (R11)."""
        doc = _loads(raw)
        jsonrpc = self.binding == JSONRPC
        refused = _a2a_error(doc, jsonrpc=jsonrpc)
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
        if status == 404:  # R11: a missing route, not a missing task
            detail = "HTTP 404 without an A2A error body: endpoint gone or moved"
        else:
            detail = f"HTTP {status} without an A2A error body"
        return EndpointUnreachableError(url, detail, task=task, status=status)

    def _decode(self, url: str, raw: bytes | None) -> object:
        if raw is None:
            raise InvalidAgentResponseError(url, f"body over the limit of {self.max_bytes} bytes")
        try:
            return remote_loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise InvalidAgentResponseError(url, f"body is not JSON ({str(exc)[:80]})") from None


def _a2a_error(doc: object, *, jsonrpc: bool) -> tuple[int | str, str] | None:
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


def _loads(raw: bytes | None) -> object:
    if not raw:
        return None
    try:
        return remote_loads(raw)
    except (ValueError, RecursionError):
        return None


def _with_auth(
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


def _redacted(text: str, auth: RequestAuth | None) -> str:
    return text if auth is None else redact(text, auth.secrets)


def _encode(payload: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:  # e.g. metadata that is not JSON
        raise UsageError(f"request is not JSON-serialisable: {exc}") from None


def _segment(task_id: str) -> str:
    return quote(task_id, safe="")


def _same_task(url: str, task_id: str, task: RemoteTask) -> RemoteTask:
    """An answer about another task must not be observed as this one's (R12)."""
    if task.id != task_id:
        raise WrongTaskAnswerError(url, task_id, task.id, task.state)
    return task


def _message_params(
    *,
    text: str,
    message_id: str,
    context_id: str | None,
    task_id: str | None,
    metadata: Mapping[str, Any] | None,
    return_immediately: bool,
    push_config: PushConfig | None,
    media_type: str,
) -> dict[str, Any]:
    """A SendMessageRequest with one text part from the user."""
    message: dict[str, Any] = {
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [{"text": text, "mediaType": media_type}],
    }
    if context_id:
        message["contextId"] = context_id
    if task_id:
        if not context_id:
            raise UsageError(f"task {task_id}: a follow-up message needs its context id")
        message["taskId"] = task_id
    if metadata:
        message["metadata"] = dict(metadata)
    params: dict[str, Any] = {"message": message}
    configuration: dict[str, Any] = {}
    if return_immediately:
        configuration["returnImmediately"] = True
    if push_config is not None:
        configuration["taskPushNotificationConfig"] = push_config.to_json()
    if configuration:
        params["configuration"] = configuration
    return params
