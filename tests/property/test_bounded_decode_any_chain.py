"""R16 for remote bodies: for any bytes and any chain of up to three content encodings, the bounded
decoder returns exactly the bytes sent (one encoding at most, within the limit) or refuses them with
:class:`BodyRefused` — and it never holds more than the limit and one piece while it decodes.

The property is one function, :func:`violation`, checked against the real decoder and, to show it
has teeth, against decoders with planted bugs that it must catch.
"""

from __future__ import annotations

import hashlib
import tracemalloc
import zlib
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import cardfence.engine.http.bodies
from cardfence.engine.http.bodies import BodyRefused, BoundedDecoder

# The hunts find bodies of a few hundred kilobytes; their repr is long, and that is fine.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# Allowance for what decoding holds besides the piece it hands out: zlib's state and window
# (about 40 KiB) and the raw bytes being fed, twice over (the chunk and its unconsumed tail).
ZLIB_STATE = 64 * 1024

# --- strategies ----------------------------------------------------------------------------------


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


# name -> (Content-Encoding token, encoder)
ENCODERS = {
    "gzip": ("gzip", lambda data: zlib.compress(data, 6, wbits=31)),
    "deflate": ("deflate", zlib.compress),
    "deflate-raw": ("deflate", _raw_deflate),
    "identity": ("identity", lambda data: data),
}

chains = st.lists(st.sampled_from(sorted(ENCODERS)), max_size=3)
# Short arbitrary bytes, and long repetitive ones (they compress well: small bombs).
bodies = st.binary(max_size=512) | st.builds(
    lambda unit, times: unit * times, st.binary(min_size=1, max_size=16), st.integers(0, 12_000)
)
# Pieces and arrivals of a single byte only for short bodies: byte by byte under tracemalloc, a
# long one costs seconds and proves nothing a short one does not.
SHORT = 1024


def _case(body: bytes) -> st.SearchStrategy[tuple[bytes, list[str], int, int, int]]:
    short = len(body) <= SHORT
    return st.tuples(
        st.just(body),
        chains,
        st.integers(0, 20_000),  # limit
        st.sampled_from([1, 100, 4096] if short else [100, 4096]),  # piece
        st.sampled_from([1, 64, 65_536] if short else [64, 65_536]),  # how the raw bytes arrive
    )


cases = bodies.flatmap(_case)

Case = tuple[bytes, list[str], int, int, int]


# --- the property --------------------------------------------------------------------------------


def violation(case: Case) -> str | None:
    """What is wrong with the decoder's answer to ``case``, or None when it is acceptable."""
    body, chain, limit, piece, feed = case
    raw, header = body, []
    for name in chain:
        token, encode = ENCODERS[name]
        raw = encode(raw)
        header.append(token)
    stacked = len([name for name in chain if name != "identity"]) > 1
    digest, size = hashlib.sha256(), 0
    refused: BodyRefused | None = None
    tracemalloc.start()
    try:
        decoder = BoundedDecoder(", ".join(header), limit, piece=piece)
        for start in range(0, len(raw), feed):
            for out in decoder.feed(raw[start : start + feed]):
                digest.update(out)
                size += len(out)
        for out in decoder.flush():
            digest.update(out)
            size += len(out)
    except BodyRefused as exc:
        refused = exc
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!r}"[:300]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    bound = limit + piece + 2 * min(feed, len(raw)) + ZLIB_STATE
    if peak > bound:
        return f"held {peak} bytes decoding (limit {limit}, piece {piece}): over {bound}"
    if size > limit:
        return f"handed out {size} bytes, over the limit of {limit}"
    if stacked:
        return None if refused is not None and refused.kind == "encoding" else "stack accepted"
    if len(body) > limit:
        return None if refused is not None and refused.kind == "too_large" else "over limit kept"
    if refused is not None:
        return f"refused a body within its limit: {refused.detail}"
    if (size, digest.digest()) != (len(body), hashlib.sha256(body).digest()):
        return f"decoded {size} bytes that are not the {len(body)} sent"
    return None


@given(cases)
def test_any_body_under_any_chain_decodes_exactly_or_is_refused_within_its_bounds(
    case: Case,
) -> None:
    assert violation(case) is None


# --- teeth: the same property catches planted bugs -----------------------------------------------


def catches() -> Case:
    """A case on which the property rejects the decoder (hypothesis fails the test if none). A
    budget of its own (the profile's, small under ``dev``, is for the property), and no shrinking:
    one failing case is all the hunt has to show."""
    budget = settings(
        max_examples=5000,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,  # the same hunt on every run: a planted bug is caught every time
    )
    return find(cases, lambda case: violation(case) is not None, settings=budget)


class _Greedy:
    """A decompressor that ignores ``max_length``: decodes all it is given at once."""

    def __init__(self, wbits: int) -> None:
        self._inner = zlib.decompressobj(wbits)

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        return self._inner.decompress(data)  # the planted bug: no max_length

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_property_catches_a_decoder_that_ignores_max_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cardfence.engine.http.bodies, "_decompressor", _Greedy)
    problem = violation(catches())
    assert problem is not None
    assert "held" in problem


def test_property_catches_a_limit_counted_on_compressed_bytes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def count_nothing(self: BoundedDecoder, size: int) -> None:
        self.produced += size  # the planted bug: decoded bytes are not checked against the limit

    monkeypatch.setattr(BoundedDecoder, "_count", count_nothing)
    assert violation(catches()) is not None


def test_property_catches_a_decoder_that_decodes_a_stack_of_encodings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def first_only(header: str | None) -> tuple[str, ...]:
        names = tuple(n.strip() for n in (header or "").split(",") if n.strip() != "identity")
        return tuple(n for n in names[:1] if n)  # the planted bug: the rest is ignored

    monkeypatch.setattr(cardfence.engine.http.bodies, "content_encodings", first_only)
    assert violation(catches()) == "stack accepted"
