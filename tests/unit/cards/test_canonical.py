"""Remote JSON bytes to a JSON value, limit by limit, and the RFC 8785 hashes (R2, R3, R16).

Written to kill the mutants of ``engine/cards/canonical.py`` that ``scripts/mutation`` found
alive: each refusal names the field it is about and says what is wrong with it, and each limit
holds exactly at its bound. Every remote document (card, key set, answer, stream event, push
body, token answer, discovery document) is read by its ``loads``: a repeated member name is
refused by each, naming it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest
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
