"""Bounded decoding at its edges: how the raw bytes are cut, the deflate header, the last piece.

The same body decodes to the same bytes however the network cuts it, a refusal stops exactly one
byte past the limit, and a deflate body is told zlib-wrapped or raw by its header alone."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterable

import httpx
import pytest

from cardfence.engine.http.bodies import BodyRefused, BoundedDecoder, content_encodings, read_body

TEXT = b"".join(b"line %d of a body that compresses well\n" % n for n in range(400))


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def decode_in(
    chunks: list[bytes], encoding: str, max_bytes: int = 1 << 20, piece: int = 64
) -> bytes:
    decoder = BoundedDecoder(encoding, max_bytes, piece=piece)
    out = b"".join(b"".join(decoder.feed(chunk)) for chunk in chunks)
    return out + b"".join(decoder.flush())


def cut(raw: bytes, size: int) -> list[bytes]:
    return [raw[n : n + size] for n in range(0, len(raw), size)]


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        ("gzip", gzip.compress(TEXT)),
        ("deflate", zlib.compress(TEXT)),
        ("deflate", raw_deflate(TEXT)),
    ],
)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1 << 20])
def test_a_body_decodes_to_the_same_bytes_however_it_is_cut_and_pieced(
    encoding: str, raw: bytes, size: int
) -> None:
    for piece in (1, 5, 64, 1 << 16):
        assert decode_in(cut(raw, size), encoding, piece=piece) == TEXT


@pytest.mark.parametrize("encoding", ["gzip", "deflate-raw"])
@pytest.mark.parametrize("size", [1, 10, 1 << 20])
def test_a_highly_compressed_body_is_decoded_whole_in_small_pieces(
    encoding: str, size: int
) -> None:
    # The last input can be taken while a full piece leaves decoded output pending: a raw deflate
    # stream has no trailer to hold it back, so that output must still come out of this feed.
    repeated = b"ab" * 50_000
    raw = gzip.compress(repeated) if encoding == "gzip" else raw_deflate(repeated)
    decoder = BoundedDecoder(encoding.removesuffix("-raw"), 1 << 20, piece=100)
    pieces = [out for chunk in cut(raw, size) for out in decoder.feed(chunk)]
    assert b"".join(pieces) == repeated
    assert max(map(len, pieces)) == 100
    assert list(decoder.flush()) == []


def test_a_refusal_near_the_limit_stops_one_byte_past_it_whatever_was_decoded_before() -> None:
    decoder = BoundedDecoder("gzip", 100, piece=60)
    got: list[bytes] = []
    with pytest.raises(BodyRefused) as caught:
        got.extend(decoder.feed(gzip.compress(b"a" * 1000)))
    assert caught.value.kind == "too_large"
    assert (
        caught.value.detail
        == "body over the limit of 100 bytes once decoded (stopped decoding at 101)"
    )
    assert b"".join(got) == b"a" * 60


def test_a_two_byte_raw_deflate_body_is_complete() -> None:
    empty = raw_deflate(b"")
    assert len(empty) == 2
    assert decode_in([empty], "deflate") == b""
    assert decode_in(cut(empty, 1), "deflate") == b""


def test_a_raw_deflate_body_whose_first_byte_looks_like_zlib_is_still_raw() -> None:
    # A stored block (0x08: not final, stored; low nibble 8 like zlib's CM) of one byte, then an
    # empty final block. 0x0801 is not a multiple of 31, so this is no RFC 1950 header.
    raw = b"\x08\x01\x00\xfe\xffa" + raw_deflate(b"")
    assert (0x08 << 8 | 0x01) % 31 != 0
    assert decode_in([raw], "deflate") == b"a"


def test_data_after_the_end_of_a_deflate_body_is_refused() -> None:
    decoder = BoundedDecoder("deflate", 1000)
    with pytest.raises(BodyRefused) as caught:
        list(decoder.feed(zlib.compress(b"abc") + b"tail"))
    assert (caught.value.kind, caught.value.detail) == (
        "encoding",
        "deflate body has data after its end",
    )


def test_zero_padding_between_gzip_members_is_skipped_but_other_bytes_are_refused() -> None:
    assert decode_in([gzip.compress(b"a") + b"\0\0" + gzip.compress(b"b")], "gzip") == b"ab"
    with pytest.raises(BodyRefused) as caught:
        decode_in([gzip.compress(b"a") + b"XX" + gzip.compress(b"b")], "gzip")
    assert caught.value.kind == "encoding"


# -- read_body on a streamed response ------------------------------------------------------------


class Chunks(httpx.AsyncByteStream):
    """A response body arriving in the given raw chunks; ``taken`` counts those read."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


def streamed(chunks: list[bytes], **headers: str) -> tuple[httpx.Response, Chunks]:
    stream = Chunks(chunks)
    names = {key.replace("_", "-"): value for key, value in headers.items()}
    return httpx.Response(200, headers=names, stream=stream), stream


async def test_a_streamed_compressed_body_is_decoded_within_the_limit() -> None:
    raw = gzip.compress(TEXT)
    response, _ = streamed(cut(raw, 100), content_encoding="gzip", content_length=str(len(raw)))
    assert await read_body(response, len(TEXT), piece=50) == TEXT


async def test_a_streamed_body_over_its_decoded_limit_is_refused() -> None:
    response, _ = streamed(cut(gzip.compress(TEXT), 100), content_encoding="gzip")
    with pytest.raises(BodyRefused) as caught:
        await read_body(response, len(TEXT) - 1)
    assert caught.value.kind == "too_large"


async def test_a_declared_length_over_the_raw_limit_is_refused_before_reading() -> None:
    response, stream = streamed([b"x" * 11], content_length=" 11 ")
    with pytest.raises(BodyRefused) as caught:
        await read_body(response, 10)
    assert (caught.value.kind, caught.value.detail) == (
        "too_large",
        "body declared 11 bytes, over the limit of 10",
    )
    assert stream.taken == 0
    # At the limit, it is read; gzip allows twice the limit and a little.
    response, _ = streamed([b"x" * 10], content_length="10")
    assert await read_body(response, 10) == b"x" * 10
    raw = gzip.compress(b"y" * 10)
    response, _ = streamed([raw], content_encoding="gzip", content_length=str(2 * 10 + 1024))
    assert await read_body(response, 10) == b"y" * 10


async def test_a_streamed_compressed_body_cut_short_is_refused() -> None:
    raw = gzip.compress(TEXT)
    response, _ = streamed([raw[: len(raw) // 2]], content_encoding="gzip")
    with pytest.raises(BodyRefused) as caught:
        await read_body(response, 1 << 20)
    assert (caught.value.kind, caught.value.detail) == (
        "encoding",
        "gzip body ends before its compressed stream does",
    )


async def test_a_streamed_body_in_many_raw_chunks_is_joined_in_order() -> None:
    response, stream = streamed(cut(TEXT, 7))
    assert await read_body(response, len(TEXT)) == TEXT
    assert stream.taken == len(cut(TEXT, 7))


# -- the decoder's bounds and refusals ------------------------------------------------------------


@pytest.mark.parametrize(("max_bytes", "piece"), [(-1, 1), (10, 0), (-1, 0)])
def test_a_negative_limit_or_an_empty_piece_is_a_programming_error(
    max_bytes: int, piece: int
) -> None:
    with pytest.raises(ValueError, match=r"^max_bytes must be >= 0 and piece > 0$"):
        BoundedDecoder(None, max_bytes, piece=piece)


def test_stacked_and_unknown_encodings_are_refused_by_name() -> None:
    with pytest.raises(BodyRefused) as stacked:
        BoundedDecoder("gzip, deflate", 10)
    assert stacked.value.detail == (
        "content encodings gzip, deflate refused: one at most is decoded "
        "(a stack of them expands a small body without bound)"
    )
    with pytest.raises(BodyRefused) as unknown:
        BoundedDecoder("b" * 50, 10)
    assert unknown.value.detail == (
        f"content encoding {'b' * 40!r} refused: only gzip, deflate are decoded"
    )


def test_raw_input_is_bounded_by_the_limit_plain_and_twice_it_and_a_little_compressed() -> None:
    plain = BoundedDecoder(None, 10)
    assert plain.raw_limit == 10
    with pytest.raises(BodyRefused) as over:
        list(plain.feed(b"x" * 11))
    assert over.value.detail == "body over the limit of 10 bytes (stopped reading at 11)"
    packed = BoundedDecoder("gzip", 10)
    assert packed.raw_limit == 2 * 10 + 1024
    with pytest.raises(BodyRefused) as over:
        list(packed.feed(b"\0" * 1045))
    assert over.value.detail == "gzip body over the limit of 1044 bytes (stopped reading at 1045)"


def test_the_raw_bound_counts_every_chunk_fed_not_only_the_last() -> None:
    decoder = BoundedDecoder("gzip", 10)
    for _ in range(10):
        assert list(decoder.feed(b"\0" * 100)) == []  # zero padding: decodes to nothing
    with pytest.raises(BodyRefused) as over:
        list(decoder.feed(b"\0" * 100))
    assert over.value.detail == "gzip body over the limit of 1044 bytes (stopped reading at 1100)"


# --------------------------------------------------------------------------------------------------
# The bounded decoder (R16): one content encoding at most, the limit applied to decoded bytes while
# decoding, and nothing expanded past it.


BODY = b'{"jsonrpc": "2.0", "id": 1, "result": {"text": "' + b"hello " * 500 + b'"}}'
MiB = 1 << 20


def raw_deflate_bounded_decode(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def zeros_gzip(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(MiB)
    return b"".join(packer.compress(block) for _ in range(size // MiB)) + packer.flush()


def drain(pieces: Iterable[bytes], sizes: list[int] | None = None) -> None:
    for piece in pieces:
        if sizes is not None:
            sizes.append(len(piece))


def decode(
    encoding: str | None, raw: bytes, limit: int, *, piece: int = 64 * 1024, feed: int = 4096
) -> tuple[bytes, list[int]]:
    """The decoded body and the size of every piece handed out."""
    decoder = BoundedDecoder(encoding, limit, piece=piece)
    out, sizes = bytearray(), []

    def take(pieces: Iterable[bytes]) -> None:
        for chunk in pieces:
            sizes.append(len(chunk))
            out.extend(chunk)

    for start in range(0, len(raw), feed):
        take(decoder.feed(raw[start : start + feed]))
    take(decoder.flush())
    return bytes(out), sizes


# -- what decodes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        (None, BODY),
        ("identity", BODY),
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate", raw_deflate_bounded_decode(BODY)),
        ("Identity, GZIP", gzip.compress(BODY)),
    ],
    ids=["none", "identity", "gzip", "x-gzip", "deflate-zlib", "deflate-raw", "identity-and-case"],
)
def test_each_accepted_encoding_decodes_to_the_bytes_sent(encoding: str | None, raw: bytes) -> None:
    for feed in (1, 7, 4096):
        assert decode(encoding, raw, len(BODY), feed=feed)[0] == BODY


def test_concatenated_gzip_members_decode_as_one_body() -> None:
    raw = gzip.compress(b"first ") + b"\0\0" + gzip.compress(b"second")
    assert decode("gzip", raw, 100, feed=3)[0] == b"first second"


def test_an_empty_body_with_an_encoding_is_empty() -> None:
    assert decode("gzip", b"", 10)[0] == b""
    assert decode("deflate", b"", 10)[0] == b""


def test_the_content_encoding_header_is_read_in_the_order_applied() -> None:
    assert content_encodings("gzip, identity, , DEFLATE") == ("gzip", "deflate")
    assert content_encodings(None) == ()


# -- what is refused ----------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["gzip, gzip", "deflate, gzip", "gzip,gzip,gzip"])
def test_stacked_encodings_are_refused_before_anything_is_decoded(header: str) -> None:
    with pytest.raises(BodyRefused) as refused:
        BoundedDecoder(header, MiB)
    assert refused.value.kind == "encoding"
    assert "one at most" in refused.value.detail


@pytest.mark.parametrize("header", ["br", "zstd", "compress", "gzip;q=1"])
def test_an_encoding_we_do_not_decode_is_refused_by_name(header: str) -> None:
    with pytest.raises(BodyRefused, match="only gzip, deflate are decoded") as refused:
        BoundedDecoder(header, MiB)
    assert refused.value.kind == "encoding"
    assert header in refused.value.detail


@pytest.mark.parametrize(
    ("encoding", "raw", "detail"),
    [
        ("gzip", gzip.compress(BODY)[:-4], "ends before its compressed stream does"),
        ("gzip", b"not gzip at all", "cannot be decoded"),
        ("gzip", b"\0\0\0", "ends before its compressed stream does"),
        ("deflate", zlib.compress(BODY) + b"tail", "data after its end"),
        ("deflate", zlib.compress(BODY)[:1], "ends before its compressed stream does"),
    ],
    ids=["truncated-gzip", "corrupt-gzip", "only-padding", "deflate-tail", "deflate-one-byte"],
)
def test_a_broken_compressed_body_is_refused(encoding: str, raw: bytes, detail: str) -> None:
    with pytest.raises(BodyRefused, match=detail) as refused:
        decode(encoding, raw, MiB)
    assert refused.value.kind == "encoding"


# -- the limit, on decoded bytes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [(None, BODY), ("gzip", gzip.compress(BODY)), ("deflate", raw_deflate_bounded_decode(BODY))],
    ids=["identity", "gzip", "deflate"],
)
def test_a_body_one_byte_over_the_limit_is_refused_and_one_at_it_is_not(
    encoding: str | None, raw: bytes
) -> None:
    assert decode(encoding, raw, len(BODY))[0] == BODY
    with pytest.raises(BodyRefused) as refused:
        decode(encoding, raw, len(BODY) - 1)
    assert refused.value.kind == "too_large"


def test_a_bomb_stops_one_byte_past_the_limit_in_pieces_no_larger_than_asked() -> None:
    decoder = BoundedDecoder("gzip", MiB, piece=4096)
    sizes: list[int] = []
    with pytest.raises(BodyRefused, match="over the limit of 1048576 bytes once decoded"):
        drain(decoder.feed(zeros_gzip(64 * MiB)), sizes)
    assert max(sizes) <= 4096
    assert decoder.produced == sum(sizes) <= MiB


def test_decoding_a_64_mib_bomb_under_a_1_mib_limit_holds_little_memory() -> None:
    raw = zeros_gzip(64 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(BodyRefused):  # each piece is dropped: the decoder's hold is measured
            drain(BoundedDecoder("gzip", MiB).feed(raw))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MiB, f"peak {peak} bytes while decoding"


def test_compressed_input_is_bounded_even_when_it_decodes_to_nothing() -> None:
    empty_block = b"\x00\x00\x00\xff\xff"  # a stored, non-final deflate block of no bytes
    decoder = BoundedDecoder("deflate", 1000)
    with pytest.raises(BodyRefused, match="deflate body over the limit of 3024 bytes") as refused:
        drain(decoder.feed(empty_block * 1000))
    assert refused.value.kind == "too_large"
    assert decoder.produced == 0


def test_a_limit_of_zero_accepts_only_an_empty_body() -> None:
    assert decode("gzip", gzip.compress(b""), 0)[0] == b""
    with pytest.raises(BodyRefused):
        decode("gzip", gzip.compress(b"x"), 0)


# -- read_body on a response made in memory ------------------------------------------------------


async def test_a_response_made_in_memory_is_read_as_httpx_decoded_it_within_the_limit() -> None:
    response = httpx.Response(200, content=BODY)
    assert await read_body(response, len(BODY)) == BODY
    with pytest.raises(BodyRefused) as refused:
        await read_body(httpx.Response(200, content=BODY), len(BODY) - 1)
    assert refused.value.kind == "too_large"
