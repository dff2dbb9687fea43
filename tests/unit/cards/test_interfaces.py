"""Which of a card's interfaces cardfence talks to, and in what (``engine/cards/interfaces.py``),
value by value: the URL rule (R16), the ranking of interfaces, the refusals and their messages, the
media-type matching of skills' modes and the A2A versions spoken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.cards.spoken import (
    HTTP_JSON,
    JSONRPC,
    V03,
    V10,
    dialect_of,
    modes_match,
    modes_meet,
    part_kind,
    spoken_version,
)
from cardfence.engine.cards.urls import is_loopback, url_refusal
from cardfence.engine.errors import CardInvalidError, ProtocolUnsupportedError

CARD_URL = "https://a.test/.well-known/agent-card.json"
PLAIN = "plain http to a non-loopback host refused (https required)"
NO_HOST = "not an http(s) URL with a host"


def card(*interfaces: tuple[str, str, str]) -> AgentCard:
    """A v1.0 card with these (url, binding, version) interfaces, in this order; an empty
    binding or version is left out of the card."""
    declared: list[dict[str, Any]] = []
    for url, binding, version in interfaces:
        entry = {"url": url}
        if binding:
            entry["protocolBinding"] = binding
        if version:
            entry["protocolVersion"] = version
        declared.append(entry)
    doc = {"name": "Agent", "version": "1", "supportedInterfaces": declared, "skills": []}
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


def legacy(version: str = "") -> AgentCard:
    """A 0.2/0.3-shaped card: a top-level url, ``protocolVersion`` only when given."""
    doc: dict[str, Any] = {"name": "Agent", "url": "https://a.test/rpc", "skills": []}
    if version:
        doc["protocolVersion"] = version
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


# --- the URL rule (R16) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LocalHost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost.a.test", False),
        ("X127.0.0.1", False),
        ("10.0.0.1", False),
        ("a.test", False),
        ("", False),
    ],
)
def test_only_localhost_and_loopback_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://a.test/rpc", None),
        ("HTTPS://a.test/rpc", None),
        ("http://127.0.0.1:8000/rpc", None),
        ("http://[::1]:8000/rpc", None),
        ("HTTP://localhost/rpc", None),
        ("http://a.test/rpc", PLAIN),
        ("http://10.0.0.1/rpc", PLAIN),
        ("https:///rpc", NO_HOST),
        ("http:///rpc", NO_HOST),
        ("ftp://a.test/rpc", NO_HOST),
        ("a.test/rpc", NO_HOST),
        ("http://[::1/rpc", "not a valid URL"),
    ],
)
def test_a_url_is_refused_with_its_reason_unless_https_or_loopback_http(
    url: str, why: str | None
) -> None:
    assert url_refusal(url) == why


def test_allow_insecure_lifts_only_the_loopback_condition() -> None:
    assert url_refusal("http://a.test/rpc", allow_insecure=True) is None
    assert url_refusal("ftp://a.test/rpc", allow_insecure=True) == NO_HOST
    assert url_refusal("http:///rpc", allow_insecure=True) == NO_HOST


# --- choosing an interface ------------------------------------------------------------------------


def test_declared_1x_comes_before_undeclared_which_comes_before_0x() -> None:
    offered = (
        ("https://a.test/v03", "JSONRPC", "0.3"),
        ("https://a.test/none", "JSONRPC", ""),
        ("https://a.test/v11", "JSONRPC", "1.1"),
    )
    assert select_interface(card(*offered)).url == "https://a.test/v11"
    assert select_interface(card(*offered[:2])).url == "https://a.test/none"
    assert select_interface(card(offered[0])).url == "https://a.test/v03"


def test_the_version_outranks_the_preferred_binding_which_outranks_the_card_order() -> None:
    offered = card(
        ("https://a.test/rest03", "HTTP+JSON", "0.3"),
        ("https://a.test/rpc", "JSONRPC", "1.0"),
        ("https://a.test/rest", "HTTP+JSON", "1.0"),
    )
    assert select_interface(offered).url == "https://a.test/rpc"
    assert select_interface(offered, ["http+json"]).url == "https://a.test/rest"
    assert select_interface(offered, ["rest"]).url == "https://a.test/rest"


def test_a_binding_named_twice_keeps_its_first_place_in_the_preference() -> None:
    offered = card(("https://a.test/rpc", "JSONRPC", "1.0"), ("https://a.test/rest", "REST", "1.0"))
    assert select_interface(offered, ["HTTP+JSON", "JSONRPC", "REST"]).binding == HTTP_JSON
    assert select_interface(offered, ["JSONRPC", "HTTP+JSON", "JSONRPC"]).binding == JSONRPC


def test_preferring_an_unspoken_binding_names_it_and_what_is_spoken() -> None:
    with pytest.raises(ValueError, match="'grpc'") as refused:
        select_interface(card(("https://a.test/rpc", "JSONRPC", "1.0")), ["JSONRPC", "grpc"])
    assert str(refused.value) == "cannot prefer binding 'grpc': we speak ('JSONRPC', 'HTTP+JSON')"


def test_upper_case_schemes_are_spoken_and_other_schemes_are_not() -> None:
    offered = card(
        ("ws://a.test/rpc", "JSONRPC", "1.0"),
        ("HTTPS://a.test/rpc", "JSONRPC", "1.0"),
    )
    assert select_interface(offered).url == "HTTPS://a.test/rpc"


def test_an_insecure_interface_is_passed_over_for_a_usable_one_later_in_the_card() -> None:
    offered = card(
        ("http://a.test/rpc", "JSONRPC", "1.0"),
        ("https://a.test/rest", "HTTP+JSON", "0.3"),
    )
    assert select_interface(offered).url == "https://a.test/rest"
    assert select_interface(offered, allow_insecure=True).url == "http://a.test/rpc"


def test_a_card_whose_interfaces_speak_no_version_we_speak_names_the_versions_once() -> None:
    offered = card(
        ("https://a.test/a", "JSONRPC", "2.0"),
        ("https://a.test/b", "HTTP+JSON", "0.1"),
        ("https://a.test/c", "JSONRPC", "2.0"),
        ("https://a.test/d", "GRPC", "1.0"),
    )
    with pytest.raises(ProtocolUnsupportedError) as refused:
        select_interface(offered)
    assert refused.value.offered == ("2.0", "0.1")
    assert refused.value.url == CARD_URL
    assert refused.value.kind == "unsupported_protocol"


def test_a_card_with_no_binding_we_speak_lists_what_it_offers() -> None:
    offered = card(
        ("grpc.a.test:443", "GRPC", "1.0"),
        ("https://a.test/x", "", "1.0"),
        ("ftp://a.test/rpc", "JSONRPC", "1.0"),
    )
    with pytest.raises(CardInvalidError) as refused:
        select_interface(offered)
    assert not isinstance(refused.value, ProtocolUnsupportedError)
    assert refused.value.detail == (
        "invalid Agent Card: supportedInterfaces: none we speak "
        "(GRPC grpc.a.test:443, ? https://a.test/x, JSONRPC ftp://a.test/rpc)"
    )
    assert (refused.value.field, refused.value.kind) == ("supportedInterfaces", "invalid_card")
    assert refused.value.url == CARD_URL


def test_a_card_of_insecure_interfaces_only_names_three_and_counts_the_rest() -> None:
    urls = [f"http://{host}.test/rpc" for host in "abcd"]
    with pytest.raises(CardInvalidError) as refused:
        select_interface(card(*((url, "JSONRPC", "1.0") for url in urls)))
    assert refused.value.detail == (
        f"no interface may be used: JSONRPC {urls[0]}: {PLAIN}; JSONRPC {urls[1]}: {PLAIN}; "
        f"JSONRPC {urls[2]}: {PLAIN} (and 1 more)"
    )
    assert (refused.value.field, refused.value.kind) == ("supportedInterfaces", "insecure")
    assert refused.value.url == CARD_URL
    with pytest.raises(CardInvalidError) as three:
        select_interface(card(*((url, "JSONRPC", "1.0") for url in urls[:3])))
    assert three.value.detail.endswith(f"JSONRPC {urls[2]}: {PLAIN}")


def test_a_legacy_card_without_a_version_is_spoken_as_0_3() -> None:
    chosen = select_interface(legacy())
    assert (chosen.url, chosen.speaks, chosen.dialect) == ("https://a.test/rpc", V03, V03)
    assert select_interface(legacy("0.2.5")).speaks == V03
    with pytest.raises(ProtocolUnsupportedError):
        select_interface(legacy("0.1"))


# --- media types ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("modes", "media_type", "matches"),
    [
        ((), "image/png", True),
        (("*",), "image/png", True),
        (("*/*",), "image/png", True),
        (("image/png",), "IMAGE/PNG; q=1", True),
        (("Image/PNG; x=y",), "image/png", True),
        (("image/jpeg",), "image/png", False),
        (("image/*",), "image/png", True),
        (("image/*",), "imagex/png", False),
        (("text/*",), "text", False),
        (("text/*",), "text/x/y", True),
        (("text/x/*",), "text/x/y", False),
        (("text/*",), "application/json", False),
        (("text",), "text/markdown", True),
        (("data",), "application/json", True),
        (("data",), "application/ld+json", True),
        (("data",), "text/plain", False),
        (("file",), "image/png", True),
        (("file",), "application/json", False),
        (("text/plain", "image/*"), "image/gif", True),
    ],
)
def test_a_mode_matches_its_type_ranges_and_the_0_3_part_words(
    modes: tuple[str, ...], media_type: str, matches: bool
) -> None:
    assert modes_match(modes, media_type) is matches


@pytest.mark.parametrize(
    ("offered", "wanted", "meets"),
    [
        ((), "image/png", True),
        (("image/png",), "image/png", True),
        (("image/png",), "image/*", True),
        (("image/*",), "image/png", True),
        (("text/plain",), "*/*", True),
        (("text/plain",), "image/*", False),
        (("text",), "text/*", True),
        (("text",), "text/markdown", True),
        (("text",), "image/*", False),
        (("data",), "application/*", True),
        (("data",), "text/*", False),
        (("file",), "image/*", True),
        (("file",), "text/*", False),
        (("text/plain", "image/png"), "image/*", True),
        (("image/png",), "imagex/*", False),
    ],
)
def test_an_accepted_output_range_meets_a_mode_a_skill_produces(
    offered: tuple[str, ...], wanted: str, meets: bool
) -> None:
    assert modes_meet(offered, wanted) is meets


@pytest.mark.parametrize(
    ("media_type", "kind"),
    [
        ("text/plain", "text"),
        (" TEXT/Markdown; charset=utf-8", "text"),
        ("application/json", "data"),
        ("Application/JSON; charset=utf-8", "data"),
        ("application/vnd.a+json", "data"),
        ("application/jsonl", "file"),
        ("textual/x", "file"),
        ("image/png", "file"),
    ],
)
def test_a_media_type_travels_in_the_0_3_part_of_its_kind(media_type: str, kind: str) -> None:
    assert part_kind(media_type) == kind


# --- versions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "legacy_card", "spoken"),
    [
        ("1.0", False, V10),
        ("1", False, V10),
        ("1.5.2", True, V10),
        (" 1.0 ", False, V10),
        ("", False, V10),
        ("  ", False, V10),
        ("", True, V03),
        ("0.3", False, V03),
        ("0.3.0", False, V03),
        ("0.2.1", False, V03),
        ("0.1", False, ""),
        ("0", False, ""),
        ("0.30", False, ""),
        ("2.0", False, ""),
        ("10.0", False, ""),
    ],
)
def test_the_version_spoken_to_an_interface_is_1_0_for_1x_and_0_3_for_0_2_and_0_3(
    declared: str, legacy_card: bool, spoken: str
) -> None:
    assert spoken_version(declared, legacy_card=legacy_card) == spoken


@pytest.mark.parametrize(
    ("declared", "legacy_card", "dialect"),
    [
        ("0.3", False, V03),
        (" 0.1", False, V03),
        ("", True, V03),
        (" ", True, V03),
        ("", False, V10),
        ("1.0", True, V10),
        ("2.0", False, V10),
        ("10.3", False, V10),
    ],
)
def test_any_0x_interface_takes_the_0_3_shapes_and_any_other_the_1_0_ones(
    declared: str, legacy_card: bool, dialect: str
) -> None:
    assert dialect_of(declared, legacy_card=legacy_card) == dialect


def test_an_interface_is_taken_for_one_of_a_1_0_card_unless_told_otherwise() -> None:
    assert (spoken_version(""), dialect_of("")) == (V10, V10)
