"""The ``cardfence`` command line: a thin layer over the Python API (see CLI.md).

Global options (``--db``, ``--json``, ``--debug``) are accepted before and after the command name.
Every non-zero exit ends stderr with one line that starts with the error's type name.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from engine import errors
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
