"""``cardfence serve``: webhook ingress and the driver that keeps every live task moving
(``docs/cli.md``). Runs until SIGTERM or SIGINT, then exits 0 with nothing half-written."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from typing import Annotated

import typer

from cardfence.engine import errors
from cardfence.engine.cli._app import (
    MIN_POLL_INTERVAL,
    CredentialsOption,
    DbOption,
    DebugOption,
    InsecureOption,
    JsonOption,
    app,
    check_seconds,
    checked_store_url,
    configured,
    open_store,
    options_of,
)
from cardfence.engine.cli._tasks import CardAgeOption, PollOption, RetryAfterOption
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.http.pool import engine_client, tls_context
from cardfence.engine.serve.decision_log import DecisionLog
from cardfence.engine.wire.push import (
    BODY_SECONDS,
    MAX_DELIVERIES_IN_FLIGHT,
    MAX_REFUSALS,
    IngressLimits,
)

__all__ = ["serve_command"]


@app.command("serve")
def serve_command(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port (0: any free port).")
    ] = 8080,
    max_poll_interval: PollOption = 30.0,
    max_retry_after: RetryAfterOption = 300.0,
    max_card_age: CardAgeOption = 120.0,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Polls in flight at once, at most.")
    ] = 32,
    agent_requests: Annotated[
        int,
        typer.Option(
            "--agent-requests",
            min=1,
            help="Requests in flight to any one agent at once, at most (the others wait).",
        ),
    ] = 8,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            metavar="S",
            help="How long this process's claim on a task holds unrenewed (renewed every third "
            "of it); another serve takes over a crashed one's tasks after it.",
        ),
    ] = 15.0,
    max_deliveries: Annotated[
        int,
        typer.Option(
            "--max-deliveries",
            min=1,
            help="Push deliveries taken at once, at most; one more is answered 503 with "
            "Retry-After, unread (the safety polls still bring its news).",
        ),
    ] = MAX_DELIVERIES_IN_FLIGHT,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout",
            metavar="S",
            help="How long a delivery's body may take to arrive in full (408 after), and a "
            "request's head (the connection is closed after); also how long an idle "
            "connection is kept open: keep it above the agents' client keep-alive (5 s).",
        ),
    ] = BODY_SECONDS,
    max_refusals: Annotated[
        int,
        typer.Option(
            "--max-refusals",
            min=0,
            help="Refused deliveries (bad credentials, unknown task, malformed) one source may "
            "have at once, given back at as many a minute; past them its deliveries are answered "
            "429, unread. 0: no limit.",
        ),
    ] = MAX_REFUSALS,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Also serve GET /metrics: counts in the Prometheus text format (deliveries, "
            "tasks followed, polls, leases).",
        ),
    ] = False,
    tls_cert: Annotated[
        str | None,
        typer.Option(
            "--tls-cert",
            metavar="FILE",
            help="Serve HTTPS with this certificate (PEM, its chain after it); needs --tls-key.",
        ),
    ] = None,
    tls_key: Annotated[
        str | None,
        typer.Option("--tls-key", metavar="FILE", help="The certificate's private key (PEM)."),
    ] = None,
    allow_insecure_http: InsecureOption = False,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Receive push deliveries at http(s)://HOST:PORT/webhook and keep every live task moving."""
    # Imported here: uvicorn and Starlette are for this command only (the others start faster).
    from cardfence.engine.serve.driver import Driver
    from cardfence.engine.serve.host import listen, serve

    options = options_of(ctx, db, json_, debug, credentials)
    check_seconds("--max-poll-interval", max_poll_interval, minimum=MIN_POLL_INTERVAL)
    check_seconds("--max-retry-after", max_retry_after)
    check_seconds("--max-card-age", max_card_age)
    check_seconds("--lease-ttl", lease_ttl)
    check_seconds("--body-timeout", body_timeout)
    checked_store_url(options)
    tls = _server_tls(tls_cert, tls_key)
    config = EngineConfig(
        max_poll_interval=max_poll_interval,
        max_retry_after=max_retry_after,
        max_card_age=max_card_age,
        card_limits=CardLimits(allow_insecure=allow_insecure_http),
        requests_per_agent=agent_requests,
        requests_in_flight=workers,
    )
    config = configured(options, config)
    try:
        sock = listen(host, port)
    except OSError as refused:
        raise errors.UsageError(f"cannot listen on {host}:{port}: {refused.strerror}") from None
    store = open_store(options)
    decisions = _log_decisions(debug)

    async def main() -> None:
        async with engine_client(tls_context(config.ca_file)) as client:
            engine = Engine(store, client, config)
            driver = Driver(engine, workers=workers, lease_ttl=lease_ttl)
            limits = IngressLimits(
                deliveries=max_deliveries,
                body_seconds=body_timeout,
                refusals=max_refusals or None,
            )
            await serve(
                engine, sock, driver=driver, limits=limits, metrics=metrics, tls=tls,
                started=_started,
            )  # fmt: skip

    try:
        asyncio.run(main())
    finally:
        sock.close()
        decisions.stop()


def _server_tls(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """The certificate and key to serve HTTPS with, checked to load; ``None`` for plain HTTP."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise errors.UsageError("--tls-cert and --tls-key go together: give both or neither")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as refused:
        raise errors.UsageError(
            f"cannot serve HTTPS with --tls-cert {cert} and --tls-key {key}: {refused}"
        ) from None
    return cert, key


def _started(url: str) -> None:
    sys.stderr.write(f"cardfence serve: webhook at {url}\n")
    sys.stderr.flush()


def _log_decisions(debug: bool) -> DecisionLog:
    """Decisions (one JSON line each) to stderr, written by a thread of their own; so are the
    warnings and errors of every other logger (uvicorn's ``Invalid HTTP request received.``,
    asyncio's), which would otherwise reach stderr as plain text between the JSON lines.
    uvicorn's info lines (started, waiting for startup) only repeat serve's own and are left
    out."""
    log = DecisionLog(sys.stderr)
    cardfence = logging.getLogger("cardfence")
    cardfence.handlers[:] = [log.handler]
    cardfence.setLevel(logging.DEBUG if debug else logging.INFO)
    cardfence.propagate = False
    others = logging.getLogger()
    others.handlers[:] = [log.handler]
    others.setLevel(logging.WARNING)
    log.start()
    return log
