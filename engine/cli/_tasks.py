"""The task commands of ``cardfence``: run, reply, cancel, resume, tasks, show, audit
(``docs/cli.md``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer

from cardfence.engine import errors
from cardfence.engine.cli import _signals as signals
from cardfence.engine.cli._app import (
    MIN_POLL_INTERVAL,
    CardTimeoutOption,
    CredentialsOption,
    DbOption,
    DebugOption,
    Globals,
    InsecureOption,
    Interrupted,
    JsonOption,
    MaxCardBytesOption,
    app,
    check_positive,
    check_seconds,
    checked_store_url,
    configured,
    emit,
    open_store,
    options_of,
)
from cardfence.engine.cli._message import MessageOptions, check_media_range, message_parts
from cardfence.engine.cli._render import (
    audit_text,
    event_json,
    task_line,
    task_path,
    task_table,
    timeline,
)
from cardfence.engine.client.audit import audit as audit_store
from cardfence.engine.client.audit import rebuild_projections as rebuild_store
from cardfence.engine.client.config import DEFAULT_MAX_MESSAGE_BYTES, EngineConfig
from cardfence.engine.client.creation import check_webhook_url
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.following import UNTIL
from cardfence.engine.client.tasklog import AsOf, TaskLog, task_stream_id
from cardfence.engine.core.answers import TaskState
from cardfence.engine.core.lifecycle import STATES, TERMINAL
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.fetch import CardLimits, card_urls
from cardfence.engine.http.deadline import until as requests_until
from cardfence.engine.http.pool import engine_client, tls_context
from cardfence.store.errors import CardfenceError, CorruptRecordError

_T = TypeVar("_T")

UntilOption = Annotated[
    str,
    typer.Option("--until", help="interrupted (input-required, auth-required or terminal) "
                 "or terminal."),
]  # fmt: skip
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds the command may take.")]
PollOption = Annotated[
    float,
    typer.Option("--max-poll-interval", help="Safety polls are never further apart (seconds)."),
]
RetryAfterOption = Annotated[
    float,
    typer.Option(
        "--max-retry-after",
        help="The longest wait an agent's Retry-After (429, 503) is honoured for (seconds).",
    ),
]
CardAgeOption = Annotated[
    float,
    typer.Option("--max-card-age", help="Re-validate the card at most this often (seconds)."),
]
TaskArgument = Annotated[str, typer.Argument(metavar="TASK", help="Local key or remote task id.")]
AsOfOption = Annotated[
    str | None,
    typer.Option(
        "--as-of",
        metavar="TIME|@POSITION",
        help="As it stood then: an ISO 8601 time (without an offset, UTC) or a global position "
        "@N; replays the events recorded up to there.",
    ),
]

# `--state` takes A2A's lower-case names; `unknown` is one, though no task is ever left in it.
STATE_NAMES = (*STATES, TaskState.UNKNOWN)
FORMATS = ("text", "mermaid")


def _engine_run(
    options: Globals,
    config: EngineConfig,
    job: Callable[[Engine], Awaitable[_T]],
    deadline: float | None = None,
    *,
    left: Callable[[Engine], Awaitable[str]],
    existing: bool = True,
) -> _T:
    """Run ``job`` on an engine (``existing``: of a store already there); every request it
    makes, and the store's opening, connections and statements, end by ``deadline`` (R16). On
    SIGINT/SIGTERM the job is cancelled at its next await (the append in hand commits first)
    and :class:`Interrupted` says what ``left(engine)`` reports."""
    config = configured(options, config)
    store = open_store(options, existing=existing, deadline=deadline)

    async def main() -> _T:
        with signals.cancellable():
            async with engine_client(tls_context(config.ca_file)) as client:
                engine = Engine(store, client, config)
                try:
                    with requests_until(deadline):
                        return await job(engine)
                except asyncio.CancelledError as cancelled:
                    if not signals.interrupted_by_us(cancelled):
                        raise
                    said = await left(engine)
                    raise Interrupted(f"{signals.received()} received: {said}") from None
                finally:
                    await engine.aclose()

    return asyncio.run(main())


def _left_task(key: str) -> Callable[[Engine], Awaitable[str]]:
    """What an interruption left of one task, read back from the store."""

    async def left(engine: Engine) -> str:
        try:
            state = (await engine.task(key)).state
        except CardfenceError:
            return "interrupted before the task was recorded; nothing was sent"
        return f"task {key} left as recorded ({state}); `cardfence resume {key}` continues it"

    return left


async def _left_every(_engine: Engine) -> str:
    return "the tasks are left as recorded; `cardfence resume --all` continues them"


async def _caught(job: Awaitable[TaskView]) -> TaskView | Exception:
    """``job``'s view, or the error it raised: one task's failure, even a bug, never stops the
    tasks driven beside it."""
    try:
        return await job
    except Exception as failure:
        return failure


def _check_drive_options(
    until: str, timeout: float, max_poll_interval: float, max_retry_after: float
) -> None:
    """Checked before anything is opened or sent (exit 2)."""
    if until not in UNTIL:
        raise errors.UsageError(f"--until must be one of {', '.join(UNTIL)}, not {until!r}")
    check_seconds("--timeout", timeout)
    check_seconds("--max-poll-interval", max_poll_interval, minimum=MIN_POLL_INTERVAL)
    check_seconds("--max-retry-after", max_retry_after)


def _human(options: Globals, render: Callable[[], str]) -> str:
    """The human text, rendered only when it is what gets printed (not under ``--json``)."""
    return "" if options.json else render()


def _finish(options: Globals, view: TaskView) -> None:
    """Print the task and end as docs/cli.md says: 8 for a terminal state other than completed."""
    emit(options, view.to_json(), task_line(view))
    if view.state in TERMINAL and view.state != "completed":
        raise errors.TaskEndedError(view.task, view.state, view.last_message)


async def _drive_or_report(
    engine: Engine, options: Globals, key: str, until: str, deadline: float
) -> TaskView:
    """Drive; on a deadline, print where the task stands before failing (exit 6)."""
    try:
        return await engine.drive(key, until=until, timeout=max(deadline - time.monotonic(), 0.0))
    except errors.DeadlineExceeded:
        view = await engine.task(key)
        emit(options, view.to_json(), task_line(view))
        raise


TextOption = Annotated[
    list[str] | None,
    typer.Option("--text", help="A text part (repeatable), of --media-type."),
]
MediaTypeOption = Annotated[
    str,
    typer.Option(
        "--media-type",
        metavar="TYPE",
        help="The media type of the --text parts (application/json: a filled-in form).",
    ),
]
FileOption = Annotated[
    list[str] | None,
    typer.Option(
        "--file",
        metavar="PATH[;type=MEDIA]",
        help="A file part (repeatable): the file's bytes, its name, the media type given or "
        "guessed from the name.",
    ),
]
FileUrlOption = Annotated[
    list[str] | None,
    typer.Option(
        "--file-url", metavar="URL[;type=MEDIA]", help="A file part by reference (repeatable)."
    ),
]
DataOption = Annotated[
    str | None,
    typer.Option("--data", metavar="JSON|@PATH", help="A data part: a JSON object."),
]
MetadataOption = Annotated[
    str | None,
    typer.Option("--metadata", metavar="JSON", help="The message's metadata: a JSON object."),
]
MaxMessageBytesOption = Annotated[
    int,
    typer.Option(
        "--max-message-bytes",
        metavar="N",
        help="The largest message sent (its encoded request); a larger one is a usage error.",
    ),
]


@app.command()
def run(
    ctx: typer.Context,
    agent_url: Annotated[str, typer.Argument(metavar="AGENT_URL")],
    skill: Annotated[
        str | None,
        typer.Option("--skill", help="The skill id to use (optional when the card has one)."),
    ] = None,
    text: TextOption = None,
    media_type: MediaTypeOption = "text/plain",
    file: FileOption = None,
    file_url: FileUrlOption = None,
    data: DataOption = None,
    metadata: MetadataOption = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context", metavar="TASK", help="Continue the conversation of this earlier task."
        ),
    ] = None,
    reference: Annotated[
        list[str] | None,
        typer.Option(
            "--reference", metavar="TASK", help="Name an earlier task in referenceTaskIds."
        ),
    ] = None,
    accept: Annotated[
        list[str] | None,
        typer.Option(
            "--accept",
            metavar="MEDIA",
            help="An output mode accepted (repeatable); the skill must produce one of them.",
        ),
    ] = None,
    max_message_bytes: MaxMessageBytesOption = DEFAULT_MAX_MESSAGE_BYTES,
    webhook_url: Annotated[
        str | None, typer.Option("--webhook-url", help="Ask for push delivery to this URL.")
    ] = None,
    webhook_token: Annotated[
        str | None, typer.Option("--webhook-token", help="Token for push deliveries.")
    ] = None,
    until: UntilOption = "interrupted",
    timeout: TimeoutOption = 300.0,
    max_poll_interval: PollOption = 30.0,
    max_retry_after: RetryAfterOption = 300.0,
    max_card_age: CardAgeOption = 120.0,
    card_timeout: CardTimeoutOption = 10.0,
    max_card_bytes: MaxCardBytesOption = 1_048_576,
    accept_contract: Annotated[
        bool, typer.Option("--accept-contract", help="Accept a changed agent contract.")
    ] = False,
    extension: Annotated[
        list[str] | None,
        typer.Option(
            "--extension",
            metavar="URI",
            help="Activate this A2A extension (repeatable): the caller complies with it. "
            "A card requiring one not activated refuses the task.",
        ),
    ] = None,
    allow_insecure_http: InsecureOption = False,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Discover the agent, check skill and contract, send the message, then drive the task."""
    options = options_of(ctx, db, json_, debug, credentials)
    _check_drive_options(until, timeout, max_poll_interval, max_retry_after)
    check_seconds("--max-card-age", max_card_age)
    check_seconds("--card-timeout", card_timeout)
    check_positive("--max-card-bytes", max_card_bytes)
    check_positive("--max-message-bytes", max_message_bytes)
    accepted = [check_media_range(mode) for mode in accept or ()]
    card_urls(agent_url)  # a URL that cannot be used is a usage error before anything is opened
    if webhook_url:
        check_webhook_url(webhook_url)
    given = MessageOptions(text or (), media_type, file or (), file_url or (), data, metadata)
    parts, sent_metadata = message_parts(given, max_message_bytes)
    checked_store_url(options)
    deadline = time.monotonic() + timeout
    key = uuid.uuid4().hex  # chosen here, so an interruption can name the task
    config = EngineConfig(
        max_poll_interval=max_poll_interval,
        max_retry_after=max_retry_after,
        max_card_age=max_card_age,
        card_limits=CardLimits(
            timeout=min(card_timeout, timeout),
            max_bytes=max_card_bytes,
            allow_insecure=allow_insecure_http,
        ),
        max_message_bytes=max_message_bytes,
    )

    async def job(engine: Engine) -> TaskView:
        view = await engine.start_task(
            agent_url,
            skill=skill,
            parts=parts,
            metadata=sent_metadata,
            context=context,
            references=reference or (),
            accept=accepted,
            accept_contract=accept_contract,
            key=key,
            extensions=extension or (),
        )
        if webhook_url:
            await engine.register_webhook(view.task, webhook_url, token=webhook_token)
        return await _drive_or_report(engine, options, view.task, until, deadline)

    _finish(
        options, _engine_run(options, config, job, deadline, left=_left_task(key), existing=False)
    )


@app.command()
def reply(
    ctx: typer.Context,
    task: TaskArgument,
    text: TextOption = None,
    media_type: MediaTypeOption = "text/plain",
    file: FileOption = None,
    file_url: FileUrlOption = None,
    data: DataOption = None,
    metadata: MetadataOption = None,
    max_message_bytes: MaxMessageBytesOption = DEFAULT_MAX_MESSAGE_BYTES,
    until: UntilOption = "interrupted",
    timeout: TimeoutOption = 300.0,
    max_poll_interval: PollOption = 30.0,
    max_retry_after: RetryAfterOption = 300.0,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Answer an input-required task, then drive it."""
    options = options_of(ctx, db, json_, debug, credentials)
    _check_drive_options(until, timeout, max_poll_interval, max_retry_after)
    check_positive("--max-message-bytes", max_message_bytes)
    given = MessageOptions(text or (), media_type, file or (), file_url or (), data, metadata)
    parts, sent_metadata = message_parts(given, max_message_bytes)
    deadline = time.monotonic() + timeout
    found: list[str] = []

    async def job(engine: Engine) -> TaskView:
        found.append((await engine.task(task)).task)
        view = await engine.reply(task, parts=parts, metadata=sent_metadata)
        return await _drive_or_report(engine, options, view.task, until, deadline)

    async def left(engine: Engine) -> str:
        return await _left_task(found[0])(engine) if found else "nothing was sent"

    config = EngineConfig(
        max_poll_interval=max_poll_interval,
        max_retry_after=max_retry_after,
        max_message_bytes=max_message_bytes,
    )
    _finish(options, _engine_run(options, config, job, deadline, left=left))


@app.command()
def cancel(
    ctx: typer.Context,
    task: TaskArgument,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Ask the remote to cancel; the state moves only when the remote reports it."""
    options = options_of(ctx, db, json_, debug, credentials)
    found: list[str] = []

    async def job(engine: Engine) -> TaskView:
        found.append((await engine.task(task)).task)
        return await engine.cancel(task)

    async def left(engine: Engine) -> str:
        return await _left_task(found[0])(engine) if found else "nothing was sent"

    view = _engine_run(options, EngineConfig(), job, left=left)
    emit(options, view.to_json(), task_line(view))


@app.command()
def resume(
    ctx: typer.Context,
    task: Annotated[str | None, typer.Argument(metavar="[TASK]")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every task not yet terminal.")] = False,
    accept_contract: Annotated[
        bool,
        typer.Option(
            "--accept-contract",
            help="Accept the agent's contract as it is now, and send the task's credentials to "
            "the origin its endpoint moved to.",
        ),
    ] = False,
    until: UntilOption = "interrupted",
    timeout: TimeoutOption = 300.0,
    max_poll_interval: PollOption = 30.0,
    max_retry_after: RetryAfterOption = 300.0,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """After a restart: reconcile each task with a fresh card (R9), then drive it."""
    options = options_of(ctx, db, json_, debug, credentials)
    if (task is None) == (not all_):
        raise errors.UsageError("name one TASK or pass --all")
    _check_drive_options(until, timeout, max_poll_interval, max_retry_after)
    deadline = time.monotonic() + timeout
    config = EngineConfig(max_poll_interval=max_poll_interval, max_retry_after=max_retry_after)

    async def one(engine: Engine, key: str, *, report: bool) -> TaskView:
        view = await engine.resume(key, accept_contract=accept_contract)
        if report:  # one task: on a deadline, its document is the one printed
            return await _drive_or_report(engine, options, view.task, until, deadline)
        left = max(deadline - time.monotonic(), 0.0)
        return await engine.drive(view.task, until=until, timeout=left)

    if task is not None:
        found: list[str] = []

        async def single(engine: Engine) -> TaskView:
            found.append((await engine.task(task)).task)
            return await one(engine, task, report=True)

        async def left(engine: Engine) -> str:
            return await _left_task(found[0])(engine) if found else "nothing was sent"

        _finish(options, _engine_run(options, config, single, deadline, left=left))
        return

    async def every(engine: Engine) -> tuple[list[TaskView], list[str], list[Exception]]:
        # Every task at once, not one after another: a task that waits long (for its agent, or
        # for an answer under `--until terminal`) holds up no other. The engine bounds what is
        # in flight to each agent; the documents keep the store's order of the tasks.
        # A task whose record was altered in the store is left out, the others driven (exit 10).
        heads, unreadable = engine.log.all_readable()
        pending = [h.key for h in heads if h.state["state"] not in TERMINAL]
        outcomes = await asyncio.gather(
            *(_caught(one(engine, key, report=False)) for key in pending)
        )
        views: list[TaskView] = []
        orphaned: list[str] = []
        failures: list[Exception] = [*unreadable]
        for key, outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, TaskView):
                views.append(outcome)
                continue
            if isinstance(outcome, errors.TaskOrphanedError):
                orphaned.append(key)
            else:
                failures.append(outcome)
            if not isinstance(outcome, CardfenceError):  # a bug: named, the others go on
                said = " ".join(f"task {key}: {type(outcome).__name__}: {outcome}".split())
                with contextlib.suppress(OSError):
                    sys.stderr.write(f"{said} (a bug)\n")
            if not isinstance(outcome, CorruptRecordError):
                views.append(await engine.task(key))
        return views, orphaned, failures

    views, orphaned, failures = _engine_run(options, config, every, deadline, left=_left_every)
    document: dict[str, Any] = {"tasks": [v.to_json() for v in views], "orphaned": orphaned}
    human = "\n".join(task_line(v) for v in views) or "no task to resume"
    emit(options, document, human)
    bugs = [failure for failure in failures if not isinstance(failure, CardfenceError)]
    if bugs:  # exit 1 says one happened, whatever else did
        raise bugs[0]
    if orphaned:
        raise errors.TaskOrphanedError(orphaned[0], "", "", f"{len(orphaned)} task(s) orphaned")
    if failures:
        raise failures[0]


@app.command()
def tasks(
    ctx: typer.Context,
    state: Annotated[
        str | None,
        typer.Option("--state", help=f"Only tasks in this state: {', '.join(STATE_NAMES)}."),
    ] = None,
    as_of: AsOfOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """One row per task (--as-of: every task as it stood then)."""
    options = options_of(ctx, db, json_, debug)
    if state is not None and state not in STATE_NAMES:
        raise errors.UsageError(
            f"unknown state {state!r} for --state: expected one of {', '.join(STATE_NAMES)}"
        )
    point = None if as_of is None else AsOf.parse(as_of)
    unreadable: list[CorruptRecordError] = []
    with open_store(options, existing=True) as store:
        log = TaskLog(store)
        if point is None:
            heads, unreadable = log.all_readable(status=state)
        else:
            heads = log.all_as_of(point, status=state)
    views = [TaskView.of(h.state, h.updated_at) for h in heads]  # rows name no content
    document: dict[str, Any] = {"tasks": [v.to_row() for v in views]}
    as_of_text = None if point is None else str(point)
    if as_of_text is not None:
        document["as_of"] = as_of_text
    emit(options, document, _human(options, lambda: task_table(views, as_of=as_of_text)))
    if unreadable:  # the others are listed; exit 10 names the first left out
        raise unreadable[0]


@app.command()
def show(
    ctx: typer.Context,
    task: TaskArgument,
    as_of: AsOfOption = None,
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="text|mermaid",
            help="text: the timeline; mermaid: the task's path as a mermaid state diagram.",
        ),
    ] = "text",
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """The task's timeline: its own stream, versions 1..n (--as-of: up to a past point)."""
    options = options_of(ctx, db, json_, debug)
    if format_ not in FORMATS:
        raise errors.UsageError(f"unknown --format {format_!r}: expected text or mermaid")
    point = None if as_of is None else AsOf.parse(as_of)
    with open_store(options, existing=True) as store:
        log = TaskLog(store)
        key = log.find(task)
        if point is None:
            head = log.head(key)
            events = store.read_stream(task_stream_id(head.key))
        else:
            head, events = log.as_of(key, point)
        view = log.view(head.state, head.updated_at)
    document: dict[str, Any] = {
        "task": view.task,
        "remote_task_id": view.remote_task_id,
        "state": view.state,
        "delivery_mode": view.delivery_mode,
        "card_revision": view.card_revision,
        "contract_hash": view.contract_hash,
        "flags": list(view.flags),
        "repeats_ignored": view.repeats_ignored,
        "failures_repeated": view.failures_repeated,
        "references": list(view.references),
        "events": [event_json(e) for e in events],
    }
    as_of_text = None if point is None else str(point)
    if as_of_text is not None:
        document["as_of"] = as_of_text
    if format_ == "mermaid":
        diagram = task_path(events)
        document["mermaid"] = diagram
        emit(options, document, diagram)
        return
    emit(
        options,
        document,
        _human(options, lambda: timeline(view, events, view.contract_hash, as_of=as_of_text)),
    )


@app.command()
def audit(
    ctx: typer.Context,
    verify_signatures: Annotated[
        bool,
        typer.Option(
            "--verify-signatures",
            help="Also verify again every signed card read recorded as verified, against the "
            "key set recorded with it.",
        ),
    ] = False,
    rebuild_projections: Annotated[
        bool,
        typer.Option(
            "--rebuild-projections",
            help="Rewrite from its events the projection of every stream whose only violations "
            "are of its projection (its log intact), then audit again.",
        ),
    ] = False,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Verify every stream's chain and versions, replay it against its projection, and check
    every referenced card snapshot (--verify-signatures: and every verified card signature).
    Exit 5 on any violation (with --rebuild-projections: any left once rebuilt)."""
    options = options_of(ctx, db, json_, debug)
    check = rebuild_store if rebuild_projections else audit_store
    with open_store(options, existing=True) as store:
        report = check(store, verify_signatures=verify_signatures)
    emit(options, report.to_json(), audit_text(report))
    if not report.ok:
        first = report.violations[0]
        raise errors.AuditViolation(
            len(report.violations), f"{first.stream} @{first.position}: {first.kind}"
        )
