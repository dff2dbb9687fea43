"""The ``cardfence`` command line: a thin layer over the Python API (see CLI.md).

Global options (``--db``, ``--json``, ``--debug``) are accepted before and after the command name.
Every non-zero exit ends stderr with one line that starts with the error's type name.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import typer

from engine import errors
from engine.card_history import RevisionEntry, revision_history
from engine.discovery import CardLimits, CardRead, Discovery, card_urls
from store import EventStore

DEFAULT_DB = "sqlite:///cardfence.db"

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_CREATION_REFUSED = 3
EXIT_ORPHANED = 4
EXIT_AUDIT = 5
EXIT_DEADLINE = 6
EXIT_REMOTE_REFUSED = 7
EXIT_TERMINAL_NOT_COMPLETED = 8
EXIT_UNREACHABLE = 9

# Most specific first: CardInvalidError is a DiscoveryError.
_EXIT_CODES: tuple[tuple[type[errors.CardfenceError], int], ...] = (
    (errors.UsageError, EXIT_USAGE),
    (errors.DiscoveryError, EXIT_CREATION_REFUSED),
    (errors.SkillUnavailableError, EXIT_CREATION_REFUSED),
    (errors.ContractChangedError, EXIT_CREATION_REFUSED),
    (errors.TaskOrphanedError, EXIT_ORPHANED),
    (errors.AuditViolation, EXIT_AUDIT),
    (errors.DeadlineExceeded, EXIT_DEADLINE),
    (errors.RemoteRefusedError, EXIT_REMOTE_REFUSED),
    (errors.EndpointUnreachableError, EXIT_UNREACHABLE),
)


def exit_code_for(error: errors.CardfenceError) -> int:
    """The exit code CLI.md assigns to an error (1 for errors it does not name)."""
    for kind, code in _EXIT_CODES:
        if isinstance(error, kind):
            return code
    return EXIT_UNEXPECTED


@dataclass
class Globals:
    db: str | None = None
    json: bool = False
    debug: bool = False


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db", help="Event store URL (default: $CARDFENCE_DB, else sqlite:///cardfence.db)."
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Print tracebacks of unexpected errors.")
]

app = typer.Typer(
    name="cardfence",
    help="Drive A2A v1.0 tasks whose Agent Card may gate creation, never continuation.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global_options(
    ctx: typer.Context, db: DbOption = None, json_: JsonOption = False, debug: DebugOption = False
) -> None:
    ctx.obj = Globals(db=db, json=json_, debug=debug)


def _options(ctx: typer.Context, db: str | None, json_: bool, debug: bool) -> Globals:
    """Merge options given after the command with those given before it."""
    before = ctx.obj if isinstance(ctx.obj, Globals) else Globals()
    return Globals(db=db or before.db, json=json_ or before.json, debug=debug or before.debug)


def store_url(options: Globals) -> str:
    return options.db or os.environ.get("CARDFENCE_DB") or DEFAULT_DB


def open_store(options: Globals) -> EventStore:
    """Open (and migrate) the store the options name."""
    return EventStore.open(store_url(options))


def emit(options: Globals, document: dict[str, Any], human: str) -> None:
    """Print the JSON document (``--json``) or the human text, on stdout."""
    if options.json:
        sys.stdout.write(json.dumps(document, sort_keys=False) + "\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")


@app.command()
def migrate(
    ctx: typer.Context, db: DbOption = None, json_: JsonOption = False, debug: DebugOption = False
) -> None:
    """Bring the store to the newest schema and print its revision."""
    options = _options(ctx, db, json_, debug)
    with open_store(options) as store:
        revision = store.schema_revision()
    emit(options, {"db": store.url, "revision": revision}, f"{revision}")


CardTimeoutOption = Annotated[
    float, typer.Option("--card-timeout", help="Seconds one card read may take, all in.")
]
MaxCardBytesOption = Annotated[
    int, typer.Option("--max-card-bytes", help="Largest card body accepted, in bytes.")
]
InsecureOption = Annotated[
    bool,
    typer.Option("--allow-insecure-http", help="Allow plain http to hosts other than loopback."),
]


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
    """Read the agent's card once (conditional), then show the revisions this store has seen."""
    options = _options(ctx, db, json_, debug)
    limits = CardLimits(
        timeout=card_timeout, max_bytes=max_card_bytes, allow_insecure=allow_insecure_http
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
    document: dict[str, Any] = {
        "agent": origin,
        "read": _read_json(read, failure),
        "revisions": [entry.to_json() for entry in history],
    }
    emit(options, document, _render_history(origin, read, history))
    if failure is not None:
        raise failure


async def _read_card_once(store: EventStore, agent_url: str, limits: CardLimits) -> CardRead:
    async with httpx.AsyncClient() as client:
        return await Discovery(store, client, limits=limits).read(agent_url, fresh=True)


def _read_json(read: CardRead | None, failure: errors.DiscoveryError | None) -> dict[str, Any]:
    if read is not None:
        return {"ok": True, "url": read.url, "status": read.status, "revision": read.revision}
    assert failure is not None
    return {"ok": False, "url": failure.url, "kind": failure.kind, "detail": failure.detail}


def _render_history(origin: str, read: CardRead | None, history: list[RevisionEntry]) -> str:
    lines = [f"agent {origin}"]
    if read is not None:
        how = "unchanged (304)" if read.status == 304 else "read (200)"
        lines.append(f"card {how}: revision {read.revision[:12]} version {read.card.version}")
    lines.append("")
    for entry in history:
        lines.append(
            f"  {entry.revision[:12]}  version {entry.version or '-':<10} "
            f"first seen {entry.first_seen}  etag {entry.etag or '-'}"
        )
        for group, change in entry.changes.items():
            lines.append(f"      {group}: {json.dumps(change, sort_keys=True)}")
    if not history:
        lines.append("  (no revision recorded)")
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code (never raises)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        command.main(args=args, prog_name="cardfence", standalone_mode=False)
    except typer.Exit as stop:
        return int(stop.exit_code)
    except typer.Abort:
        _fail("Aborted: interrupted")
        return EXIT_UNEXPECTED
    except errors.CardfenceError as exc:
        if debug:
            traceback.print_exc(file=sys.stderr)
        _fail(f"{type(exc).__name__}: {_single_line(str(exc))}")
        return exit_code_for(exc)
    except Exception as exc:  # a bug: say so in one line, trace only on request
        if _is_usage_error(exc):
            return _usage_failure(exc)
        if debug:
            traceback.print_exc(file=sys.stderr)
        _fail(f"{type(exc).__name__}: {_single_line(str(exc))} (a bug; rerun with --debug)")
        return EXIT_UNEXPECTED
    return EXIT_OK


def _is_usage_error(exc: Exception) -> bool:
    # click's UsageError (vendored inside newer typer releases): exit code 2 and a message.
    return getattr(exc, "exit_code", None) == EXIT_USAGE and hasattr(exc, "format_message")


def _usage_failure(exc: Exception) -> int:
    message = str(exc.format_message())  # type: ignore[attr-defined]
    if type(exc).__name__ == "NoArgsIsHelpError":
        sys.stderr.write(message.rstrip() + "\n")
        message = "no command given"
    _fail(f"UsageError: {_single_line(message)}")
    return EXIT_USAGE


def _single_line(text: str) -> str:
    return " ".join(text.split()) or "no detail"


def _fail(line: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(line + "\n")


def main() -> None:
    """Console-script entry point."""
    raise SystemExit(run())
