"""Remote JSON bytes to a JSON value, limit by limit, and the RFC 8785 hashes (R2, R3, R16).

Each refusal names the field it is about and says what is wrong with it, and each limit holds
exactly at its bound. Every remote document (card, key set, answer, stream event, push body, token
answer, discovery document) is read by its ``loads``: a repeated member name is refused by each,
naming it."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Awaitable, Callable
from fractions import Fraction

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.cards import card_document
from support.hostile import Reply, RoutedServer, completed_event, sse, working_event
from support.mocked import Body, mocked_agents

from cardfence.engine.auth import tokens
from cardfence.engine.auth.config import OAuthClient
from cardfence.engine.auth.credentials import TokenNeeded
from cardfence.engine.cards.canonical import (
    DUPLICATE,
    NON_FINITE,
    SAFE_INTEGER,
    canonical,
    check_tree,
    decode,
    loads,
    object_pairs,
    path_of,
    sha256,
)
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.cards.keys import parse_keys
from cardfence.engine.cards.model import parse_card
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.errors import (
    CardInvalidError,
    CardSignatureError,
    InvalidAgentResponseError,
    TokenRequestError,
)
from cardfence.engine.wire.push import Refused
from cardfence.engine.wire.push import decode as push_body
from cardfence.engine.wire.transport import A2ATransport


def refusal(body: bytes, max_depth: int = 8) -> tuple[str, str]:
    with pytest.raises(FieldError) as caught:
        decode(body, max_depth)
    return caught.value.path, caught.value.detail


def test_a_body_decodes_to_its_json_value_a_leading_bom_tolerated() -> None:
    assert decode(b'{"a": [1, 2.5, true, null, "x"]}', 8) == {"a": [1, 2.5, True, None, "x"]}
    assert decode(b'\xef\xbb\xbf{"a": 1}', 8) == {"a": 1}


def test_bytes_that_are_not_utf8_are_refused_with_the_offset_of_the_bad_byte() -> None:
    assert refusal(b'{"a": "\xff"}') == ("", "body is not UTF-8 (byte 7)")


def test_text_that_is_not_json_is_refused_with_the_parser_message_and_line() -> None:
    assert refusal(b'{\n"a": }') == ("", "body is not JSON (Expecting value at line 2)")


def test_an_integer_over_pythons_digit_limit_is_refused_as_unacceptable_json() -> None:
    field, problem = refusal(b"1" * 5000)
    assert field == ""
    assert problem.startswith("body is not acceptable JSON (Exceeds the limit")


def test_nesting_past_the_parsers_stack_is_refused_as_too_deep() -> None:
    assert refusal(b"[" * 100_000 + b"]" * 100_000, 64) == ("", "nested deeper than 64 levels")


def test_the_depth_limit_holds_exactly_at_its_bound_and_names_the_field() -> None:
    # {"a": {"b": []}}: the object is level 1, "a" level 2, "b" level 3.
    assert decode(b'{"a": {"b": []}}', 3) == {"a": {"b": []}}
    assert refusal(b'{"a": {"b": []}}', 2) == ("a.b", "nested deeper than 2 levels")
    assert refusal(b"[[[]]]", 2) == ("[0][0]", "nested deeper than 2 levels")
    assert decode(b'{"a": {"b": 1}}', 2) == {"a": {"b": 1}}  # scalars are no deeper level


def test_a_repeated_key_is_refused_at_its_path() -> None:
    assert refusal(b'{"skills": [{"id": 1, "id": 2}]}') == ("skills[0].id", DUPLICATE)
    assert refusal(b'{"a": 1, "b": 2, "a": 3}') == ("a", DUPLICATE)


def test_the_first_repeated_key_is_the_one_named() -> None:
    marked = object_pairs([("a", 1), ("b", 2), ("b", 3), ("a", 4)])
    assert getattr(marked, "duplicate", None) == "b"
    plain = object_pairs([("a", 1), ("b", 2)])
    assert plain == {"a": 1, "b": 2}
    assert not hasattr(plain, "duplicate")


def test_non_finite_numbers_are_refused_at_their_path() -> None:
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        assert refusal(b'{"a": [0, ' + constant + b"]}") == (
            "a[1]",
            "NaN and Infinity are not JSON numbers",
        )


@pytest.mark.parametrize(
    "number", [SAFE_INTEGER, -SAFE_INTEGER, 2**53 + 1, -(2**60), 0, 1.5, -0.0, 1.2e18, 1e21, 1e308]
)
def test_numbers_a_double_holds_are_accepted_as_read(number: float) -> None:
    # Past ±(2**53-1) too: RFC 8785 writes them as the doubles they denote (test_jcs_numbers).
    assert decode(repr(number).encode(), 1) == number


@pytest.mark.parametrize("number", [2**1024, -(2**1024), 2**1024 - 2**970])
def test_integers_past_the_largest_double_either_side_are_refused_naming_it(number: int) -> None:
    assert refusal(b'{"n": ' + str(number).encode() + b"}") == (
        "n",
        "number beyond the largest double (±1.7976931348623157e+308)",
    )


def test_booleans_are_not_numbers_to_range_check() -> None:
    check_tree({"a": True, "b": False}, 2)


def test_a_lone_surrogate_is_refused_in_a_string_and_in_a_key() -> None:
    assert refusal(b'{"a": ["ok", "\\ud800"]}') == (
        "a[1]",
        "string is not valid Unicode (lone surrogate)",
    )
    assert refusal(b'{"a": {"\\udfff": 1}}') == ("a.\udfff", "key is not valid Unicode")
    assert decode('{"é": "ü\\ud83d\\ude00"}'.encode(), 2) == {"é": "ü😀"}


def test_paths_join_keys_with_dots_and_indices_in_brackets() -> None:
    assert path_of(None) == ""
    assert path_of(((((None, "a"), 0), "b"), 2)) == "a[0].b[2]"
    assert path_of(((None, 0), "x")) == "[0].x"


def test_canonical_bytes_follow_rfc_8785_and_the_hash_is_their_sha256() -> None:
    value = {"b": [1.0, "é"], "a": None}
    assert canonical(value, "x") == b'{"a":null,"b":[1,"\xc3\xa9"]}'
    assert sha256(value, "x") == hashlib.sha256(b'{"a":null,"b":[1,"\xc3\xa9"]}').hexdigest()


def test_an_integer_past_2_53_is_canonicalised_as_the_double_it_denotes() -> None:
    assert canonical({"a": [2**53 + 1, "x"], "b": 2**60}, "") == (
        b'{"a":[9007199254740992,"x"],"b":1152921504606847000}'
    )


@pytest.mark.parametrize(
    "value", [{"a": float("nan")}, {"a": [2**53 + 1, 2**1024]}, {"a": object()}]
)
def test_a_value_rfc_8785_cannot_write_is_refused_at_the_given_path(value: object) -> None:
    for call in (canonical, sha256):
        with pytest.raises(FieldError) as caught:
            call(value, "skills[0]")
        assert caught.value.path == "skills[0]"
        assert caught.value.detail.startswith("cannot be canonicalised (RFC 8785): ")


# -- loads: I-JSON (RFC 7493) for every remote document --------------------------------------------


def test_a_repeated_member_name_is_refused_at_any_depth_naming_it() -> None:
    for body, path in [
        (b'{"result": {"task": {"id": "a"}, "task": {"id": "b"}}}', "result.task"),
        (b'[{"a": 1}, {"b": {"c": [{"d": 1, "d": 1}]}}]', "[1].b.c[0].d"),
        (b'{"a": 1, "a": 1}', "a"),  # even with the same value
    ]:
        with pytest.raises(FieldError) as caught:
            loads(body)
        assert (caught.value.path, caught.value.detail) == (path, DUPLICATE)
    assert loads(b'{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}') == {
        "a": {"a": 1},
        "b": [{"a": 2}, {"a": 3}],
    }


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
def test_a_number_no_double_holds_is_refused_at_its_path(number: bytes) -> None:
    with pytest.raises(FieldError) as caught:
        loads(b'{"a": [1.5, ' + number + b"]}")
    assert (caught.value.path, caught.value.detail) == ("a[1]", NON_FINITE)
    assert loads(b'{"a": 1.5, "b": -2e3, "c": 7, "d": 1e308}') == {
        "a": 1.5,
        "b": -2000.0,
        "c": 7,
        "d": 1e308,
    }


def test_a_refused_document_that_is_not_json_further_on_is_refused_as_not_json() -> None:
    with pytest.raises(FieldError, match=r"^body is not JSON \(Expecting value at line 2\)$"):
        loads(b'[{"a": 1, "a": 2},\n x]')


def test_only_utf8_is_read_the_offset_of_a_bad_byte_counting_a_leading_bom() -> None:
    assert loads(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    with pytest.raises(FieldError, match=r"^body is not UTF-8 \(byte 10\)$"):
        loads(b'\xef\xbb\xbf{"a": "\xff"}')
    with pytest.raises(FieldError, match=r"^body is not UTF-8 \(byte 0\)$"):
        loads('{"a": 1}'.encode("utf-16"))


def test_nesting_past_the_parsers_stack_is_refused_naming_the_limit_when_given() -> None:
    bomb = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(FieldError, match=r"^nested deeper than the parser's stack$"):
        loads(bomb)
    with pytest.raises(FieldError, match=r"^nested deeper than 9 levels$"):
        loads(bomb, max_depth=9)


def _twice(doc: object, member: str, first: object) -> bytes:
    """``doc`` as JSON with its first member ``member`` given twice: ``first``, then its own."""
    text = json.dumps(doc)
    name = json.dumps(member) + ": "
    assert name in text
    return text.replace(name, name + json.dumps(first) + ", " + name, 1).encode()


def _rpc(request: httpx.Request, result: object) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": json.loads(request.content)["id"], "result": result}


def _events(*frames: bytes) -> httpx.Response:
    return httpx.Response(200, stream=Body(*frames), headers={"content-type": "text/event-stream"})


async def _card(body: bytes) -> str:
    with pytest.raises(CardInvalidError) as refused:
        parse_card(body, url="https://agent.test/card")
    return str(refused.value)


async def _keys(body: bytes) -> str:
    with pytest.raises(CardSignatureError) as refused:
        parse_keys(body, source="jku", url="https://agent.test/keys", card_url="")
    return str(refused.value)


async def _answer(binding: str, answer: Callable[[httpx.Request], bytes]) -> str:
    async with mocked_agents() as make:
        transport = make(lambda r: httpx.Response(200, content=answer(r)), binding)
        with pytest.raises(InvalidAgentResponseError) as refused:
            await transport.get_task("t-1")
    return str(refused.value)


async def _events_of(binding: str, answer: Callable[[httpx.Request], httpx.Response]) -> str:
    async def drained(transport: A2ATransport) -> None:
        async with transport.subscribe("t-1") as updates:
            async for _ in updates:
                pass

    async with mocked_agents() as make:
        with pytest.raises(InvalidAgentResponseError) as refused:
            await drained(make(answer, binding))
    return str(refused.value)


async def _push(body: bytes) -> str:
    with pytest.raises(Refused) as refused:
        push_body(body, {"content-type": "application/json"})
    return refused.value.delivery.detail


async def _token(body: bytes) -> str:
    answer = httpx.Response(200, content=body, request=httpx.Request("POST", "https://a.test/t"))
    with pytest.raises(tokens._Failure) as refused:
        tokens._check_answer("https://a.test/t", (), answer)
    return refused.value.detail


async def _discovery(body: bytes) -> str:
    with RoutedServer() as server:
        url = server.url + "/.well-known/openid-configuration"
        server.routes["/.well-known/openid-configuration"] = Reply(body=body)
        needed = TokenNeeded("openIdConnect", OAuthClient("id", "s"), (), discovery_url=url)
        async with tokens.TokenSource() as source:
            with pytest.raises(TokenRequestError) as refused:
                await source.token(needed)
    return refused.value.token_detail


_TASK = working_event()["task"]
_DONE = "TASK_STATE_COMPLETED"
_BEARER = {"access_token": "a", "token_type": "Bearer", "expires_in": 60}
_OIDC = {"issuer": "https://id.test", "token_endpoint": "https://id.test/token"}


@pytest.mark.parametrize(
    ("read", "path"),
    [
        pytest.param(
            lambda: _card(_twice(card_document(), "id", "other")), "skills[0].id", id="card"
        ),
        pytest.param(
            lambda: _keys(_twice({"keys": [{"kty": "EC"}]}, "kty", "oct")),
            "keys[0].kty",
            id="key set",
        ),
        pytest.param(
            lambda: _answer(JSONRPC, lambda r: _twice(_rpc(r, _TASK), "state", _DONE)),
            "result.status.state",
            id="JSON-RPC answer",
        ),
        pytest.param(
            lambda: _answer(HTTP_JSON, lambda r: _twice(_TASK, "state", _DONE)),
            "status.state",
            id="HTTP+JSON answer",
        ),
        pytest.param(
            lambda: _events_of(
                JSONRPC, lambda r: _events(sse(_twice(_rpc(r, working_event()), "task", _TASK)))
            ),
            "result.task",
            id="JSON-RPC stream event",
        ),
        pytest.param(
            lambda: _events_of(
                HTTP_JSON, lambda r: _events(sse(_twice(completed_event(), "taskId", "t-2")))
            ),
            "statusUpdate.taskId",
            id="HTTP+JSON stream event",
        ),
        pytest.param(
            lambda: _push(_twice(completed_event(), "state", "TASK_STATE_WORKING")),
            "statusUpdate.status.state",
            id="push body",
        ),
        pytest.param(
            lambda: _token(_twice(_BEARER, "access_token", "b")), "access_token", id="token answer"
        ),
        pytest.param(
            lambda: _discovery(_twice(_OIDC, "token_endpoint", "https://elsewhere.test/token")),
            "token_endpoint",
            id="discovery document",
        ),
    ],
)
async def test_every_remote_document_refuses_a_repeated_member_naming_it(
    read: Callable[[], Awaitable[str]], path: str
) -> None:
    assert f"{path}: {DUPLICATE}" in await read()


# --------------------------------------------------------------------------------------------------
# RFC 8785 numbers to the letter (R14): what a card's revision hashes is what JCS writes.
#
# RFC 8785 §3.2.2.3 writes a number as ECMAScript's ``Number.prototype.toString`` writes the
# IEEE-754 double it denotes. The published samples (Appendix B, the §3.2.2 example and its UTF-8
# bytes in §3.2.4) are checked as given; every other finite double is checked against
# :func:`es_number`, the ECMAScript rule written out here from its definition with exact arithmetic,
# independently of ``repr`` and of the ``rfc8785`` package.


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
