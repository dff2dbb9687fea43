"""``cardfence serve`` against a real a2a-sdk agent that sends real pushes: the webhook app and the
driver in one process (in the test's loop, and as the command in a subprocess). Push-only progress,
a push withdrawn before registration, streams followed and cut, SIGTERM mid-load. SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from support import Peer, make_tls
from support.engine_fixtures import (
    FAST,
    StreamCutter,
    assert_audit_ok,
    calls,
    data_of,
    held_delivery,
    point_jsonrpc_at,
    read_answer,
    restored,
    state_of,
    transitions,
    types,
    wait_until,
    webhook_url,
    withdraw_push,
)

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.http.pool import engine_client
from cardfence.engine.serve.driver import Driver
from cardfence.engine.serve.host import listen, serve
from cardfence.store.event_store import EventStore

SLOW = [("submitted", "working"), ("working", "completed")]
# Polls far apart: whatever moves a task within a test's few seconds is a push or a stream.
FAR_POLLS = dataclasses.replace(FAST, first_poll_interval=30.0, max_poll_interval=30.0)
STREAMS = dataclasses.replace(FAR_POLLS, follow_streams=True)


@dataclasses.dataclass
class Serving:
    url: str  # the webhook
    driver: Driver


@contextlib.asynccontextmanager
async def serving(
    db: str, config: EngineConfig = FAST, *, metrics: bool = False
) -> AsyncIterator[Serving]:
    """`serve` on 127.0.0.1 in this loop over the store at ``db`` (with ``GET /metrics`` when
    ``metrics``); stopped, then audited."""
    # Made as `cardfence serve` makes it: `serve` closes it when it stops.
    store = await asyncio.to_thread(EventStore.open, db)
    engine = Engine(store, engine_client(), config, owns_client=True)
    driver = Driver(engine, scan_interval=0.05)
    stop = asyncio.Event()
    up: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    job = asyncio.create_task(
        serve(
            engine,
            listen("127.0.0.1", 0),
            driver=driver,
            metrics=metrics,
            started=up.set_result,
            stop=stop,
        )
    )
    done, _ = await asyncio.wait({job, up}, return_when=asyncio.FIRST_COMPLETED)
    if job in done:
        job.result()
    try:
        yield Serving(up.result(), driver)
    finally:
        stop.set()
        await job
        with EventStore.open(db) as store:
            assert_audit_ok(store)


def completion(store: EventStore, key: str) -> dict[str, object]:
    [done] = [
        d for d in data_of(store, key, ev.STATE_CHANGED) if d["to"] in ("completed", "failed")
    ]
    return done


async def test_pushes_the_agent_sends_move_the_task_to_its_end_through_serve(
    peer: Peer, db_url: str
) -> None:
    async with serving(db_url, FAR_POLLS) as app, Engine.connect(db_url, config=FAR_POLLS) as run:
        view = await run.start_task(peer.base_url, skill="slow", text="slow 0.4")
        registered = await run.register_webhook(view.task, app.url)
        assert registered.registered

        await wait_until(
            lambda: state_of(run, view.task)["state"] == "completed", timeout=10, what="pushes"
        )

        assert completion(run.store, view.task)["source"] == "push"
        assert types(run.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
        # The registration told the agent a Bearer secret of its own (R15), and the deliveries
        # were accepted only because the agent presented it with the token.
        assert state_of(run, view.task)["webhook"]["auth_sha256"]
        assert registered.authorization is not None
        assert registered.authorization.startswith("Bearer ")
        assert transitions(run.store, view.task) == SLOW
        assert calls(peer, "CancelTask") == 0


def exposition(text: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition, by name and labels as written."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def test_serve_with_metrics_counts_deliveries_polls_and_leases(
    peer: Peer, db_url: str
) -> None:
    async with (
        serving(db_url, FAR_POLLS, metrics=True) as app,
        Engine.connect(db_url, config=FAR_POLLS) as run,
        httpx.AsyncClient() as client,
    ):
        view = await run.start_task(peer.base_url, skill="slow", text="slow 0.4")
        assert (await run.register_webhook(view.task, app.url)).registered
        await wait_until(
            lambda: state_of(run, view.task)["state"] == "completed", timeout=10, what="pushes"
        )
        await wait_until(lambda: app.driver.followed == 0, what="the ended task let go")

        response = await client.get(app.url.removesuffix("/webhook") + "/metrics")

        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = exposition(response.text)
        pushes = len(data_of(run.store, view.task, ev.STATE_CHANGED))
        assert samples['cardfence_deliveries_total{status="200",outcome="applied"}'] == pushes
        assert samples["cardfence_deliveries_in_flight"] == 0
        assert samples["cardfence_tasks_followed"] == 0
        assert samples['cardfence_leases_total{event="claimed"}'] >= 1
        assert samples["cardfence_polls_total"] == app.driver.polls


@pytest.mark.parametrize("agent03", ["shared_peer03", "shared_peer03_rest"])
async def test_a_0_3_agents_pushes_of_the_whole_task_move_it_to_its_end_through_serve(
    request: pytest.FixtureRequest, db_url: str, agent03: str
) -> None:
    """The official a2a-sdk 0.3 agent (its own process), over each of its bindings: it pushes
    the whole task with the token alone (0.3 sends no ``Authorization``), and ``serve`` takes
    those pushes as it takes 1.0 ones."""
    with restored(request.getfixturevalue(agent03)) as peer03:
        async with (
            serving(db_url, FAR_POLLS) as app,
            Engine.connect(db_url, config=FAR_POLLS) as run,
        ):
            view = await run.start_task(peer03.base_url, skill="slow", text="slow 0.4")
            registered = await run.register_webhook(view.task, app.url)
            assert registered.registered
            assert registered.authorization is None  # none is asked of a 0.3 agent

            await wait_until(
                lambda: state_of(run, view.task)["state"] == "completed",
                timeout=10,
                what="pushes",
            )

            assert completion(run.store, view.task)["source"] == "push"
            assert types(run.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
            assert transitions(run.store, view.task)[-1][1] == "completed"


async def test_push_withdrawn_before_registration_sends_no_registration_and_serve_polls_it_home(
    peer: Peer, db_url: str
) -> None:
    async with serving(db_url) as app, Engine.connect(db_url, config=FAST) as run:
        view = await run.start_task(peer.base_url, skill="slow", text="slow 0.3")
        peer.mutate_card(withdraw_push)

        outcome = await run.register_webhook(view.task, app.url)

        assert not outcome.registered
        assert calls(peer, "CreateTaskPushNotificationConfig") == 0
        assert [d["reason"] for d in data_of(run.store, view.task, ev.DELIVERY_DOWNGRADED)] == [
            "push_not_advertised"
        ]
        await wait_until(lambda: state_of(run, view.task)["state"] == "completed", timeout=10)
        assert transitions(run.store, view.task) == SLOW


async def test_the_tasks_stream_brings_its_progress_when_polls_are_far_apart(
    peer: Peer, db_url: str
) -> None:
    peer.hold()
    async with serving(db_url, STREAMS) as app, Engine.connect(db_url, config=FAR_POLLS) as run:
        view = await run.start_task(peer.base_url, skill="slow", text="slow 0")
        await wait_until(lambda: calls(peer, "SubscribeToTask") >= 1, what="a subscription")
        assert view.task in app.driver._streams
        peer.release()

        await wait_until(lambda: state_of(run, view.task)["state"] == "completed", timeout=10)

        assert completion(run.store, view.task)["source"] == "stream"
        assert transitions(run.store, view.task) == SLOW
        assert calls(peer, "SubscribeToTask") >= 1


async def test_a_stream_cut_mid_task_falls_back_to_polling_and_the_task_completes(
    peer: Peer, db_url: str
) -> None:
    config = dataclasses.replace(FAST, max_poll_interval=1.0, follow_streams=True)
    with StreamCutter(peer.jsonrpc_url) as relay:
        peer.mutate_card(point_jsonrpc_at(relay.url))
        peer.hold()
        async with serving(db_url, config), Engine.connect(db_url, config=config) as run:
            view = await run.start_task(peer.base_url, skill="slow", text="slow 0")
            await wait_until(lambda: relay.cuts >= 2, what="streams cut and subscribed again")
            peer.release()

            await wait_until(lambda: state_of(run, view.task)["state"] == "completed", timeout=10)

            assert transitions(run.store, view.task) == SLOW
            assert completion(run.store, view.task)["source"] == "poll"


async def test_a_card_withdrawing_streaming_only_stops_new_subscriptions_and_the_polls_finish(
    peer: Peer, db_url: str
) -> None:
    """R7: the card changes only the delivery path; the task completes, nothing is cancelled."""
    config = dataclasses.replace(FAST, max_poll_interval=1.0, follow_streams=True)
    with StreamCutter(peer.jsonrpc_url) as relay:
        peer.mutate_card(point_jsonrpc_at(relay.url))
        peer.hold()
        async with serving(db_url, config), Engine.connect(db_url, config=config) as run:
            view = await run.start_task(peer.base_url, skill="slow", text="slow 0")
            await wait_until(lambda: relay.cuts >= 1, what="a stream followed")
            peer.mutate_card(lambda card: card["capabilities"].update(streaming=False))
            await wait_until(
                lambda: ev.CARD_REVISION_CHANGED in types(run.store, view.task),
                what="the re-validation to see the change",
            )
            subscribed = relay.relayed.count("SubscribeToTask")
            await asyncio.sleep(3.0)  # three times the resubscription backoff
            assert relay.relayed.count("SubscribeToTask") <= subscribed + 1  # one in flight
            peer.release()

            await wait_until(lambda: state_of(run, view.task)["state"] == "completed", timeout=10)

            assert transitions(run.store, view.task) == SLOW
            assert calls(peer, "CancelTask") == 0


async def test_drive_follows_the_tasks_stream_beside_its_polls(peer: Peer, db_url: str) -> None:
    peer.hold()
    async with Engine.connect(db_url, config=STREAMS) as run:
        view = await run.start_task(peer.base_url, skill="slow", text="slow 0")
        driving = asyncio.create_task(run.drive(view.task, until="terminal", timeout=20))
        await wait_until(lambda: calls(peer, "SubscribeToTask") >= 1, what="a subscription")
        peer.release()

        done = await driving

        assert done.state == "completed"
        assert completion(run.store, view.task)["source"] == "stream"
        assert calls(peer, "GetTask") == 1  # the first poll; the stream brought the rest
        await run.settle()
        assert_audit_ok(run.store)


async def test_polls_kept_under_a_second_apart_follow_no_stream_beside_them(
    peer: Peer, db_url: str
) -> None:
    """Polls at most ``max_poll_interval`` (here 0.2 s) apart already bring the news within it:
    neither ``drive`` nor ``serve`` asks the agent for a stream as well."""
    config = dataclasses.replace(FAST, follow_streams=True)
    async with serving(db_url, config), Engine.connect(db_url, config=config) as run:
        served = await run.start_task(peer.base_url, skill="slow", text="slow 1.5")
        driven = await run.start_task(peer.base_url, skill="slow", text="slow 1.5")

        done = await run.drive(driven.task, until="terminal", timeout=20)
        await wait_until(lambda: state_of(run, served.task)["state"] == "completed", timeout=10)

        assert done.state == "completed"
        assert calls(peer, "SubscribeToTask") == 0
        assert calls(peer, "GetTask") >= 2 * 1.5 / FAST.max_poll_interval  # polled throughout


# -- the command ----------------------------------------------------------------------------------


def _serve_command(db: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cardfence", "serve", "--db", db, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@contextlib.contextmanager
def _serve_running(db: str, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """``cardfence serve`` on ``db``, killed afterwards if the test has not stopped it."""
    process = _serve_command(db, *extra)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def _stopped(process: subprocess.Popen[str]) -> str:
    """SIGTERM to a ``serve`` process; asserts it exits 0 within 30 s and returns its log."""
    process.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, stderr
    return stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_serve_stops_on_a_signal_mid_load_exits_0_and_resume_finishes_every_task(
    peer: Peer, db_url: str, sig: signal.Signals
) -> None:
    with EventStore.open(db_url):
        pass  # migrated before two processes open it
    # Two requests at most to the agent at once: the others wait their turn, and all finish.
    with _serve_running(db_url, "--max-poll-interval", "0.5", "--agent-requests", "2") as process:
        hook = webhook_url(process)
        async with Engine.connect(db_url, config=FAST) as run:
            views = []
            for _ in range(20):
                view = await run.start_task(peer.base_url, skill="slow", text="slow 0.6")
                assert (await run.register_webhook(view.task, hook)).registered
                views.append(view)
            await wait_until(
                lambda: any(state_of(run, v.task)["state"] != "submitted" for v in views),
                timeout=10,
                what="serve to move a task",
            )
            process.send_signal(sig)
            _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
            assert process.returncode == 0, stderr

            logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
            decisions = [line for line in logged if line.get("task") and line.get("event")]
            assert decisions, "no decision was logged"
            assert any(line.get("event") == "Stopping" for line in logged)
            assert_audit_ok(run.store)

            for view in views:
                await run.resume(view.task)
                done = await run.drive(view.task, until="terminal", timeout=15)
                assert done.state == "completed"
                # `working` may have come and gone while nobody watched: never twice, never lost
                # once recorded.
                assert transitions(run.store, view.task) in (SLOW, [("submitted", "completed")])
            await run.settle()
            assert_audit_ok(run.store)


async def test_serve_over_https_receives_the_agents_real_pushes(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    # The agent in a process of its own, trusting the test's CA for the pushes it sends.
    agent = subprocess.Popen(
        [sys.executable, "-m", "cardfence", "demo", "--agent-only", "--port", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "SSL_CERT_FILE": str(tls.ca)},
    )  # fmt: skip
    process = _serve_command(
        db, "--tls-cert", str(tls.server_cert), "--tls-key", str(tls.server_key)
    )
    try:
        assert agent.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(agent.stdout.readline), 60)
        agent_url = json.loads(line)["agent"]
        hook = webhook_url(process)
        assert hook.startswith("https://127.0.0.1:")
        async with Engine.connect(db, config=FAR_POLLS) as run:
            view = await run.start_task(agent_url, skill="slow", text="slow 0.4")
            assert (await run.register_webhook(view.task, hook)).registered

            await wait_until(
                lambda: (
                    ev.WEBHOOK_CONFIRMED in types(run.store, view.task)
                    and state_of(run, view.task)["state"] == "completed"
                ),
                timeout=20,
                what="a push over HTTPS and the task's end",
            )
            # WebhookConfirmed is recorded on the first delivery that serve accepted: the agent's
            # push came over HTTPS. (serve also polls: either may record the transitions.)
            assert types(run.store, view.task).count(ev.WEBHOOK_CONFIRMED) == 1
        process.send_signal(signal.SIGTERM)
        # The agent's connection idles in its pool and never answers the TLS close: the stop
        # must not wait for it (uvicorn alone waited out its 30 s graceful period).
        _, stderr = await asyncio.to_thread(process.communicate, timeout=20)
        assert process.returncode == 0, stderr
    finally:
        for child in (process, agent):
            if child.poll() is None:
                child.kill()
                child.communicate()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "nowhere.pem", "--tls-key", "nowhere.key"], "cannot serve HTTPS"),
    ],
)
def test_serve_refuses_tls_files_it_cannot_use_with_a_usage_error(
    tmp_path: Path, given: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cardfence", "serve", "--db",
         f"sqlite:///{tmp_path / 'c.db'}", "--port", "0", *given],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_serve_refuses_a_port_it_cannot_listen_on_with_a_usage_error(tmp_path: Path) -> None:
    with contextlib.closing(listen("127.0.0.1", 0)) as taken:
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cardfence", "serve", "--db",
             f"sqlite:///{tmp_path / 'c.db'}", "--port", str(port)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


async def test_serve_answers_503_past_max_deliveries_and_408_past_the_body_timeout(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with _serve_running(db, "--max-deliveries", "1", "--body-timeout", "1") as process:
        url = webhook_url(process)
        headers = {"content-type": "application/json", "x-a2a-notification-token": "t"}
        body = b'{"statusUpdate": {"taskId": "r-1", "contextId": "c-1"}}'
        with EventStore.open(db) as store:
            marks = store.last_position()
        async with held_delivery(url, headers, body, sent=10) as (slow, _):
            async with held_delivery(url, headers, body, sent=len(body)) as (turned_away, _):
                status, fields, answer = await read_answer(turned_away)
                assert (status, fields["retry-after"], answer["outcome"]) == (503, "1", "refused")
            status, _, answer = await read_answer(slow)  # its body never arrives in full
            assert (status, answer["outcome"]) == (408, "refused")
        stderr = await _stopped(process)
        logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert sorted(line["status"] for line in logged if "status" in line) == [408, 503]
        with EventStore.open(db) as store:
            assert store.last_position() == marks  # nothing written for either


async def _post_for_no_task(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """A well-formed delivery for a remote task no webhook is registered for (refused 404)."""
    status = b'"status": {"state": "TASK_STATE_WORKING"}'
    body = b'{"statusUpdate": {"taskId": "r-1", "contextId": "c-1", ' + status + b"}}"
    headers = {"content-type": "application/json", "x-a2a-notification-token": "token-1"}
    return await client.post(url, content=body, headers=headers)


@pytest.mark.parametrize(("limit", "statuses"), [("2", [404, 404, 429, 429]), ("0", [404] * 4)])
async def test_serve_sheds_a_source_past_max_refusals_and_counts_it_and_0_never_sheds(
    tmp_path: Path, limit: str, statuses: list[int]
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with _serve_running(db, "--max-refusals", limit, "--metrics") as process:
        url = webhook_url(process)
        async with httpx.AsyncClient(timeout=10) as client:
            answers = [await _post_for_no_task(client, url) for _ in range(4)]
            metrics = (await client.get(url.replace("/webhook", "/metrics"))).text
        assert [answer.status_code for answer in answers] == statuses
        shed = 1 if limit == "2" else 0
        if shed:
            assert answers[2].headers["retry-after"] == "30"  # 2 given back a minute
        assert f"cardfence_delivery_sources_shed {shed}" in metrics
        assert f"cardfence_delivery_sources_shed_total {shed}" in metrics
        answered_429 = 'cardfence_deliveries_total{status="429",outcome="refused"}'
        assert (f"{answered_429} 2" in metrics) if shed else (answered_429 not in metrics)
        stderr = await _stopped(process)
        logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        # Each refusal is logged; the shedding once, with its source; the 429s are counted only.
        assert [line.get("status") for line in logged if "status" in line] == (
            [404, 404, 429] if shed else [404] * 4
        )
        assert [line["source"] for line in logged if line.get("outcome") == "shed"] == (
            ["127.0.0.1"] if shed else []
        )
        with EventStore.open(db) as store:
            assert store.last_position() == 0


async def test_serve_closes_connections_whose_request_head_does_not_arrive_in_time(
    tmp_path: Path,
) -> None:
    with _serve_running(f"sqlite:///{tmp_path / 'c.db'}", "--body-timeout", "1") as process:
        url = httpx.URL(webhook_url(process))

        async def closed_by_serve(first: bytes, then: bytes) -> bytes:
            """Send ``first`` (a whole request, or nothing), read its answer, then send ``then``
            (part of a head): what the server sent before it closed the connection."""
            reader, writer = await asyncio.open_connection(url.host, url.port)
            try:
                writer.write(first)
                answer = await asyncio.wait_for(reader.readuntil(b'ok"}'), 10) if first else b""
                writer.write(then)
                await writer.drain()
                rest = await asyncio.wait_for(reader.read(), 10)  # b"" once closed
                return answer + rest
            finally:
                writer.close()

        health = f"GET /healthz HTTP/1.1\r\nhost: {url.netloc.decode()}\r\n\r\n".encode()
        partial = b"POST /webhook HTTP/1.1\r\nhost: x\r\ncontent-type: appl"
        assert await closed_by_serve(b"", b"") == b""  # nothing sent at all
        assert await closed_by_serve(b"", partial) == b""  # a head that never ends
        kept_alive = await closed_by_serve(health, partial)  # the next head on a kept-alive one
        assert kept_alive.startswith(b"HTTP/1.1 200")
        assert kept_alive.endswith(b'"ok"}')
        await _stopped(process)


async def test_serve_keeps_an_idle_connection_longer_than_an_agents_httpx_client_does(
    tmp_path: Path,
) -> None:
    """a2a-sdk agents push through httpx, whose pool reuses an idle connection for up to 5 s:
    were serve to close it at that same moment, a push would meet the close and be lost."""
    expiry = httpx.Limits(max_connections=None).keepalive_expiry or 5.0  # httpx's default: 5 s
    with _serve_running(f"sqlite:///{tmp_path / 'c.db'}") as process:
        url = httpx.URL(webhook_url(process))
        health = f"GET /healthz HTTP/1.1\r\nhost: {url.netloc.decode()}\r\n\r\n".encode()
        reader, writer = await asyncio.open_connection(url.host, url.port)
        try:
            for pause in (0.0, expiry + 0.5):
                await asyncio.sleep(pause)
                writer.write(health)
                answer = await asyncio.wait_for(reader.readuntil(b'ok"}'), 10)
                assert answer.startswith(b"HTTP/1.1 200")  # the same connection, still open
        finally:
            writer.close()
        await _stopped(process)


async def test_garbage_sent_to_serve_is_logged_as_a_json_line_like_every_other(
    tmp_path: Path,
) -> None:
    with _serve_running(f"sqlite:///{tmp_path / 'c.db'}") as process:
        url = httpx.URL(webhook_url(process))
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(b"\x16\x03\x01 not HTTP at all\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10)  # uvicorn's 400, then the close
        writer.close()
        stderr = await _stopped(process)

    # The one line that is no decision: the URL, announced as docs/cli.md says.
    lines = [line for line in stderr.splitlines() if not line.startswith("cardfence serve: ")]
    logged = [json.loads(line) for line in lines]  # each line one JSON object
    assert {"logger": "uvicorn.error", "level": "warning"}.items() <= next(
        line for line in logged if line["message"] == "Invalid HTTP request received."
    ).items()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--max-deliveries", "0"), ("--body-timeout", "0"), ("--max-refusals", "-1")],
)
def test_serve_refuses_ingress_limits_below_their_minimum_with_a_usage_error(
    tmp_path: Path, option: str, value: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cardfence", "serve", "--db",
         f"sqlite:///{tmp_path / 'c.db'}", "--port", "0", option, value],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert option in result.stderr


def test_serve_refuses_agent_requests_below_one_with_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cardfence", "serve", "--db",
         f"sqlite:///{tmp_path / 'c.db'}", "--port", "0", "--agent-requests", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--agent-requests" in result.stderr


async def test_serve_whose_log_nobody_reads_answers_every_delivery_and_logs_each_once_read(
    tmp_path: Path,
) -> None:
    # stderr is a pipe read only once serve has stopped: its buffer (64 KiB) fills after a few
    # hundred lines, and a process writing its log on the event loop would stop with it. The
    # lines wait for the reader (up to 10,000 of them; tests/unit/serve/test_decision_log.py drops
    # what finds no room past that).
    db = f"sqlite:///{tmp_path / 'c.db'}"
    sent = 800  # each refused (no such task) and logged: about 300 KB of lines
    with _serve_running(db, "--max-refusals", "0") as process:
        url = webhook_url(process)
        async with httpx.AsyncClient(timeout=10) as client:
            answers = [await _post_for_no_task(client, url) for _ in range(sent)]
        assert {answer.status_code for answer in answers} == {404}

        stderr = await _stopped(process)
        logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert len([line for line in logged if line.get("status") == 404]) == sent
        assert len(stderr.encode()) > 1 << 16  # more than the pipe holds: serve outran it
        assert not [line for line in logged if "log lines dropped" in line["message"]]
        with EventStore.open(db) as store:
            assert store.last_position() == 0
