"""A2A requests to one agent interface, over an injected ``httpx.AsyncClient``.

One :class:`A2ATransport` per card :class:`Interface` (binding ``JSONRPC`` or ``HTTP+JSON``,
docs/wire.md), speaking the A2A version the interface declares: 1.0, where every request carries
``A2A-Version: 1.0`` (a 1.0 server refuses requests without it), or 0.3 (and 0.2), whose methods,
paths and shapes :mod:`engine.wire._v03` translates to and from 1.0's, so that every answer is read
into the same values whatever the version. Every request is bounded (R16) and its answer told
apart (R11: an A2A error, an endpoint not reached, an answer that is not valid) by
:mod:`engine.wire.exchange`, which also adds each request's credentials (R15); this module holds the
operations the engine uses and the event streams.

Event streams (:meth:`A2ATransport.subscribe`, :meth:`A2ATransport.send_streaming_message`) are
read with httpx-sse, bounded the same way: the answer that opens one within the timeout and the
deadline, each event within ``max_bytes``, each read within an idle timeout and the deadline; a
stream that ends early is a :class:`StreamDroppedError`, the caller's cue to poll (docs/wire.md).

Answers are parsed by :mod:`engine.wire.v10`; the transport keeps no state beyond the JSON-RPC id.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    aclosing,
    asynccontextmanager,
)
from dataclasses import replace
from typing import Any, Final
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, aconnect_sse

from cardfence.engine.auth.redaction import Redaction
from cardfence.engine.cards.spoken import JSONRPC
from cardfence.engine.core.answers import (
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    PushConfig,
    RemoteMessage,
    RemoteTask,
    StreamUpdate,
)
from cardfence.engine.core.messages import Message
from cardfence.engine.core.parts import Data, Part, Text, media_type_of
from cardfence.engine.errors import (
    EndpointUnreachableError,
    InvalidAgentResponseError,
    MessageTooLargeError,
    OperationUnsupportedError,
    RemoteRefusedError,
    StreamDroppedError,
    UsageError,
    WrongTaskAnswerError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import BodyRefused, read_body
from cardfence.engine.http.pool import REPLAYABLE
from cardfence.engine.wire._event_stream import EVENT_STREAM, BoundedEvents
from cardfence.engine.wire.exchange import (
    READS,
    Exchange,
    a2a_error,
    answer_json,
    hiding,
    request_json,
    with_auth,
)
from cardfence.engine.wire.v10 import (
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
    parse_task_page,
)

__all__ = [
    "A2ATransport",
    "check_message_size",
    "message_params",
    "part_json",
]

# After one of these a stream has nothing more to say about its task (a2a-sdk stops there too).
_FINAL_STATES: Final = TERMINAL_STATES | INTERRUPTED_STATES


class A2ATransport(Exchange):
    """The A2A operations the engine uses, on one interface of one agent.

    ``headers`` are sent with every request; ``A2A-Version`` (1.0 only) and ``Content-Type``
    are always ours. :attr:`version` is what is spoken: 0.3 when the interface declares 0.x
    (or is of a 0.x card that declares nothing), else 1.0. ``credentials`` add what the task's
    frozen contract requires, per request (R15). ``timeout`` bounds each request as a whole, a
    blocking ``SendMessage`` included. ``max_pages`` bounds ``list_tasks``. ``slots``, when given,
    bounds the requests in flight (streams aside) across every transport sharing it.
    """

    # --- operations ---------------------------------------------------------------------------

    async def send_message(
        self,
        *,
        text: str | None = None,
        message_id: str,
        context_id: str | None,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        return_immediately: bool = True,
        push_config: PushConfig | None = None,
        media_type: str = "text/plain",
        message: Message | None = None,
    ) -> RemoteTask | RemoteMessage:
        """SendMessage from the user: ``message`` (its parts, metadata, references, accepted
        output modes), or one ``text`` part of ``media_type``. ``metadata`` is sent over the
        message's own (the skill the engine asks for: ``skillId``).

        With ``task_id`` the ``context_id`` is required: a2a-sdk 1.3 would otherwise mint a new
        context for the reply and every later update (docs/wire.md).
        """
        params = message_params(
            _message_of(message, text, media_type),
            message_id=message_id,
            context_id=context_id,
            task_id=task_id,
            metadata=metadata,
            return_immediately=return_immediately,
            push_config=push_config,
        )
        url, result = await self._call(
            "SendMessage",
            params,
            "POST",
            "/message:send",
            body=params,
            task=task_id or "",
            secrets=push_config.secrets if push_config is not None else (),
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
        """CreateTaskPushNotificationConfig; returns the config as the agent stored it, with the
        token and credentials it repeats hidden (``***``) as every secret in an answer is."""
        body = config.to_json()
        url, result = await self._call(
            "CreateTaskPushNotificationConfig",
            {"taskId": task_id, **body},
            "POST",
            f"/tasks/{_segment(task_id)}/pushNotificationConfigs",
            body=body,
            task=task_id,
            secrets=config.secrets,  # an agent may answer with the config it stored, token and all
        )
        return parse_push_config(self._answer("push_config", result), url=url)

    async def list_tasks(
        self, *, context_id: str, page_size: int = 50, history_length: int | None = None
    ) -> tuple[RemoteTask, ...]:
        """ListTasks of one context, following ``nextPageToken`` for at most ``max_pages`` pages
        (a deliberate bound: what lies beyond is not returned). ``history_length``, when given,
        asks for at most that many messages of each task's history (none asked: the agent's
        default).

        A2A 0.3 has no ListTasks: :class:`OperationUnsupportedError`, nothing sent.
        """
        if self.legacy:
            raise OperationUnsupportedError(self.interface.url, "ListTasks", version=self.version)
        tasks: list[RemoteTask] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(self.max_pages):
            params: dict[str, Any] = {"contextId": context_id, "pageSize": page_size}
            if history_length is not None:
                params["historyLength"] = history_length
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
        text: str | None = None,
        message_id: str,
        context_id: str | None,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idle_timeout: float | None = None,
        media_type: str = "text/plain",
        message: Message | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamUpdate]]:
        """SendStreamingMessage: :meth:`send_message`, answered by an event stream.

        Used as :meth:`subscribe` is, with the same errors. Entering sends the message. The
        first event names the task (a new one: a2a-sdk sends it ``submitted``); every later
        one must be about it, and with ``task_id`` (a reply), every one must be about that
        task. A bare message is the whole answer: the agent made no task.
        """
        params = message_params(
            _message_of(message, text, media_type),
            message_id=message_id,
            context_id=context_id,
            task_id=task_id,
            metadata=metadata,
            return_immediately=False,
            push_config=None,
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
            url, content, verb = self.interface.url, request_json(envelope), "POST"
        else:
            url = self.interface.url.rstrip("/") + path
            if body is not None:
                content = request_json(body)
        budget = deadline.left(self.timeout)
        if budget <= 0:
            detail = "timeout: the deadline passed before the request could be sent (not sent)"
            raise EndpointUnreachableError(url, detail, task=task)
        # The opening answer is bounded by ``budget`` (asyncio.timeout below); each read of the
        # stream after it by ``idle`` and the deadline (BoundedEvents). httpx's own read timeout
        # is only a backstop behind both.
        timeout = httpx.Timeout(budget, connect=min(budget, 10.0), read=max(budget, idle))
        auth = await self.credentials.prepare() if self.credentials is not None else None
        headers, query = with_auth(self._headers, None, auth)
        hide = hiding(auth)
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
                            extensions={REPLAYABLE: True} if method in READS else None,
                        )
                    )
                    await self._open(source.response, url, method, request_id, task, hide)
            except (TimeoutError, httpx.TimeoutException):
                cut = "" if budget == self.timeout else " (the deadline)"
                detail = f"timeout: the event stream did not open within {budget:.3g}s{cut}"
                raise EndpointUnreachableError(url, detail, task=task) from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                detail = hide.text(f"network error: {str(exc) or type(exc).__name__}")
                raise EndpointUnreachableError(url, detail, task=task) from None
            updates = self._updates(
                source.response, url, request_id, task=task, idle=idle, operation=method, hide=hide
            )
            async with aclosing(updates):
                yield updates

    async def _open(
        self,
        response: httpx.Response,
        url: str,
        method: str,
        request_id: int | None,
        task: str,
        hide: Redaction,
    ) -> None:
        """Returns when ``response`` opens an event stream; raises the error it is otherwise
        (read with the request's secrets hidden: ``hide``)."""
        status = response.status_code
        ok = 200 <= status < 300
        media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if ok and media_type == EVENT_STREAM:
            return
        try:
            raw: bytes | None = hide.body(await read_body(response, self.max_bytes))
        except BodyRefused:
            raw = None  # no A2A error to read in it
        jsonrpc = self.binding == JSONRPC
        if not ok:
            raise self._failure(url, status, raw, task, method, response.headers.get("retry-after"))
        # JSON-RPC refuses with HTTP 200 and a JSON error object, a stream's opening too.
        refused = a2a_error(answer_json(raw), jsonrpc=True) if jsonrpc else None
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
        hide: Redaction,
    ) -> AsyncGenerator[StreamUpdate, None]:
        """The stream's updates, until a final one (see :meth:`subscribe`); each event read with
        the request's secrets hidden (``hide``)."""
        body = BoundedEvents(response, self.max_bytes, idle, url, task)
        expected = task or None  # SendStreamingMessage: the first event names the task
        events = EventSource(body.as_response()).aiter_sse()
        async with aclosing(events):
            async for event in events:
                if event.event not in ("message", "error") or not event.data:
                    continue  # another event type, or no data: not an A2A event (SSE ignores it)
                raw = hide.body(event.data.encode())
                if len(raw) > self.max_bytes:
                    raise InvalidAgentResponseError(
                        url,
                        f"stream event over the limit of {self.max_bytes} bytes ({len(raw)}); "
                        "the stream was closed",
                    )
                update = replace(
                    self._stream_update(url, raw, request_id, task, operation), size=len(raw)
                )
                if event.event == "error":
                    raise InvalidAgentResponseError(url, "an error event that is not an A2A error")
                if update.task_id is not None:
                    if expected is None:
                        expected = body.task = update.task_id  # a drop from here names it
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
        refused = a2a_error(doc, jsonrpc=False)
        if refused is not None:
            code, message = refused
            raise RemoteRefusedError(url, code, message, task=task)
        return parse_stream_response(self._answer("stream", doc), url=url)


def _segment(task_id: str) -> str:
    return quote(task_id, safe="")


def _same_task(url: str, task_id: str, task: RemoteTask) -> RemoteTask:
    """An answer about another task must not be observed as this one's (R12)."""
    if task.id != task_id:
        raise WrongTaskAnswerError(url, task_id, task.id, task.state)
    return task


def _message_of(message: Message | None, text: str | None, media_type: str) -> Message:
    if message is not None:
        return message
    if text is None:
        raise UsageError("a message needs its parts (or a text)")
    return Message(parts=(Text(text, media_type),))


def message_params(
    message: Message,
    *,
    message_id: str,
    context_id: str | None,
    task_id: str | None,
    metadata: Mapping[str, Any] | None,
    return_immediately: bool,
    push_config: PushConfig | None,
) -> dict[str, Any]:
    """A 1.0 SendMessageRequest (its JSON-RPC params) from the user, carrying ``message``; its
    metadata with ``metadata`` over it. What the engine's bound on a message measures
    (:func:`check_message_size`)."""
    out: dict[str, Any] = {
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [part_json(part) for part in message.parts],
    }
    if context_id:
        out["contextId"] = context_id
    if task_id:
        if not context_id:
            raise UsageError(f"task {task_id}: a follow-up message needs its context id")
        out["taskId"] = task_id
    sent = {**(message.metadata or {}), **(metadata or {})}
    if sent:
        out["metadata"] = sent
    if message.references:
        out["referenceTaskIds"] = list(message.references)
    params: dict[str, Any] = {"message": out}
    configuration: dict[str, Any] = {}
    if message.accepted_output_modes:
        configuration["acceptedOutputModes"] = list(message.accepted_output_modes)
    if return_immediately:
        configuration["returnImmediately"] = True
    if push_config is not None:
        configuration["taskPushNotificationConfig"] = push_config.to_json()
    if configuration:
        params["configuration"] = configuration
    return params


def part_json(part: Part) -> dict[str, Any]:
    """One part as A2A 1.0 sends it: ``{"text"}``, ``{"raw"}`` (base64), ``{"url"}`` or
    ``{"data"}``, with its ``mediaType`` (and a file's ``filename``)."""
    out: dict[str, Any]
    if isinstance(part, Text):
        out = {"text": part.text}
    elif isinstance(part, Data):
        out = {"data": part.data}
    else:
        if part.data is not None:
            out = {"raw": base64.b64encode(part.data).decode("ascii")}
        else:
            out = {"url": part.url}
        if part.filename:
            out["filename"] = part.filename
    out["mediaType"] = media_type_of(part)
    return out


def check_message_size(
    message: Message,
    bound: int,
    *,
    message_id: str,
    context_id: str,
    task_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """:class:`MessageTooLargeError` when ``message``'s encoded request params are over
    ``bound`` bytes (the engine's ``max_message_bytes``); nothing is recorded or sent then."""
    params = message_params(
        message,
        message_id=message_id,
        context_id=context_id,
        task_id=task_id,
        metadata=metadata,
        return_immediately=True,
        push_config=None,
    )
    size = len(request_json(params))
    if size > bound:
        raise MessageTooLargeError(size, bound)
