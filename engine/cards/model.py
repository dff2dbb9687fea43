"""The Agent Card model: untrusted bytes in, one typed immutable card out. Pure: no I/O.

A2A v1.0 cards (``supportedInterfaces``, ``securityRequirements``) and 0.3 cards (top-level ``url``,
``protocolVersion``, ``security``, ``additionalInterfaces``) are read into the same model; a dual
card (what a2a-sdk serves when one interface is 0.3) is read through its 1.0 fields. Unknown fields
are kept in the raw document and hashed, never rejected. Three hashes, all SHA-256 over RFC 8785
canonical JSON:

- ``revision`` (R14): the whole card as received minus ``signatures``.
- ``contract_hash`` (R3): protocol versions, security schemes and requirements, in one canonical
  shape for 0.3 and 1.0, so re-publishing the same contract in the other version hashes equal.
- ``Skill.compatibility_hash`` (R9): id, effective modes, skill security, ``*schema*`` fields;
  descriptive fields (name, description, tags, examples) do not count.

What cardfence makes of a card to talk to the agent: the bindings, A2A versions and media types
it speaks are :mod:`.spoken`, the URL rule :mod:`.urls`, the choice of interface
:mod:`.interfaces`.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

from cardfence.engine.cards import fields
from cardfence.engine.cards.canonical import canonical as _canonical
from cardfence.engine.cards.canonical import decode as _decode
from cardfence.engine.cards.canonical import sha256 as _sha256
from cardfence.engine.cards.spoken import (
    BINDING_ALIASES,
    JSONRPC,
    dialect_of,
    modes_match,
    spoken_version,
)
from cardfence.engine.cards.urls import url_fault, without_userinfo
from cardfence.engine.errors import CardInvalidError

__all__ = [
    "AgentCard",
    "Capabilities",
    "Contract",
    "Extension",
    "Interface",
    "SecurityRequirement",
    "Skill",
    "parse_card",
]

# 1.0 proto JSON wraps each scheme in a oneof key; 0.3 flattens it and names it in "type".
_SCHEME_KEYS_BY_V03_TYPE: Final = {
    "apiKey": "apiKeySecurityScheme",
    "http": "httpAuthSecurityScheme",
    "oauth2": "oauth2SecurityScheme",
    "openIdConnect": "openIdConnectSecurityScheme",
    "mutualTLS": "mtlsSecurityScheme",
}


@dataclass(frozen=True, slots=True)
class Interface:
    """One endpoint; ``binding`` is ``JSONRPC`` or ``HTTP+JSON`` when we speak it.

    ``protocol_version`` is as the card declares it (``""`` when it does not); ``legacy_card``
    marks an interface of a 0.2/0.3-shaped card (top-level ``url``), whose silence means 0.x.
    ``tenant`` (1.0) names the tenant every request to this interface is for: JSON-RPC carries
    it in its params, HTTP+JSON as the first segment of the path.
    """

    url: str
    binding: str
    protocol_version: str
    legacy_card: bool = field(default=False, compare=False, repr=False)
    tenant: str = ""  # 1.0: sent with every request to this interface (none: "")

    @property
    def speaks(self) -> str:
        """The A2A version cardfence speaks here (:data:`V10` or :data:`V03`), ``""`` for a
        version it does not speak (:func:`spoken_version`)."""
        return spoken_version(self.protocol_version, legacy_card=self.legacy_card)

    @property
    def dialect(self) -> str:
        """The version whose methods and shapes a request here takes: :data:`V03` for any 0.x
        (and a 0.x card that declares none), else :data:`V10`."""
        return dialect_of(self.protocol_version, legacy_card=self.legacy_card)


@dataclass(frozen=True, slots=True)
class Extension:
    uri: str
    required: bool


@dataclass(frozen=True, slots=True)
class Capabilities:
    streaming: bool = False
    push_notifications: bool = False
    extended_agent_card: bool = False
    extensions: tuple[Extension, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class SecurityRequirement:
    """One alternative: all these schemes, each with these scopes (0.3 and 1.0 read alike)."""

    schemes: tuple[tuple[str, tuple[str, ...]], ...]

    def to_json(self) -> dict[str, list[str]]:
        return {name: list(scopes) for name, scopes in self.schemes}


@dataclass(frozen=True, slots=True)
class Skill:
    """A skill with its *effective* modes: its own, else the card's defaults (as A2A says)."""

    id: str
    name: str
    description: str
    tags: tuple[str, ...]
    examples: tuple[str, ...]
    input_modes: tuple[str, ...]
    output_modes: tuple[str, ...]
    security_requirements: tuple[SecurityRequirement, ...]
    compatibility_hash: str  # R9: what a resumed task depends on
    content_hash: str  # everything, descriptive fields included (tells compatible edits apart)

    def accepts(self, media_type: str) -> bool:
        """Whether the skill takes this input type; no modes declared anywhere accepts anything."""
        return modes_match(self.input_modes, media_type)

    def produces(self, media_type: str) -> bool:
        return modes_match(self.output_modes, media_type)


@dataclass(frozen=True, slots=True)
class Contract:
    """The R3 contract fields of a card, hashed in one shape whatever the card's A2A version."""

    protocol_versions: tuple[str, ...]
    security_schemes_hash: str
    security_requirements_hash: str  # card-level and skill-level together
    hash: str

    def changed_parts(self, other: Contract) -> tuple[str, ...]:
        parts = (
            ("protocol_versions", self.protocol_versions != other.protocol_versions),
            ("security_schemes", self.security_schemes_hash != other.security_schemes_hash),
            (
                "security_requirements",
                self.security_requirements_hash != other.security_requirements_hash,
            ),
        )
        return tuple(name for name, changed in parts if changed)


@dataclass(frozen=True, slots=True)
class AgentCard:
    """A validated Agent Card. Build it with :func:`parse_card`; equal cards share a revision."""

    name: str
    description: str
    version: str
    interfaces: tuple[Interface, ...]
    capabilities: Capabilities
    default_input_modes: tuple[str, ...]
    default_output_modes: tuple[str, ...]
    security_requirements: tuple[SecurityRequirement, ...]
    skills: tuple[Skill, ...]
    contract: Contract
    revision: str
    source_url: str = field(default="", compare=False)
    _raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _canonical: bytes = field(default=b"", repr=False, compare=False)

    @property
    def contract_hash(self) -> str:
        return self.contract.hash

    @property
    def protocol_versions(self) -> tuple[str, ...]:
        return self.contract.protocol_versions

    @property
    def push_notifications(self) -> bool:
        return self.capabilities.push_notifications

    @property
    def streaming(self) -> bool:
        return self.capabilities.streaming

    def skill(self, skill_id: str) -> Skill | None:
        return next((s for s in self.skills if s.id == skill_id), None)

    def compatibility_hash(self, skill_id: str) -> str | None:
        """The skill's R9 compatibility hash, or None when the card does not carry it."""
        found = self.skill(skill_id)
        return found.compatibility_hash if found else None

    def security_schemes(self) -> dict[str, dict[str, Any]]:
        """The declared ``securitySchemes`` by name, each in 1.0 proto-JSON shape (a 0.3 scheme
        converted, e.g. ``{"httpAuthSecurityScheme": {"scheme": "bearer"}}``), as fresh copies."""
        declared = self._raw.get("securitySchemes")
        if not isinstance(declared, dict):
            return {}
        return {
            name: copy.deepcopy(_scheme_v10_shape(scheme, fields.join("securitySchemes", name)))
            for name, scheme in declared.items()
        }

    def canonical_bytes(self) -> bytes:
        """RFC 8785 JSON of the card without ``signatures``: what the store keeps (R14)."""
        return self._canonical

    def to_json(self) -> dict[str, Any]:
        """The card as received (signatures and unknown fields included), as a fresh copy."""
        return copy.deepcopy(self._raw)


def parse_card(
    body: bytes, *, url: str = "", max_bytes: int = 1_048_576, max_depth: int = 32
) -> AgentCard:
    """Parse untrusted bytes into an :class:`AgentCard`.

    Raises:
        CardInvalidError: for any body that is not a valid card (``kind="too_large"`` when over
            ``max_bytes``, checked before parsing); the message names the offending field.
    """
    if len(body) > max_bytes:
        raise CardInvalidError(
            url,
            f"card body is {len(body)} bytes, over the limit of {max_bytes}",
            kind="too_large",
        )
    try:
        doc = _decode(body, max_depth)
        return _build(doc, url)
    except fields.FieldError as exc:
        where = f"{exc.path}: " if exc.path else ""
        detail = f"invalid Agent Card: {where}{exc.detail}"
        raise CardInvalidError(url, detail, field=exc.path) from None


# --- building: JSON value -> AgentCard ------------------------------------------------------------


def _build(doc: object, url: str) -> AgentCard:
    if not isinstance(doc, dict):
        raise fields.FieldError("", f"card must be a JSON object, not {fields.kind(doc)}")
    name = _str(doc, "name", "")
    if not name:
        raise fields.FieldError("name", "required: a non-empty string")
    interfaces = _interfaces(doc)
    default_in = _strs(doc, "defaultInputModes", "")
    default_out = _strs(doc, "defaultOutputModes", "")
    requirements = _requirements(doc, "")
    skills = _skills(doc, default_in, default_out)
    canonical = _canonical({k: v for k, v in doc.items() if k != "signatures"}, "")
    return AgentCard(
        name=name,
        description=_str(doc, "description", ""),
        version=_str(doc, "version", ""),
        interfaces=interfaces,
        capabilities=_capabilities(doc),
        default_input_modes=default_in,
        default_output_modes=default_out,
        security_requirements=requirements,
        skills=skills,
        contract=_contract(doc, interfaces, requirements, skills),
        revision=hashlib.sha256(canonical).hexdigest(),
        source_url=url,
        _raw=doc,
        _canonical=canonical,
    )


def _interfaces(doc: dict[str, Any]) -> tuple[Interface, ...]:
    found = [
        (
            Interface(
                url=_required_str(item, "url", at),
                binding=_binding(_str(item, "protocolBinding", at)),
                protocol_version=_str(item, "protocolVersion", at),
                tenant=_str(item, "tenant", at),
            ),
            at,
        )
        for item, at in fields.objects(doc, "supportedInterfaces", "")
    ]
    if not found and doc.get("url") is not None:
        # 0.3: the top-level url (preferredTransport defaults to JSONRPC) plus additional ones,
        # all at the card's protocolVersion.
        version = _str(doc, "protocolVersion", "")
        found.append(
            (
                Interface(
                    _required_str(doc, "url", ""),
                    _binding(_str(doc, "preferredTransport", "") or JSONRPC),
                    version,
                    legacy_card=True,
                ),
                "",
            )
        )
        found.extend(
            (
                Interface(
                    _required_str(item, "url", at),
                    _binding(_str(item, "transport", at)),
                    version,
                    legacy_card=True,
                ),
                at,
            )
            for item, at in fields.objects(doc, "additionalInterfaces", "")
        )
    if not found:
        raise fields.FieldError(
            "supportedInterfaces", "required: at least one interface (or a 0.3 top-level url)"
        )
    unique: dict[tuple[str, str, str], Interface] = {}
    for interface, at in found:
        # R16: a URL no request could be sent to, or one that carries credentials (they would
        # be sent as Basic, and kept wherever the card is), makes the card invalid: refused at
        # creation, a failed read mid-task (R8), never an endpoint to move to (R9).
        fault = url_fault(interface.url)
        if fault is not None:
            where = fields.join(at, "url")
            raise fields.FieldError(where, f"{fault}: {without_userinfo(interface.url)}")
        # 0.3 additionalInterfaces SHOULD repeat the main url
        unique.setdefault((interface.url, interface.binding, interface.tenant), interface)
    return tuple(unique.values())


def _binding(name: str) -> str:
    return BINDING_ALIASES.get(name.upper(), name.upper())


def _capabilities(doc: dict[str, Any]) -> Capabilities:
    caps = fields.optional_object(doc, "capabilities", "")
    extended = _bool(caps, "extendedAgentCard", "capabilities")
    if extended is None:  # 0.3 kept it at the top level
        extended = _bool(doc, "supportsAuthenticatedExtendedCard", "")
    return Capabilities(
        streaming=bool(_bool(caps, "streaming", "capabilities")),
        push_notifications=bool(_bool(caps, "pushNotifications", "capabilities")),
        extended_agent_card=bool(extended),
        extensions=tuple(
            Extension(_required_str(item, "uri", at), bool(_bool(item, "required", at)))
            for item, at in fields.objects(caps, "extensions", "capabilities")
        ),
    )


def _skills(
    doc: dict[str, Any], default_in: tuple[str, ...], default_out: tuple[str, ...]
) -> tuple[Skill, ...]:
    skills: dict[str, Skill] = {}
    for item, at in fields.objects(doc, "skills", ""):
        skill_id = _required_str(item, "id", at)
        if skill_id in skills:
            raise fields.FieldError(f"{at}.id", f"duplicate skill id {skill_id!r}")
        # Proto JSON omits empty lists, so [] and absent both mean "the card's defaults".
        input_modes = _strs(item, "inputModes", at) or default_in
        output_modes = _strs(item, "outputModes", at) or default_out
        requirements = _requirements(item, at)
        compatibility = {  # R9: descriptive fields are left out on purpose
            "id": skill_id,
            "inputModes": sorted({m.lower() for m in input_modes}),
            "outputModes": sorted({m.lower() for m in output_modes}),
            "securityRequirements": [r.to_json() for r in requirements],
            "schemaFields": {k: v for k, v in item.items() if "schema" in k.lower()},
        }
        skills[skill_id] = Skill(
            id=skill_id,
            name=_str(item, "name", at),
            description=_str(item, "description", at),
            tags=_strs(item, "tags", at),
            examples=_strs(item, "examples", at),
            input_modes=input_modes,
            output_modes=output_modes,
            security_requirements=requirements,
            compatibility_hash=_sha256(compatibility, at),
            content_hash=_sha256([item, compatibility], at),
        )
    return tuple(skills.values())


def _requirements(obj: dict[str, Any], path: str) -> tuple[SecurityRequirement, ...]:
    """1.0 ``securityRequirements`` (else 0.3 ``security``) as sorted requirements (R3).

    1.0 proto JSON: ``[{"schemes": {"oauth": {"list": ["read"]}, "mtls": {}}}]``;
    0.3: ``[{"oauth": ["read"], "mtls": []}]``. Order carries no meaning in either.
    """
    found: list[SecurityRequirement] = []
    if obj.get("securityRequirements") is not None:
        for item, at in fields.objects(obj, "securityRequirements", path):
            schemes = fields.optional_object(item, "schemes", at)
            pairs = []
            for name, scopes in schemes.items():
                where = f"{at}.schemes.{name}"
                if not isinstance(scopes, dict):
                    raise fields.FieldError(where, f"must be an object, not {fields.kind(scopes)}")
                pairs.append((name, tuple(sorted(set(_strs(scopes, "list", where))))))
            found.append(SecurityRequirement(tuple(sorted(pairs))))
    else:
        for item, at in fields.objects(obj, "security", path):
            pairs = [(name, tuple(sorted(set(_strs(item, name, at))))) for name in item]
            found.append(SecurityRequirement(tuple(sorted(pairs))))
    return tuple(sorted(found))


def _contract(
    doc: dict[str, Any],
    interfaces: tuple[Interface, ...],
    requirements: tuple[SecurityRequirement, ...],
    skills: tuple[Skill, ...],
) -> Contract:
    versions = tuple(sorted({i.protocol_version for i in interfaces if i.protocol_version}))
    schemes = {
        name: _scheme_v10_shape(scheme, fields.join("securitySchemes", name))
        for name, scheme in fields.optional_object(doc, "securitySchemes", "").items()
    }
    all_requirements = {
        "card": [r.to_json() for r in requirements],
        "skills": {
            s.id: [r.to_json() for r in s.security_requirements]
            for s in skills
            if s.security_requirements
        },
    }
    whole = {"protocolVersions": list(versions), "securitySchemes": schemes, **all_requirements}
    return Contract(
        protocol_versions=versions,
        security_schemes_hash=_sha256(schemes, "securitySchemes"),
        security_requirements_hash=_sha256(all_requirements, "securityRequirements"),
        hash=_sha256(whole, ""),
    )


def _scheme_v10_shape(scheme: object, path: str) -> dict[str, Any]:
    """A security scheme in 1.0 proto-JSON shape, whether written for 1.0, 0.3 or both.

    a2a-sdk's dual cards merge the 0.3 keys into the 1.0 object; the 1.0 oneof key wins.
    """
    if not isinstance(scheme, dict):
        raise fields.FieldError(path, f"must be an object, not {fields.kind(scheme)}")
    for key in _SCHEME_KEYS_BY_V03_TYPE.values():
        if key in scheme:
            return {key: scheme[key]}
    kind = scheme.get("type")
    key = _SCHEME_KEYS_BY_V03_TYPE.get(kind, "") if isinstance(kind, str) else ""
    if not key:
        return scheme  # a scheme type we do not know: hashed as written
    body = {k: v for k, v in scheme.items() if k != "type"}
    if "in" in body:  # 0.3 apiKey "in" is 1.0 "location"
        body["location"] = body.pop("in")
    return {key: body}


# --- typed field access: every failure names its dotted path ------------------------------------


def _str(obj: dict[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise fields.FieldError(
            fields.join(path, key), f"must be a string, not {fields.kind(value)}"
        )
    return value


def _required_str(obj: dict[str, Any], key: str, path: str) -> str:
    value = _str(obj, key, path)
    if not value:
        raise fields.FieldError(fields.join(path, key), "required: a non-empty string")
    return value


def _bool(obj: dict[str, Any], key: str, path: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise fields.FieldError(
            fields.join(path, key), f"must be a boolean, not {fields.kind(value)}"
        )
    return value


def _strs(obj: dict[str, Any], key: str, path: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fields.FieldError(
            fields.join(path, key), f"must be a list of strings, not {fields.kind(value)}"
        )
    for n, item in enumerate(value):
        if not isinstance(item, str):
            raise fields.FieldError(
                f"{fields.join(path, key)}[{n}]", f"must be a string, not {fields.kind(item)}"
            )
    return tuple(value)
