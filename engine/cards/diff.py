"""What changed between two Agent Card revisions (pure).

The result is the payload of ``CardRevisionChanged`` (R7) and of ``cardfence cards --json``
"changes". Skills are compared by their R9 compatibility hash, the contract by its R3 hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cardfence.engine.cards.model import AgentCard, Extension, Interface

__all__ = [
    "CapabilityChanges",
    "CardDiff",
    "ContractChanges",
    "EndpointChanges",
    "SkillChanges",
    "diff",
]


@dataclass(frozen=True, slots=True)
class CapabilityChanges:
    """Each field is ``(old, new)`` when it changed, else None."""

    push_notifications: tuple[bool, bool] | None = None
    streaming: tuple[bool, bool] | None = None
    extended_agent_card: tuple[bool, bool] | None = None
    extensions: tuple[tuple[Extension, ...], tuple[Extension, ...]] | None = None

    @property
    def is_empty(self) -> bool:
        return self.to_json() == {}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("push_notifications", "streaming", "extended_agent_card"):
            change = getattr(self, name)
            if change is not None:
                out[name] = {"old": change[0], "new": change[1]}
        if self.extensions is not None:
            out["extensions"] = {
                side: [{"uri": e.uri, "required": e.required} for e in extensions]
                for side, extensions in zip(("old", "new"), self.extensions, strict=True)
            }
        return out


@dataclass(frozen=True, slots=True)
class SkillChanges:
    """Skill ids. ``changed_compatibly``: only descriptive fields moved (R9 still resumes)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed_compatibly: tuple[str, ...] = ()
    changed_incompatibly: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return self.to_json() == {}

    def to_json(self) -> dict[str, Any]:
        groups = {
            "added": self.added,
            "removed": self.removed,
            "changed_compatibly": self.changed_compatibly,
            "changed_incompatibly": self.changed_incompatibly,
        }
        return {name: list(ids) for name, ids in groups.items() if ids}


@dataclass(frozen=True, slots=True)
class ContractChanges:
    """``parts`` names what moved: protocol_versions, security_schemes, security_requirements."""

    changed: bool
    old_hash: str
    new_hash: str
    parts: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.changed

    def to_json(self) -> dict[str, Any]:
        if not self.changed:
            return {}
        return {"changed": True, "old": self.old_hash, "new": self.new_hash, "parts": [*self.parts]}


@dataclass(frozen=True, slots=True)
class EndpointChanges:
    """The interfaces in card order, old and new (R7 records a move; R9 acts on it)."""

    old: tuple[Interface, ...]
    new: tuple[Interface, ...]

    @property
    def is_empty(self) -> bool:
        return self.old == self.new

    def to_json(self) -> dict[str, Any]:
        if self.is_empty:
            return {}
        return {
            side: [
                {"url": i.url, "binding": i.binding, "protocol_version": i.protocol_version}
                | ({"tenant": i.tenant} if i.tenant else {})
                for i in interfaces
            ]
            for side, interfaces in (("old", self.old), ("new", self.new))
        }


@dataclass(frozen=True, slots=True)
class CardDiff:
    capabilities: CapabilityChanges
    skills: SkillChanges
    contract: ContractChanges
    endpoints: EndpointChanges
    version: tuple[str, str] | None = None

    @property
    def is_empty(self) -> bool:
        return self.to_json() == {}

    def to_json(self) -> dict[str, Any]:
        """Plain JSON with only the groups that changed."""
        groups: dict[str, dict[str, Any]] = {
            "capabilities": self.capabilities.to_json(),
            "skills": self.skills.to_json(),
            "contract": self.contract.to_json(),
            "endpoints": self.endpoints.to_json(),
        }
        if self.version is not None:
            groups["version"] = {"old": self.version[0], "new": self.version[1]}
        return {name: group for name, group in groups.items() if group}


def diff(old: AgentCard, new: AgentCard) -> CardDiff:
    """Group what changed from ``old`` to ``new``; an unchanged group is empty."""
    return CardDiff(
        capabilities=_capability_changes(old, new),
        skills=_skill_changes(old, new),
        contract=ContractChanges(
            changed=old.contract_hash != new.contract_hash,
            old_hash=old.contract_hash,
            new_hash=new.contract_hash,
            parts=old.contract.changed_parts(new.contract),
        ),
        endpoints=EndpointChanges(old.interfaces, new.interfaces),
        version=(old.version, new.version) if old.version != new.version else None,
    )


def _capability_changes(old: AgentCard, new: AgentCard) -> CapabilityChanges:
    was, now = old.capabilities, new.capabilities

    def pair(a: bool, b: bool) -> tuple[bool, bool] | None:
        return (a, b) if a != b else None

    old_ext = tuple(sorted(was.extensions, key=lambda e: (e.uri, e.required)))
    new_ext = tuple(sorted(now.extensions, key=lambda e: (e.uri, e.required)))
    return CapabilityChanges(
        push_notifications=pair(was.push_notifications, now.push_notifications),
        streaming=pair(was.streaming, now.streaming),
        extended_agent_card=pair(was.extended_agent_card, now.extended_agent_card),
        extensions=(old_ext, new_ext) if old_ext != new_ext else None,
    )


def _skill_changes(old: AgentCard, new: AgentCard) -> SkillChanges:
    before = {s.id: s for s in old.skills}
    after = {s.id: s for s in new.skills}
    kept = [s for s in new.skills if s.id in before]
    return SkillChanges(
        added=tuple(s.id for s in new.skills if s.id not in before),
        removed=tuple(s.id for s in old.skills if s.id not in after),
        changed_compatibly=tuple(
            s.id
            for s in kept
            if s.compatibility_hash == before[s.id].compatibility_hash
            and s.content_hash != before[s.id].content_hash
        ),
        changed_incompatibly=tuple(
            s.id for s in kept if s.compatibility_hash != before[s.id].compatibility_hash
        ),
    )
