"""The card model (``engine/cards/model.py``) where the card tests looked only for a field's name:
each refusal's whole detail, the copies handed out, the schemes read in 1.0 shape, what a skill
produces. Each test kills mutants that the card tests let live (docs/proofs.md, "Mutation
score"). Pure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cardfence.engine.cards.model import AgentCard, parse_card
from cardfence.engine.errors import CardInvalidError

CARD_URL = "https://a.test/.well-known/agent-card.json"


def minimal(**fields: Any) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": "Agent",
        "supportedInterfaces": [
            {"url": "https://a.test/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "skills": [{"id": "echo", "name": "Echo", "description": "Echoes", "tags": []}],
    }
    card.update(fields)
    return card


def parse(doc: Any) -> AgentCard:
    return parse_card(json.dumps(doc).encode(), url=CARD_URL)


def refusal(doc: Any) -> CardInvalidError:
    with pytest.raises(CardInvalidError) as refused:
        parse(doc)
    return refused.value


@pytest.mark.parametrize(
    ("doc", "field", "detail"),
    [
        ([1], "", "card must be a JSON object, not a list"),
        (minimal(name=""), "name", "required: a non-empty string"),
        (minimal(name=7), "name", "must be a string, not a number"),
        (minimal(description=True), "description", "must be a string, not a boolean"),
        (
            minimal(supportedInterfaces=[]),
            "supportedInterfaces",
            "required: at least one interface (or a 0.3 top-level url)",
        ),
        (
            minimal(supportedInterfaces=[{"url": ""}]),
            "supportedInterfaces[0].url",
            "required: a non-empty string",
        ),
        (
            minimal(supportedInterfaces=[{"url": "https://a.test", "protocolVersion": 1}]),
            "supportedInterfaces[0].protocolVersion",
            "must be a string, not a number",
        ),
        (
            minimal(capabilities={"streaming": "yes"}),
            "capabilities.streaming",
            "must be a boolean, not a string",
        ),
        (
            minimal(capabilities={"extensions": [{"uri": "urn:x", "required": 1}]}),
            "capabilities.extensions[0].required",
            "must be a boolean, not a number",
        ),
        (
            minimal(supportsAuthenticatedExtendedCard="yes"),
            "supportsAuthenticatedExtendedCard",
            "must be a boolean, not a string",
        ),
        (
            minimal(defaultInputModes="text/plain"),
            "defaultInputModes",
            "must be a list of strings, not a string",
        ),
        (
            minimal(defaultOutputModes=["text/plain", None]),
            "defaultOutputModes[1]",
            "must be a string, not null",
        ),
        (
            minimal(skills=[{"id": "a"}, {"id": "a"}]),
            "skills[1].id",
            "duplicate skill id 'a'",
        ),
        (
            minimal(skills=[{"id": "a", "tags": [{}]}]),
            "skills[0].tags[0]",
            "must be a string, not an object",
        ),
        (
            minimal(securityRequirements=[{"schemes": {"oauth": ["read"]}}]),
            "securityRequirements[0].schemes.oauth",
            "must be an object, not a list",
        ),
        (
            minimal(securityRequirements=[{"schemes": {"oauth": {"list": "read"}}}]),
            "securityRequirements[0].schemes.oauth.list",
            "must be a list of strings, not a string",
        ),
        (
            minimal(security=[{"oauth": "read"}]),
            "security[0].oauth",
            "must be a list of strings, not a string",
        ),
        (minimal(securitySchemes=[1]), "securitySchemes", "must be an object, not a list"),
        (minimal(version=2), "version", "must be a string, not a number"),
        (
            minimal(extra=2**1024),
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
            minimal(supportedInterfaces=[{"url": "https://a.test", "protocolBinding": 1}]),
            "supportedInterfaces[0].protocolBinding",
            "must be a string, not a number",
        ),
        (
            minimal(supportedInterfaces=[{"url": "https://a.test", "tenant": {}}]),
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
            minimal(securityRequirements=[{"schemes": []}]),
            "securityRequirements[0].schemes",
            "must be an object, not a list",
        ),
        (minimal(capabilities=[]), "capabilities", "must be an object, not a list"),
        (
            minimal(capabilities={"extendedAgentCard": 1}),
            "capabilities.extendedAgentCard",
            "must be a boolean, not a number",
        ),
        (
            minimal(capabilities={"extensions": [{"required": True}]}),
            "capabilities.extensions[0].uri",
            "required: a non-empty string",
        ),
        (minimal(skills={"id": "a"}), "skills", "must be a list, not an object"),
        (
            minimal(skills=[{"id": "a", "name": 1}]),
            "skills[0].name",
            "must be a string, not a number",
        ),
        (
            minimal(skills=[{"id": "a", "description": []}]),
            "skills[0].description",
            "must be a string, not a list",
        ),
        (
            minimal(skills=[{"id": "a", "examples": [1]}]),
            "skills[0].examples[0]",
            "must be a string, not a number",
        ),
        (
            minimal(skills=[{"id": "a", "inputModes": "text/plain"}]),
            "skills[0].inputModes",
            "must be a list of strings, not a string",
        ),
        (
            minimal(skills=[{"id": "a", "outputModes": [None]}]),
            "skills[0].outputModes[0]",
            "must be a string, not null",
        ),
        (
            minimal(skills=[{"id": "a", "securityRequirements": [{"schemes": {"k": 1}}]}]),
            "skills[0].securityRequirements[0].schemes.k",
            "must be an object, not a number",
        ),
        (
            minimal(skills=[{"id": "a", "security": [{"k": "read"}]}]),
            "skills[0].security[0].k",
            "must be a list of strings, not a string",
        ),
        (minimal(securitySchemes={"k": 1}), "securitySchemes.k", "must be an object, not a number"),
        (minimal(securitySchemes={"k": None}), "securitySchemes.k", "must be an object, not null"),
    ],
)
def test_each_refusal_names_the_field_and_says_what_is_wrong_with_it(
    doc: Any, field: str, detail: str
) -> None:
    refused = refusal(doc)
    where = f"{field}: " if field else ""
    assert (refused.field, refused.detail) == (field, f"invalid Agent Card: {where}{detail}")
    assert (refused.url, refused.kind) == (CARD_URL, "invalid_card")


def test_the_copies_a_card_hands_out_are_deep() -> None:
    schemes = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
    card = parse(minimal(securitySchemes=schemes))
    card.to_json()["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] = "x"
    card.security_schemes()["bearer"]["httpAuthSecurityScheme"]["scheme"] = "y"
    assert card.to_json()["securitySchemes"] == schemes
    assert card.security_schemes() == schemes


def test_schemes_are_read_in_1_0_shape_and_one_of_unknown_type_as_written() -> None:
    card = parse(
        minimal(
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
    assert parse(minimal()).security_schemes() == {}
    assert parse(minimal(securitySchemes=None)).security_schemes() == {}


def test_a_skill_produces_only_its_output_modes() -> None:
    skill = parse(minimal(defaultOutputModes=["text/plain"])).skill("echo")
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
    skill = parse(minimal(skills=[described])).skill("echo")
    assert skill is not None
    assert (skill.name, skill.description, skill.tags, skill.examples) == (
        "Echo",
        "Echoes what it is sent",
        ("debug", "text"),
        ("echo hello", "echo again"),
    )
    bare = parse(minimal(skills=[{"id": "echo"}])).skill("echo")
    assert bare is not None
    assert (bare.name, bare.description, bare.tags, bare.examples) == ("", "", (), ())


def test_a_body_over_the_limit_is_refused_by_its_size_and_the_default_limit_is_one_mib() -> None:
    padded = json.dumps(minimal()).encode()
    at_limit = padded + b" " * (1_048_576 - len(padded))
    assert parse_card(at_limit).source_url == ""
    with pytest.raises(CardInvalidError) as refused:
        parse_card(at_limit + b" ", url=CARD_URL)
    assert (refused.value.url, refused.value.kind) == (CARD_URL, "too_large")
    assert refused.value.detail == "card body is 1048577 bytes, over the limit of 1048576"


def test_the_card_default_modes_are_kept_as_declared() -> None:
    card = parse(minimal(defaultInputModes=["text/plain"], defaultOutputModes=["image/png"]))
    assert (card.default_input_modes, card.default_output_modes) == (
        ("text/plain",),
        ("image/png",),
    )
