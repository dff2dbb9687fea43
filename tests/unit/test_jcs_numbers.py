"""RFC 8785 numbers to the letter (R14): what a card's revision hashes is what JCS writes.

RFC 8785 §3.2.2.3 writes a number as ECMAScript's ``Number.prototype.toString`` writes the
IEEE-754 double it denotes. The published samples (Appendix B, the §3.2.2 example and its UTF-8
bytes in §3.2.4) are checked as given; every other finite double is checked against
:func:`es_number`, the ECMAScript rule written out here from its definition with exact
arithmetic, independently of ``repr`` and of the ``rfc8785`` package.
"""

from __future__ import annotations

import hashlib
import math
import struct
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cardfence.engine.cards.canonical import SAFE_INTEGER, canonical, decode
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.cards.model import parse_card
from cardfence.engine.errors import CardInvalidError

LARGEST_DOUBLE_INTEGER = 2**1024 - 2**970 - 1  # the last integer float() rounds below 2**1024

# --- the ECMAScript rule, from its definition ----------------------------------------------------


def es_number(x: float) -> str:
    """Number::toString(x) for a finite double, as ECMA-262 defines it (RFC 8785 §3.2.2.3)."""
    if x == 0:
        return "0"  # -0 too
    if x < 0:
        return "-" + es_number(-x)
    digits, n = shortest_digits(x)
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def shortest_digits(x: float) -> tuple[str, int]:
    """The digits of s and n: s * 10**(n-k) reads back as x, k (the digits of s) as small as
    possible, and of two such s the one nearer x, the even one on a tie (ECMA-262's note)."""
    exact = Fraction(x)
    e = math.floor(math.log10(x))  # then made exact: 10**e <= x < 10**(e+1)
    while Fraction(10) ** e > exact:
        e -= 1
    while Fraction(10) ** (e + 1) <= exact:
        e += 1
    for k in range(1, 18):
        scale = Fraction(10) ** (e + 1 - k)
        below = math.floor(exact / scale)
        fits = [s for s in (below, below + 1) if float(f"{s}e{e + 1 - k}") == x]
        if fits:
            s = min(fits, key=lambda s: (abs(s * scale - exact), s % 2))
            text, n = str(s), e + 1
            if len(text) > k:  # below + 1 reached 10**k: the next power of ten
                n += 1
            return text.rstrip("0"), n
    raise AssertionError(f"no 17-digit decimal reads back as {x!r}")


def double(bits: int) -> float:
    return float(struct.unpack(">d", bits.to_bytes(8, "big"))[0])


# --- the published samples -----------------------------------------------------------------------

# RFC 8785 Appendix B: IEEE-754 binary64 bits and the text JCS writes for them.
APPENDIX_B = [
    (0x0000000000000000, "0"),
    (0x8000000000000000, "0"),
    (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"),
    (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"),
    (0xFFEFFFFFFFFFFFFF, "-1.7976931348623157e+308"),
    (0x4340000000000000, "9007199254740992"),
    (0xC340000000000000, "-9007199254740992"),
    (0x4430000000000000, "295147905179352830000"),
    (0x44B52D02C7E14AF5, "9.999999999999997e+22"),
    (0x44B52D02C7E14AF6, "1e+23"),
    (0x44B52D02C7E14AF7, "1.0000000000000001e+23"),
    (0x444B1AE4D6E2EF4E, "999999999999999700000"),
    (0x444B1AE4D6E2EF4F, "999999999999999900000"),
    (0x444B1AE4D6E2EF50, "1e+21"),
    (0x3EB0C6F7A0B5ED8C, "9.999999999999997e-7"),
    (0x3EB0C6F7A0B5ED8D, "0.000001"),
    (0x41B3DE4355555553, "333333333.3333332"),
    (0x41B3DE4355555554, "333333333.33333325"),
    (0x41B3DE4355555555, "333333333.3333333"),
    (0x41B3DE4355555556, "333333333.3333334"),
    (0x41B3DE4355555557, "333333333.33333343"),
    (0xBECBF647612F3696, "-0.0000033333333333333333"),
    (0x43143FF3C1CB0959, "1424953923781206.2"),  # round to even
]


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B, ids=[f"{b:016x}" for b, _ in APPENDIX_B])
def test_appendix_b_numbers_are_written_as_the_rfc_writes_them(bits: int, text: str) -> None:
    assert canonical(double(bits), "") == text.encode()
    assert es_number(double(bits)) == text  # the reference the properties below rely on
    assert canonical(decode(text.encode(), 1), "") == text.encode()  # and it reads back


# RFC 8785 §3.2.2: the example object, and in §3.2.4 the UTF-8 bytes of its canonical form.
RFC_EXAMPLE = rb"""{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"""
RFC_EXAMPLE_CANONICAL = r"""{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"""  # noqa: E501
RFC_EXAMPLE_UTF8 = (
    "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 75 65 2c 66 61 6c 73 65 5d 2c"
    " 22 6e 75 6d 62 65 72 73 22 3a 5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31"
    " 65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 5d 2c 22 73 74 72 69 6e 67 22"
    " 3a 22 e2 82 ac 24 5c 75 30 30 30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d"
)


def test_the_rfc_example_object_canonicalises_to_the_rfc_bytes() -> None:
    written = canonical(decode(RFC_EXAMPLE, 4), "")
    assert written == RFC_EXAMPLE_CANONICAL.encode()
    assert written == bytes.fromhex(RFC_EXAMPLE_UTF8)


# Literals as a card carries them, and the text JCS writes: exponent forms either side of the
# decimal range, numbers past 2**53 as the double nearest them (ties to even), zeros signless.
LITERALS = [
    (b"1e21", b"1e+21"),
    (b"1E21", b"1e+21"),
    (b"1e20", b"100000000000000000000"),
    (b"1E-7", b"1e-7"),
    (b"0.0000001", b"1e-7"),
    (b"0.000001", b"0.000001"),
    (b"-0", b"0"),
    (b"-0.0", b"0"),
    (b"4.50", b"4.5"),
    (b"2e-3", b"0.002"),
    (b"1.0", b"1"),
    (b"100e-2", b"1"),
    (b"1.2e18", b"1200000000000000000"),
    (b"9007199254740991", b"9007199254740991"),
    (b"9007199254740992", b"9007199254740992"),
    (b"9007199254740993", b"9007199254740992"),
    (b"9007199254740995", b"9007199254740996"),
    (b"-9007199254740993", b"-9007199254740992"),
    (b"9007199254740993.0", b"9007199254740992"),
    (b"1152921504606846976", b"1152921504606847000"),  # 2**60: shortest digits, then zeros
    (b"123456789012345678901234567890", b"1.2345678901234568e+29"),
    (b"1" + b"0" * 308, b"1e+308"),
]


@pytest.mark.parametrize(
    ("literal", "written"), LITERALS, ids=[lit.decode()[:24] for lit, _ in LITERALS]
)
def test_a_number_is_written_as_the_double_its_literal_denotes(
    literal: bytes, written: bytes
) -> None:
    assert canonical(decode(b'{"n": [' + literal + b"]}", 2), "") == b'{"n":[' + written + b"]}"


def test_integers_within_the_safe_range_are_written_exactly_and_beyond_as_doubles() -> None:
    assert SAFE_INTEGER == 2**53 - 1
    assert canonical([SAFE_INTEGER, -SAFE_INTEGER], "") == b"[9007199254740991,-9007199254740991]"
    assert canonical([2**53 + 1, -(2**53) - 1], "") == b"[9007199254740992,-9007199254740992]"
    assert canonical([True, False, 10**21], "") == b"[true,false,1e+21]"  # booleans stay


def test_an_integer_past_the_largest_double_is_refused_at_its_path() -> None:
    # JSON.parse reads it as Infinity, which RFC 8785 cannot write.
    largest = str(LARGEST_DOUBLE_INTEGER).encode()
    assert canonical(decode(b'{"n": ' + largest + b"}", 1), "") == b'{"n":1.7976931348623157e+308}'
    past = str(LARGEST_DOUBLE_INTEGER + 1).encode()
    with pytest.raises(FieldError) as caught:
        decode(b'{"a": {"n": [1, -' + past + b"]}}", 3)
    assert (caught.value.path, caught.value.detail) == (
        "a.n[1]",
        "number beyond the largest double (±1.7976931348623157e+308)",
    )
    with pytest.raises(FieldError) as caught:
        canonical({"n": LARGEST_DOUBLE_INTEGER + 1}, "params")
    assert caught.value.path == "params"
    assert caught.value.detail.startswith("cannot be canonicalised (RFC 8785): ")


# --- a card --------------------------------------------------------------------------------------

CARD = b"""{
  "name": "Ledger",
  "version": "3",
  "supportedInterfaces": [
    {"url": "http://ledger.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
  ],
  "capabilities": {"extensions": [{"uri": "urn:ext:limits", "required": false,
    "params": {"ceiling": 1e21, "floor": 1e20, "serial": 9007199254740993, "step": 2.50E-3}}]},
  "skills": [{"id": "post", "name": "Post"}],
  "signatures": [{"protected": "e30", "signature": "c2ln"}]
}"""
CARD_CANONICAL = (
    b'{"capabilities":{"extensions":[{"params":{"ceiling":1e+21,"floor":100000000000000000000,'
    b'"serial":9007199254740992,"step":0.0025},"required":false,"uri":"urn:ext:limits"}]},'
    b'"name":"Ledger","skills":[{"id":"post","name":"Post"}],"supportedInterfaces":[{'
    b'"protocolBinding":"JSONRPC","protocolVersion":"1.0","url":"http://ledger.test/rpc"}],'
    b'"version":"3"}'
)


def test_a_card_with_numbers_past_2_53_and_in_exponent_form_parses_and_hashes_as_jcs() -> None:
    card = parse_card(CARD)
    assert card.canonical_bytes() == CARD_CANONICAL
    assert card.revision == hashlib.sha256(CARD_CANONICAL).hexdigest()
    # The stored snapshot (the canonical bytes) parses back to the same revision.
    assert parse_card(card.canonical_bytes()).revision == card.revision


def test_a_card_spelling_the_same_doubles_otherwise_has_the_same_revision() -> None:
    respelled = (
        CARD.replace(b"1e21", b"1000000000000000000000.0")
        .replace(b"1e20", b"1E+20")
        .replace(b"9007199254740993", b"9007199254740992")
        .replace(b"2.50E-3", b"0.0025")
    )
    assert parse_card(respelled).revision == parse_card(CARD).revision


def test_a_card_with_an_integer_past_the_largest_double_is_invalid_naming_the_field() -> None:
    body = CARD.replace(b"9007199254740993", b"9" * 400)
    with pytest.raises(CardInvalidError) as refused:
        parse_card(body)
    assert refused.value.field == "capabilities.extensions[0].params.serial"


# --- any finite double ---------------------------------------------------------------------------

finite_doubles = st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**64 - 1).map(
    double
).filter(math.isfinite)


@given(finite_doubles)
def test_any_finite_double_is_written_as_ecmascript_writes_it(x: float) -> None:
    written = canonical(x, "")
    assert written.decode() == es_number(x)
    assert float(written) == x  # text that reads back, as a double, as x


@given(finite_doubles)
def test_every_spelling_of_a_double_is_written_alike(x: float) -> None:
    spellings = {repr(x), f"{x:.17e}", f"{x:.17E}", f"{x:.25g}", f"{x:.1100f}"}
    written = {canonical(decode(text.encode(), 1), "") for text in spellings}
    assert written == {canonical(x, "")}
    assert canonical(decode(canonical(x, ""), 1), "") == canonical(x, "")


@given(st.integers(-LARGEST_DOUBLE_INTEGER, LARGEST_DOUBLE_INTEGER))
def test_any_integer_a_double_holds_is_written_as_that_double(n: int) -> None:
    written = canonical(n, "")
    assert written == es_number(float(n)).encode()
    if abs(n) <= SAFE_INTEGER:
        assert written == str(n).encode()
    assert canonical(decode(str(n).encode(), 1), "") == written
