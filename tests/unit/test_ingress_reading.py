"""The webhook ingress reads a delivery's body only as far as it must: it stops as soon as the body
passes 256 KiB (``read_bounded``, and the ASGI app around it), and refuses from the head alone
(size announced, content type) without reading the body at all. No server, no store: the app's
engine is a stand-in that fails the test if a delivery ever reaches it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

from starlette.types import Message
from support.asgi import post_webhook

from cardfence.engine.client.engine import Engine
from cardfence.engine.serve.ingress import read_bounded, webhook_app
from cardfence.engine.wire.push import MAX_DELIVERY_BYTES

CHUNK = 64 * 1024
TEN_MEGABYTES = 10 * 1024 * 1024


class NoEngine:
    """What the app is given: reaching ``deliver`` means the body was not refused in time."""

    async def deliver(self, body: bytes, headers: dict[str, str]) -> Any:
        raise AssertionError(f"a body of {len(body)} bytes reached the engine")


class Drip:
    """An HTTP request body of ``total`` bytes in ``CHUNK``-byte ASGI messages, counting how many
    the app asked for."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.received = 0

    async def receive(self) -> Message:
        self.received += 1
        size = min(CHUNK, self.left)
        self.left -= size
        return {"type": "http.request", "body": b" " * size, "more_body": self.left > 0}


async def call_app(headers: list[tuple[bytes, bytes]], drip: Drip) -> tuple[int, dict[str, Any]]:
    app = webhook_app(cast(Engine, NoEngine()))
    status, _, answer = await post_webhook(app, headers, drip.receive)
    return status, answer


async def test_read_bounded_stops_reading_ten_megabytes_just_past_the_limit() -> None:
    consumed = 0
    closed = False

    async def ten_megabytes() -> AsyncGenerator[bytes, None]:
        nonlocal consumed, closed
        try:
            for _ in range(TEN_MEGABYTES // CHUNK):
                consumed += 1
                yield b" " * CHUNK
        finally:
            closed = True

    assert await read_bounded(ten_megabytes(), MAX_DELIVERY_BYTES) is None
    assert consumed == MAX_DELIVERY_BYTES // CHUNK + 1  # the chunk that passed the limit, no more
    assert closed  # the source is closed at once, not left to the garbage collector


async def test_read_bounded_keeps_a_body_of_exactly_the_limit_and_refuses_one_byte_more() -> None:
    async def body(total: int) -> AsyncGenerator[bytes, None]:
        while total > 0:
            size = min(CHUNK, total)
            total -= size
            yield b"x" * size

    kept = await read_bounded(body(MAX_DELIVERY_BYTES), MAX_DELIVERY_BYTES)
    assert kept is not None
    assert len(kept) == MAX_DELIVERY_BYTES
    assert await read_bounded(body(MAX_DELIVERY_BYTES + 1), MAX_DELIVERY_BYTES) is None


async def test_app_cuts_a_chunked_ten_megabyte_body_after_the_limit() -> None:
    drip = Drip(TEN_MEGABYTES)

    status, answer = await call_app([(b"content-type", b"application/json")], drip)

    assert (status, answer["outcome"]) == (413, "refused")
    assert drip.received == MAX_DELIVERY_BYTES // CHUNK + 1
    assert drip.left == TEN_MEGABYTES - drip.received * CHUNK


async def test_app_refuses_an_announced_oversize_body_without_reading_it() -> None:
    drip = Drip(TEN_MEGABYTES)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"10485760")]

    status, answer = await call_app(headers, drip)

    assert (status, answer["outcome"]) == (413, "refused")
    assert drip.received == 0


async def test_app_refuses_a_content_type_other_than_json_without_reading_the_body() -> None:
    drip = Drip(1024)

    status, answer = await call_app([(b"content-type", b"text/plain")], drip)

    assert (status, answer["outcome"]) == (415, "refused")
    assert drip.received == 0
