"""Exit codes and error lines as docs/cli.md fixes them."""

from __future__ import annotations

import pytest

from cardfence.engine import errors
from cardfence.engine.cli.app import exit_code_for


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
        (errors.StoreUnavailableError("sqlite://", "disk I/O error"), 10),
        (errors.SchemaTooNewError("sqlite://", "zz_future"), 10),
        (errors.ConcurrencyError("task:t1", 3, 4), 1),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_each_error_maps_to_its_documented_exit_code(
    error: errors.CardfenceError, code: int
) -> None:
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
