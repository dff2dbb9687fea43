"""``--credentials`` through the real ``cardfence`` console script (docs/cli.md): the file or
``$CARDFENCE_CREDENTIALS``, refused when others can read it, ``env:`` values read at use, the
refusal before sending when the contract's credentials are missing, and the local fingerprint
key."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from support import AuthPeer
from support.auth_peer import bearer_scheme, requirement
from support.cli import CARDFENCE, RUN_FAST, document, failed_with

TOKEN = "cli-bearer-5e6f7a8b"


@pytest.fixture
def peer(auth_peer: AuthPeer) -> AuthPeer:
    auth_peer.protect({"bearer": bearer_scheme()}, [requirement("bearer")])
    auth_peer.accept_bearer("bearer", TOKEN)
    return auth_peer


def credentials_file(tmp_path: Path, peer: AuthPeer, value: str, mode: int = 0o600) -> Path:
    path = tmp_path / "credentials.toml"
    path.write_text(f'[agents."{peer.base_url}"]\nbearer = {{ token = "{value}" }}\n')
    path.chmod(mode)
    return path


def cardfence(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "CARDFENCE_CREDENTIALS"}
    environment["XDG_STATE_HOME"] = str(tmp_path / "state")
    environment["CARDFENCE_DB"] = f"sqlite:///{tmp_path / 'cardfence.db'}"
    environment.update(env or {})
    return subprocess.run(
        [CARDFENCE, *args], capture_output=True, text=True, timeout=60, env=environment
    )


def run_echo(
    tmp_path: Path, peer: AuthPeer, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cardfence(
        tmp_path, *extra, "run", peer.base_url, "--skill", "echo", "--text", "echo hi",
        "--until", "terminal", *RUN_FAST, "--json", env=env,
    )  # fmt: skip


def test_run_with_a_credentials_file_sends_the_token_and_completes(
    peer: AuthPeer, tmp_path: Path
) -> None:
    path = credentials_file(tmp_path, peer, TOKEN)

    result = run_echo(tmp_path, peer, "--credentials", str(path))

    assert result.returncode == 0, result.stderr
    assert document(result)["state"] == "completed"
    hits = [hit for hit in peer.auth_log if hit.binding is not None]
    assert hits
    assert all(hit.credentials.get("authorization") == f"Bearer {TOKEN}" for hit in hits)
    key = tmp_path / "state" / "cardfence" / "fingerprint.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_the_credentials_file_comes_from_the_environment_with_env_values(
    peer: AuthPeer, tmp_path: Path
) -> None:
    path = credentials_file(tmp_path, peer, "env:AGENT_TOKEN")

    result = run_echo(
        tmp_path, peer, env={"CARDFENCE_CREDENTIALS": str(path), "AGENT_TOKEN": TOKEN}
    )

    assert result.returncode == 0, result.stderr
    assert document(result)["state"] == "completed"


def test_a_credentials_file_others_can_read_is_refused_before_anything_is_sent(
    peer: AuthPeer, tmp_path: Path
) -> None:
    path = credentials_file(tmp_path, peer, TOKEN, mode=0o644)

    result = run_echo(tmp_path, peer, "--credentials", str(path))

    error = failed_with(result, 2, "CredentialsConfigError")
    assert "chmod 600" in error["error"]["message"]
    assert peer.auth_log == []


def test_without_credentials_the_contract_refuses_creation_with_exit_3(
    peer: AuthPeer, tmp_path: Path
) -> None:
    result = run_echo(tmp_path, peer)

    error = failed_with(result, 3, "CredentialsMissingError")
    assert "bearer not configured" in error["error"]["message"]
    assert "nothing was sent" in error["error"]["message"]
    assert [hit for hit in peer.auth_log if hit.binding is not None] == []


def test_an_unset_env_value_is_a_usage_error_naming_the_variable_not_a_secret(
    peer: AuthPeer, tmp_path: Path
) -> None:
    path = credentials_file(tmp_path, peer, "env:CARDFENCE_TEST_UNSET_TOKEN")

    result = run_echo(tmp_path, peer, "--credentials", str(path))

    error = failed_with(result, 2, "CredentialsConfigError")
    assert "CARDFENCE_TEST_UNSET_TOKEN is not set" in error["error"]["message"]
    assert [hit for hit in peer.auth_log if hit.binding is not None] == []


def test_revoked_credentials_exit_9_and_leave_the_task_to_resume(
    peer: AuthPeer, tmp_path: Path
) -> None:
    path = credentials_file(tmp_path, peer, "not-the-token")
    peer.accept_bearer("bearer", TOKEN)

    result = run_echo(tmp_path, peer, "--credentials", str(path))

    failed_with(result, 9, "AuthorizationFailedError")
    assert "HTTP 401" in result.stderr
    assert "not-the-token" not in result.stderr + result.stdout
    shown = cardfence(tmp_path, "tasks", "--json")
    rows = json.loads(shown.stdout)["tasks"]
    assert rows[0]["flags"] == ["credentials_rejected"]
