"""Human renderings for the terminal: a task's timeline, the task list, an audit. Text only."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from cardfence.engine import events as ev
from cardfence.engine.audit import AuditReport
from cardfence.engine.views import TaskView
from cardfence.store import RecordedEvent

_STYLE = {
    ev.STATE_CHANGED: "bold",
    ev.DELIVERY_DOWNGRADED: "yellow",
    ev.DISCOVERY_UNAVAILABLE: "yellow",
    ev.FLAGGED_FOR_REVIEW: "magenta",
    ev.CONTRACT_DIVERGED: "magenta",
    ev.TASK_ORPHANED: "red",
    ev.ENDPOINT_UNREACHABLE: "red",
    ev.CARD_REVISION_CHANGED: "cyan",
}


def _text(table: Table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None, soft_wrap=False).print(table)
    return buffer.getvalue()


def task_line(view: TaskView) -> str:
    """One line per task for ``run`` and friends."""
    parts = [f"task {view.task}", f"state {view.state}", f"delivery {view.delivery_mode}"]
    if view.remote_task_id:
        parts.insert(1, f"remote {view.remote_task_id}")
    if view.flags:
        parts.append(f"flags {', '.join(view.flags)}")
    lines = ["  ".join(parts)]
    if view.last_message:
        lines.append(f"  message: {view.last_message}")
    for artifact in view.artifacts:
        texts = [p.get("text") for p in artifact.get("parts", ()) if p.get("text")]
        lines.append(f"  artifact {artifact.get('name') or artifact.get('artifact_id')}: "
                     + " | ".join(str(t) for t in texts))  # fmt: skip
    return "\n".join(lines)


def summary(event: RecordedEvent) -> str:
    """What an event says, in a few words."""
    data = event.data
    if event.type == ev.STATE_CHANGED:
        text = f"{data.get('from')} → {data.get('to')}  via {data.get('source')}"
        return text + (f"  “{data['message']}”" if data.get("message") else "")
    if event.type == ev.OBSERVATION_IGNORED:
        return f"{data.get('state')} via {data.get('source')}: {data.get('reason')}"
    if event.type == ev.TASK_SUBMITTED:
        return (
            f"skill {data.get('skill')} on {data.get('agent')}  card "
            f"{str(data.get('card_revision'))[:12]} v{data.get('card_version')}"
        )
    if event.type == ev.CARD_REVISION_CHANGED:
        changed = ", ".join(sorted((data.get("changes") or {}).keys())) or "revision"
        return f"{str(data.get('old'))[:12]} → {str(data.get('new'))[:12]} ({changed})"
    if event.type in (ev.DELIVERY_DOWNGRADED, ev.FLAGGED_FOR_REVIEW, ev.TASK_ORPHANED):
        return f"{data.get('reason')}: {data.get('detail', '')}"
    if event.type == ev.DISCOVERY_UNAVAILABLE:
        failure = f"{data.get('kind')} {data.get('detail')}"
        return f"card read failed ({failure}) during {data.get('during')}"
    if event.type == ev.WEBHOOK_REGISTERED:
        return f"config {data.get('config_id')} → {data.get('url')} (provisional)"
    if event.type == ev.ARTIFACT_RECEIVED:
        return f"{data.get('name') or data.get('artifact_id')}"
    keep = {k: v for k, v in data.items() if k not in ("at",)}
    return json.dumps(keep, sort_keys=True)[:100]


def timeline(view: TaskView, events: Sequence[RecordedEvent], contract_hash: str | None) -> str:
    table = Table(title=None, show_edge=False, pad_edge=False)
    for column in ("v", "recorded", "event", "what"):
        table.add_column(column)
    for event in events:
        table.add_row(
            str(event.version),
            event.recorded_at.strftime("%H:%M:%S.%f")[:-3],
            event.type,
            summary(event),
            style=_STYLE.get(event.type),
        )
    head = [
        task_line(view),
        f"  card revision {view.card_revision}  contract {contract_hash}",
        "",
    ]
    return "\n".join(head) + _text(table)


def task_table(views: Sequence[TaskView]) -> str:
    if not views:
        return "no tasks"
    table = Table(show_edge=False, pad_edge=False)
    for column in ("task", "remote", "agent", "skill", "state", "delivery", "flags", "updated"):
        table.add_column(column)
    for v in views:
        table.add_row(
            v.task[:12],
            (v.remote_task_id or "-")[:12],
            v.agent or "-",
            v.skill or "-",
            v.state,
            v.delivery_mode,
            ", ".join(v.flags) or "-",
            v.updated_at.strftime("%Y-%m-%d %H:%M:%S") if v.updated_at else "-",
        )
    return _text(table)


def audit_text(report: AuditReport) -> str:
    head = f"{report.streams_checked} streams, {report.events_checked} events checked"
    if report.ok:
        return head + ": the log is intact and every projection replays exactly"
    lines = [f"{head}: {len(report.violations)} violation(s)"]
    lines += [f"  {v.stream} @{v.position}: {v.kind}: {v.detail}" for v in report.violations]
    return "\n".join(lines)


def event_json(event: RecordedEvent) -> dict[str, Any]:
    return {
        "position": event.position,
        "version": event.version,
        "type": event.type,
        "recorded_at": event.recorded_at.isoformat(),
        "data": event.data,
    }
