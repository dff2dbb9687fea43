"""The bounded decoder (R16): one content encoding at most, the limit applied to decoded bytes
while decoding, and nothing expanded past it."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Iterable

import httpx
import pytest

from cardfence.engine.http.bodies import BodyRefused, BoundedDecoder, content_encodings, read_body

BODY = b'{"jsonrpc": "2.0", "id": 1, "result": {"text": "' + b"hello " * 500 + b'"}}'
MiB = 1 << 20


def raw_deflate(data: bytes) -> bytes:
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
        ("deflate", raw_deflate(BODY)),
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
    [(None, BODY), ("gzip", gzip.compress(BODY)), ("deflate", raw_deflate(BODY))],
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
