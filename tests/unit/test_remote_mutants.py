"""Answers read field by field, and every refusal naming its field and the agent (R12, R16).

Written to kill the mutants of ``engine/wire/v10.py`` that ``scripts/mutation`` found alive: a
stream event or push delivery is applied from the fields read here, so each field of each event
kind is the contract, and so is the dotted path a refusal names (what an operator reads first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cardfence.engine.core.answers import Part, RemoteMessage, StatusMessage
from cardfence.engine.errors import InvalidAgentResponseError
from cardfence.engine.wire.v10 import (
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
    parse_task_page,
    parse_timestamp,
)

URL = "http://a.test/rpc"
MESSAGE: dict[str, Any] = {
    "messageId": "m-1",
    "contextId": "c-1",
    "taskId": "t-1",
    "role": "ROLE_AGENT",
    "parts": [{"text": "hello"}, {"data": {"k": 1}}, {"text": "world"}],
}
STATUS_MESSAGE = StatusMessage(
    "m-1",
    "agent",
    (Part("text", text="hello"), Part("data", data={"k": 1}), Part("text", text="world")),
    "hello\nworld",
)


def refused(call: Any, document: object, url: str = URL) -> str:
    with pytest.raises(InvalidAgentResponseError) as caught:
        call(document, url=url)
    assert caught.value.url == url
    return str(caught.value)


def detail(text: str, url: str = URL) -> str:
    return f"{url}: invalid agent response: {text} (nothing was changed)"


# --- the url and the path of a refusal ------------------------------------------------------------


def test_a_refused_task_page_names_the_agent_and_the_field() -> None:
    assert refused(parse_task_page, {"tasks": 1}) == detail("tasks: must be a list, not a number")
    assert refused(parse_task_page, []) == detail("body: must be an object, not a list")


def test_a_refusal_without_a_url_names_none() -> None:
    for call in (
        parse_task_page,
        parse_timestamp,
        parse_task,
        parse_stream_response,
        parse_push_config,
        parse_send_response,
    ):
        with pytest.raises(InvalidAgentResponseError) as caught:
            call(3)
        assert caught.value.url == ""
        assert str(caught.value).startswith(": invalid agent response: ")


def test_a_task_page_gives_its_tasks_and_next_page_token() -> None:
    page = {
        "tasks": [{"id": "t-1", "status": {"state": "TASK_STATE_WORKING"}}],
        "nextPageToken": "p-2",
    }
    tasks, token = parse_task_page(page, url=URL)
    assert [(t.id, t.state) for t in tasks] == [("t-1", "working")]
    assert token == "p-2"


def test_a_timestamp_is_read_as_aware_utc_and_refused_as_timestamp() -> None:
    assert parse_timestamp("2026-01-02T03:04:05+01:00", url=URL) == datetime(
        2026, 1, 2, 2, 4, 5, tzinfo=UTC
    )
    assert refused(parse_timestamp, 3) == detail(
        "timestamp: must be an RFC 3339 string, not a number"
    )
    assert refused(parse_timestamp, "yesterday") == detail(
        "timestamp: not an RFC 3339 timestamp: 'yesterday'"
    )


# --- 0.3 file parts -------------------------------------------------------------------------------


def message_with(part: object) -> dict[str, Any]:
    return {"message": {"messageId": "m", "parts": [part]}}


def test_a_03_file_part_by_uri_or_bytes_keeps_its_media_type() -> None:
    by_uri = parse_send_response(
        message_with({"file": {"uri": "https://x.test/f", "mimeType": "a/b"}})
    )
    by_bytes = parse_send_response(message_with({"file": {"bytes": "aGk=", "mimeType": "c/d"}}))
    assert isinstance(by_uri, RemoteMessage)
    assert isinstance(by_bytes, RemoteMessage)
    assert by_uri.parts == (Part("url", url="https://x.test/f", media_type="a/b"),)
    assert by_bytes.parts == (Part("raw", data="aGk=", media_type="c/d"),)


@pytest.mark.parametrize(
    ("file", "problem"),
    [
        (5, "message.parts[0].file: must be an object, not a number"),
        ({"uri": 5}, "message.parts[0].file.uri: must be a string, not a number"),
        ({"bytes": []}, "message.parts[0].file.bytes: must be a string, not a list"),
        ({}, "message.parts[0].file.bytes: required: a non-empty string"),
        (
            {"bytes": "aGk=", "mimeType": 1},
            "message.parts[0].file.mimeType: must be a string, not a number",
        ),
    ],
)
def test_a_broken_03_file_part_is_refused_at_its_path(file: object, problem: str) -> None:
    assert refused(parse_send_response, message_with({"file": file})) == detail(problem)


# --- stream events, field by field ----------------------------------------------------------------


def test_a_task_event_carries_every_field_of_its_task() -> None:
    update = parse_stream_response(
        {
            "task": {
                "id": "t-1",
                "contextId": "c-1",
                "generation": "7",
                "status": {
                    "state": "TASK_STATE_INPUT_REQUIRED",
                    "timestamp": "2026-01-02T03:04:05Z",
                    "message": MESSAGE,
                },
            }
        }
    )
    assert (update.kind, update.task_id, update.context_id) == ("task", "t-1", "c-1")
    assert update.state == "input-required"
    assert update.timestamp == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert update.generation == 7
    assert update.message == STATUS_MESSAGE
    assert update.task is not None
    assert update.task.id == "t-1"
    assert update.artifact is None


def test_a_message_event_carries_the_message_and_its_ids() -> None:
    update = parse_stream_response({"message": MESSAGE})
    assert (update.kind, update.task_id, update.context_id) == ("message", "t-1", "c-1")
    assert update.message == STATUS_MESSAGE
    assert (update.state, update.task, update.artifact) == (None, None, None)


def test_an_artifact_event_carries_its_ids_generation_and_artifact() -> None:
    update = parse_stream_response(
        {
            "artifactUpdate": {
                "taskId": "t-1",
                "contextId": "c-1",
                "generation": 4,
                "artifact": {"artifactId": "a-1", "parts": [{"text": "x"}]},
            }
        }
    )
    assert (update.kind, update.task_id, update.context_id, update.generation) == (
        "artifact",
        "t-1",
        "c-1",
        4,
    )
    assert update.artifact is not None
    assert update.artifact.artifact_id == "a-1"
    assert update.artifact.parts == (Part("text", text="x"),)


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ({"message": 5}, "message: must be an object, not a number"),
        ({"artifactUpdate": 5}, "artifactUpdate: must be an object, not a number"),
        (
            {"artifactUpdate": {"artifact": {}}},
            "artifactUpdate.taskId: required: a non-empty string",
        ),
        (
            {"artifactUpdate": {"taskId": "t", "generation": -1, "artifact": {"artifactId": "a"}}},
            "artifactUpdate.generation: must be a non-negative integer",
        ),
    ],
)
def test_a_broken_stream_event_is_refused_at_its_path(event: object, problem: str) -> None:
    assert refused(parse_stream_response, event) == detail(problem)


def test_an_artifact_keeps_its_description_and_refuses_a_wrong_one_at_its_path() -> None:
    event: dict[str, Any] = {
        "artifactUpdate": {
            "taskId": "t-1",
            "artifact": {"artifactId": "a-1", "name": "n", "description": "d", "parts": []},
        }
    }
    artifact = parse_stream_response(event).artifact
    assert artifact is not None
    assert (artifact.name, artifact.description) == ("n", "d")
    event["artifactUpdate"]["artifact"]["description"] = 5
    assert refused(parse_stream_response, event) == detail(
        "artifactUpdate.artifact.description: must be a string, not a number"
    )


def test_the_ids_of_an_artifact_event_are_refused_at_their_path() -> None:
    bad_context = {"artifactUpdate": {"taskId": "t", "contextId": 1, "artifact": {}}}
    assert refused(parse_stream_response, bad_context) == detail(
        "artifactUpdate.contextId: must be a string, not a number"
    )
    bad_task = {"artifactUpdate": {"taskId": "t\x00", "artifact": {}}}
    assert refused(parse_stream_response, bad_task) == detail(
        "artifactUpdate.taskId: must be printable text"
    )


def test_a_status_event_carries_its_message() -> None:
    update = parse_stream_response(
        {
            "statusUpdate": {
                "taskId": "t-1",
                "contextId": "c-1",
                "status": {"state": "TASK_STATE_FAILED", "message": MESSAGE},
            }
        }
    )
    assert (update.kind, update.task_id, update.context_id, update.state) == (
        "status",
        "t-1",
        "c-1",
        "failed",
    )
    assert update.message == STATUS_MESSAGE


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ({"statusUpdate": 5}, "statusUpdate: must be an object, not a number"),
        (
            {"statusUpdate": {"taskId": "t", "contextId": [], "status": {}}},
            "statusUpdate.contextId: must be a string, not a list",
        ),
    ],
)
def test_a_broken_status_event_is_refused_at_its_path(event: object, problem: str) -> None:
    assert refused(parse_stream_response, event) == detail(problem)


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        (
            {"statusUpdate": {"taskId": "t", "generation": -1, "status": {}}},
            "statusUpdate.generation: must be a non-negative integer",
        ),
        (
            {"statusUpdate": {"taskId": "t", "status": {"generation": "x"}}},
            "statusUpdate.status.generation: must be a non-negative integer",
        ),
        ({"kind": ""}, "kind: unknown 0.3 event kind ''"),
        ({"kind": "k" * 50}, f"kind: unknown 0.3 event kind {'k' * 40!r}"),
        (
            {"message": {"messageId": "m", "role": []}},
            "message.role: must be a string, not a list",
        ),
    ],
)
def test_a_broken_field_of_an_event_is_refused_with_what_it_is(event: object, problem: str) -> None:
    assert refused(parse_stream_response, event) == detail(problem)


# --- push configs and parts ---------------------------------------------------------------------


def test_a_push_config_is_read_with_its_authentication() -> None:
    config = parse_push_config(
        {
            "id": "p-1",
            "url": "https://hook.test/x",
            "token": "tok",
            "authentication": {"scheme": "Bearer", "credentials": "abc"},
        },
        url=URL,
    )
    assert (config.id, config.url, config.token) == ("p-1", "https://hook.test/x", "tok")
    assert (config.auth_scheme, config.auth_credentials) == ("Bearer", "abc")


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            {"id": "p", "url": "u", "authentication": 5},
            "authentication: must be an object, not a number",
        ),
        (
            {"id": "p", "url": "u", "authentication": {"scheme": 1}},
            "authentication.scheme: must be a string, not a number",
        ),
        (
            {"id": "p", "url": "u", "authentication": {"credentials": []}},
            "authentication.credentials: must be a string, not a list",
        ),
        ({"id": "p", "url": "u", "token": 1}, "token: must be a string, not a number"),
        ({"id": "p", "url": ""}, "url: required: a non-empty string"),
    ],
)
def test_a_broken_push_config_is_refused_at_its_path(config: object, problem: str) -> None:
    assert refused(parse_push_config, config) == detail(problem)


def test_data_and_url_parts_keep_their_media_type() -> None:
    message = parse_send_response(
        {
            "message": {
                "messageId": "m",
                "parts": [
                    {"data": {"k": 1}, "mediaType": "application/json"},
                    {"url": "https://x.test/f", "mediaType": "image/png"},
                ],
            }
        }
    )
    assert isinstance(message, RemoteMessage)
    assert message.parts == (
        Part("data", data={"k": 1}, media_type="application/json"),
        Part("url", url="https://x.test/f", media_type="image/png"),
    )


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (
            {"messageId": "m", "parts": [{}]},
            "message.parts[0]: exactly one of text, raw, url, data is required (got none)",
        ),
        ({"messageId": ""}, "message.messageId: required: a non-empty string"),
        ({"messageId": "m", "contextId": 1}, "message.contextId: must be a string, not a number"),
        ({"messageId": "m", "taskId": 1}, "message.taskId: must be a string, not a number"),
    ],
)
def test_a_broken_message_is_refused_at_its_path(message: object, problem: str) -> None:
    assert refused(parse_send_response, {"message": message}) == detail(problem)


# --- SendMessage answers ----------------------------------------------------------------------


TASK: dict[str, Any] = {"id": "t-1", "status": {"state": "TASK_STATE_WORKING"}}


def test_a_wrapped_answer_is_read_by_its_key_even_when_it_also_says_its_kind() -> None:
    task = parse_send_response({"task": TASK, "kind": "task"})
    message = parse_send_response({"message": MESSAGE, "kind": "message"})
    assert not isinstance(task, RemoteMessage)
    assert (task.id, task.state) == ("t-1", "working")
    assert isinstance(message, RemoteMessage)
    assert (message.message_id, message.text) == ("m-1", "hello\nworld")


def test_a_bare_03_answer_is_read_by_its_kind() -> None:
    task = parse_send_response({**TASK, "kind": "task"})
    message = parse_send_response({**MESSAGE, "kind": "message"})
    assert not isinstance(task, RemoteMessage)
    assert task.id == "t-1"
    assert isinstance(message, RemoteMessage)
    assert message.message_id == "m-1"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"kind": "task", "id": "t"}, "status: required: an object"),
        ({"kind": "message"}, "messageId: required: a non-empty string"),
        ({"kind": 3}, "kind: must be a string, not a number"),
        ({"kind": "other"}, "body: exactly one of task, message is required (got none)"),
        ({"task": 1}, "task: must be an object, not a number"),
    ],
)
def test_a_broken_send_answer_is_refused_at_its_path(answer: object, problem: str) -> None:
    assert refused(parse_send_response, answer) == detail(problem)


# --- timestamps and generations ------------------------------------------------------------------


@pytest.fixture
def local_zone_is_not_utc() -> Iterator[None]:
    """The machine's local time zone set to UTC+9 (a POSIX TZ string: no tz database needed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "JST-9")
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


@pytest.mark.usefixtures("local_zone_is_not_utc")
def test_a_timestamp_is_read_in_utc_whatever_the_local_zone() -> None:
    stamp = parse_timestamp("2026-01-02T03:04:05-02:00")
    assert stamp.utcoffset() == timedelta(0)
    assert stamp == datetime(2026, 1, 2, 5, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stamp", "problem"),
    [
        ("2026-02-30T00:00:00Z", "not a valid date and time: '2026-02-30T00:00:00Z'"),
        (
            "2026-02-30T00:00:00." + "1" * 40 + "Z",
            f"not a valid date and time: {('2026-02-30T00:00:00.' + '1' * 40)[:40]!r}",
        ),
        ("x" * 50, f"not an RFC 3339 timestamp: {'x' * 40!r}"),
    ],
)
def test_a_bad_timestamp_is_refused_showing_its_first_40_characters(
    stamp: str, problem: str
) -> None:
    assert refused(parse_timestamp, stamp) == detail(f"timestamp: {problem}")


def test_generation_zero_is_a_generation() -> None:
    update = parse_stream_response({"statusUpdate": {"taskId": "t", "generation": 0, "status": {}}})
    assert update.generation == 0


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ({"generation": -1}, "task.generation: must be a non-negative integer"),
        (
            {"status": {"generation": True}},
            "task.status.generation: must be a non-negative integer",
        ),
    ],
)
def test_a_bad_generation_of_a_task_is_refused_at_its_path(
    task: dict[str, Any], problem: str
) -> None:
    event = {"task": {"id": "t", "status": {}, **task}}
    assert refused(parse_stream_response, event) == detail(problem)


# --- identifiers and nested paths ----------------------------------------------------------------


def test_an_identifier_of_256_characters_is_kept_and_one_of_257_refused_at_its_path() -> None:
    task = {"id": "t", "contextId": "c" * 256, "status": {}}
    assert parse_stream_response({"task": task}).context_id == "c" * 256
    assert refused(parse_stream_response, {"task": {**task, "contextId": "c" * 257}}) == detail(
        "task.contextId: longer than 256 characters"
    )


@pytest.mark.parametrize("bad", ["a\nb", "a\tb", "a\x00b", "a\ud800b"])
def test_an_identifier_that_is_not_printable_text_is_refused(bad: str) -> None:
    event = {"statusUpdate": {"taskId": bad, "status": {}}}
    assert refused(parse_stream_response, event) == detail(
        "statusUpdate.taskId: must be printable text"
    )


def test_an_empty_status_timestamp_reads_as_none() -> None:
    update = parse_stream_response({"task": {"id": "t", "status": {"timestamp": ""}}})
    assert update.timestamp is None


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ({"artifacts": 1}, "task.artifacts: must be a list, not a number"),
        ({"artifacts": [{}]}, "task.artifacts[0].artifactId: required: a non-empty string"),
        (
            {"status": {"timestamp": 1}},
            "task.status.timestamp: must be an RFC 3339 string, not a number",
        ),
    ],
)
def test_a_broken_field_of_a_task_event_is_refused_at_its_path(
    task: dict[str, Any], problem: str
) -> None:
    event = {"task": {"id": "t", "status": {}, **task}}
    assert refused(parse_stream_response, event) == detail(problem)
