"""An event stream's body read within its bounds (engine/wire/_event_stream.py), from a raw HTTP
server on
127.0.0.1 that sends exactly the bytes, pauses and breaks each test scripts.

What a followed task relies on: events split anywhere arrive whole; no event grows past the
answer limit in memory, while keep-alive comments never add up to one; a silent or a too-slow
stream is dropped with its reason; a stream cut or closed early says how it ended, and the events
before the break still stand.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Literal

import httpx
import pytest
from httpx_sse import EventSource
from support.hostile import Reply, RoutedServer, sse

from cardfence.engine.errors import InvalidAgentResponseError, StreamDroppedError
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import PIECE, BodyRefused, BoundedDecoder
from cardfence.engine.wire._event_stream import EVENT_STREAM, BoundedEvents

PATH = "/stream"
TASK = "t-stream"
SLACK = 2 * PIECE  # how far past the limit an unfinished event may be read before it is refused


def _stream(
    server: RoutedServer,
    chunks: Iterable[bytes | float],
    *,
    end: Literal["done", "cut", "hang"] = "done",
    encoding: str | None = None,
) -> str:
    headers = {"Content-Type": EVENT_STREAM}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    server.routes[PATH] = Reply(chunks=list(chunks), end=end, headers=headers)
    return f"{server.url}{PATH}"


async def _open(
    client: httpx.AsyncClient, url: str, *, max_bytes: int = 1000, idle: float = 5.0
) -> AsyncIterator[BoundedEvents]:
    async with client.stream("GET", url) as response:
        yield BoundedEvents(response, max_bytes, idle, url, TASK)


async def _read(body: BoundedEvents, into: list[bytes] | None = None) -> bytes:
    read = [] if into is None else into
    async for piece in body:
        read.append(piece)
    return b"".join(read)


async def test_events_split_anywhere_arrive_whole_and_a_clean_close_says_closed(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    wire = sse('{"n": 1}') + sse('{"n": 2}', event="update")
    url = _stream(server, [wire[:3], wire[3:17], wire[17:]])
    async for body in _open(client, url):
        source = EventSource(body.as_response())
        got = [(event.event, event.data) async for event in source.aiter_sse()]
        assert got == [("message", '{"n": 1}'), ("update", '{"n": 2}')]
        assert body.ended() == ("closed", "the agent closed the stream before a final state")


async def test_the_body_is_handed_to_the_parser_as_utf8_event_stream_of_the_same_request(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [sse("x")])
    async for body in _open(client, url):
        response = body.as_response()
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.request.url == url


async def test_a_stream_closed_inside_an_event_is_cut_and_counts_the_unfinished_bytes(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [sse("whole"), b"data: half"])
    async for body in _open(client, url):
        assert await _read(body) == sse("whole") + b"data: half"
        assert body.ended() == ("cut", "the stream ended inside an event (10 bytes unfinished)")


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\r", b"\r\n\r\n"])
async def test_each_kind_of_blank_line_ends_an_event(
    server: RoutedServer, client: httpx.AsyncClient, blank: bytes
) -> None:
    url = _stream(server, [b"data: a" + blank])
    async for body in _open(client, url):
        await _read(body)
        assert body.ended()[0] == "closed"


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\r", b"\r\n\r\n"])
async def test_a_stream_that_begins_with_a_blank_line_has_nothing_unfinished(
    server: RoutedServer, client: httpx.AsyncClient, blank: bytes
) -> None:
    url = _stream(server, [blank])
    async for body in _open(client, url):
        assert await _read(body) == blank
        assert body.ended()[0] == "closed"


async def test_what_is_held_between_reads_to_find_a_split_blank_line_is_three_bytes(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [b"data: " + b"x" * 100, 0.05, b"y" * 100, 0.05, b"\n"])
    async for body in _open(client, url):
        async for _piece in body:
            assert len(body._tail) <= 3
        assert body.ended() == ("cut", "the stream ended inside an event (207 bytes unfinished)")


@pytest.mark.parametrize("split", [1, 2, 3])
async def test_a_blank_line_split_between_two_reads_still_ends_the_event(
    server: RoutedServer, client: httpx.AsyncClient, split: int
) -> None:
    event = b"data: a\r\n\r\n"
    url = _stream(server, [event[: len(event) - split], 0.05, event[len(event) - split :]])
    async for body in _open(client, url):
        await _read(body)
        assert body.ended()[0] == "closed"


async def test_an_event_at_the_limit_and_its_slack_is_read_and_one_byte_more_is_refused(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    limit = 100
    at_limit = b"data: " + b"a" * (limit + SLACK - 6)
    url = _stream(server, [at_limit, 0.05, b"\n\n"])
    async for body in _open(client, url, max_bytes=limit):
        assert await _read(body) == at_limit + b"\n\n"

    url = _stream(server, [at_limit, 0.05, b"a", 0.05, b"\n\n"])
    async for body in _open(client, url, max_bytes=limit):
        with pytest.raises(InvalidAgentResponseError) as caught:
            await _read(body)
        assert caught.value.url == url
        assert str(caught.value) == (
            f"{url}: invalid agent response: stream event over the limit of {limit} bytes "
            f"(stopped reading at {limit + SLACK + 1}); the stream was closed (nothing was changed)"
        )


async def test_keep_alive_comments_never_add_up_to_an_event_over_the_limit(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    comment = b": keep-alive " + b"." * 1000 + b"\n\n"
    count = (SLACK // len(comment)) * 3
    url = _stream(server, [comment] * count + [sse("done")])
    async for body in _open(client, url, max_bytes=10):
        assert len(await _read(body)) == count * len(comment) + len(sse("done"))


async def test_a_large_read_is_handed_out_in_pieces_of_at_most_piece_bytes(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    event = sse("b" * (3 * PIECE))
    url = _stream(server, [event])
    async for body in _open(client, url, max_bytes=4 * PIECE):
        pieces = [piece async for piece in body]
        assert b"".join(pieces) == event
        assert max(len(piece) for piece in pieces) <= PIECE
        assert len(pieces) >= 4


async def test_a_gzipped_stream_is_decoded_and_a_truncated_one_is_cut_after_its_events(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    wire = sse("one") + sse("two")
    packed = zlib.compress(wire, 9, wbits=31)
    async for body in _open(client, _stream(server, [packed], encoding="gzip")):
        assert await _read(body) == wire
        assert body.ended()[0] == "closed"

    url = _stream(server, [packed[:-8]], encoding="gzip")
    async for body in _open(client, url):
        assert await _read(body) == wire  # every event decoded before the end stands
        reason, detail = body.ended()
        assert reason == "cut"
        assert "gzip" in detail


async def test_an_encoding_it_cannot_decode_is_refused_before_any_read(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [sse("x")], encoding="br")
    async with client.stream("GET", url) as response:
        with pytest.raises(InvalidAgentResponseError) as caught:
            BoundedEvents(response, 1000, 5.0, url, TASK)
    assert str(caught.value).startswith(f"{url}: invalid agent response: ")
    assert "br" in str(caught.value)


async def test_a_corrupt_gzip_stream_is_refused_as_an_invalid_answer_saying_why(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    garbage = b"this is not gzip at all\n\n"
    with pytest.raises(BodyRefused) as refused:
        list(BoundedDecoder("gzip", 1 << 20).feed(garbage))
    url = _stream(server, [garbage], encoding="gzip")
    async for body in _open(client, url):
        with pytest.raises(InvalidAgentResponseError) as caught:
            await _read(body)
        assert str(caught.value) == (
            f"{url}: invalid agent response: {refused.value.detail} (nothing was changed)"
        )


async def test_a_silent_stream_is_dropped_as_idle_naming_the_task_and_the_wait(
    server: RoutedServer,
) -> None:
    url = _stream(server, [sse("first")], end="hang")
    # The client's own read timeout is far longer: the idle timeout is the stream's own.
    async with httpx.AsyncClient(timeout=60.0) as client:
        async for body in _open(client, url, idle=0.2):
            read: list[bytes] = []
            started = time.monotonic()
            with pytest.raises(StreamDroppedError) as caught:
                await _read(body, read)
            assert time.monotonic() - started < 30.0
            assert read == [sse("first")]
            assert (caught.value.reason, caught.value.detail) == ("idle", "no byte within 0.2s")
            assert caught.value.task == TASK
            assert caught.value.url == url


async def test_a_deadline_sooner_than_the_idle_timeout_drops_the_stream_as_deadline(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [], end="hang")
    async for body in _open(client, url, idle=30.0):
        with deadline.within(0.2), pytest.raises(StreamDroppedError) as caught:
            await _read(body)
        assert (caught.value.reason, caught.value.detail) == ("deadline", "the deadline passed")


async def test_a_deadline_already_passed_drops_the_stream_before_it_reads(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [sse("never read")])
    async for body in _open(client, url):
        with deadline.within(-1.0), pytest.raises(StreamDroppedError) as caught:
            await _read(body)
        assert (caught.value.reason, caught.value.detail) == ("deadline", "the deadline passed")


async def test_a_connection_broken_mid_stream_is_cut_and_the_events_before_it_stand(
    server: RoutedServer, client: httpx.AsyncClient
) -> None:
    url = _stream(server, [sse("before")], end="cut")
    async for body in _open(client, url):
        assert await _read(body) == sse("before")
        reason, detail = body.ended()
        assert reason == "cut"
        assert detail.startswith("network error: ")
        assert len(detail) <= len("network error: ") + 120


class _Breaking(httpx.AsyncByteStream):
    """A body that sends one event, then fails as a broken connection does, with ``message``
    (no real socket can be made to fail with a message chosen, or with none)."""

    def __init__(self, message: str) -> None:
        self.message = message

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield sse("before")
        raise httpx.ReadError(self.message)


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        ("x" * 200, "network error: " + "x" * 120),
        ("", "network error: ReadError"),
    ],
)
async def test_a_network_errors_detail_keeps_120_characters_or_names_the_error(
    message: str, detail: str
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": EVENT_STREAM}, stream=_Breaking(message)
        )

    url = "http://agent.test/stream"
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        async for body in _open(client, url):
            assert await _read(body) == sse("before")
            assert body.ended() == ("cut", detail)
