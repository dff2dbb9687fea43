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


# --------------------------------------------------------------------------------------------------
# The hashes a store keeps of a card stay the same from one release to the next.
#
# A task records the revision, contract hash and skill compatibility hash of the card it was created
# under (R3, R9, R14), and every later card read is compared with them: on resume, at each
# re-validation, by the audit. A release that hashed the same card otherwise would see every stored
# task's contract diverge and its skill change on the first read after the upgrade. So the hashes of
# two fixed cards, one of each A2A generation, are written out here: a change to any of them is a
# change to stored data, which needs a migration and a CHANGELOG entry, not a new expected value.


V10_CARD: dict[str, Any] = {
    "name": "Invoices",
    "description": "Reconciles invoices",
    "version": "2.1.0",
    "supportedInterfaces": [
        {"url": "https://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {
            "url": "https://a.test/rest",
            "protocolBinding": "HTTP+JSON",
            "protocolVersion": "1.0",
            "tenant": "acme",
        },
        {"url": "https://a.test/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ],
    "capabilities": {"streaming": True, "pushNotifications": True},
    "securitySchemes": {
        "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "JWT"}},
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}},
    },
    "securityRequirements": [
        {"schemes": {"bearer": {"list": ["write", "read"]}}},
        {"schemes": {"key": {}}},
    ],
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["application/json"],
    "skills": [
        {
            "id": "reconcile",
            "name": "Reconcile",
            "description": "Matches",
            "tags": ["finance"],
            "examples": ["reconcile March"],
            "inputModes": ["text/plain", "application/json"],
            "inputSchema": {"type": "object"},
            "securityRequirements": [{"schemes": {"bearer": {"list": ["admin"]}}}],
        },
        {"id": "echo", "name": "Echo", "description": "Echoes", "tags": []},
    ],
    "signatures": [{"protected": "e30", "signature": "AA"}],
}

# The same contract as published by a 0.3 agent: flattened schemes, "security", bare-word modes.
V03_CARD: dict[str, Any] = {
    "name": "Invoices",
    "version": "2.1.0",
    "url": "https://a.test/v03",
    "protocolVersion": "0.3.0",
    "additionalInterfaces": [{"url": "https://a.test/rest", "transport": "REST"}],
    "securitySchemes": {
        "bearer": {"type": "http", "scheme": "Bearer", "bearerFormat": "JWT"},
        "key": {"type": "apiKey", "in": "header", "name": "X-Key"},
    },
    "security": [{"bearer": ["write", "read"]}, {"key": []}],
    "defaultInputModes": ["text"],
    "defaultOutputModes": ["data"],
    "skills": [
        {
            "id": "reconcile",
            "name": "Reconcile",
            "description": "Matches",
            "tags": [],
            "security": [{"bearer": ["admin"]}],
        }
    ],
}

SCHEMES = "1add32001b58f9b61fd31e87f5247a6c81a63fe1fc8129ba3bb84a453c684b8c"
REQUIREMENTS = "5b8ae811a97c79d02abb2018338fc29c1df15576fb47a5dde83ea4b5ffe25d40"


def hashes(card: AgentCard) -> dict[str, Any]:
    return {
        "revision": card.revision,
        "contract": card.contract_hash,
        "schemes": card.contract.security_schemes_hash,
        "requirements": card.contract.security_requirements_hash,
        "skills": {s.id: (s.compatibility_hash, s.content_hash) for s in card.skills},
    }


def test_a_1_0_card_keeps_the_hashes_stores_already_hold() -> None:
    assert hashes(parse_card(json.dumps(V10_CARD).encode())) == {
        "revision": "216489213d7e8db2c9bd5ad31687f13b5a36c02cae15e8d39c8454c1ef5c3913",
        "contract": "36af1ab5858d08426d5d4e1441fd4e5df269618b7b5a0546d5bf4a1624d92b48",
        "schemes": SCHEMES,
        "requirements": REQUIREMENTS,
        "skills": {
            "reconcile": (
                "71c769724a9096ea51ec8265b1157d140e805470e5b415f99e175951e1b7d048",
                "1498e73e2246566f5bb11dc39adfcb8c1f8c9eb1d224ef39a2d7118c79371494",
            ),
            "echo": (
                "9e785a1b8a21fd20887cfbb228ce883d62eb0e7591bea622254e01330725cf05",
                "cef95cc6fbcb81beaaf57617c67b77994ea3c3ee76b0d68e3dbe3686f0b16aa8",
            ),
        },
    }


def test_a_0_3_card_keeps_the_hashes_stores_already_hold() -> None:
    assert hashes(parse_card(json.dumps(V03_CARD).encode())) == {
        "revision": "b1e7da75d8b74675810d61e040a78e9de9bcc4be5bfccdd065b900e4f5cbcdb5",
        "contract": "ba676331e61924c1105a80886aa69abcd3f53bc4eff45f12a81eec83992a10ab",
        "schemes": SCHEMES,
        "requirements": REQUIREMENTS,
        "skills": {
            "reconcile": (
                "afd3a795b54a479c5b7e849421c4665e80e338da2f7b1653aa4a8e7fc1ffb859",
                "6da00daa104b3830c6f5f98f736377b3950fcbd9e013a54c757cf876af1a4151",
            ),
        },
    }


# --------------------------------------------------------------------------------------------------
# The card model (``engine/cards/model.py``) refusal by refusal: each refusal's whole detail, the
# copies handed out, the schemes read in 1.0 shape, what a skill produces. Pure.


HTTPS_CARD_URL = "https://a.test/.well-known/agent-card.json"


def required_only(**fields: Any) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": "Agent",
        "supportedInterfaces": [
            {"url": "https://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "skills": [{"id": "echo", "name": "Echo", "description": "Echoes", "tags": []}],
    }
    card.update(fields)
    return card


def parse_https(doc: Any) -> AgentCard:
    return parse_card(json.dumps(doc).encode(), url=HTTPS_CARD_URL)


def refusal(doc: Any) -> CardInvalidError:
    with pytest.raises(CardInvalidError) as refused:
        parse_https(doc)
    return refused.value


@pytest.mark.parametrize(
    ("doc", "field", "detail"),
    [
        ([1], "", "card must be a JSON object, not a list"),
        (required_only(name=""), "name", "required: a non-empty string"),
        (required_only(name=7), "name", "must be a string, not a number"),
        (required_only(description=True), "description", "must be a string, not a boolean"),
        (
            required_only(supportedInterfaces=[]),
            "supportedInterfaces",
            "required: at least one interface (or a 0.3 top-level url)",
        ),
        (
            required_only(supportedInterfaces=[{"url": ""}]),
            "supportedInterfaces[0].url",
            "required: a non-empty string",
        ),
        (
            required_only(supportedInterfaces=[{"url": "https://a.test", "protocolVersion": 1}]),
            "supportedInterfaces[0].protocolVersion",
            "must be a string, not a number",
        ),
        (
            required_only(capabilities={"streaming": "yes"}),
            "capabilities.streaming",
            "must be a boolean, not a string",
        ),
        (
            required_only(capabilities={"extensions": [{"uri": "urn:x", "required": 1}]}),
            "capabilities.extensions[0].required",
            "must be a boolean, not a number",
        ),
        (
            required_only(supportsAuthenticatedExtendedCard="yes"),
            "supportsAuthenticatedExtendedCard",
            "must be a boolean, not a string",
        ),
        (
            required_only(defaultInputModes="text/plain"),
            "defaultInputModes",
            "must be a list of strings, not a string",
        ),
        (
            required_only(defaultOutputModes=["text/plain", None]),
            "defaultOutputModes[1]",
            "must be a string, not null",
        ),
        (
            required_only(skills=[{"id": "a"}, {"id": "a"}]),
            "skills[1].id",
            "duplicate skill id 'a'",
        ),
        (
            required_only(skills=[{"id": "a", "tags": [{}]}]),
            "skills[0].tags[0]",
            "must be a string, not an object",
        ),
        (
            required_only(securityRequirements=[{"schemes": {"oauth": ["read"]}}]),
            "securityRequirements[0].schemes.oauth",
            "must be an object, not a list",
        ),
        (
            required_only(securityRequirements=[{"schemes": {"oauth": {"list": "read"}}}]),
            "securityRequirements[0].schemes.oauth.list",
            "must be a list of strings, not a string",
        ),
        (
            required_only(security=[{"oauth": "read"}]),
            "security[0].oauth",
            "must be a list of strings, not a string",
        ),
        (
            required_only(securitySchemes=[1]),
            "securitySchemes",
            "must be an object, not a list",
        ),
        (required_only(version=2), "version", "must be a string, not a number"),
        (
            required_only(extra=2**1024),
            "extra",
            "number beyond the largest double (±1.7976931348623157e+308)",
        ),
        (
            {"name": "A", "url": "https://a.test", "additionalInterfaces": [{"url": ""}]},
            "additionalInterfaces[0].url",
            "required: a non-empty string",
        ),
        (
            {
                "name": "A",
                "url": "https://a.test",
                "additionalInterfaces": [{"url": "https://b.test", "transport": 1}],
            },
            "additionalInterfaces[0].transport",
            "must be a string, not a number",
        ),
        (
            {"name": "A", "url": "https://a.test", "additionalInterfaces": {}},
            "additionalInterfaces",
            "must be a list, not an object",
        ),
        (
            required_only(supportedInterfaces=[{"url": "https://a.test", "protocolBinding": 1}]),
            "supportedInterfaces[0].protocolBinding",
            "must be a string, not a number",
        ),
        (
            required_only(supportedInterfaces=[{"url": "https://a.test", "tenant": {}}]),
            "supportedInterfaces[0].tenant",
            "must be a string, not an object",
        ),
        ({"name": "A", "url": "", "skills": []}, "url", "required: a non-empty string"),
        (
            {"name": "A", "url": "https://a.test", "protocolVersion": 0.3},
            "protocolVersion",
            "must be a string, not a number",
        ),
        (
            {"name": "A", "url": "https://a.test", "preferredTransport": 1},
            "preferredTransport",
            "must be a string, not a number",
        ),
        (
            required_only(securityRequirements=[{"schemes": []}]),
            "securityRequirements[0].schemes",
            "must be an object, not a list",
        ),
        (required_only(capabilities=[]), "capabilities", "must be an object, not a list"),
        (
            required_only(capabilities={"extendedAgentCard": 1}),
            "capabilities.extendedAgentCard",
            "must be a boolean, not a number",
        ),
        (
            required_only(capabilities={"extensions": [{"required": True}]}),
            "capabilities.extensions[0].uri",
            "required: a non-empty string",
        ),
        (required_only(skills={"id": "a"}), "skills", "must be a list, not an object"),
        (
            required_only(skills=[{"id": "a", "name": 1}]),
            "skills[0].name",
            "must be a string, not a number",
        ),
        (
            required_only(skills=[{"id": "a", "description": []}]),
            "skills[0].description",
            "must be a string, not a list",
        ),
        (
            required_only(skills=[{"id": "a", "examples": [1]}]),
            "skills[0].examples[0]",
            "must be a string, not a number",
        ),
        (
            required_only(skills=[{"id": "a", "inputModes": "text/plain"}]),
            "skills[0].inputModes",
            "must be a list of strings, not a string",
        ),
        (
            required_only(skills=[{"id": "a", "outputModes": [None]}]),
            "skills[0].outputModes[0]",
            "must be a string, not null",
        ),
        (
            required_only(skills=[{"id": "a", "securityRequirements": [{"schemes": {"k": 1}}]}]),
            "skills[0].securityRequirements[0].schemes.k",
            "must be an object, not a number",
        ),
        (
            required_only(skills=[{"id": "a", "security": [{"k": "read"}]}]),
            "skills[0].security[0].k",
            "must be a list of strings, not a string",
        ),
        (
            required_only(securitySchemes={"k": 1}),
            "securitySchemes.k",
            "must be an object, not a number",
        ),
        (
            required_only(securitySchemes={"k": None}),
            "securitySchemes.k",
            "must be an object, not null",
        ),
    ],
)
def test_each_refusal_names_the_field_and_says_what_is_wrong_with_it(
    doc: Any, field: str, detail: str
) -> None:
    refused = refusal(doc)
    where = f"{field}: " if field else ""
    assert (refused.field, refused.detail) == (field, f"invalid Agent Card: {where}{detail}")
    assert (refused.url, refused.kind) == (HTTPS_CARD_URL, "invalid_card")


def test_the_copies_a_card_hands_out_are_deep() -> None:
    schemes = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
    card = parse_https(required_only(securitySchemes=schemes))
    card.to_json()["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] = "x"
    card.security_schemes()["bearer"]["httpAuthSecurityScheme"]["scheme"] = "y"
    assert card.to_json()["securitySchemes"] == schemes
    assert card.security_schemes() == schemes


def test_schemes_are_read_in_1_0_shape_and_one_of_unknown_type_as_written() -> None:
    card = parse_https(
        required_only(
            securitySchemes={
                "key": {"type": "apiKey", "in": "header", "name": "X-Key"},
                "both": {
                    "type": "http",
                    "scheme": "basic",
                    "httpAuthSecurityScheme": {"scheme": "Basic"},
                },
                "future": {"type": "quantumAuth", "strength": 9},
                "odd": {"type": ["http"], "scheme": "basic"},
                "untyped": {"scheme": "basic"},
            }
        )
    )
    assert card.security_schemes() == {
        "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}},
        "both": {"httpAuthSecurityScheme": {"scheme": "Basic"}},
        "future": {"type": "quantumAuth", "strength": 9},
        "odd": {"type": ["http"], "scheme": "basic"},
        "untyped": {"scheme": "basic"},
    }
    assert parse_https(required_only()).security_schemes() == {}
    assert parse_https(required_only(securitySchemes=None)).security_schemes() == {}


def test_a_skill_produces_only_its_output_modes() -> None:
    skill = parse_https(required_only(defaultOutputModes=["text/plain"])).skill("echo")
    assert skill is not None
    assert skill.produces("text/markdown; charset=utf-8") is False
    assert skill.produces("TEXT/PLAIN") is True


def test_a_skill_keeps_its_descriptive_fields_as_the_card_gives_them() -> None:
    described = {
        "id": "echo",
        "name": "Echo",
        "description": "Echoes what it is sent",
        "tags": ["debug", "text"],
        "examples": ["echo hello", "echo again"],
    }
    skill = parse_https(required_only(skills=[described])).skill("echo")
    assert skill is not None
    assert (skill.name, skill.description, skill.tags, skill.examples) == (
        "Echo",
        "Echoes what it is sent",
        ("debug", "text"),
        ("echo hello", "echo again"),
    )
    bare = parse_https(required_only(skills=[{"id": "echo"}])).skill("echo")
    assert bare is not None
    assert (bare.name, bare.description, bare.tags, bare.examples) == ("", "", (), ())


def test_a_body_over_the_limit_is_refused_by_its_size_and_the_default_limit_is_one_mib() -> None:
    padded = json.dumps(required_only()).encode()
    at_limit = padded + b" " * (1_048_576 - len(padded))
    assert parse_card(at_limit).source_url == ""
    with pytest.raises(CardInvalidError) as refused:
        parse_card(at_limit + b" ", url=HTTPS_CARD_URL)
    assert (refused.value.url, refused.value.kind) == (HTTPS_CARD_URL, "too_large")
    assert refused.value.detail == "card body is 1048577 bytes, over the limit of 1048576"


def test_the_card_default_modes_are_kept_as_declared() -> None:
    card = parse_https(
        required_only(defaultInputModes=["text/plain"], defaultOutputModes=["image/png"])
    )
    assert (card.default_input_modes, card.default_output_modes) == (
        ("text/plain",),
        ("image/png",),
    )
