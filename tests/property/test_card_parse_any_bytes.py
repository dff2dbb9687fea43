"""P7 for cards: any bytes give an AgentCard or a CardInvalidError, never another exception.

The property is one function, :func:`escapes`, checked against the real parser and, to show it has
teeth, against deliberately broken variants that it must catch.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import cardfence.engine.cards.model
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.errors import CardInvalidError

DEPTH_LIMIT = 32  # parse_card's default max_depth

# --- strategies ----------------------------------------------------------------------------------


def json_trees(
    leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str]
) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=12,
    )


# Hostile: NaN, Infinity, integers past 2**53, lone surrogates. Clean: what a real card holds.
hostile_text = st.text(max_size=8) | st.sampled_from(["\ud800", "x\udfff", "\x00", "é"])
json_values = json_trees(
    st.none() | st.booleans() | st.integers() | st.floats() | hostile_text, hostile_text
)
clean_values = json_trees(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    st.text(max_size=8),
)


def card_documents(*, hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Card-shaped documents; when hostile, any field may be missing or hold anything (1 in 20)."""

    def field(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(*[strategy] * 19, json_values) if hostile else strategy

    def obj(
        required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
    ) -> st.SearchStrategy[dict[str, Any]]:
        if hostile:
            return st.fixed_dictionaries({}, optional={**required, **optional})
        return st.fixed_dictionaries(required, optional=optional)

    names = st.sampled_from(["bearer", "oauth", "key", ""])
    modes = st.lists(st.sampled_from(["text/plain", "*/*", "image/*", "x"]), max_size=3)
    interface = obj(
        {"url": field(st.sampled_from(["http://a.test/rpc", "https://b.test", "ftp://x"]))},
        {
            "protocolBinding": field(st.sampled_from(["JSONRPC", "HTTP+JSON", "GRPC", "REST"])),
            "protocolVersion": field(st.sampled_from(["1.0", "0.3", ""])),
        },
    )
    scopes = obj({}, {"list": field(modes)})
    requirement_v10 = obj({}, {"schemes": field(st.dictionaries(names, field(scopes), max_size=2))})
    requirement_v03 = st.dictionaries(names, field(st.lists(st.text(max_size=4), max_size=2)))
    scheme = st.fixed_dictionaries(
        {"type": st.sampled_from(["apiKey", "http", "oauth2", "nope"])},
        optional={"in": st.just("header"), "scheme": st.just("Bearer")},
    ) | st.fixed_dictionaries({"httpAuthSecurityScheme": clean_values})
    skill = obj(
        {"id": field(st.text(min_size=1, max_size=3))},
        {
            "name": field(st.text(max_size=4)),
            "tags": field(st.lists(st.text(max_size=4), max_size=2)),
            "inputModes": field(modes),
            "outputModes": field(modes),
            "securityRequirements": field(st.lists(requirement_v10, max_size=2)),
            "security": field(st.lists(requirement_v03, max_size=2)),
            "inputSchema": field(clean_values),
        },
    )
    skills = st.lists(skill, max_size=3, unique_by=None if hostile else (lambda s: s["id"]))
    capabilities = obj(
        {},
        {
            "pushNotifications": field(st.booleans()),
            "streaming": field(st.booleans()),
            "extensions": field(st.lists(obj({"uri": field(st.text(min_size=1))}, {}), max_size=2)),
        },
    )
    return st.fixed_dictionaries(
        {
            "name": field(st.text(min_size=1, max_size=6)),
            "supportedInterfaces": field(st.lists(interface, max_size=3)),
        },
        optional={
            "version": field(st.text(max_size=4)),
            "url": field(st.sampled_from(["http://old.test", "https://old.test/a2a"])),
            "protocolVersion": field(st.sampled_from(["0.3.0", ""])),
            "preferredTransport": field(st.sampled_from(["JSONRPC", "REST", "GRPC"])),
            "additionalInterfaces": field(st.lists(interface, max_size=2)),
            "capabilities": field(capabilities),
            "securitySchemes": field(st.dictionaries(names, field(scheme), max_size=2)),
            "securityRequirements": field(st.lists(requirement_v10, max_size=2)),
            "security": field(st.lists(requirement_v03, max_size=2)),
            "defaultInputModes": field(modes),
            "skills": field(skills),
            "signatures": field(clean_values),
            "vendorExtra": field(clean_values),
        },
    )


def nested(depth: int, opener: bytes, closer: bytes) -> bytes:
    return opener * depth + b"0" + closer * depth


deep_bodies = st.builds(
    lambda depth, brackets: nested(depth, *brackets),
    st.integers(1, 5000),
    st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]),
)
# A valid card carrying deep nesting in an unknown field: only the depth limit can refuse it.
deep_cards = st.integers(1, 200).map(
    lambda depth: b'{"name":"a","url":"http://a.test","x":' + nested(depth, b"[", b"]") + b"}"
)
serialised = st.one_of(json_values, card_documents(hostile=True)).map(
    lambda doc: json.dumps(doc, allow_nan=True).encode()
)
truncated = st.tuples(serialised, st.integers(0, 200)).map(lambda t: t[0][: t[1]])
any_bytes = st.one_of(st.binary(), serialised, truncated, deep_bodies, deep_cards)


# --- the property --------------------------------------------------------------------------------


def depth_of(doc: object) -> int:
    """Container nesting depth, iteratively (the input may be deep)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return deepest


def escapes(parser: Callable[[bytes], object], body: bytes) -> str | None:
    """What is wrong with ``parser``'s answer to ``body``, or None when it is acceptable."""
    try:
        card = parser(body)
    except CardInvalidError:
        return None
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!r}"[:300]
    if not isinstance(card, AgentCard):
        return f"returned {type(card).__name__}, not an AgentCard"
    if depth_of(card.to_json()) > DEPTH_LIMIT:
        return "accepted a card nested deeper than the limit"
    return None


@given(any_bytes)
def test_any_bytes_give_a_card_or_a_card_invalid_error(body: bytes) -> None:
    assert escapes(parse_card, body) is None


@given(card_documents(hostile=False).map(lambda doc: json.dumps(doc).encode()))
def test_accepted_cards_reparse_from_canonical_bytes_to_the_same_hashes(body: bytes) -> None:
    try:
        card = parse_card(body)
    except CardInvalidError:
        return
    again = parse_card(card.canonical_bytes())
    assert (again.revision, again.contract_hash) == (card.revision, card.contract_hash)
    assert [s.compatibility_hash for s in again.skills] == [
        s.compatibility_hash for s in card.skills
    ]


# --- teeth: the same property catches planted bugs -----------------------------------------------


def catches(parser: Callable[[bytes], object]) -> bytes:
    """A body on which the property rejects ``parser`` (hypothesis fails the test if none)."""
    # A budget of its own: the profile's (small under `dev`) is for the property, not the hunt.
    budget = settings(max_examples=5000, database=None, deadline=None, derandomize=True)
    return find(any_bytes, lambda body: escapes(parser, body) is not None, settings=budget)


def test_property_catches_a_parser_that_lets_decoding_errors_escape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        cardfence.engine.cards.model, "_decode", lambda body, max_depth: json.loads(body)
    )
    assert escapes(parse_card, catches(parse_card)) is not None


def test_property_catches_a_parser_that_lets_a_key_error_escape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def required_str(obj: dict[str, Any], key: str, path: str) -> str:
        return str(obj[key])  # the planted bug: trusts the field to be there

    monkeypatch.setattr(cardfence.engine.cards.model, "_required_str", required_str)
    body = catches(parse_card)
    assert "KeyError" in (escapes(parse_card, body) or "")


def test_property_catches_a_parser_without_the_depth_limit() -> None:
    unlimited = functools.partial(parse_card, max_depth=10**6)
    body = catches(unlimited)
    assert escapes(unlimited, body) == "accepted a card nested deeper than the limit"
