"""Exit codes and error lines as docs/cli.md fixes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import cardfence.engine.cli.main  # noqa: F401  (every command module, with their errors)
from cardfence.engine import errors
from cardfence.engine.cli._app import Interrupted, OutputError, exit_code_for, exit_code_of
from cardfence.store.errors import (
    CardfenceError,
    ConcurrencyError,
    PayloadError,
    SchemaTooNewError,
    SnapshotMismatchError,
    StoreUnavailableError,
)

CLI_DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.UsageError("unknown task"), 2),
        (errors.DiscoveryError("http://a/card", "http_status", "503"), 3),
        (errors.CardInvalidError("http://a/card", "not JSON"), 3),
        (errors.SkillUnavailableError("http://a", "echo", "is absent"), 3),
        (errors.ContractChangedError("http://a", "a" * 64, "b" * 64, "security"), 3),
        (errors.TaskOrphanedError("t1", "echo", "c" * 64, "skill absent"), 4),
        (errors.AuditViolation(1, "gap"), 5),
        (errors.DeadlineExceeded("t1", "working", 5), 6),
        (errors.RemoteRefusedError("http://a", -32002, "not cancelable"), 7),
        (errors.EndpointUnreachableError("http://a", "404"), 9),
        (errors.InvalidAgentResponseError("http://a", "not a Task"), 9),
        (StoreUnavailableError("sqlite://", "disk I/O error"), 10),
        (SchemaTooNewError("sqlite://", "zz_future"), 10),
        (errors.ProtocolMismatchError("http://a", "GetTask", declared="1.0"), 9),
        (ConcurrencyError("task:t1", 3, 4), 10),
        (PayloadError("task:t1", "too large"), 10),
        (SnapshotMismatchError("a" * 64, "b" * 64), 10),
        (OutputError("cannot write stdout: broken pipe"), 11),
        (Interrupted("SIGINT received"), 130),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_each_error_maps_to_its_documented_exit_code(error: CardfenceError, code: int) -> None:
    assert exit_code_for(error) == code


def test_messages_are_one_line_and_say_what_was_not_done() -> None:
    samples = [
        errors.DiscoveryError(
            "http://h/.well-known/agent-card.json",
            "http_status",
            "503",
            consequence="nothing was sent",
        ),
        errors.SkillUnavailableError("http://a", "echo", "is absent from the fresh card"),
        errors.DeadlineExceeded("t1", "working", 5),
    ]
    for error in samples:
        text = str(error)
        assert "\n" not in text
        assert "not" in text
    assert str(samples[0]) == ("GET http://h/.well-known/agent-card.json -> 503 (nothing was sent)")


def _every_error_type() -> list[type[CardfenceError]]:
    found: list[type[CardfenceError]] = []
    pending = [CardfenceError]
    while pending:
        kind = pending.pop()
        found.append(kind)
        pending.extend(kind.__subclasses__())
    return [kind for kind in found if kind is not CardfenceError]


def test_every_error_type_has_a_documented_exit_code_other_than_1() -> None:
    """Exit 1 means a bug and nothing else: every error raised on purpose, the command line's
    own included, has its code, and docs/cli.md names the type beside that code."""
    documented: dict[str, int] = {}
    for row in re.findall(r"^\| `\w+` \| \d+ \|.*$", CLI_DOC.read_text(), re.M):
        code = int(row.split("|")[2])
        for name in re.findall(r"`(\w+)`", row):
            documented.setdefault(name, code)
    for kind in _every_error_type():
        if kind.__module__.startswith(("tests", "support")):
            continue  # test doubles
        code = exit_code_of(kind)
        assert code != 1, f"{kind.__name__} exits 1, the code of a bug"
        assert documented.get(kind.__name__) == code, (
            f"{kind.__name__} (exit {code}) is not in docs/cli.md's table of type names"
        )


def test_a_protocol_mismatch_names_the_versions() -> None:
    text = str(errors.ProtocolMismatchError("http://a/rpc", "SendMessage", declared="1.0",
                                            legacy="message/send"))  # fmt: skip
    assert "A2A 1.0" in text
    assert "0.3" in text
    assert "message/send" in text
    assert "\n" not in text
    assert isinstance(errors.ProtocolMismatchError("u", "GetTask", declared="1.0"),
                      errors.RemoteRefusedError)  # fmt: skip
