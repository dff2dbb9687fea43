"""An A2A event stream's body, read within its bounds (R16), as httpx-sse reads it.

:class:`BoundedEvents` stands between the HTTP response of ``SubscribeToTask`` or
``SendStreamingMessage`` and httpx-sse's parser (:mod:`engine.wire.transport` puts it there):
content
decoded here (:class:`~cardfence.engine.http.bodies.BoundedDecoder`), every read within the idle
timeout and the deadline in force (:mod:`engine.http.deadline`), and no event larger than the answer
limit held. A stream that ends early says why (:meth:`BoundedEvents.ended`), for the
:class:`~cardfence.engine.errors.StreamDroppedError` the transport raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Final

import httpx

from cardfence.engine.errors import InvalidAgentResponseError, StreamDroppedError
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import PIECE, BodyRefused, BoundedDecoder

__all__ = ["EVENT_STREAM", "BoundedEvents"]

EVENT_STREAM: Final = "text/event-stream"
# Once more than this has come in without completing an event, reading stops (memory bound): the
# event is over ``max_bytes`` already, or all but a piece of it, framing ("data: ", line ends)
# included.
_EVENT_SLACK: Final = 2 * PIECE
# An event ends at a blank line, whichever of the three SSE line ends it uses ("\r\n\r\n" ends
# in "\n\r\n").
_BLANK_LINES: Final = (b"\n\n", b"\r\r", b"\n\r\n")
_NO_TOTAL: Final = 1 << 62  # a stream has no total size limit: its events have one each


class BoundedEvents(httpx.AsyncByteStream):
    """The body of an event stream, as httpx-sse reads it: content-decoded here (one encoding
    at most, :class:`BoundedDecoder`), in pieces of at most :data:`PIECE` bytes, each read
    within the idle timeout and the deadline in force, and never more than ``max_bytes`` plus
    :data:`_EVENT_SLACK` since the last blank line: httpx-sse holds an event whole until the
    blank line that ends it, so this is what bounds its memory. (The blank lines are only
    counted here, not parsed: keep-alive comments end in one too, so they never add up.)
    """

    def __init__(
        self, response: httpx.Response, max_bytes: int, idle: float, url: str, task: str
    ) -> None:
        self._response = response
        self._limit = max_bytes + _EVENT_SLACK
        self._idle = idle
        self._url = url
        # The task the stream is about, named in a drop: the reader sets it when a stream that
        # was opened about no task yet (SendStreamingMessage) names one in its first event.
        self.task = task
        self._pending = 0  # bytes since the last blank line (the end of an event, or a comment)
        self._tail = b""  # the last bytes read, for a blank line split between two pieces
        self._cut = ""  # why the body ended early, when it did
        try:
            self._decoder = BoundedDecoder(response.headers.get("content-encoding"), _NO_TOTAL)
        except BodyRefused as refused:
            raise InvalidAgentResponseError(url, refused.detail) from None

    def as_response(self) -> httpx.Response:
        """A response made of this body, for :class:`EventSource`; SSE is UTF-8, always."""
        headers = {"content-type": f"{EVENT_STREAM}; charset=utf-8"}
        return httpx.Response(200, headers=headers, stream=self, request=self._response.request)

    def _count(self, piece: bytes) -> None:
        """Move :attr:`_pending` past ``piece``: to the bytes after its last blank line."""
        window = self._tail + piece
        ends = [at + len(blank) for blank in _BLANK_LINES if (at := window.rfind(blank)) >= 0]
        if ends:
            self._pending = len(window) - max(ends)
        else:
            self._pending += len(piece)
        self._tail = window[-3:]

    def ended(self) -> tuple[str, str]:
        """``(reason, detail)`` of a stream that ended before a final update."""
        if self._cut:
            return "cut", self._cut
        if self._pending:
            detail = f"the stream ended inside an event ({self._pending} bytes unfinished)"
            return "cut", detail
        return "closed", "the agent closed the stream before a final state"

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._response.aiter_raw()  # as they come: aiter_raw(n) would wait for n
        while True:
            wait = deadline.left(self._idle)
            if wait <= 0:
                raise self._dropped("deadline", "the deadline passed")
            try:
                async with asyncio.timeout(wait):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except (TimeoutError, httpx.TimeoutException):
                if wait < self._idle:
                    raise self._dropped("deadline", "the deadline passed") from None
                raise self._dropped("idle", f"no byte within {self._idle:.3g}s") from None
            except httpx.HTTPError as exc:
                self._cut = f"network error: {str(exc)[:120] or type(exc).__name__}"
                return  # the events before the break stand; _updates raises, after them
            pieces = self._pieces(chunk)  # lazily: a small chunk may decode to a lot
            while True:
                try:
                    piece = next(pieces)
                except StopIteration:
                    break
                except BodyRefused as refused:
                    raise InvalidAgentResponseError(self._url, refused.detail) from None
                self._count(piece)
                if self._pending > self._limit:
                    raise InvalidAgentResponseError(
                        self._url,
                        f"stream event over the limit of {self._limit - _EVENT_SLACK} bytes "
                        f"(stopped reading at {self._pending}); the stream was closed",
                    )
                yield piece
        try:
            for piece in self._decoder.flush():
                yield piece
        except BodyRefused as refused:
            self._cut = refused.detail

    def _pieces(self, chunk: bytes) -> Iterator[bytes]:
        for start in range(0, len(chunk), PIECE):
            yield from self._decoder.feed(chunk[start : start + PIECE])

    def _dropped(self, reason: str, detail: str) -> StreamDroppedError:
        return StreamDroppedError(self._url, reason, detail, task=self.task)
