"""R15, never leak: an agent or a token endpoint that repeats a request's secrets -- in an A2A
error, a task's status message, the push configuration it stored -- in any form (as sent, base64,
percent-encoded, JSON-escaped character by character) gets none of them into the hash-chained
log, the command's output (stderr, the ``--json`` document, ``--debug``'s traceback) or
``serve``'s log. One test per path (send, poll, cancel, reply, registration, token request,
serve's log) on both databases, each searching the store's bytes and every output for every
secret the hostile server was sent; and the search has teeth: with the redaction planted out,
it finds them."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import CARDFENCE
from support.engine_fixtures import FAST, database_bytes
from support.hostile import SKILL, EchoingAgent, Reply, RoutedServer, echoed

from cardfence.engine.auth.config import ApiKey, Bearer, CredentialsConfig
from cardfence.engine.auth.redaction import Redaction
from cardfence.engine.client.engine import Engine
from cardfence.engine.errors import RemoteRefusedError
from cardfence.engine.wire import exchange

# Each holds characters that JSON escapes, percent-encoding changes and base64 hides.
BEARER = 'tok/en+"bearer-9d8e7f6a'
API_KEY = "sk/query+key-51be02c é"
CLIENT_SECRET = 'oauth/secret+"client-2e1f7'


@pytest.fixture
def agent() -> Iterator[EchoingAgent]:
    with EchoingAgent() as running:
        yield running


def _credentials(tmp_path: Path, agent: EchoingAgent) -> Path:
    path = tmp_path / "credentials.toml"
    path.write_text(
        f'[agents."{agent.url}"]\n'
        f"bearer = {{ token = '{BEARER}' }}\n"
        f"key = {{ api_key = '{API_KEY}' }}\n"
        f"oauth = {{ client_id = 'scan-client', client_secret = '{CLIENT_SECRET}' }}\n",
        encoding="utf-8",
    )
    path.chmod(0o600)
    return path


def _cli(db: str, credentials: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CARDFENCE, *args, "--db", db]
    argv += ["--credentials", str(credentials)] if credentials is not None else []
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _needles(secret: str) -> list[bytes]:
    """What finds ``secret`` in any form: its core (the part every escaping and encoding leaves
    whole), the core escaped character by character, and the secret's base64 forms."""
    core = max(secret.replace("/", " ").replace("+", " ").replace('"', " ").split(), key=len)
    raw = secret.encode()
    return [
        core.encode(),
        "".join(f"\\u{ord(c):04X}" for c in core).encode(),
        base64.b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
    ]


def _webhook_secrets(agent: EchoingAgent) -> list[str]:
    """The token and authorization a registration carried, as the agent received them."""
    found = []
    for request in agent.posts("CreateTaskPushNotificationConfig"):
        config = json.loads(request.body)["params"]
        found += [config["token"], config["authentication"]["credentials"]]
    return found


def _assert_hidden(
    secrets: list[str], db: str, tmp_path: Path, *outputs: str | subprocess.CompletedProcess[str]
) -> None:
    texts = [o if isinstance(o, str) else o.stdout + o.stderr for o in outputs]
    places = {"the store": database_bytes(db, tmp_path)}
    places |= {f"output {i}": text.encode() for i, text in enumerate(texts)}
    leaks = [
        (secret, where)
        for secret in secrets
        for where, content in places.items()
        if any(needle in content for needle in _needles(secret))
    ]
    assert leaks == []
    shown = [*texts, places["the store"].decode("utf-8", "replace")]
    assert any("***" in text for text in shown), "the echo was kept or shown, its secrets hidden"


def _task(result: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(result.stdout)["task"])


def _created(db: str, credentials: Path, agent: EchoingAgent) -> str:
    """A task waiting for input (the run ends there at its first poll)."""
    agent.state = "TASK_STATE_INPUT_REQUIRED"
    started = _cli(db, credentials, "run", agent.url, "--skill", SKILL, "--text", "hi", "--json")
    return _task(started)


# -- the paths ---------------------------------------------------------------------------------


def test_a_send_refused_with_the_secrets_echoed_records_and_shows_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    agent.refusing.add("SendMessage")
    run = ("run", agent.url, "--skill", SKILL, "--text", "hi")
    as_json = _cli(db_url, credentials, *run, "--json")
    debug = _cli(db_url, credentials, *run, "--debug")

    assert as_json.returncode == debug.returncode == 3, as_json.stderr
    assert "CreationRefusedError" in as_json.stdout
    _assert_hidden([BEARER, API_KEY], db_url, tmp_path, as_json, debug)
    assert b"TaskCreationRefused" in database_bytes(db_url, tmp_path)


def test_a_poll_answered_with_the_secrets_in_the_agents_question_stores_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    agent.state = "TASK_STATE_INPUT_REQUIRED"  # the send answers working; the poll asks
    run = _cli(db_url, credentials, "run", agent.url, "--skill", SKILL, "--text", "hi", "--json")
    shown = _cli(db_url, None, "show", _task(run))

    assert len(agent.posts("GetTask")) >= 1
    assert json.loads(run.stdout)["state"] == "input-required"
    assert "***" in shown.stdout  # the agent's question, as it was kept
    _assert_hidden([BEARER, API_KEY], db_url, tmp_path, run, shown)


def test_a_cancel_refused_with_the_secrets_echoed_records_and_shows_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    task = _created(db_url, credentials, agent)
    agent.refusing.add("CancelTask")
    cancel = _cli(db_url, credentials, "cancel", task, "--json")

    assert cancel.returncode != 0
    assert b"CancelRefused" in database_bytes(db_url, tmp_path)
    _assert_hidden([BEARER, API_KEY], db_url, tmp_path, cancel)


def test_a_reply_refused_with_the_secrets_echoed_records_and_shows_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    task = _created(db_url, credentials, agent)
    agent.refusing.add("SendMessage")
    reply = _cli(db_url, credentials, "reply", task, "--text", "yes", "--json", "--debug")

    assert reply.returncode != 0
    assert len(agent.posts("SendMessage")) == 2
    _assert_hidden([BEARER, API_KEY], db_url, tmp_path, reply)


def test_a_registration_refused_with_the_webhook_secrets_echoed_records_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    agent.refusing.add("CreateTaskPushNotificationConfig")
    agent.state = "TASK_STATE_INPUT_REQUIRED"
    run = _cli(db_url, credentials, "run", agent.url, "--skill", SKILL, "--text", "hi", "--json",
               "--webhook-url", "http://127.0.0.1:9/hook",
               "--webhook-token", "hook-token/+8c1d0e")  # fmt: skip

    secrets = _webhook_secrets(agent)
    assert len(secrets) == 2
    assert b"DeliveryDowngraded" in database_bytes(db_url, tmp_path)
    _assert_hidden([BEARER, API_KEY, *secrets], db_url, tmp_path, run)


def test_a_token_endpoint_repeating_the_client_secret_shows_and_records_none_of_it(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    with RoutedServer() as tokens:

        def refuse(request: object) -> Reply:
            echo = echoed(request)  # type: ignore[arg-type]
            body = {"error": "invalid_client", "error_description": echo}
            return Reply(status=401, body=json.dumps(body).encode())

        tokens.routes["/token"] = refuse
        agent.token_url = tokens.url + "/token"
        run = ("run", agent.url, "--skill", SKILL, "--text", "hi")
        as_json = _cli(db_url, credentials, *run, "--json")
        debug = _cli(db_url, credentials, *run, "--debug")

    assert len(tokens.requests) == 2
    assert as_json.returncode == 9, as_json.stderr
    assert "TokenRequestError" in as_json.stdout
    _assert_hidden([CLIENT_SECRET], db_url, tmp_path, as_json, debug)


def test_serves_log_of_polls_refused_with_the_secrets_echoed_shows_none_of_them(
    db_url: str, agent: EchoingAgent, tmp_path: Path
) -> None:
    credentials = _credentials(tmp_path, agent)
    _created(db_url, credentials, agent)
    agent.refusing.add("GetTask")
    polled = len(agent.posts("GetTask"))
    serve = subprocess.Popen(
        [sys.executable, "-m", "cardfence", "serve", "--db", db_url, "--port", "0",
         "--credentials", str(credentials), "--max-poll-interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while len(agent.posts("GetTask")) < polled + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        serve.send_signal(signal.SIGTERM)
        _, log = serve.communicate(timeout=30)

    assert len(agent.posts("GetTask")) >= polled + 2, log
    assert "RemoteRefusedError" in log or "refused" in log
    _assert_hidden([BEARER, API_KEY], db_url, tmp_path, log)


# -- the search has teeth ----------------------------------------------------------------------


async def test_with_the_redaction_planted_out_the_search_finds_the_echoed_secrets(
    agent: EchoingAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'planted.db'}"
    monkeypatch.setattr(exchange, "redaction", lambda secrets: Redaction(()))
    agent.refusing.add("SendMessage")
    origin = {agent.url: {"bearer": Bearer(BEARER), "key": ApiKey(API_KEY)}}
    config = dataclasses.replace(FAST, credentials=CredentialsConfig.of(origin))
    async with Engine.connect(db, config=config) as engine:
        with pytest.raises(RemoteRefusedError) as refused:
            await engine.start_task(agent.url, skill=SKILL, text="hi")

    with pytest.raises(AssertionError):
        _assert_hidden([BEARER], db, tmp_path, str(refused.value))
    stored = database_bytes(db, tmp_path)
    assert any(needle in stored for needle in _needles(BEARER))
