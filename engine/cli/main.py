"""The ``cardfence`` command line: a thin layer over the Python API (docs/cli.md).

Global options (``--db``, ``--json``, ``--debug``) are accepted before and after the command name.
Every non-zero exit ends stderr with one line that starts with the error's type name.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated, Any

import httpx
import typer

from cardfence.engine import errors

# Imported for what importing them does: each registers its commands on the app.
from cardfence.engine.cli import _artifacts, _demo, _events, _serve, _tasks  # noqa: F401
from cardfence.engine.cli import _signals as signals
from cardfence.engine.cli._app import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
    CardTimeoutOption,
    DbOption,
    DebugOption,
    InsecureOption,
    JsonOption,
    MaxCardBytesOption,
    app,
    check_positive,
    check_seconds,
    emit,
    emitted,
    exit_code_for,
    open_store,
    options_of,
    silence_stdout,
    with_card_signatures,
)
from cardfence.engine.core import events as ev
from cardfence.engine.discovery.card_read import CardRead
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.discovery.history import RevisionEntry, revision_history, stored_card
from cardfence.engine.discovery.reads import Discovery
from cardfence.store.errors import CardfenceError
from cardfence.store.event_store import EventStore

__all__ = ["run"]


@app.command()
def migrate(
    ctx: typer.Context, db: DbOption = None, json_: JsonOption = False, debug: DebugOption = False
) -> None:
    """Bring the store to the newest schema and print its revision."""
    options = options_of(ctx, db, json_, debug)
    with open_store(options) as store:
        revision = store.schema_revision()
    emit(options, {"db": store.url, "revision": revision}, f"{revision}")


@app.command()
def cards(
    ctx: typer.Context,
    agent_url: Annotated[str, typer.Argument(metavar="AGENT_URL")],
    card_timeout: CardTimeoutOption = 10.0,
    max_card_bytes: MaxCardBytesOption = 1_048_576,
    allow_insecure_http: InsecureOption = False,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Read the agent's card once (conditional), then show the revisions this store has seen
    (and those of its authenticated extended card, when tasks read one)."""
    options = options_of(ctx, db, json_, debug)
    check_seconds("--card-timeout", card_timeout)
    check_positive("--max-card-bytes", max_card_bytes)
    limits = with_card_signatures(
        CardLimits(
            timeout=card_timeout, max_bytes=max_card_bytes, allow_insecure=allow_insecure_http
        )
    )
    origin = card_urls(agent_url)[0]
    with open_store(options) as store:
        read: CardRead | None = None
        failure: errors.DiscoveryError | None = None
        try:
            read = asyncio.run(_read_card_once(store, agent_url, limits))
        except errors.DiscoveryError as exc:
            failure = exc
            exc.consequence = "the revisions already recorded are shown"
        history = revision_history(store, origin)
        skills = _public_skills(store, read, history)
        extended_history = revision_history(store, origin, extended=True)
        extended = _extended_json(store, origin, skills, extended_history)
    document: dict[str, Any] = {
        "agent": origin,
        "read": _read_json(read, failure),
        "revisions": [entry.to_json() for entry in history],
        "skills": skills,
        "extended": extended,
    }
    shown = _render_history(origin, read, history, skills)
    if extended is not None:
        shown += "\n\n" + _render_extended(extended, extended_history)
    emit(options, document, shown)
    if failure is not None:
        raise failure


async def _read_card_once(store: EventStore, agent_url: str, limits: CardLimits) -> CardRead:
    with signals.cancellable():
        async with httpx.AsyncClient() as client:
            return await Discovery(store, client, limits=limits).read(agent_url, fresh=True)


def _read_json(read: CardRead | None, failure: errors.DiscoveryError | None) -> dict[str, Any]:
    if read is not None:
        return {"ok": True, "url": read.url, "status": read.status, "revision": read.revision}
    assert failure is not None
    return {"ok": False, "url": failure.url, "kind": failure.kind, "detail": failure.detail}


def _public_skills(
    store: EventStore, read: CardRead | None, history: list[RevisionEntry]
) -> list[str] | None:
    """The skill ids of the public card just read, else of the last one recorded."""
    card = read.card if read is not None else None
    if card is None and history:
        card = stored_card(store, history[-1].revision)
    return None if card is None else [skill.id for skill in card.skills]


def _extended_json(
    store: EventStore, origin: str, public: list[str] | None, history: list[RevisionEntry]
) -> dict[str, Any] | None:
    """The authenticated extended card as the log last recorded it (R15; ``cards`` does not
    read it: that takes a task's credentials), or None when it never was."""
    if not history:
        return None
    head = store.stream(ev.agent_stream_id(origin))
    state = head.state if head is not None else {}
    revision = str(state.get("extended_revision") or history[-1].revision)
    card = stored_card(store, revision)
    skills = [skill.id for skill in card.skills] if card is not None else []
    return {
        "revision": revision,
        "version": card.version if card is not None else None,
        "fetched_at": state.get("extended_fetched_at"),
        "skills": skills,
        "only_extended": [skill for skill in skills if skill not in (public or ())],
        "revisions": [entry.to_json() for entry in history],
    }


def _render_history(
    origin: str, read: CardRead | None, history: list[RevisionEntry], skills: list[str] | None
) -> str:
    lines = [f"agent {origin}"]
    if read is not None:
        how = "unchanged (304)" if read.status == 304 else "read (200)"
        lines.append(f"card {how}: revision {read.revision[:12]} version {read.card.version}")
    if skills is not None:
        lines.append(f"skills: {', '.join(skills) or '(none)'}")
    lines.append("")
    lines.extend(_render_revisions(history))
    return "\n".join(lines)


def _render_extended(extended: dict[str, Any], history: list[RevisionEntry]) -> str:
    only = extended["only_extended"]
    beyond = f" (only on the extended card: {', '.join(only)})" if only else ""
    lines = [
        f"extended card (authenticated): revision {extended['revision'][:12]} "
        f"version {extended['version'] or '-'}, last read {extended['fetched_at'] or '-'}",
        f"skills: {', '.join(extended['skills']) or '(none)'}{beyond}",
        "",
        *_render_revisions(history),
    ]
    return "\n".join(lines)


def _render_revisions(history: list[RevisionEntry]) -> list[str]:
    lines = []
    for entry in history:
        lines.append(
            f"  {entry.revision[:12]}  version {entry.version or '-':<10} "
            f"first seen {entry.first_seen}  etag {entry.etag or '-'}"
        )
        for group, change in entry.changes.items():
            lines.append(f"      {group}: {json.dumps(change, sort_keys=True)}")
    if not history:
        lines.append("  (no revision recorded)")
    return lines


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code (never raises)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    as_json = "--json" in args
    command = typer.main.get_command(app)
    try:
        # A signal that came while the command line loaded (console script) is raised here.
        with signals.handled():
            returned = command.main(args=args, prog_name="cardfence", standalone_mode=False)
    except (KeyboardInterrupt, asyncio.CancelledError, typer.Abort) as stop:
        if isinstance(stop, asyncio.CancelledError) and signals.received() is None:
            return _bug(stop, as_json, debug)
        return _interrupted(as_json)
    except typer.Exit as stop:
        code = int(stop.exit_code)
    except Exception as exc:
        return _failure(exc, as_json, debug)
    else:
        # typer returns the code of an Exit it caught: 130 for a KeyboardInterrupt.
        code = returned if isinstance(returned, int) else EXIT_OK
    return _interrupted(as_json) if code == EXIT_INTERRUPTED else code


def _interrupted(as_json: bool) -> int:
    return _failed(as_json, "Interrupted", signals.detail(), EXIT_INTERRUPTED)


def _failure(exc: Exception, as_json: bool, debug: bool) -> int:
    """The exit code and closing line of an error that ended the command."""
    if isinstance(exc, CardfenceError):
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        return _failed(as_json, type(exc).__name__, str(exc), exit_code_for(exc))
    if _is_usage_error(exc):
        return _usage_failure(exc, as_json)
    return _bug(exc, as_json, debug)


def _bug(exc: BaseException, as_json: bool, debug: bool) -> int:
    """Exit 1: say so in one line, the traceback only on request."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    detail = f"{exc} (a bug; rerun with --debug)"
    return _failed(as_json, type(exc).__name__, detail, EXIT_UNEXPECTED)


def _failed(as_json: bool, name: str, message: str, code: int) -> int:
    """End stderr with the one-line error; under ``--json`` make sure stdout holds a document."""
    line = _single_line(message)
    if as_json and not emitted():
        document = {"error": {"type": name, "message": line, "exit_code": code}}
        try:
            sys.stdout.write(json.dumps(document) + "\n")
        except OSError:
            silence_stdout()
    _fail(f"{name}: {line}")
    return code


def _is_usage_error(exc: Exception) -> bool:
    # click's UsageError (vendored inside newer typer releases): exit code 2 and a message.
    return getattr(exc, "exit_code", None) == EXIT_USAGE and hasattr(exc, "format_message")


def _usage_failure(exc: Exception, as_json: bool) -> int:
    message = str(exc.format_message())  # type: ignore[attr-defined]
    if type(exc).__name__ == "NoArgsIsHelpError":
        sys.stderr.write(message.rstrip() + "\n")
        message = "no command given"
    return _failed(as_json, "UsageError", message, EXIT_USAGE)


def _single_line(text: str) -> str:
    return " ".join(text.split()) or "no detail"


def _fail(line: str) -> None:
    try:
        sys.stdout.flush()
    except OSError:
        silence_stdout()
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
