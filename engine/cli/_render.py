"""Human renderings for the terminal: a task's timeline, the task list, an audit, and a task's
path as a mermaid state diagram. Text only.

Every event type of the catalogue (``engine/core/events.py``) is put in words by :func:`describe`;
a type
this version does not know (written by a newer cardfence) is shown as its compact JSON instead, and
nothing an event carries (a remote's message included) can break a rendering.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from cardfence.engine.client.audit import AuditReport
from cardfence.engine.core import events as ev
from cardfence.engine.core.lifecycle import TERMINAL, TaskLifecycle
from cardfence.engine.core.views import TaskView
from cardfence.store.errors import CorruptRecordError
from cardfence.store.records import RecordedEvent

_WIDTH: Final = 160  # a timeline's lines are wrapped to this many columns
_MIN_WRAPPED: Final = 20  # the narrowest a wrapped column is made

_UNPRINTABLE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _line(value: object) -> str:
    """``value`` as one printable line: control characters (terminal escapes, newlines) shown
    escaped, never interpreted."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def part_said(part: Mapping[str, Any]) -> str:
    """A part that is not text, in a few words: its data as compact JSON (200 characters at
    most), or its URL, or the size of its bytes; with its media type and file name."""
    about = " ".join(str(part[k]) for k in ("filename", "media_type") if part.get(k))
    kind = str(part.get("kind"))
    if kind == "data":
        shown = json.dumps(part.get("data"), separators=(",", ":"), ensure_ascii=False)
        shown = shown if len(shown) <= 200 else shown[:199] + "…"
    elif kind == "url":
        shown = str(part.get("url"))
    else:
        shown = f"{len(str(part.get('data') or ''))} base64 characters"
    return f"{kind}{f' ({about})' if about else ''}: {shown}"


def task_line(view: TaskView) -> str:
    """One line per task for ``run`` and friends."""
    parts = [f"task {view.task}", f"state {view.state}", f"delivery {view.delivery_mode}"]
    if view.remote_task_id:
        parts.insert(1, f"remote {view.remote_task_id}")
    if view.flags:
        parts.append(f"flags {', '.join(view.flags)}")
    lines = [_line("  ".join(parts))]
    if view.last_message:
        lines.append(f"  message: {_line(view.last_message)}")
    for part in view.last_message_parts:
        if part.get("kind") != "text":
            lines.append(f"  message {_line(part_said(part))}")
    for artifact in view.artifacts:
        texts = [p.get("text") for p in artifact.get("parts", ()) if p.get("text")]
        lines.append(_line(f"  artifact {artifact.get('name') or artifact.get('artifact_id')}: "
                           + " | ".join(str(t) for t in texts)))  # fmt: skip
    return "\n".join(lines)


# -- events in words ----------------------------------------------------------------------------

Describe = Callable[[Mapping[str, Any]], str]


def _short(value: Any, width: int = 12) -> str:
    """A hash or id cut to ``width`` characters; ``-`` when absent."""
    return "-" if value is None or value == "" else str(value)[:width]


def _endpoint(value: Any) -> str:
    if isinstance(value, Mapping):
        about = [str(v) for v in (value.get("binding"), value.get("protocol_version")) if v]
        if value.get("tenant"):
            about.append(f"tenant {value['tenant']}")
        return f"{value.get('url')}" + (f" ({' '.join(about)})" if about else "")
    return _short(value, 200)


def _quoted(text: Any) -> str:
    return f"  “{text}”" if text else ""


def _task_submitted(d: Mapping[str, Any]) -> str:
    card = "extended card" if d.get("extended") else "card"  # R15: frozen under it
    return (
        f"skill {d.get('skill')} on {d.get('agent')}  {card} {_short(d.get('card_revision'))} "
        f"v{d.get('card_version')}  contract {_short(d.get('contract_hash'))}"
        + "".join(f"  extension {uri}" for uri in d.get("extensions") or ())
    )


def _state_changed(d: Mapping[str, Any]) -> str:
    return f"{d.get('from')} → {d.get('to')}  via {d.get('source')}" + _quoted(d.get("message"))


def _observation_ignored(d: Mapping[str, Any]) -> str:
    return f"{d.get('state')} via {d.get('source')} ignored: {d.get('reason')}"


def _webhook_registered(d: Mapping[str, Any]) -> str:
    return f"config {d.get('config_id')} → {d.get('url')} (provisional)"


def _webhook_confirmed(d: Mapping[str, Any]) -> str:
    return f"config {d.get('config_id')} confirmed by its first valid delivery"


def _delivery_downgraded(d: Mapping[str, Any]) -> str:
    return f"push off, {d.get('to') or 'polling'} from now: {d.get('reason')}: {d.get('detail')}"


def _discovery_unavailable(d: Mapping[str, Any]) -> str:
    return f"card read failed ({d.get('kind')} {d.get('detail')}) during {d.get('during')}"


def _card_revision_changed(d: Mapping[str, Any]) -> str:
    changes = d.get("changes")
    changed = ", ".join(sorted(changes)) if isinstance(changes, Mapping) and changes else "revision"
    return f"{_short(d.get('old'))} → {_short(d.get('new'))} ({changed})"


def _flagged_for_review(d: Mapping[str, Any]) -> str:
    revision = f"  card {_short(d.get('revision'))}" if d.get("revision") else ""
    return f"{d.get('reason')}: {d.get('detail')}{revision}"


def _contract_diverged(d: Mapping[str, Any]) -> str:
    return (
        f"card {_short(d.get('revision'))} has contract {_short(d.get('observed'))}; "
        f"the task keeps {_short(d.get('frozen'))}"
    )


def _task_orphaned(d: Mapping[str, Any]) -> str:
    return f"{d.get('reason')}: {d.get('detail')}  card {_short(d.get('revision'))}"


def _endpoint_moved(d: Mapping[str, Any]) -> str:
    return f"{_endpoint(d.get('old'))} → {_endpoint(d.get('new'))}"


def _endpoint_unreachable(d: Mapping[str, Any]) -> str:
    return f"{d.get('url')} unreachable during {d.get('during')}: {d.get('detail')}"


def _authorization_failed(d: Mapping[str, Any]) -> str:
    schemes = d.get("schemes")
    sent = ", ".join(map(str, schemes)) if isinstance(schemes, list) and schemes else "none"
    return (
        f"credentials refused during {d.get('during')} (HTTP {d.get('status')}, schemes: {sent}); "
        "the task goes on"
    )


def _throttled(d: Mapping[str, Any]) -> str:
    asked = d.get("asked")
    said = "named no wait" if asked is None else f"asked for {asked:g}s"
    wait = d.get("wait")
    then = "no request before the deadline" if wait is None else f"the next request after {wait:g}s"
    return (
        f"{d.get('url')} answered HTTP {d.get('status')} during {d.get('during')} and {said}: "
        f"{then} (recorded once)"
    )


def _credentials_moved(d: Mapping[str, Any]) -> str:
    return f"credentials moved from {d.get('old')} to {d.get('new')} (contract accepted)"


def _credentials_missing(d: Mapping[str, Any]) -> str:
    return f"skill {d.get('skill')} refused before sending: credentials missing: {d.get('detail')}"


def _cancel_requested(d: Mapping[str, Any]) -> str:
    return "cancel asked of the remote (the state moves only when it reports canceled)"


def _cancel_refused(d: Mapping[str, Any]) -> str:
    return f"the remote refused to cancel (code {d.get('code')}): {d.get('detail')}"


def _reply_sent(d: Mapping[str, Any]) -> str:
    return f"reply of {d.get('chars')} characters sent (message {d.get('message_id')})"


def _deadline_exceeded(d: Mapping[str, Any]) -> str:
    return f"still {d.get('state')} after {d.get('seconds')}s waiting for {d.get('until')}"


def _artifact_received(d: Mapping[str, Any]) -> str:
    parts = d.get("parts")
    texts = [
        str(p["text"]) for p in (parts if isinstance(parts, list) else ())
        if isinstance(p, Mapping) and p.get("text")
    ]  # fmt: skip
    shown = f": {' | '.join(texts)}"[:80] if texts else ""
    count = d.get("chunks")
    chunks = f"{count} chunks" if isinstance(count, int) and count > 1 else "a chunk"
    chunk = f", {chunks} appended" if d.get("append") else ""
    dropped = d.get("dropped")
    others = len(dropped) if isinstance(dropped, list) else 0
    if others:  # R12: the same report named this id with other contents too
        chunk += f", {others} other version{'s' if others > 1 else ''} in the report dropped"
    return f"{d.get('name') or d.get('artifact_id')} via {d.get('source')}{chunk}{shown}"


def _card_fetched(d: Mapping[str, Any]) -> str:
    what = "extended card" if d.get("extended") else "card"
    how = "unchanged (304)" if d.get("status") == 304 else f"read ({d.get('status')})"
    push = "push" if d.get("push_notifications") else "no push"
    return (
        f"{what} {_short(d.get('revision'))} v{d.get('version')} {how} from {d.get('url')}  "
        f"contract {_short(d.get('contract_hash'))}, {push}"
    )


def _discovery_failed(d: Mapping[str, Any]) -> str:
    return f"card read of {d.get('url')} failed: {d.get('kind')} {d.get('detail')}"


def _contract_pinned(d: Mapping[str, Any]) -> str:
    return f"contract {_short(d.get('contract_hash'))} pinned (card {_short(d.get('revision'))})"


def _contract_accepted(d: Mapping[str, Any]) -> str:
    return (
        f"contract {_short(d.get('previous'))} → {_short(d.get('contract_hash'))} accepted "
        f"(card {_short(d.get('revision'))})"
    )


def _task_creation_refused(d: Mapping[str, Any]) -> str:
    return f"skill {d.get('skill')} refused before sending: {d.get('reason')}: {d.get('detail')}"


_DESCRIBE: Final[Mapping[str, Describe]] = {
    ev.CARD_FETCHED: _card_fetched,
    ev.DISCOVERY_FAILED: _discovery_failed,
    ev.CONTRACT_PINNED: _contract_pinned,
    ev.CONTRACT_ACCEPTED: _contract_accepted,
    ev.TASK_CREATION_REFUSED: _task_creation_refused,
    ev.CREDENTIALS_MISSING: _credentials_missing,
    ev.TASK_SUBMITTED: _task_submitted,
    ev.STATE_CHANGED: _state_changed,
    ev.OBSERVATION_IGNORED: _observation_ignored,
    ev.WEBHOOK_REGISTERED: _webhook_registered,
    ev.WEBHOOK_CONFIRMED: _webhook_confirmed,
    ev.DELIVERY_DOWNGRADED: _delivery_downgraded,
    ev.DISCOVERY_UNAVAILABLE: _discovery_unavailable,
    ev.CARD_REVISION_CHANGED: _card_revision_changed,
    ev.FLAGGED_FOR_REVIEW: _flagged_for_review,
    ev.CONTRACT_DIVERGED: _contract_diverged,
    ev.TASK_ORPHANED: _task_orphaned,
    ev.ENDPOINT_MOVED: _endpoint_moved,
    ev.ENDPOINT_UNREACHABLE: _endpoint_unreachable,
    ev.CANCEL_REQUESTED: _cancel_requested,
    ev.CANCEL_REFUSED: _cancel_refused,
    ev.REPLY_SENT: _reply_sent,
    ev.DEADLINE_EXCEEDED: _deadline_exceeded,
    ev.ARTIFACT_RECEIVED: _artifact_received,
    ev.AUTHORIZATION_FAILED: _authorization_failed,
    ev.CREDENTIALS_MOVED: _credentials_moved,
    ev.THROTTLED: _throttled,
}


def describe(type_: str, data: Mapping[str, Any]) -> str | None:
    """An event in words, or ``None`` for a type this version has no words for."""
    words = _DESCRIBE.get(type_)
    if words is None:
        return None
    try:
        return _line(words(data))
    except Exception:  # a payload of an unexpected shape: shown raw, never a crash
        return None


def fallback(type_: str, payload: str) -> str:
    """A type without words: the type and its compact JSON payload, cut short."""
    try:
        decoded = json.loads(payload)
        text = json.dumps(decoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        text = payload
    text = _line(text)
    return f"{type_} {text[:100]}{'…' if len(text) > 100 else ''}"


def summary(event: RecordedEvent) -> str:
    """What an event says, in a few words (its type and compact JSON if it has none)."""
    try:
        data = event.data
    except CorruptRecordError:  # not a JSON object (altered in the store): shown raw
        return fallback(event.type, event.payload)
    said = describe(event.type, data) or fallback(event.type, event.payload)
    repeated = data.get(ev.FAILURES_REPEATED)
    if isinstance(repeated, int) and repeated > 0:
        said += f" (after {repeated} more polls or card reads failed as recorded before)"
    return said


def timeline(
    view: TaskView,
    events: Sequence[RecordedEvent],
    contract_hash: str | None,
    *,
    as_of: str | None = None,
) -> str:
    """The task's header and its events, one row each (``as_of``: the point it is shown at)."""
    rows = [
        (
            str(event.version),
            f"@{event.position}",
            event.recorded_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            event.type,
            summary(event),
        )
        for event in events
    ]
    table = columns(("v", "pos", "recorded (UTC)", "event", "what"), rows, width=_WIDTH)
    head = [
        task_line(view),
        f"  card revision {view.card_revision}  contract {contract_hash}",
        "",
    ]
    if as_of is not None:
        head.insert(0, f"as of {as_of}: the task as it stood then, and its events up to there")
    return "\n".join(head) + table


# -- the task's path as a mermaid state diagram ----------------------------------------------------

_MERMAID_IDS: Final[Mapping[str, str]] = {str(s.value): s.id for s in TaskLifecycle.states}


def _mermaid_id(state: str) -> str:
    """The lifecycle's own state id (``input-required`` -> ``input_required``, as in
    ``docs/lifecycle.md``); any other name made a safe identifier."""
    known = _MERMAID_IDS.get(state)
    if known is not None:
        return known
    return "s_" + (re.sub(r"[^0-9A-Za-z_]", "_", state) or "empty")


def _mermaid_label(state: str) -> str:
    return re.sub(r'["\\\x00-\x1f\x7f-\x9f]', "_", state)


def _mermaid_word(text: str) -> str:
    """A transition label word: nothing mermaid could read as syntax."""
    return re.sub(r"[^0-9A-Za-z_-]", "_", text) or "-"


def task_path(events: Sequence[RecordedEvent]) -> str:
    """The task's actual path as a mermaid ``stateDiagram-v2``.

    ``[*] --> submitted``, then one edge per applied ``StateChanged``, labelled with its order and
    source (``working --> input_required : 2 poll``), and ``--> [*]`` after a terminal state. Only
    the states the task went through are declared, with their A2A names as labels.
    """
    steps: list[tuple[str, str, str]] = []
    for event in events:
        if event.type != ev.STATE_CHANGED:
            continue
        try:
            data = event.data
        except CorruptRecordError:  # altered in the store: no edge drawn from it
            continue
        steps.append((str(data.get("from")), str(data.get("to")), str(data.get("source"))))
    start = steps[0][0] if steps else "submitted"
    visited = [start]
    for _, to, _ in steps:
        if to not in visited:
            visited.append(to)
    lines = ["stateDiagram-v2"]
    lines += [f'    state "{_mermaid_label(s)}" as {_mermaid_id(s)}' for s in visited]
    lines.append(f"    [*] --> {_mermaid_id(start)}")
    for order, (from_, to, source) in enumerate(steps, start=1):
        lines.append(
            f"    {_mermaid_id(from_)} --> {_mermaid_id(to)} : {order} {_mermaid_word(source)}"
        )
    last = steps[-1][1] if steps else start
    if last in TERMINAL:
        lines.append(f"    {_mermaid_id(last)} --> [*]")
    return "\n".join(lines) + "\n"


def task_table(views: Sequence[TaskView], *, as_of: str | None = None) -> str:
    """One row per task (``as_of``: the point the tasks are shown at)."""
    if as_of is not None:
        head = f"as of {as_of}: every task as it stood then"
        return head + ("\n" + task_table(views) if views else ": no tasks")
    if not views:
        return "no tasks"
    rows = [
        (
            v.task[:12],
            (v.remote_task_id or "-")[:12],
            v.agent or "-",
            v.skill or "-",
            v.state,
            v.delivery_mode,
            ", ".join(v.flags) or "-",
            v.updated_at.strftime("%Y-%m-%d %H:%M:%S") if v.updated_at else "-",
        )
        for v in views
    ]
    header = ("task", "remote", "agent", "skill", "state", "delivery", "flags", "updated")
    return columns(header, rows)


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None) -> str:
    """A plain table (``┃`` under the header, ``│`` between cells), as rich drew them before:
    time linear in the cells (a store's task list has tens of thousands of rows, a streamed
    task's timeline thousands of events), every cell one printable line. Each column is as wide
    as its widest cell; given a ``width`` the lines would pass, the last column is wrapped at
    words to fit (at least 20 characters), a word too long for it folded, never cut short."""
    cells = [[_line(cell) for cell in row] for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    over = sum(widths) + 3 * (len(widths) - 1) - (width or 0)
    if width is not None and over > 0:
        widths[-1] = max(_MIN_WRAPPED, widths[-1] - over)

    def line(row: Sequence[str], bar: str) -> str:
        return bar.join(cell.ljust(size) for cell, size in zip(row, widths, strict=True))

    def wrapped(row: list[str]) -> list[list[str]]:
        if len(row[-1]) <= widths[-1]:
            return [row]
        pieces = textwrap.wrap(row[-1], widths[-1], break_on_hyphens=False) or [""]
        blank = [""] * (len(row) - 1)
        return [[*row[:-1], pieces[0]], *([*blank, piece] for piece in pieces[1:])]

    rule = "╇".join(
        "━" * (size + (1 if i in (0, len(widths) - 1) else 2)) for i, size in enumerate(widths)
    )
    out = [line(cells[0], " ┃ "), rule]
    out += [line(part, " │ ") for row in cells[1:] for part in wrapped(row)]
    return "\n".join(out) + "\n"


def audit_text(report: AuditReport) -> str:
    lines = []
    if report.rebuilt:
        lines.append(f"rebuilt {len(report.rebuilt)} projection(s) from their events:")
        lines += [f"  {stream}" for stream in report.rebuilt]
    head = f"{report.streams_checked} streams, {report.events_checked} events checked"
    if report.ok:
        lines.append(head + ": the log is intact and every projection replays exactly")
        return "\n".join(lines)
    lines.append(f"{head}: {len(report.violations)} violation(s)")
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
