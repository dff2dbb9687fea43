"""The command line's shared parts: the typer app, global options, output and exit codes.

Global options (``--db``, ``--json``, ``--debug``) are accepted before and after the command name.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from cardfence.engine import errors
from cardfence.store import EventStore

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
EXIT_STORE_UNAVAILABLE = 10

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
    (errors.InvalidAgentResponseError, EXIT_UNREACHABLE),
    (errors.StoreUnavailableError, EXIT_STORE_UNAVAILABLE),
    (errors.SchemaTooNewError, EXIT_STORE_UNAVAILABLE),
    (errors.TaskEndedError, EXIT_TERMINAL_NOT_COMPLETED),
)


def exit_code_for(error: errors.CardfenceError) -> int:
    """The exit code docs/cli.md assigns to an error (1 for errors it does not name)."""
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


def options_of(ctx: typer.Context, db: str | None, json_: bool, debug: bool) -> Globals:
    """Merge options given after the command with those given before it."""
    before = ctx.obj if isinstance(ctx.obj, Globals) else Globals()
    return Globals(db=db or before.db, json=json_ or before.json, debug=debug or before.debug)


def store_url(options: Globals) -> str:
    return options.db or os.environ.get("CARDFENCE_DB") or DEFAULT_DB


def open_store(options: Globals) -> EventStore:
    """Open (and migrate) the store the options name."""
    return EventStore.open(store_url(options))


class _Output:
    emitted = False


def emit(options: Globals, document: dict[str, Any], human: str) -> None:
    """Print the JSON document (``--json``) or the human text, on stdout."""
    _Output.emitted = True
    if options.json:
        sys.stdout.write(json.dumps(document, sort_keys=False) + "\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")
    sys.stdout.flush()


def emitted() -> bool:
    """Whether this process has printed its document already."""
    return _Output.emitted
