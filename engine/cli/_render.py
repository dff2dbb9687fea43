"""Human renderings for the terminal: a task's timeline, the task list, an audit, and a task's
path as a mermaid state diagram. Text only.

Every event class of the catalogue (``engine/core/events.py``) is put in words by :func:`describe`,
from its typed fields, in one table keyed by the class; an event whose stored payload is not one of
its class (a type this version does not know, written by a newer cardfence; a key missing) is shown
as its type and compact JSON instead, and nothing an event carries (a remote's message included)
can break a rendering.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

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

_E = TypeVar("_E", bound=ev.Recorded)
Describe = Callable[[ev.Recorded], str]


def _short(value: object, width: int = 12) -> str:
    """A hash or id cut to ``width`` characters; ``-`` when absent."""
    return "-" if value is None or value == "" else str(value)[:width]


def _endpoint(value: object) -> str:
    if isinstance(value, Mapping):
        about = [str(v) for v in (value.get("binding"), value.get("protocol_version")) if v]
        if value.get("tenant"):
            about.append(f"tenant {value['tenant']}")
        return f"{value.get('url')}" + (f" ({' '.join(about)})" if about else "")
    return _short(value, 200)


def _quoted(text: object) -> str:
    return f"  “{text}”" if text and text is not ev.ABSENT else ""


def _task_submitted(e: ev.TaskSubmitted) -> str:
    card = "extended card" if e.extended else "card"  # R15: frozen under it
    return (
        f"skill {e.skill} on {e.agent}  {card} {_short(e.card_revision)} "
        f"v{e.card_version}  contract {_short(e.contract_hash)}"
        + "".join(f"  extension {uri}" for uri in e.extensions or ())
        + (f"  {len(e.parts)} parts" if e.parts is not None and len(e.parts) != 1 else "")
        + (f"  continues {e.context_task}" if e.context_task else "")
        + "".join(f"  references {key}" for key in e.referenced_tasks or ())
    )


def _state_changed(e: ev.StateChanged) -> str:
    return f"{e.from_} → {e.to}  via {e.source}" + _quoted(e.message)


def _observation_ignored(e: ev.ObservationIgnored) -> str:
    return f"{e.state} via {e.source} ignored: {e.reason}"


def _webhook_registered(e: ev.WebhookRegistered) -> str:
    return f"config {e.config_id} → {e.url} (provisional)"


def _webhook_confirmed(e: ev.WebhookConfirmed) -> str:
    return f"config {e.config_id} confirmed by its first valid delivery"


def _delivery_downgraded(e: ev.DeliveryDowngraded) -> str:
    return f"push off, {e.to or 'polling'} from now: {e.reason}: {e.detail}"


def _discovery_unavailable(e: ev.DiscoveryUnavailable) -> str:
    return f"card read failed ({e.kind} {e.detail}) during {e.during}"


def _card_revision_changed(e: ev.CardRevisionChanged) -> str:
    changes: object = e.changes
    changed = ", ".join(sorted(changes)) if isinstance(changes, Mapping) and changes else "revision"
    return f"{_short(e.old)} → {_short(e.new)} ({changed})"


def _flagged_for_review(e: ev.FlaggedForReview) -> str:
    revision = f"  card {_short(e.revision)}" if e.revision else ""
    return f"{e.reason}: {e.detail}{revision}"


def _contract_diverged(e: ev.ContractDiverged) -> str:
    return (
        f"card {_short(e.revision)} has contract {_short(e.observed)}; "
        f"the task keeps {_short(e.frozen)}"
    )


def _task_orphaned(e: ev.TaskOrphaned) -> str:
    return f"{e.reason}: {e.detail}  card {_short(e.revision)}"


def _endpoint_moved(e: ev.EndpointMoved) -> str:
    return f"{_endpoint(e.old)} → {_endpoint(e.new)}"


def _endpoint_unreachable(e: ev.EndpointUnreachable) -> str:
    return f"{e.url} unreachable during {e.during}: {e.detail}"


def _authorization_failed(e: ev.AuthorizationFailed) -> str:
    schemes: object = e.schemes
    sent = ", ".join(map(str, schemes)) if isinstance(schemes, list) and schemes else "none"
    return (
        f"credentials refused during {e.during} (HTTP {e.status}, schemes: {sent}); "
        "the task goes on"
    )


def _throttled(e: ev.Throttled) -> str:
    said = "named no wait" if e.asked is None else f"asked for {e.asked:g}s"
    wait = e.wait
    then = "no request before the deadline" if wait is None else f"the next request after {wait:g}s"
    return f"{e.url} answered HTTP {e.status} during {e.during} and {said}: {then} (recorded once)"


def _credentials_moved(e: ev.CredentialsMoved) -> str:
    return f"credentials moved from {e.old} to {e.new} (contract accepted)"


def _credentials_missing(e: ev.CredentialsMissing) -> str:
    return f"skill {e.skill} refused before sending: credentials missing: {e.detail}"


def _cancel_requested(e: ev.CancelRequested) -> str:
    return "cancel asked of the remote (the state moves only when it reports canceled)"


def _cancel_refused(e: ev.CancelRefused) -> str:
    return f"the remote refused to cancel (code {e.code}): {e.detail}"


def _reply_sent(e: ev.ReplySent) -> str:
    others = sum(1 for part in e.parts or () if part.get("kind") != "text")
    more = f" and {others} other part{'s' if others != 1 else ''}" if others else ""
    return f"reply of {e.chars} characters{more} sent (message {e.message_id})"


def _deadline_exceeded(e: ev.DeadlineExceeded) -> str:
    return f"still {e.state} after {e.seconds}s waiting for {e.until}"


def _artifact_received(e: ev.ArtifactReceived) -> str:
    parts: object = e.parts
    texts = [
        str(p["text"]) for p in (parts if isinstance(parts, list) else ())
        if isinstance(p, Mapping) and p.get("text")
    ]  # fmt: skip
    shown = f": {' | '.join(texts)}"[:80] if texts else ""
    count: object = e.chunks
    chunks = f"{count} chunks" if isinstance(count, int) and count > 1 else "a chunk"
    chunk = f", {chunks} appended" if e.append else ""
    dropped: object = e.dropped
    others = len(dropped) if isinstance(dropped, list) else 0
    if others:  # R12: the same report named this id with other contents too
        chunk += f", {others} other version{'s' if others > 1 else ''} in the report dropped"
    return f"{e.name or e.artifact_id} via {e.source}{chunk}{shown}"


def _card_fetched(e: ev.CardFetched) -> str:
    what = "extended card" if e.extended else "card"
    how = "unchanged (304)" if e.status == 304 else f"read ({e.status})"
    push = "push" if e.push_notifications else "no push"
    return (
        f"{what} {_short(e.revision)} v{e.version} {how} from {e.url}  "
        f"contract {_short(e.contract_hash)}, {push}"
    )


def _discovery_failed(e: ev.DiscoveryFailed) -> str:
    return f"card read of {e.url} failed: {e.kind} {e.detail}"


def _contract_pinned(e: ev.ContractPinned) -> str:
    return f"contract {_short(e.contract_hash)} pinned (card {_short(e.revision)})"


def _contract_accepted(e: ev.ContractAccepted) -> str:
    return (
        f"contract {_short(e.previous)} → {_short(e.contract_hash)} accepted "
        f"(card {_short(e.revision)})"
    )


def _task_creation_refused(e: ev.TaskCreationRefused) -> str:
    return f"skill {e.skill} refused before sending: {e.reason}: {e.detail}"


def _creation_refused_remotely(e: ev.CreationRefusedRemotely) -> str:
    return f"the agent refused the creation at {e.url} (code {e.code}): {e.message}"


def _words(cls: type[_E], words: Callable[[_E], str]) -> tuple[type[ev.Recorded], Describe]:
    """One row of :data:`_DESCRIBE`: a class and the words for its events (checked to match)."""
    return cls, cast(Describe, words)


_DESCRIBE: Final[Mapping[type[ev.Recorded], Describe]] = dict(
    (
        _words(ev.CardFetched, _card_fetched),
        _words(ev.DiscoveryFailed, _discovery_failed),
        _words(ev.ContractPinned, _contract_pinned),
        _words(ev.ContractAccepted, _contract_accepted),
        _words(ev.TaskCreationRefused, _task_creation_refused),
        _words(ev.CredentialsMissing, _credentials_missing),
        _words(ev.TaskSubmitted, _task_submitted),
        _words(ev.StateChanged, _state_changed),
        _words(ev.ObservationIgnored, _observation_ignored),
        _words(ev.WebhookRegistered, _webhook_registered),
        _words(ev.WebhookConfirmed, _webhook_confirmed),
        _words(ev.DeliveryDowngraded, _delivery_downgraded),
        _words(ev.DiscoveryUnavailable, _discovery_unavailable),
        _words(ev.CardRevisionChanged, _card_revision_changed),
        _words(ev.FlaggedForReview, _flagged_for_review),
        _words(ev.ContractDiverged, _contract_diverged),
        _words(ev.TaskOrphaned, _task_orphaned),
        _words(ev.EndpointMoved, _endpoint_moved),
        _words(ev.EndpointUnreachable, _endpoint_unreachable),
        _words(ev.CancelRequested, _cancel_requested),
        _words(ev.CancelRefused, _cancel_refused),
        _words(ev.ReplySent, _reply_sent),
        _words(ev.DeadlineExceeded, _deadline_exceeded),
        _words(ev.ArtifactReceived, _artifact_received),
        _words(ev.AuthorizationFailed, _authorization_failed),
        _words(ev.CredentialsMoved, _credentials_moved),
        _words(ev.Throttled, _throttled),
        _words(ev.CreationRefusedRemotely, _creation_refused_remotely),
    )
)
"""The words for each event class of the catalogue, keyed by the class."""


def describe(event: ev.Event) -> str | None:
    """An event in words, or ``None`` for one this version has no words for (a type written by
    a newer cardfence: :class:`~cardfence.engine.core.events.UnknownEvent`)."""
    if isinstance(event, ev.UnknownEvent):
        return None
    words = _DESCRIBE.get(type(event))
    if words is None:
        return None
    try:
        return _line(words(event))
    except Exception:  # a field of an unexpected type (altered in the store): shown raw
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
    """What an event says, in a few words: its class's words, or its type and compact JSON when
    the payload is not one of the event its stream and type name (a type written by a newer
    cardfence, a key missing, a payload altered in the store)."""
    try:
        data = event.data
    except CorruptRecordError:  # not a JSON object (altered in the store): shown raw
        return fallback(event.type, event.payload)
    try:
        typed = ev.stream_event(event.stream_id, event.type, data)
    except (KeyError, TypeError):  # a key its class always holds is missing
        typed = ev.UnknownEvent(event.type, data)
    said = describe(typed) or fallback(event.type, event.payload)
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
