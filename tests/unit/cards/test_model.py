"""The Agent Card model on the a2a-sdk 1.3 wire format, on 0.3 cards and on hostile bodies."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import httpx
import pytest
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.server.routes import create_agent_card_routes
from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

from cardfence.engine.cards.diff import CardDiff, diff
from cardfence.engine.cards.interfaces import select_interface
from cardfence.engine.cards.model import (
    AgentCard,
    Extension,
    Interface,
    SecurityRequirement,
    parse_card,
)
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.errors import CardInvalidError

CARD_URL = "http://agent.test/.well-known/agent-card.json"

# --- building cards ------------------------------------------------------------------------------


def sdk_card(versions: tuple[str, ...] = ("1.0",)) -> pb.AgentCard:
    """A card as an a2a-sdk agent declares it: one JSON-RPC and one REST interface per version."""
    interfaces = [
        pb.AgentInterface(
            url=f"http://agent.test/{v}/{path}", protocol_binding=b, protocol_version=v
        )
        for v in versions
        for path, b in (("rpc", "JSONRPC"), ("rest", "HTTP+JSON"))
    ]
    return pb.AgentCard(
        name="Invoices",
        description="Reconciles invoices",
        version="2.1.0",
        supported_interfaces=interfaces,
        capabilities=pb.AgentCapabilities(
            streaming=True,
            push_notifications=True,
            extensions=[pb.AgentExtension(uri="urn:ext:trace", required=True)],
        ),
        security_schemes={
            "bearer": pb.SecurityScheme(
                http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                    scheme="Bearer", bearer_format="JWT"
                )
            ),
            "oauth": pb.SecurityScheme(
                oauth2_security_scheme=pb.OAuth2SecurityScheme(
                    flows=pb.OAuthFlows(
                        client_credentials=pb.ClientCredentialsOAuthFlow(
                            token_url="https://auth.test/token",
                            scopes={"invoices:read": "read", "invoices:write": "write"},
                        )
                    )
                )
            ),
            "key": pb.SecurityScheme(
                api_key_security_scheme=pb.APIKeySecurityScheme(location="header", name="X-Key")
            ),
        },
        security_requirements=[
            pb.SecurityRequirement(schemes={"bearer": pb.StringList()}),
            pb.SecurityRequirement(
                schemes={"oauth": pb.StringList(list=["invoices:write", "invoices:read"])}
            ),
        ],
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["application/json"],
        skills=[
            pb.AgentSkill(
                id="invoice.reconcile",
                name="Reconcile",
                description="Matches invoices to payments",
                tags=["finance"],
                examples=["reconcile March"],
                input_modes=["application/json"],
                security_requirements=[
                    pb.SecurityRequirement(
                        schemes={"oauth": pb.StringList(list=["invoices:write"])}
                    )
                ],
            ),
            pb.AgentSkill(id="echo", name="Echo", description="Echoes", tags=["debug"]),
        ],
    )


def served(card: pb.AgentCard) -> bytes:
    """The exact body a2a-sdk's own card route sends for this card."""
    app = Starlette(routes=create_agent_card_routes(card))

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent.test") as client:
            return await client.get("/.well-known/agent-card.json")

    response = asyncio.run(get())
    assert response.status_code == 200
    return response.content


def minimal(**fields: Any) -> dict[str, Any]:
    """A small hand-written v1.0 card; keyword arguments replace or add top-level fields."""
    card: dict[str, Any] = {
        "name": "Agent",
        "version": "1",
        "supportedInterfaces": [
            {"url": "http://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "echo", "name": "Echo", "description": "Echoes", "tags": ["t"]}],
    }
    card.update(fields)
    return card


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def parse(doc: Any) -> AgentCard:
    return parse_card(encode(doc), url=CARD_URL)


def with_skill(card: dict[str, Any], **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(card)
    changed["skills"][0].update(fields)
    return changed


# --- the official wire format --------------------------------------------------------------------


def test_sdk_published_v10_card_parses_into_the_model() -> None:
    card = parse_card(served(sdk_card()), url=CARD_URL)

    assert (card.name, card.version, card.source_url) == ("Invoices", "2.1.0", CARD_URL)
    assert card.interfaces == (
        Interface("http://agent.test/1.0/rpc", JSONRPC, "1.0"),
        Interface("http://agent.test/1.0/rest", HTTP_JSON, "1.0"),
    )
    assert card.protocol_versions == ("1.0",)
    assert card.push_notifications
    assert card.streaming
    assert card.capabilities.extensions == (Extension("urn:ext:trace", required=True),)
    assert card.default_input_modes == ("text/plain", "application/json")
    assert card.security_requirements == (
        SecurityRequirement((("bearer", ()),)),
        SecurityRequirement((("oauth", ("invoices:read", "invoices:write")),)),
    )
    reconcile = card.skill("invoice.reconcile")
    assert reconcile is not None
    assert reconcile.input_modes == ("application/json",)
    assert reconcile.output_modes == ("application/json",)  # the card's default
    assert reconcile.security_requirements == (
        SecurityRequirement((("oauth", ("invoices:write",)),)),
    )
    assert [s.id for s in card.skills] == ["invoice.reconcile", "echo"]
    assert card.skill("absent") is None
    assert card.compatibility_hash("absent") is None


def test_sdk_dual_card_is_read_through_its_v10_fields() -> None:
    # With a 0.3 interface, a2a-sdk merges 0.3 fields (url, security, flattened schemes) in.
    body = served(sdk_card(versions=("1.0", "0.3")))
    raw = json.loads(body)
    assert raw["url"] == "http://agent.test/0.3/rpc"
    assert raw["securitySchemes"]["bearer"]["type"] == "http"

    dual = parse_card(body)
    pure = parse(MessageToDict(sdk_card(versions=("1.0", "0.3"))))

    assert dual.interfaces == pure.interfaces
    assert dual.protocol_versions == ("0.3", "1.0")
    assert dual.contract_hash == pure.contract_hash
    assert dual.compatibility_hash("invoice.reconcile") == pure.compatibility_hash(
        "invoice.reconcile"
    )


def test_sdk_v03_card_parses_into_the_same_model() -> None:
    legacy = to_compat_agent_card(sdk_card(versions=("0.3",))).model_dump(
        mode="json", exclude_none=True
    )
    assert "supportedInterfaces" not in legacy

    card = parse(legacy)

    assert card.interfaces == (
        Interface("http://agent.test/0.3/rpc", JSONRPC, "0.3"),
        Interface("http://agent.test/0.3/rest", HTTP_JSON, "0.3"),
    )
    assert card.security_requirements == parse_card(served(sdk_card())).security_requirements
    reconcile = card.skill("invoice.reconcile")
    assert reconcile is not None
    assert reconcile.security_requirements[0].to_json() == {"oauth": ["invoices:write"]}


def test_v03_to_v10_republication_of_the_same_contract_hashes_equal() -> None:
    proto = sdk_card(versions=("0.3",))
    as_v03 = parse(to_compat_agent_card(proto).model_dump(mode="json", exclude_none=True))
    as_v10 = parse(MessageToDict(proto))

    assert as_v03.contract_hash == as_v10.contract_hash
    assert as_v03.contract.changed_parts(as_v10.contract) == ()
    for skill in as_v10.skills:
        assert as_v03.compatibility_hash(skill.id) == skill.compatibility_hash


def test_v03_card_defaults_to_jsonrpc_and_reads_rest_alias_and_repeated_main_url() -> None:
    card = parse(
        {
            "name": "Old",
            "url": "http://old.test/a2a",
            "protocolVersion": "0.3.0",
            "additionalInterfaces": [
                {"url": "http://old.test/a2a", "transport": "JSONRPC"},
                {"url": "http://old.test/rest", "transport": "REST"},
            ],
            "security": [{"key": []}],
            "supportsAuthenticatedExtendedCard": True,
        }
    )

    assert card.interfaces == (
        Interface("http://old.test/a2a", JSONRPC, "0.3.0"),
        Interface("http://old.test/rest", HTTP_JSON, "0.3.0"),
    )
    assert card.capabilities.extended_agent_card
    assert card.skills == ()
    assert not card.push_notifications


def test_unknown_fields_are_kept_and_hashed_but_never_rejected() -> None:
    base = minimal()
    extended = minimal(vendorX={"anything": [1, 2.5, None]}, iconUrl="http://a.test/i.png")

    card = parse(extended)

    assert card.to_json()["vendorX"] == {"anything": [1, 2.5, None]}
    assert card.revision != parse(base).revision
    assert card.contract_hash == parse(base).contract_hash


def test_to_json_returns_a_copy() -> None:
    card = parse(minimal())
    card.to_json()["name"] = "mutated"
    assert card.to_json()["name"] == "Agent"


# --- hostile input: each refusal names the field -------------------------------------------------

HOSTILE: list[tuple[str, bytes, str]] = [
    ("not utf-8", b'{"name": "\xff"}', ""),
    ("not json", b"{name: 1}", ""),
    ("empty", b"", ""),
    ("not an object", b"[1, 2]", ""),
    ("missing name", encode({"url": "http://a.test"}), "name"),
    ("name not a string", encode(minimal(name=7)), "name"),
    ("no endpoint", encode({"name": "a"}), "supportedInterfaces"),
    ("interfaces not a list", encode(minimal(supportedInterfaces={})), "supportedInterfaces"),
    (
        "interface not an object",
        encode(minimal(supportedInterfaces=["x"])),
        "supportedInterfaces[0]",
    ),
    (
        "interface without url",
        encode(minimal(supportedInterfaces=[{"protocolBinding": "JSONRPC"}])),
        "supportedInterfaces[0].url",
    ),
    ("skills not a list", encode(minimal(skills={"id": "x"})), "skills"),
    (
        "skill without id",
        encode(minimal(skills=[{"id": "a"}, {"id": "b"}, {"name": "c"}])),
        "skills[2].id",
    ),
    ("skill id not a string", encode(minimal(skills=[{"id": 3}])), "skills[0].id"),
    ("duplicate skill id", encode(minimal(skills=[{"id": "a"}, {"id": "a"}])), "skills[1].id"),
    (
        "mode not a string",
        encode(minimal(skills=[{"id": "a", "inputModes": ["text/plain", 1]}])),
        "skills[0].inputModes[1]",
    ),
    (
        "capability not a boolean",
        encode(minimal(capabilities={"pushNotifications": "yes"})),
        "capabilities.pushNotifications",
    ),
    (
        "requirement scopes not an object",
        encode(minimal(securityRequirements=[{"schemes": {"oauth": ["read"]}}])),
        "securityRequirements[0].schemes.oauth",
    ),
    ("0.3 scopes not a list", encode(minimal(security=[{"oauth": "read"}])), "security[0].oauth"),
    ("scheme not an object", encode(minimal(securitySchemes={"k": 1})), "securitySchemes.k"),
    ("NaN literal", b'{"name": "a", "url": "http://a.test", "x": [NaN]}', "x[0]"),
    ("Infinity literal", b'{"name": "a", "url": "http://a.test", "x": -Infinity}', "x"),
    ("float overflowing to infinity", b'{"name": "a", "url": "http://a.test", "x": 1e400}', "x"),
    (
        "integer beyond the largest double",
        encode(minimal(skills=[{"id": "a", "n": 2**1024}])),
        "skills[0].n",
    ),
    ("integer over the digit limit", b'{"name": "a", "x": ' + b"9" * 5000 + b"}", ""),
    ("duplicate key", b'{"name": "a", "url": "http://a.test", "o": {"k": 1, "k": 2}}', "o.k"),
    ("lone surrogate", b'{"name": "a", "url": "http://a.test", "s": "\\ud800"}', "s"),
    (
        "nested deeper than the limit",
        b'{"name": "a", "url": "http://a.test", "x": ' + b"[" * 40 + b"]" * 40 + b"}",
        "x" + "[0]" * 31,
    ),
    ("nested past the recursion limit", b"[" * 100_000 + b"]" * 100_000, ""),
]


@pytest.mark.parametrize(("body", "field"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_body_is_refused_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(CardInvalidError) as refused:
        parse_card(body, url=CARD_URL)

    assert refused.value.field == field
    assert refused.value.kind == "invalid_card"
    assert CARD_URL in str(refused.value)
    assert f"{field}: " in str(refused.value)


def _rpc(url: str) -> dict[str, Any]:
    return {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}


@pytest.mark.parametrize(
    ("doc", "field", "fault"),
    [
        (minimal(supportedInterfaces=[_rpc("http://a.test:99999/rpc")]),
         "supportedInterfaces[0].url", "its port is not a number from 1 to 65535"),
        (minimal(supportedInterfaces=[_rpc("https://a.test/rpc"), _rpc("http://[::1/rpc")]),
         "supportedInterfaces[1].url", "not a valid URL"),
        (minimal(supportedInterfaces=[_rpc("https://svc:PASS@a.test/rpc")]),
         "supportedInterfaces[0].url", "it carries credentials (user:password@)"),
        ({"name": "a", "url": "https://svc:PASS@a.test/rpc"}, "url", "it carries credentials"),
        ({"name": "a", "url": "https://a.test/rpc", "additionalInterfaces": [
            {"url": "https://a.test:0/rest", "transport": "HTTP+JSON"}]},
         "additionalInterfaces[0].url", "its port is not a number"),
    ],
    ids=["port-99999", "unparseable", "userinfo", "0.3-userinfo", "0.3-port-0"],
)  # fmt: skip
def test_an_interface_url_no_request_could_use_or_carrying_credentials_makes_the_card_invalid(
    doc: dict[str, Any], field: str, fault: str
) -> None:
    with pytest.raises(CardInvalidError) as refused:
        parse(doc)

    assert (refused.value.field, refused.value.kind) == (field, "invalid_card")
    assert f"{field}: {fault}" in str(refused.value)
    assert "PASS" not in str(refused.value)  # shown without its credentials


def test_body_over_the_size_limit_is_refused_before_parsing() -> None:
    with pytest.raises(CardInvalidError) as refused:
        parse_card(b"x" * 101, url=CARD_URL, max_bytes=100)  # not JSON: never looked at
    assert refused.value.kind == "too_large"


def test_body_at_the_size_limit_is_parsed() -> None:
    body = encode(minimal())
    assert parse_card(body, max_bytes=len(body)).name == "Agent"


def test_leading_byte_order_mark_is_tolerated() -> None:
    assert parse_card(b"\xef\xbb\xbf" + encode(minimal())).revision == parse(minimal()).revision


# --- hashes --------------------------------------------------------------------------------------


def test_revision_is_stable_across_key_order_and_whitespace() -> None:
    doc = minimal(capabilities={"streaming": True, "pushNotifications": False})
    reordered = dict(reversed(list(copy.deepcopy(doc).items())))
    reordered["capabilities"] = {"pushNotifications": False, "streaming": True}

    compact = json.dumps(doc, separators=(",", ":")).encode()
    spaced = json.dumps(reordered, indent=4).encode()

    assert parse_card(compact).revision == parse_card(spaced).revision
    assert parse_card(compact).contract_hash == parse_card(spaced).contract_hash


def test_signatures_do_not_affect_revision() -> None:
    unsigned = parse(minimal())
    signed = parse(minimal(signatures=[{"protected": "eyJhbGciOiJFUzI1NiJ9", "signature": "c2ln"}]))

    assert signed.revision == unsigned.revision
    assert signed.canonical_bytes() == unsigned.canonical_bytes()
    assert b"signatures" not in signed.canonical_bytes()
    assert "signatures" in signed.to_json()


def test_canonical_bytes_reparse_to_the_same_revision() -> None:
    card = parse_card(served(sdk_card(versions=("1.0", "0.3"))))
    again = parse_card(card.canonical_bytes())

    assert again.revision == card.revision
    assert again.contract_hash == card.contract_hash
    assert again == card


def test_descriptive_skill_edit_keeps_compatibility_hash() -> None:
    before = parse(minimal())
    after = parse(
        with_skill(minimal(), name="Echo 2", description="New words", tags=["x"], examples=["hi"])
    )

    assert after.compatibility_hash("echo") == before.compatibility_hash("echo")
    assert after.revision != before.revision


@pytest.mark.parametrize(
    "change",
    [
        {"inputModes": ["application/json"]},
        {"outputModes": ["image/png"]},
        {"securityRequirements": [{"schemes": {"bearer": {}}}]},
        {"inputSchema": {"type": "object"}},
        {"OutputJSONSchema": {"type": "string"}},
    ],
    ids=["input mode", "output mode", "security", "schema field", "schema field any case"],
)
def test_mode_security_or_schema_change_alters_compatibility_hash(change: dict[str, Any]) -> None:
    before = parse(minimal())
    after = parse(with_skill(minimal(), **change))
    assert after.compatibility_hash("echo") != before.compatibility_hash("echo")


def test_card_default_mode_change_alters_compatibility_of_skills_without_their_own() -> None:
    before = parse(minimal())
    after = parse(minimal(defaultInputModes=["application/json"]))
    assert after.compatibility_hash("echo") != before.compatibility_hash("echo")


def test_compatibility_hash_ignores_mode_order_and_case() -> None:
    before = parse(with_skill(minimal(), inputModes=["text/plain", "application/json"]))
    after = parse(with_skill(minimal(), inputModes=["Application/JSON", "text/plain"]))
    assert after.compatibility_hash("echo") == before.compatibility_hash("echo")


@pytest.mark.parametrize(
    ("change", "part"),
    [
        (
            {"securitySchemes": {"mtls": {"mtlsSecurityScheme": {}}}},
            "security_schemes",
        ),
        (
            {"securityRequirements": [{"schemes": {"oauth": {"list": ["admin"]}}}]},
            "security_requirements",
        ),
        (
            {
                "supportedInterfaces": [
                    {
                        "url": "http://a.test/rpc",
                        "protocolBinding": "JSONRPC",
                        "protocolVersion": "1.1",
                    }
                ]
            },
            "protocol_versions",
        ),
    ],
    ids=["scheme rotated", "requirement changed", "protocol version bumped"],
)
def test_contract_rotation_changes_contract_hash(change: dict[str, Any], part: str) -> None:
    before = parse(minimal())
    after = parse(minimal(**change))

    assert after.contract_hash != before.contract_hash
    assert before.contract.changed_parts(after.contract) == (part,)


def test_skill_security_change_is_a_contract_change() -> None:
    before = parse(minimal())
    after = parse(with_skill(minimal(), security=[{"oauth": ["write"]}]))
    assert before.contract.changed_parts(after.contract) == ("security_requirements",)


def test_contract_hash_ignores_requirement_and_scope_order() -> None:
    one = {"schemes": {"oauth": {"list": ["a", "b"]}}}
    two = {"schemes": {"bearer": {}}}
    flipped = {"schemes": {"oauth": {"list": ["b", "a"]}}}
    assert (
        parse(minimal(securityRequirements=[one, two])).contract_hash
        == parse(minimal(securityRequirements=[two, flipped])).contract_hash
    )


def test_contract_ignores_endpoint_urls_and_descriptive_fields() -> None:
    moved = minimal(
        description="new words",
        supportedInterfaces=[
            {"url": "http://b.test/v2", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
    )
    assert parse(moved).contract_hash == parse(minimal()).contract_hash


# --- endpoint selection --------------------------------------------------------------------------


def interfaces(*entries: tuple[str, str, str]) -> AgentCard:
    return parse(
        minimal(
            supportedInterfaces=[
                {"url": url, "protocolBinding": binding, "protocolVersion": version}
                for url, binding, version in entries
            ]
        )
    )


def test_selection_follows_the_card_order_among_bindings_we_speak() -> None:
    card = interfaces(
        ("https://a.test/grpc", "GRPC", "1.0"),
        ("https://a.test/rest", "HTTP+JSON", "1.0"),
        ("https://a.test/rpc", "JSONRPC", "1.0"),
    )
    assert select_interface(card) == Interface("https://a.test/rest", HTTP_JSON, "1.0")


def test_selection_honours_the_caller_preference() -> None:
    card = interfaces(
        ("https://a.test/rest", "HTTP+JSON", "1.0"), ("https://a.test/rpc", "JSONRPC", "1.0")
    )
    assert select_interface(card, prefer=["JSONRPC"]).url == "https://a.test/rpc"
    assert select_interface(card, prefer=["REST", "JSONRPC"]).url == "https://a.test/rest"


def test_selection_falls_back_past_an_unavailable_preferred_binding() -> None:
    card = interfaces(("https://a.test/rpc", "JSONRPC", "1.0"))
    assert select_interface(card, prefer=["HTTP+JSON"]).binding == JSONRPC


def test_selection_puts_v10_interfaces_before_legacy_ones() -> None:
    card = interfaces(
        ("https://a.test/v03", "JSONRPC", "0.3"), ("https://a.test/v10", "HTTP+JSON", "1.0")
    )
    assert select_interface(card, prefer=["JSONRPC"]).url == "https://a.test/v10"


def test_selection_refuses_a_card_with_nothing_we_speak() -> None:
    card = interfaces(("grpc.a.test:443", "GRPC", "1.0"), ("ftp://a.test/x", "JSONRPC", "1.0"))
    with pytest.raises(CardInvalidError) as refused:
        select_interface(card)
    assert refused.value.field == "supportedInterfaces"
    assert CARD_URL in str(refused.value)


def test_preferring_a_binding_we_do_not_speak_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="GRPC"):
        select_interface(parse(minimal()), prefer=["GRPC"])


def test_lower_case_binding_names_are_normalised() -> None:
    card = interfaces(("https://a.test/rest", "http+json", "1.0"))
    assert select_interface(card).binding == HTTP_JSON


# --- skills and media types ----------------------------------------------------------------------


def test_skill_accepts_its_own_modes_with_wildcards_and_parameters() -> None:
    card = parse(with_skill(minimal(), inputModes=["text/*", "application/json"]))
    skill = card.skill("echo")
    assert skill is not None
    assert skill.accepts("text/markdown")
    assert skill.accepts("application/json; charset=utf-8")
    assert skill.accepts("TEXT/PLAIN")
    assert not skill.accepts("image/png")
    assert not skill.accepts("textual")


def test_skill_without_modes_falls_back_to_card_defaults() -> None:
    skill = parse(minimal()).skill("echo")
    assert skill is not None
    assert skill.accepts("text/plain")
    assert not skill.accepts("application/json")
    assert skill.produces("text/plain")


def test_no_modes_anywhere_accepts_anything() -> None:
    card = parse(minimal(defaultInputModes=[], defaultOutputModes=None))
    skill = card.skill("echo")
    assert skill is not None
    assert skill.accepts("application/x-anything")
    assert skill.produces("image/png")


def test_star_slash_star_accepts_anything() -> None:
    skill = parse(with_skill(minimal(), inputModes=["*/*"])).skill("echo")
    assert skill is not None
    assert skill.accepts("video/mp4")


# --- diff ----------------------------------------------------------------------------------------


def test_identical_cards_have_an_empty_diff() -> None:
    change = diff(parse(minimal()), parse(minimal()))
    assert change.is_empty
    assert change.to_json() == {}


def test_diff_reports_capability_changes() -> None:
    old = parse(minimal(capabilities={"pushNotifications": True, "streaming": True}))
    new = parse(
        minimal(
            capabilities={
                "streaming": True,
                "extensions": [{"uri": "urn:ext:a", "required": True}],
            }
        )
    )
    change = diff(old, new)

    assert change.capabilities.push_notifications == (True, False)
    assert change.capabilities.streaming is None
    assert change.to_json() == {
        "capabilities": {
            "push_notifications": {"old": True, "new": False},
            "extensions": {"old": [], "new": [{"uri": "urn:ext:a", "required": True}]},
        }
    }


def test_diff_reports_streaming_and_the_extended_card_coming_and_going() -> None:
    old = parse(minimal(capabilities={"streaming": True}))
    new = parse(minimal(capabilities={"extendedAgentCard": True}))
    assert diff(old, new).to_json() == {
        "capabilities": {
            "streaming": {"old": True, "new": False},
            "extended_agent_card": {"old": False, "new": True},
        }
    }
    assert diff(new, old).capabilities.extended_agent_card == (True, False)


def test_diff_of_extensions_ignores_their_order_and_lists_them_sorted() -> None:
    a, b = {"uri": "urn:ext:a", "required": False}, {"uri": "urn:ext:b", "required": True}
    old = parse(minimal(capabilities={"extensions": [b, a]}))
    assert diff(old, parse(minimal(capabilities={"extensions": [a, b]}))).is_empty
    new = parse(minimal(capabilities={"extensions": [{**a, "required": True}, b]}))
    assert diff(old, new).to_json() == {
        "capabilities": {
            "extensions": {"old": [a, b], "new": [{**a, "required": True}, b]},
        }
    }


def test_diff_groups_skills_by_compatibility() -> None:
    old = parse(minimal(skills=[{"id": "gone"}, {"id": "words"}, {"id": "modes"}, {"id": "same"}]))
    new = parse(
        minimal(
            skills=[
                {"id": "words", "description": "new words"},
                {"id": "modes", "inputModes": ["image/png"]},
                {"id": "same"},
                {"id": "new"},
            ]
        )
    )
    change = diff(old, new)

    assert change.skills.added == ("new",)
    assert change.skills.removed == ("gone",)
    assert change.skills.changed_compatibly == ("words",)
    assert change.skills.changed_incompatibly == ("modes",)
    assert change.to_json() == {
        "skills": {
            "added": ["new"],
            "removed": ["gone"],
            "changed_compatibly": ["words"],
            "changed_incompatibly": ["modes"],
        }
    }


def test_diff_reports_contract_change_with_parts() -> None:
    old = parse(minimal())
    new = parse(minimal(securitySchemes={"k": {"type": "apiKey", "in": "header", "name": "K"}}))
    change = diff(old, new)

    assert change.contract.changed
    assert change.to_json()["contract"] == {
        "changed": True,
        "old": old.contract_hash,
        "new": new.contract_hash,
        "parts": ["security_schemes"],
    }


def test_diff_reports_moved_endpoints_and_version() -> None:
    old = parse(minimal())
    moved = [{"url": "http://a.test/v2", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]
    new = parse(minimal(version="2", url="http://ignored.test/v03", supportedInterfaces=moved))
    change = diff(old, new)

    assert change.version == ("1", "2")
    assert change.to_json() == {
        "endpoints": {
            "old": [{"url": "http://a.test/rpc", "binding": "JSONRPC", "protocol_version": "1.0"}],
            "new": [{"url": "http://a.test/v2", "binding": "JSONRPC", "protocol_version": "1.0"}],
        },
        "version": {"old": "1", "new": "2"},
    }


def test_diff_names_the_tenant_of_an_interface_that_has_one() -> None:
    plain = {"url": "http://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    old = parse(minimal(supportedInterfaces=[plain]))
    new = parse(minimal(supportedInterfaces=[{**plain, "tenant": "acme"}]))
    assert diff(old, new).to_json() == {
        "endpoints": {
            "old": [{"url": "http://a.test/rpc", "binding": "JSONRPC", "protocol_version": "1.0"}],
            "new": [
                {
                    "url": "http://a.test/rpc",
                    "binding": "JSONRPC",
                    "protocol_version": "1.0",
                    "tenant": "acme",
                }
            ],
        }
    }


def test_diff_of_descriptive_edit_keeps_contract_and_endpoints_quiet() -> None:
    change = diff(parse(minimal()), parse(minimal(description="now with words")))
    assert isinstance(change, CardDiff)
    assert change.is_empty


def test_diff_payload_is_plain_json() -> None:
    old = parse_card(served(sdk_card()))
    new = parse_card(served(sdk_card(versions=("1.0", "0.3"))))
    payload = diff(old, new).to_json()

    assert json.loads(json.dumps(payload)) == payload
    assert set(payload) == {"contract", "endpoints", "skills"}
    assert payload["contract"]["parts"] == ["protocol_versions"]
    # a2a-sdk adds 0.3 "security" beside "securityRequirements": same compatibility, new bytes
    assert payload["skills"] == {"changed_compatibly": ["invoice.reconcile"]}
