"""Remote bodies read within their bounds (R16): one content encoding at most, and at most
``max_bytes`` once decoded.

Every body cardfence reads from a remote — a card, an A2A answer — goes through
:func:`read_body`. The raw bytes are decoded here rather than by httpx, so the limit applies to the
*decoded* size while decoding: a compression bomb stops one byte past the limit, and a stack of
encodings (``gzip, gzip``: two kilobytes that decode to a gigabyte) is refused before anything is
decoded. Decoding runs in pieces of at most ``piece`` bytes with a turn of the event loop between
them, so a deadline around the read fires on time. Compressed input is bounded too (twice the limit
and a little), so a stream that decodes to nothing cannot run on.

:class:`BoundedDecoder` is the part without I/O: raw bytes in, decoded pieces out. Callers turn
:class:`BodyRefused` into their own error (a card: ``CardInvalidError``; an answer:
``InvalidAgentResponseError``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from typing import Final

import httpx

__all__ = [
    "ACCEPT_ENCODING",
    "PIECE",
    "BodyRefused",
    "BoundedDecoder",
    "content_encodings",
    "read_body",
]

_DECODED: Final = ("gzip", "deflate")
ACCEPT_ENCODING: Final = "gzip, deflate"  # what we ask for: exactly what we decode
PIECE: Final = 64 * 1024
_ALIASES: Final = {"x-gzip": "gzip"}
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS


class BodyRefused(Exception):
    """A body its bounds refuse. ``kind``: ``too_large`` (over the limit, decoded or declared)
    or ``encoding`` (stacked, unknown or corrupt content encoding)."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(detail)


def content_encodings(header: str | None) -> tuple[str, ...]:
    """The encodings a ``Content-Encoding`` header names, in the order they were applied
    (``identity`` and empty entries left out)."""
    names = (part.strip().lower() for part in (header or "").split(","))
    return tuple(_ALIASES.get(name, name) for name in names if name and name != "identity")


class BoundedDecoder:
    """Decodes one body, identity, gzip or deflate (zlib-wrapped or raw), never handing out more
    than ``max_bytes`` in all: the piece that would go past the limit is decoded to one byte past
    it and refused (:class:`BodyRefused`). Compressed bodies come out in pieces of at most
    ``piece`` bytes; identity bodies as they are fed.

    ``produced`` counts the decoded bytes handed out so far.
    """

    def __init__(self, content_encoding: str | None, max_bytes: int, *, piece: int = PIECE) -> None:
        if max_bytes < 0 or piece <= 0:
            raise ValueError("max_bytes must be >= 0 and piece > 0")
        chain = content_encodings(content_encoding)
        if len(chain) > 1:
            raise BodyRefused(
                "encoding",
                f"content encodings {', '.join(chain)} refused: one at most is decoded "
                "(a stack of them expands a small body without bound)",
            )
        if chain and chain[0] not in _DECODED:
            raise BodyRefused(
                "encoding",
                f"content encoding {chain[0][:40]!r} refused: only {ACCEPT_ENCODING} are decoded",
            )
        self.encoding = chain[0] if chain else "identity"
        self.max_bytes = max_bytes
        self.piece = piece
        identity = self.encoding == "identity"
        self.raw_limit = max_bytes if identity else 2 * max_bytes + 1024
        self.raw = 0
        self.produced = 0
        self._inflater: zlib._Decompress | None = None  # None: between gzip members / not begun
        self._head = b""  # deflate: the first byte, until the second tells zlib from raw
        self._ended = False  # deflate: the stream's end was seen
        self._begun = False  # a compressed stream (gzip: a member) was begun

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decode the next raw bytes; yields decoded pieces. Raises :class:`BodyRefused`."""
        self.raw += len(data)
        if self.raw > self.raw_limit:
            what = "body" if self.encoding == "identity" else f"{self.encoding} body"
            raise BodyRefused(
                "too_large",
                f"{what} over the limit of {self.raw_limit} bytes (stopped reading at {self.raw})",
            )
        if self.encoding == "identity":
            self._count(len(data))
            if data:
                yield data
            return
        try:
            yield from self._inflate(data)
        except zlib.error as exc:
            raise BodyRefused(
                "encoding", f"{self.encoding} body cannot be decoded ({exc})"
            ) from None

    def flush(self) -> Iterator[bytes]:
        """The end of the raw body: a compressed stream cut short is refused."""
        if self.encoding == "identity" or self.raw == 0:
            return
        unfinished = not self._begun or (self._inflater is not None and not self._inflater.eof)
        if unfinished:
            raise BodyRefused(
                "encoding", f"{self.encoding} body ends before its compressed stream does"
            )
        yield from ()

    # -- decoding --------------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        if self.produced + size > self.max_bytes:
            raise BodyRefused(
                "too_large",
                f"body over the limit of {self.max_bytes} bytes once decoded "
                f"(stopped decoding at {self.produced + size})",
            )
        self.produced += size

    def _start(self, data: bytes) -> bytes | None:
        """Begin a stream (gzip: a member) on ``data``; the bytes to inflate, or None when more
        input is needed to begin."""
        if self.encoding == "gzip":
            data = data.lstrip(b"\0")  # zero padding between gzip members, as gzip(1) allows
            if not data:
                return None
            self._inflater = _decompressor(_GZIP_WBITS)
            self._begun = True
            return data
        if self._ended:
            if data:
                raise BodyRefused("encoding", "deflate body has data after its end")
            return None
        data = self._head + data
        if len(data) < 2:
            self._head = data
            return None
        self._head = b""
        cmf, flg = data[0], data[1]
        wrapped = cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0  # RFC 1950 header
        self._inflater = _decompressor(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        self._begun = True
        return data

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._inflater is None:
                begun = self._start(data)
                if begun is None:
                    return
                data = begun
            inflater = self._inflater
            assert inflater is not None
            # One byte past the limit is enough to know a body is over it.
            room = min(self.piece, self.max_bytes - self.produced + 1)
            out = inflater.decompress(data, room)
            data = inflater.unconsumed_tail
            if out:
                self._count(len(out))
                yield out
            if inflater.eof:
                rest = inflater.unused_data
                self._inflater = None
                if self.encoding == "deflate":
                    self._ended = True
                data = rest
                if not data:
                    return
            elif not data and len(out) < room:
                return  # all input taken and no output pending (a full piece may leave some)


def _decompressor(wbits: int) -> zlib._Decompress:
    return zlib.decompressobj(wbits)


async def read_body(response: httpx.Response, max_bytes: int, *, piece: int = PIECE) -> bytes:
    """The body of a streamed ``response``, decoded, at most ``max_bytes`` long.

    Raises :class:`BodyRefused` before reading when the encodings or the declared length are
    refused, and while reading as soon as the body goes over its limit.
    """
    try:
        loaded = response.content  # a response made in memory (a mock): read, and decoded, already
    except httpx.ResponseNotRead:
        pass
    else:
        return b"".join(BoundedDecoder(None, max_bytes, piece=max(len(loaded), 1)).feed(loaded))
    decoder = BoundedDecoder(response.headers.get("content-encoding"), max_bytes, piece=piece)
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > decoder.raw_limit:
        raise BodyRefused(
            "too_large", f"body declared {declared} bytes, over the limit of {decoder.raw_limit}"
        )
    body = bytearray()
    async for raw in response.aiter_raw(piece):
        for out in decoder.feed(raw):
            body += out
            await asyncio.sleep(0)  # the loop runs between pieces: a deadline can fire
    for out in decoder.flush():
        body += out
    return bytes(body)
