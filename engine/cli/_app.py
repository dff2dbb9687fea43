"""The command line's shared parts: the typer app, global options, output and exit codes.

Global options (``--db``, ``--json``, ``--debug``) are accepted before and after the command name;
``--credentials`` before it, and after it on the commands that send requests to agents.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
import typer

from cardfence.engine import errors
from cardfence.engine.auth.config import CredentialsConfig, load_credentials
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.signature_files import load_card_signatures
from cardfence.store.database import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    normalise_url,
)
from cardfence.store.errors import (
    CardfenceError,
    SchemaTooNewError,
    StoreError,
    StoreUnavailableError,
)
from cardfence.store.event_store import EventStore

# Not a circle: for start-up time, the engine loads when a command that drives tasks runs.
if TYPE_CHECKING:
    from cardfence.engine.client.config import EngineConfig

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
EXIT_OUTPUT = 11
EXIT_INTERRUPTED = 130

# The smallest --max-poll-interval taken: below it the safety polls would hammer the agent.
MIN_POLL_INTERVAL = 0.1


class Interrupted(CardfenceError):
    """SIGINT or SIGTERM stopped the command (exit 130); the message says what was left."""


class OutputError(CardfenceError):
    """stdout could not be written (closed by its reader, or full); exit 11. What the command
    did is recorded in the store all the same."""


# Most specific first: CardInvalidError is a DiscoveryError.
_EXIT_CODES: tuple[tuple[type[CardfenceError], int], ...] = (
    (errors.UsageError, EXIT_USAGE),
    (errors.DiscoveryError, EXIT_CREATION_REFUSED),
    (errors.SkillUnavailableError, EXIT_CREATION_REFUSED),
    (errors.ExtensionRequiredError, EXIT_CREATION_REFUSED),
    (errors.ContractChangedError, EXIT_CREATION_REFUSED),
    (errors.CredentialsMissingError, EXIT_CREATION_REFUSED),
    (errors.TaskOrphanedError, EXIT_ORPHANED),
    (errors.AuditViolation, EXIT_AUDIT),
    (errors.DeadlineExceeded, EXIT_DEADLINE),
    (errors.CreationRefusedError, EXIT_CREATION_REFUSED),
    (errors.ProtocolMismatchError, EXIT_UNREACHABLE),
    (errors.OperationUnsupportedError, EXIT_UNREACHABLE),
    (errors.RemoteRefusedError, EXIT_REMOTE_REFUSED),
    (errors.EndpointUnreachableError, EXIT_UNREACHABLE),
    (errors.InvalidAgentResponseError, EXIT_UNREACHABLE),
    (StoreUnavailableError, EXIT_STORE_UNAVAILABLE),
    (SchemaTooNewError, EXIT_STORE_UNAVAILABLE),
    # The rest of the store's refusals (another writer first, a payload out of range, a snapshot
    # that does not hash to its key): the store refused the write.
    (StoreError, EXIT_STORE_UNAVAILABLE),
    (errors.TaskEndedError, EXIT_TERMINAL_NOT_COMPLETED),
    (OutputError, EXIT_OUTPUT),
    (Interrupted, EXIT_INTERRUPTED),
)


def exit_code_for(error: CardfenceError) -> int:
    """The exit code docs/cli.md assigns to an error (1 for errors it does not name)."""
    return exit_code_of(type(error))


def exit_code_of(kind: type[CardfenceError]) -> int:
    """The exit code docs/cli.md assigns to an error type (1, a bug, for types it does not name)."""
    for named, code in _EXIT_CODES:
        if issubclass(kind, named):
            return code
    return EXIT_UNEXPECTED


@dataclass
class Globals:
    db: str | None = None
    json: bool = False
    debug: bool = False
    credentials: str | None = None


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
CredentialsOption = Annotated[
    str | None,
    typer.Option(
        "--credentials",
        help="Credentials for agents, a TOML file only its owner can read "
        "(default: $CARDFENCE_CREDENTIALS).",
    ),
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
    ctx: typer.Context,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
    credentials: CredentialsOption = None,
) -> None:
    ctx.obj = Globals(db=db, json=json_, debug=debug, credentials=credentials)


def options_of(
    ctx: typer.Context, db: str | None, json_: bool, debug: bool, credentials: str | None = None
) -> Globals:
    """Merge options given after the command with those given before it."""
    before = ctx.obj if isinstance(ctx.obj, Globals) else Globals()
    chosen = db if db is not None else before.db  # `--db ""` is given, and refused later
    return Globals(
        db=chosen,
        json=json_ or before.json,
        debug=debug or before.debug,
        credentials=credentials if credentials is not None else before.credentials,
    )


def credentials_of(options: Globals) -> CredentialsConfig | None:
    """The credentials file the options (else ``$CARDFENCE_CREDENTIALS``) name, loaded; None
    when neither names one. Refused (:class:`errors.CredentialsConfigError`, exit 2) when it is
    readable by group or others, or malformed."""
    path = options.credentials
    if path is None:
        path = os.environ.get("CARDFENCE_CREDENTIALS") or None
    if path is None:
        return None
    if not path.strip():
        raise errors.UsageError("--credentials is empty: name a file, or leave the option out")
    return load_credentials(Path(path))


def configured(options: Globals, config: EngineConfig) -> EngineConfig:
    """``config`` with what the options and the environment say of agents: the credentials
    (and the local fingerprint key) and the card signature policies."""
    credentials = credentials_of(options)
    if credentials is not None:
        config = dataclasses.replace(
            config, credentials=credentials, fingerprint_key=fingerprint_key()
        )
    return dataclasses.replace(config, card_limits=with_card_signatures(config.card_limits))


def with_card_signatures(limits: CardLimits) -> CardLimits:
    """``limits`` with the card signature policies of the file ``$CARDFENCE_CARD_SIGNATURES``
    names (docs/cli.md, "Signed cards"); a file that cannot be read is a usage error."""
    path = os.environ.get("CARDFENCE_CARD_SIGNATURES") or None
    if path is None:
        return limits
    return dataclasses.replace(limits, signatures=load_card_signatures(Path(path)))


def fingerprint_key() -> bytes | None:
    """The local key the log's secret fingerprints are made with (R15), so one secret has one
    fingerprint across commands: ``$CARDFENCE_FINGERPRINT_KEY`` (a file path), else
    ``$XDG_STATE_HOME/cardfence/fingerprint.key`` (``~/.local/state/...``), made on first use
    with 32 random bytes, readable by its owner only. None (a key per process) when it can
    neither be read nor made."""
    named = os.environ.get("CARDFENCE_FINGERPRINT_KEY")
    if named:
        path = Path(named)
    else:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        path = Path(state) / "cardfence" / "fingerprint.key"
    try:
        key = path.read_bytes()
        return key if len(key) >= 16 else None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = secrets.token_bytes(32)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "wb") as out:
            out.write(key)
        return key
    except FileExistsError:  # another process made it first
        return fingerprint_key()
    except OSError:
        return None


def store_url(options: Globals) -> str:
    if options.db is not None:
        return options.db
    return os.environ.get("CARDFENCE_DB") or DEFAULT_DB


def checked_store_url(options: Globals, *, existing: bool = False) -> str:
    """The store URL, refused (UsageError) when the command line cannot use it: empty, not a
    URL, an in-memory SQLite database (it would vanish with the process), or, with
    ``existing``, a SQLite file that does not exist (a typo would show an empty store)."""
    url = store_url(options)
    if not url.strip():
        raise errors.UsageError("--db is empty: name a store, e.g. sqlite:///cardfence.db")
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise errors.UsageError(
            f"--db {url!r} is not a database URL (e.g. sqlite:///cardfence.db, "
            "postgresql://host/db); nothing was opened"
        ) from None
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    in_memory = (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    )
    if in_memory:
        raise errors.UsageError(
            f"--db {url}: an in-memory store would vanish with the process; "
            "name a file, e.g. sqlite:///cardfence.db"
        )
    if existing and not database.startswith("file:") and not Path(database).exists():
        raise errors.UsageError(
            f"no store at {database}: nothing was created (check --db or $CARDFENCE_DB; "
            "`cardfence migrate` creates an empty store)"
        )
    return url


def open_store(
    options: Globals, *, existing: bool = False, deadline: float | None = None
) -> EventStore:
    """Open (and migrate) the store the options name; ``existing``: only one already there.

    ``deadline`` (a ``time.monotonic`` value: a command's ``--timeout``) bounds the opening
    whole, and cuts the store's own bounds on every later connection and statement to the time
    left then (R16: no fixed timeout outlives ``--timeout``)."""
    url = checked_store_url(options, existing=existing)
    if deadline is None:
        return EventStore.open(url)
    return _open_by(url, deadline)


def _open_by(url: str, deadline: float) -> EventStore:
    """Open the store on a thread of its own and wait for it until ``deadline`` at most: libpq
    counts its connect timeout in whole seconds, two at least, and a server that accepts the
    connection and never answers a statement is not bounded by ``statement_timeout`` at all."""
    left = max(deadline - time.monotonic(), 0.001)
    opening = _Opening()
    worker = threading.Thread(
        target=opening.run,
        args=(url, left),
        name="cardfence-store-open",
        daemon=True,  # one that never answers must not keep the process from exiting
    )
    worker.start()
    try:
        opening.done.wait(left)
    finally:
        store, failure = opening.settle()
    if failure is not None:
        raise failure
    if store is None:
        shown = normalise_url(url).render_as_string(hide_password=True)
        raise StoreUnavailableError(
            shown, "no answer before --timeout ran out, while opening the store; nothing was sent"
        )
    return store


class _Opening:
    """A store being opened on a thread, and whether its waiter still wants it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._store: EventStore | None = None
        self._failure: BaseException | None = None
        self._abandoned = False

    def run(self, url: str, left: float) -> None:
        try:
            store = EventStore.open(
                url,
                connect_timeout=min(DEFAULT_CONNECT_TIMEOUT, left),
                statement_timeout=min(DEFAULT_STATEMENT_TIMEOUT, left),
            )
        except BaseException as failure:
            with self._lock:
                self._failure = failure
            self.done.set()
            return
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._store = store
        if abandoned:  # opened too late: nobody will use or close it
            store.close()
        self.done.set()

    def settle(self) -> tuple[EventStore | None, BaseException | None]:
        """What the opening came to by now; from here on a late store is closed, unused."""
        with self._lock:
            self._abandoned = True
            return self._store, self._failure


def check_seconds(option: str, value: float, *, minimum: float = 0.0) -> None:
    """A duration option must be a finite number of seconds above zero (and ``minimum``)."""
    if not math.isfinite(value) or value <= 0:
        raise errors.UsageError(f"{option} must be a number of seconds > 0, not {value:g}")
    if value < minimum:
        raise errors.UsageError(f"{option} must be at least {minimum:g} seconds, not {value:g}")


def check_positive(option: str, value: int) -> None:
    if value <= 0:
        raise errors.UsageError(f"{option} must be > 0, not {value}")


class _Output:
    emitted = False


def emit(options: Globals, document: dict[str, Any], human: str) -> None:
    """Print the JSON document (``--json``) or the human text, on stdout."""
    _Output.emitted = True
    text = json.dumps(document, sort_keys=False) if options.json else human.rstrip("\n")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as failure:
        silence_stdout()
        raise OutputError(f"cannot write stdout: {failure}") from None


def silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's last flush cannot fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def emitted() -> bool:
    """Whether this process has printed its document already."""
    return _Output.emitted
