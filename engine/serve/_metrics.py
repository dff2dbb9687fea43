"""Metrics in the Prometheus text format (version 0.0.4), for ``GET /metrics``.

Pure: each part of a running ``serve`` (the webhook ingress, the driver) describes what it counts
as :class:`Family` values, and :func:`render` writes them out. Nothing here keeps state or
imports a metrics library; the counters live where they are counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["CONTENT_TYPE", "Family", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Kind = Literal["counter", "gauge"]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its name, help line, kind, and samples (labels, value)."""

    name: str
    help: str
    kind: Kind
    samples: Sequence[tuple[Mapping[str, str], float]] = ()

    @classmethod
    def single(cls, name: str, help_: str, kind: Kind, value: float) -> Family:
        """A family of one sample without labels."""
        return cls(name, help_, kind, [({}, value)])


def render(families: Iterable[Family]) -> str:
    """The exposition text of ``families``, one block each, in the order given."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape(family.help, quote=False)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            lines.append(f"{family.name}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{name}="{_escape(value, quote=True)}"' for name, value in labels.items())
    return "{" + pairs + "}"


def _escape(text: str, *, quote: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
