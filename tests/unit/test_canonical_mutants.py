"""Card bytes to JSON, limit by limit, and the RFC 8785 hashes (R2, R3, R16).

Written to kill the mutants of ``engine/cards/canonical.py`` that ``scripts/mutation`` found
alive: each refusal names the field it is about and says what is wrong with it, and each limit
holds exactly at its bound.
"""

from __future__ import annotations

import hashlib

import pytest

from cardfence.engine.cards.canonical import (
    SAFE_INTEGER,
    canonical,
    check_tree,
    decode,
    object_pairs,
    path_of,
    sha256,
)
from cardfence.engine.fields import FieldError


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
    assert refusal(b'{"skills": [{"id": 1, "id": 2}]}') == ("skills[0].id", "duplicate key")
    assert refusal(b'{"a": 1, "b": 2, "a": 3}') == ("a", "duplicate key")


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
def test_an_integer_past_the_largest_double_is_refused_at_its_path(number: int) -> None:
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
