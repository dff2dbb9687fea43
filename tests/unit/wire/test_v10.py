"""Reading what agents send: the a2a-sdk 1.3 shapes of docs/wire.md, 0.3 shapes, broken bodies."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cardfence.engine.core.answers import (
    ACTIVE_STATES,
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    Artifact,
    Part,
    PushConfig,
    RemoteMessage,
    RemoteTask,
    StatusMessage,
    TaskState,
    normalise_state,
)
from cardfence.engine.errors import InvalidAgentResponseError
from cardfence.engine.wire.v10 import (
    HISTORY_IDS_KEPT,
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
    parse_task_page,
    parse_timestamp,
)

URL = "http://agent.test/a2a/jsonrpc"

# --- bodies copied from docs/wire.md -------------------------------------------------------------

BLOCKING_ECHO = {
    "task": {
        "id": "2bc30fa1-0de7-44ee-8288-48a9752c0253",
        "contextId": "8fd0ee1c-c223-43c0-88f7-9080f046fdf7",
        "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-11-29T15:26:20.420072Z"},
        "artifacts": [
            {
                "artifactId": "aef7eeb6-ae83-45e6-88bb-518d6381f60c",
                "name": "echo",
                "parts": [{"text": "hello"}],
            }
        ],
        "history": [
            {
                "messageId": "m-1795965980417905202",
                "contextId": "8fd0ee1c-c223-43c0-88f7-9080f046fdf7",
                "taskId": "2bc30fa1-0de7-44ee-8288-48a9752c0253",
                "role": "ROLE_USER",
                "parts": [{"text": "echo hello"}],
            }
        ],
    }
}
ASK_INTERRUPTED = {
    "task": {
        "id": "5638266f-5269-4ee9-81e9-b68df5eeec43",
        "contextId": "14021392-894a-4358-a48e-23fab8f85920",
        "status": {
            "state": "TASK_STATE_INPUT_REQUIRED",
            "message": {
                "messageId": "6f6d7b87-0001",
                "contextId": "14021392-894a-4358-a48e-23fab8f85920",
                "taskId": "5638266f-5269-4ee9-81e9-b68df5eeec43",
                "role": "ROLE_AGENT",
                "parts": [{"text": "What is your answer?"}],
            },
            "timestamp": "2026-11-29T15:26:20.554295Z",
        },
    }
}
RETURN_IMMEDIATELY = {
    "task": {
        "id": "593c2757-9eb7-4b3d-bf0a-2f2688cbf93a",
        "contextId": "342a6323-1224-468f-bdaf-fad2e7f6bd9a",
        "status": {"state": "TASK_STATE_SUBMITTED", "timestamp": "2026-11-29T15:26:20.466844Z"},
        "history": [{"messageId": "m-1795965980464986105", "…": "…"}],
    }
}
GET_TASK = {
    "id": "5638266f-5269-4ee9-81e9-b68df5eeec43",
    "contextId": "14021392-894a-4358-a48e-23fab8f85920",
    "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-11-29T15:26:20.598424Z"},
    "artifacts": [
        {
            "artifactId": "afc1b9af-47b5-43fd-b648-55efa5d93169",
            "name": "answer",
            "parts": [{"text": "answer: 42"}],
        }
    ],
    "history": ["… 3 messages …"],
}
CANCELED = {
    "id": "6e368cfa-4437-4107-b59e-a2cbd1408ec3",
    "contextId": "a7ac9e8d-d1d9-424c-bf57-6172955c9652",
    "status": {"state": "TASK_STATE_CANCELED", "timestamp": "2026-11-29T15:26:21.007255Z"},
    "history": ["…"],
}
LIST_PAGE = {  # ListTasks prints default fields: "" and [] mean absent
    "tasks": [
        {
            "id": "04b270cd-92ba-45d2-8bbe-08e94f312c1c",
            "contextId": "82795076-0bf4-41f2-bbaf-33ff2d9b3375",
            "status": {"state": "TASK_STATE_FAILED", "timestamp": "2026-11-29T15:38:31.320089Z"},
            "history": [
                {
                    "messageId": "m2",
                    "role": "ROLE_USER",
                    "parts": [{"text": "fail", "filename": "", "mediaType": ""}],
                    "extensions": [],
                    "referenceTaskIds": [],
                }
            ],
        }
    ],
    "nextPageToken": "eyJ0cyI6MTc5NTk2NjcxMTMyMDA4OTAwMCwiaWQiOiIwNGIyNzBjZC05MmJhIn0",
    "pageSize": 1,
    "totalSize": 2,
}
PUSH_TASK = {
    "task": {
        "id": "df8d80f4-5167-4306-adbd-fae5d75cb14c",
        "contextId": "addb8c21-57a9-4de6-84d8-c1f230c53d22",
        "status": {"state": "TASK_STATE_SUBMITTED", "timestamp": "2026-11-29T15:26:38.167956Z"},
        "history": [
            {
                "messageId": "m-1795965998162074424",
                "role": "ROLE_USER",
                "parts": [{"text": "slow 0.3"}],
            }
        ],
    }
}
PUSH_STATUS = {
    "statusUpdate": {
        "taskId": "df8d80f4-5167-4306-adbd-fae5d75cb14c",
        "contextId": "addb8c21-57a9-4de6-84d8-c1f230c53d22",
        "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-11-29T15:26:38.168032Z"},
    }
}
PUSH_ARTIFACT = {
    "artifactUpdate": {
        "taskId": "df8d80f4-5167-4306-adbd-fae5d75cb14c",
        "contextId": "addb8c21-57a9-4de6-84d8-c1f230c53d22",
        "artifact": {
            "artifactId": "21035807-b126-491a-9b7b-dbc9802d74c8",
            "name": "slow",
            "parts": [{"text": "slept 0.3s"}],
        },
    }
}
PUSH_CONFIG = {
    "id": "cfg-1",
    "taskId": "6e368cfa-4437-4107-b59e-a2cbd1408ec3",
    "url": "http://127.0.0.1:36237/hook",
    "token": "tok-1",
    "authentication": {"scheme": "Bearer", "credentials": "sekrit"},
}


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- the real shapes -----------------------------------------------------------------------------


def test_blocking_send_reads_the_completed_task_with_its_artifact() -> None:
    task = parse_send_response(BLOCKING_ECHO, url=URL)
    assert task == RemoteTask(
        id="2bc30fa1-0de7-44ee-8288-48a9752c0253",
        context_id="8fd0ee1c-c223-43c0-88f7-9080f046fdf7",
        state=TaskState.COMPLETED,
        timestamp=at(2026, 11, 29, 15, 26, 20, 420072),
        generation=None,
        message=None,
        artifacts=(
            Artifact("aef7eeb6-ae83-45e6-88bb-518d6381f60c", "echo", (Part("text", text="hello"),)),
        ),
        history_ids=("m-1795965980417905202",),
    )


def test_input_required_carries_the_agents_question() -> None:
    task = parse_send_response(ASK_INTERRUPTED)
    assert isinstance(task, RemoteTask)
    assert task.state == "input-required"
    assert task.state in INTERRUPTED_STATES
    assert task.message == StatusMessage(
        "6f6d7b87-0001",
        "agent",
        (Part("text", text="What is your answer?"),),
        "What is your answer?",
    )


def test_return_immediately_reads_submitted() -> None:
    task = parse_send_response(RETURN_IMMEDIATELY)
    assert isinstance(task, RemoteTask)
    assert (task.state, task.artifacts, task.message) == ("submitted", (), None)


def test_get_task_and_cancel_results_are_bare_tasks() -> None:
    task = parse_task(GET_TASK)
    assert task.state == "completed"
    assert task.artifacts[0].parts[0].text == "answer: 42"
    assert parse_task(CANCELED).state == "canceled"


def test_send_answered_with_a_bare_message() -> None:
    body = {
        "message": {
            "messageId": "a-1",
            "contextId": "c-1",
            "role": "ROLE_AGENT",
            "parts": [{"text": "hi"}, {"data": {"n": 1}}, {"text": "there"}],
        }
    }
    answer = parse_send_response(body)
    assert answer == RemoteMessage(
        "a-1",
        "c-1",
        None,
        "agent",
        (Part("text", text="hi"), Part("data", data={"n": 1}), Part("text", text="there")),
        "hi\nthere",
    )


def test_list_tasks_page_treats_printed_defaults_as_absent() -> None:
    tasks, token = parse_task_page(LIST_PAGE)
    assert [(t.state, t.history_ids) for t in tasks] == [("failed", ("m2",))]
    assert token == LIST_PAGE["nextPageToken"]
    last = {**LIST_PAGE, "nextPageToken": "", "tasks": []}
    assert parse_task_page(last) == ((), None)


def test_a_history_gives_its_first_message_ids_passing_over_what_is_not_a_message() -> None:
    said = [{"messageId": f"m-{n}"} for n in range(HISTORY_IDS_KEPT + 5)]
    history = ["…", {"messageId": 7}, {"role": "ROLE_USER"}, *said]
    task = parse_task({**GET_TASK, "history": history})
    assert task.history_ids == tuple(f"m-{n}" for n in range(HISTORY_IDS_KEPT - 3))
    with pytest.raises(InvalidAgentResponseError, match="history: must be a list, not an object"):
        parse_task({**GET_TASK, "history": {"messageId": "m-1"}})


def test_push_bodies_read_as_stream_updates() -> None:
    first = parse_stream_response(PUSH_TASK)
    assert (first.kind, first.state, first.task_id) == ("task", "submitted", first.task.id)  # type: ignore[union-attr]
    status = parse_stream_response(PUSH_STATUS)
    assert (status.kind, status.state, status.timestamp) == (
        "status",
        "working",
        at(2026, 11, 29, 15, 26, 38, 168032),
    )
    assert status.context_id == "addb8c21-57a9-4de6-84d8-c1f230c53d22"
    artifact = parse_stream_response(PUSH_ARTIFACT)
    assert (artifact.kind, artifact.state, artifact.timestamp) == ("artifact", None, None)
    assert artifact.artifact == Artifact(
        "21035807-b126-491a-9b7b-dbc9802d74c8", "slow", (Part("text", text="slept 0.3s"),)
    )
    message = parse_stream_response(
        {"message": {"messageId": "x", "taskId": "t", "role": "ROLE_AGENT", "parts": []}}
    )
    assert (message.kind, message.task_id, message.message.text) == ("message", "t", "")  # type: ignore[union-attr]


def test_an_artifact_chunk_reads_append_and_anything_but_a_boolean_is_refused() -> None:
    def update(**fields: object) -> dict[str, Any]:
        return {"artifactUpdate": {**PUSH_ARTIFACT["artifactUpdate"], **fields}}

    assert parse_stream_response(PUSH_ARTIFACT).append is False
    assert parse_stream_response(update(append=None)).append is False
    assert parse_stream_response(update(append=True, lastChunk=True)).append is True
    with pytest.raises(InvalidAgentResponseError, match=r"artifactUpdate\.append.*boolean"):
        parse_stream_response(update(append="yes"))


def test_push_config_echo_reads_back_and_keeps_secrets_out_of_repr() -> None:
    config = parse_push_config(PUSH_CONFIG)
    assert config == PushConfig("cfg-1", "http://127.0.0.1:36237/hook", "tok-1", "Bearer", "sekrit")
    assert "sekrit" not in repr(config)
    assert "tok-1" not in repr(config)
    assert config.to_json() == {k: v for k, v in PUSH_CONFIG.items() if k != "taskId"}
    assert PushConfig("x", "http://h").to_json() == {"id": "x", "url": "http://h"}


def test_values_are_immutable() -> None:
    task = parse_task(GET_TASK)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.state = "failed"  # type: ignore[misc]
    assert isinstance(task.artifacts, tuple)
    assert isinstance(task.artifacts[0].parts, tuple)
    assert hash(Part("data", data={"unhashable": []})) == hash(Part("data", data=None))


# --- states --------------------------------------------------------------------------------------

STATE_SPELLINGS = [
    ("TASK_STATE_SUBMITTED", "submitted"),
    ("TASK_STATE_WORKING", "working"),
    ("TASK_STATE_INPUT_REQUIRED", "input-required"),
    ("TASK_STATE_AUTH_REQUIRED", "auth-required"),
    ("TASK_STATE_COMPLETED", "completed"),
    ("TASK_STATE_FAILED", "failed"),
    ("TASK_STATE_CANCELED", "canceled"),
    ("TASK_STATE_REJECTED", "rejected"),
    ("TASK_STATE_UNSPECIFIED", "unknown"),
    # 0.3
    ("submitted", "submitted"),
    ("working", "working"),
    ("input-required", "input-required"),
    ("auth-required", "auth-required"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("canceled", "canceled"),
    ("rejected", "rejected"),
    ("unknown", "unknown"),
    ("cancelled", "canceled"),  # nobody's spelling, but the agent did end the task
    # proto enum numbers
    (1, "submitted"),
    (3, "completed"),
    (6, "input-required"),
    (8, "auth-required"),
    (0, "unknown"),
]


@pytest.mark.parametrize(("wire", "ours"), STATE_SPELLINGS)
def test_state_spellings_of_both_versions_normalise(wire: object, ours: str) -> None:
    assert normalise_state(wire) == ours
    body = copy.deepcopy(GET_TASK)
    body["status"]["state"] = wire
    assert parse_task(body).state == ours


@pytest.mark.parametrize(
    "wire", ["TASK_STATE_PAUSED", "paused", "", None, 9, -1, True, 2**80, ["completed"], {}]
)
def test_unknown_states_read_as_unknown_and_never_raise(wire: object) -> None:
    assert normalise_state(wire) == "unknown"


def test_a_missing_state_is_unspecified_which_is_unknown() -> None:
    # Proto JSON omits an enum at its default (TASK_STATE_UNSPECIFIED).
    assert parse_task({"id": "t", "status": {}}).state == "unknown"


def test_state_groups() -> None:
    assert {"completed", "failed", "canceled", "rejected"} == TERMINAL_STATES
    assert {"input-required", "auth-required"} == INTERRUPTED_STATES
    assert {"submitted", "working"} | INTERRUPTED_STATES == ACTIVE_STATES
    assert not ACTIVE_STATES & TERMINAL_STATES
    assert "unknown" not in ACTIVE_STATES | TERMINAL_STATES


# --- timestamps ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T15:26:20Z", at(2026, 11, 29, 15, 26, 20)),
        ("2026-11-29T15:26:20.420Z", at(2026, 11, 29, 15, 26, 20, 420000)),
        ("2026-11-29T15:26:20.420072Z", at(2026, 11, 29, 15, 26, 20, 420072)),
        ("2026-11-29T15:26:20.420072999Z", at(2026, 11, 29, 15, 26, 20, 420072)),
        ("2026-11-29T15:26:20.4Z", at(2026, 11, 29, 15, 26, 20, 400000)),
        ("2026-11-29T15:26:20.000000000001z", at(2026, 11, 29, 15, 26, 20)),
        ("2026-11-29T17:26:20.5+02:00", at(2026, 11, 29, 15, 26, 20, 500000)),
        ("2026-11-29T09:56:20-05:30", at(2026, 11, 29, 15, 26, 20)),
        ("2026-11-29 15:26:20+00:00", at(2026, 11, 29, 15, 26, 20)),
        ("2016-12-31T23:59:60Z", at(2016, 12, 31, 23, 59, 59, 999999)),  # leap second
    ],
)
def test_timestamps_with_any_fraction_and_offset_read_as_aware_utc(
    text: str, expected: datetime
) -> None:
    stamp = parse_timestamp(text)
    assert stamp == expected
    assert stamp.utcoffset() == timedelta(0)
    body = copy.deepcopy(GET_TASK)
    body["status"]["timestamp"] = text
    assert parse_task(body).timestamp == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-29T15:26:20",  # no zone
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-11-29T25:00:00Z",
        "2026-11-29T15:26:20.Z",
        "2026-11-29T15:26:20+24:00",
        "0001-01-01T00:00:00+01:00",  # before datetime.min in UTC
        "9999-12-31T23:59:59-01:00",  # after datetime.max in UTC
        "٢٠٢٦-11-29T15:26:20Z",  # non-ASCII digits
        "yesterday",
        " 2026-11-29T15:26:20Z",
    ],
)
def test_unparsable_timestamps_are_refused_naming_the_field(text: str) -> None:
    body = copy.deepcopy(GET_TASK)
    body["status"]["timestamp"] = text
    with pytest.raises(InvalidAgentResponseError, match=r"status\.timestamp: ") as caught:
        parse_task(body, url=URL)
    assert caught.value.url == URL


def test_a_missing_timestamp_is_none() -> None:
    assert parse_task({"id": "t", "status": {"state": "TASK_STATE_SUBMITTED"}}).timestamp is None


# --- generation (A2A 1.1 draft) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [("task", 7, 7), ("task", "7", 7), ("status", 3, 3), ("task", "18446744073709551615", None)],
)
def test_generation_is_read_from_the_task_or_its_status(
    where: str, value: object, expected: int | None
) -> None:
    body = copy.deepcopy(GET_TASK)
    (body if where == "task" else body["status"])["generation"] = value
    if expected is None:  # 20 digits: not a 64-bit counter
        with pytest.raises(InvalidAgentResponseError, match="generation"):
            parse_task(body)
    else:
        assert parse_task(body).generation == expected
    assert parse_task(GET_TASK).generation is None


def test_generation_on_a_status_update() -> None:
    body = copy.deepcopy(PUSH_STATUS)
    body["statusUpdate"]["generation"] = "12"
    assert parse_stream_response(body).generation == 12


# --- broken bodies: each names its field ---------------------------------------------------------


def mutated(doc: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of ``doc`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("id", ..., "id: required"),
        ("id", "", "id: required"),
        ("id", 5, "id: must be a string, not a number"),
        ("contextId", ["x"], "contextId: must be a string, not a list"),
        ("status", ..., "status: required"),
        ("status", "TASK_STATE_COMPLETED", "status: must be an object, not a string"),
        ("status.state", ["x"], "status.state: must be a string, not a list"),
        ("status.state", True, "status.state: must be a string, not a boolean"),
        ("status.timestamp", 1700000000, "status.timestamp: must be an RFC 3339 string"),
        ("status.message", "oops", "status.message: must be an object"),
        ("artifacts", {}, "artifacts: must be a list, not an object"),
        ("artifacts.0", None, "artifacts[0]: must be an object, not null"),
        ("artifacts.0.artifactId", ..., "artifacts[0].artifactId: required"),
        ("artifacts.0.name", 3, "artifacts[0].name: must be a string"),
        ("artifacts.0.parts", "text", "artifacts[0].parts: must be a list"),
        ("artifacts.0.parts.0", {}, "artifacts[0].parts[0]: exactly one of text, raw, url, data"),
        (
            "artifacts.0.parts.0",
            {"text": "a", "data": 1},
            "artifacts[0].parts[0]: exactly one of text, raw, url, data is required "
            "(got text, data)",
        ),
        ("artifacts.0.parts.0.text", 42, "artifacts[0].parts[0].text: must be a string"),
        ("artifacts.0.parts.0.mediaType", 1, "artifacts[0].parts[0].mediaType: must be a string"),
        ("generation", -1, "generation: must be a non-negative integer"),
        ("generation", 1.5, "generation: must be a non-negative integer"),
    ],
)
def test_a_broken_task_is_refused_naming_the_field(path: str, value: object, named: str) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        parse_task(mutated(GET_TASK, path, value), url=URL)
    assert f"invalid agent response: {named}" in str(caught.value)
    assert caught.value.url == URL


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("status.message.messageId", ..., "status.message.messageId: required"),
        ("status.message.role", ["x"], "status.message.role: must be a string"),
        ("status.message.parts.0", "text", "status.message.parts[0]: must be an object"),
    ],
)
def test_a_broken_status_message_is_refused_naming_the_field(
    path: str, value: object, named: str
) -> None:
    with pytest.raises(InvalidAgentResponseError, match=f"task.{path.split('.')[0]}"):
        parse_send_response(mutated(ASK_INTERRUPTED, f"task.{path}", value))
    with pytest.raises(
        InvalidAgentResponseError, match=named.replace(".", r"\.").replace("[", r"\[")
    ):
        parse_task(mutated(ASK_INTERRUPTED["task"], path, value))


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (None, "body: must be an object, not null"),
        ([], "body: must be an object, not a list"),
        ({}, "body: exactly one of task, message is required (got none)"),
        ({"task": GET_TASK, "message": {}}, "exactly one of task, message is required"),
        ({"task": "x"}, "task: must be an object, not a string"),
        ({"task": {"status": {}}}, "task.id: required"),
        ({"message": {"parts": []}}, "message.messageId: required"),
        (GET_TASK, "exactly one of task, message is required (got none)"),  # a bare 1.0 task
    ],
)
def test_a_broken_send_response_is_refused_naming_the_field(body: object, named: str) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        parse_send_response(body)
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("x", "body: must be an object, not a string"),
        ({}, "exactly one of task, statusUpdate, artifactUpdate, message is required (got none)"),
        ({**PUSH_STATUS, **PUSH_ARTIFACT}, "(got statusUpdate, artifactUpdate)"),
        (mutated(PUSH_STATUS, "statusUpdate.taskId", ...), "statusUpdate.taskId: required"),
        (mutated(PUSH_STATUS, "statusUpdate.status", ...), "statusUpdate.status: required"),
        (
            mutated(PUSH_STATUS, "statusUpdate.status.timestamp", "soon"),
            "statusUpdate.status.timestamp: not an RFC 3339 timestamp",
        ),
        (
            mutated(PUSH_ARTIFACT, "artifactUpdate.artifact", ...),
            "artifactUpdate.artifact: required",
        ),
        (
            mutated(PUSH_ARTIFACT, "artifactUpdate.artifact.parts", 1),
            "artifactUpdate.artifact.parts: must be a list",
        ),
        (mutated(PUSH_TASK, "task.status", []), "task.status: must be an object"),
        ({"kind": "frobnicate"}, "kind: unknown 0.3 event kind"),
    ],
)
def test_a_broken_stream_response_is_refused_naming_the_field(body: object, named: str) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        parse_stream_response(body, url=URL)
    assert named in str(caught.value)


def test_broken_pages_and_push_configs_name_the_field() -> None:
    with pytest.raises(InvalidAgentResponseError, match=r"tasks\[0\]\.status: required"):
        parse_task_page({"tasks": [{"id": "t"}]})
    with pytest.raises(InvalidAgentResponseError, match="nextPageToken: must be a string"):
        parse_task_page({"tasks": [], "nextPageToken": 3})
    with pytest.raises(InvalidAgentResponseError, match="id: required"):
        parse_push_config({"url": "http://h"})
    with pytest.raises(InvalidAgentResponseError, match="authentication: must be an object"):
        parse_push_config({"id": "c", "url": "http://h", "authentication": "Bearer x"})


# --- parts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "part"),
    [
        ({"text": ""}, Part("text", text="")),
        (
            {"text": "hi", "mediaType": "text/markdown"},
            Part("text", text="hi", media_type="text/markdown"),
        ),
        ({"data": None}, Part("data", data=None)),
        ({"data": [1, {"a": "b"}]}, Part("data", data=[1, {"a": "b"}])),
        (
            {"url": "https://x.test/f.pdf", "filename": "f.pdf"},
            Part("url", url="https://x.test/f.pdf", filename="f.pdf"),
        ),
        ({"text": "hi", "filename": ""}, Part("text", text="hi")),  # printed default: absent
        (
            {"raw": "aGk=", "mediaType": "image/png"},
            Part("raw", data="aGk=", media_type="image/png"),
        ),
        ({"text": None, "url": "u"}, Part("url", url="u")),
        # 0.3
        ({"kind": "text", "text": "hi"}, Part("text", text="hi")),
        ({"kind": "data", "data": {"a": 1}}, Part("data", data={"a": 1})),
        (
            {"kind": "file", "file": {"uri": "https://x.test/f", "mimeType": "application/pdf"}},
            Part("url", url="https://x.test/f", media_type="application/pdf"),
        ),
        ({"kind": "file", "file": {"bytes": "aGk="}}, Part("raw", data="aGk=")),
        (
            {"kind": "file", "file": {"bytes": "aGk=", "name": "hi.txt"}},
            Part("raw", data="aGk=", filename="hi.txt"),
        ),
    ],
)
def test_part_kinds(wire: dict[str, Any], part: Part) -> None:
    task = parse_task(
        {"id": "t", "status": {}, "artifacts": [{"artifactId": "a", "parts": [wire]}]}
    )
    assert task.artifacts[0].parts == (part,)


def test_roles_of_both_versions() -> None:
    def role(value: object) -> str:
        message = {"messageId": "m", "parts": [], **({} if value is ... else {"role": value})}
        return parse_stream_response({"message": message}).message.role  # type: ignore[union-attr]

    assert [role(v) for v in ("ROLE_USER", "ROLE_AGENT", "user", "agent", 2)] == [
        "user",
        "agent",
        "user",
        "agent",
        "agent",
    ]
    assert {role(v) for v in (..., "ROLE_UNSPECIFIED", "robot", 0)} == {"unknown"}


# --- 0.3 shapes ----------------------------------------------------------------------------------

V03_TASK = {
    "kind": "task",
    "id": "t-03",
    "contextId": "c-03",
    "status": {
        "state": "input-required",
        "timestamp": "2025-06-01T10:00:00.123+00:00",
        "message": {
            "kind": "message",
            "messageId": "q",
            "role": "agent",
            "parts": [{"kind": "text", "text": "Which one?"}],
        },
    },
}


def test_v03_bare_task_and_message_as_send_results() -> None:
    task = parse_send_response(V03_TASK)
    assert isinstance(task, RemoteTask)
    assert (task.id, task.state, task.message.text) == ("t-03", "input-required", "Which one?")  # type: ignore[union-attr]
    message = parse_send_response(
        {
            "kind": "message",
            "messageId": "m",
            "role": "agent",
            "parts": [{"kind": "text", "text": "ok"}],
        }
    )
    assert isinstance(message, RemoteMessage)
    assert message.text == "ok"


def test_v03_push_and_stream_shapes() -> None:
    assert parse_stream_response(V03_TASK).kind == "task"
    status = parse_stream_response(
        {
            "kind": "status-update",
            "taskId": "t-03",
            "contextId": "c-03",
            "status": {"state": "completed", "timestamp": "2025-06-01T10:00:01Z"},
            "final": True,
        }
    )
    assert (status.kind, status.state, status.task_id) == ("status", "completed", "t-03")
    artifact = parse_stream_response(
        {
            "kind": "artifact-update",
            "taskId": "t-03",
            "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "x"}]},
        }
    )
    assert artifact.kind == "artifact"
    assert artifact.artifact is not None


# --------------------------------------------------------------------------------------------------
# Answers read field by field, and every refusal naming its field and the agent (R12, R16).
#
# A stream event or push delivery is applied from the fields read here, so each field of each event
# kind is the contract, and so is the dotted path a refusal names (what an operator reads first).


RPC_URL = "http://a.test/rpc"
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


def refused(call: Any, document: object, url: str = RPC_URL) -> str:
    with pytest.raises(InvalidAgentResponseError) as caught:
        call(document, url=url)
    assert caught.value.url == url
    return str(caught.value)


def detail(text: str, url: str = RPC_URL) -> str:
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
    tasks, token = parse_task_page(page, url=RPC_URL)
    assert [(t.id, t.state) for t in tasks] == [("t-1", "working")]
    assert token == "p-2"


def test_a_timestamp_is_read_as_aware_utc_and_refused_as_timestamp() -> None:
    assert parse_timestamp("2026-01-02T03:04:05+01:00", url=RPC_URL) == datetime(
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
        url=RPC_URL,
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
        ({"generation": -1}, "task.generation: must be a non-negative integer"),
        (
            {"status": {"generation": True}},
            "task.status.generation: must be a non-negative integer",
        ),
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
