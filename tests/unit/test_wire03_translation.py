"""engine/wire/_v03.py's translation functions called directly, for what the recorded exchanges of
wire/test_v03.py do not reach: each 0.3 shape an answer or a push may take, each dialect's
parts, the defaults of a request built from sparse params, and what is passed on unchanged for
engine.remote to refuse. Pure: no transport, no agent.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cardfence.engine.wire import _v03 as wire03

STATUS = {"state": "working"}
REST_MESSAGE = {"messageId": "m-1", "role": "ROLE_AGENT", "content": [{"text": "hi"}]}
RPC_MESSAGE = {"kind": "message", "messageId": "m-1", "parts": [{"kind": "text", "text": "hi"}]}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- requests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rest", [False, True])
@pytest.mark.parametrize("operation", ["SendMessage", "SendStreamingMessage"])
def test_both_send_operations_translate_their_message(operation: str, rest: bool) -> None:
    params = {"message": {"messageId": "m", "parts": [{"text": "hi", "mediaType": "text/plain"}]}}
    out = wire03.request(operation, params, rest=rest)
    assert out["message"]["role"] == ("ROLE_USER" if rest else "user")
    parts = out["message"]["content" if rest else "parts"]
    assert parts == ([{"text": "hi"}] if rest else [{"kind": "text", "text": "hi"}])


@pytest.mark.parametrize("rest", [False, True])
def test_a_message_without_parts_is_sent_with_none(rest: bool) -> None:
    out = wire03.request("SendMessage", {"message": {"messageId": "m"}}, rest=rest)
    assert out["message"]["content" if rest else "parts"] == []


@pytest.mark.parametrize(
    ("configuration", "blocking"),
    [({}, True), ({"returnImmediately": False}, True), ({"returnImmediately": True}, False)],
)
def test_a_send_always_says_whether_it_blocks(
    configuration: dict[str, Any], blocking: bool
) -> None:
    params = {"message": {"parts": []}, "configuration": configuration}
    assert wire03.request("SendMessage", params, rest=True)["configuration"] == {
        "blocking": blocking
    }


def test_a_push_config_without_a_task_id_names_the_empty_task() -> None:
    params = {"id": "cfg", "url": "https://hook.test/webhook", "token": "t"}
    rpc = wire03.request("CreateTaskPushNotificationConfig", params, rest=False)
    assert rpc["taskId"] == ""
    rest = wire03.request("CreateTaskPushNotificationConfig", params, rest=True)
    assert rest["parent"] == "tasks/"
    assert rest["config"]["name"] == "tasks//pushNotificationConfigs/cfg"


def test_a_rest_cancel_without_an_id_names_the_empty_task() -> None:
    assert wire03.request("CancelTask", {}, rest=True) == {"name": "tasks/"}


def test_a_part_without_a_media_type_is_plain_text() -> None:
    out = wire03.request("SendMessage", {"message": {"parts": [{"text": "hi"}]}}, rest=False)
    assert out["message"]["parts"] == [{"kind": "text", "text": "hi"}]


@pytest.mark.parametrize("rest", [False, True])
def test_a_part_that_is_not_text_is_sent_as_it_is(rest: bool) -> None:
    part = {"url": "https://files.test/a.pdf", "mediaType": "application/pdf"}
    out = wire03.request("SendMessage", {"message": {"parts": [part]}}, rest=rest)
    assert out["message"]["content" if rest else "parts"] == [part]


# --- answers -------------------------------------------------------------------------------------


def test_a_card_is_returned_as_it_is_whatever_its_shape() -> None:
    doc = {"kind": "task", "id": "t", "status": STATUS}
    assert wire03.answer("card", doc, rest=False) is doc


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"kind": "task", "id": "t", "status": STATUS}, "task"),
        ({"kind": "message", "messageId": "m"}, "message"),
        ({"kind": "status-update", "taskId": "t", "status": STATUS}, "statusUpdate"),
        ({"kind": "artifact-update", "taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"taskId": "t", "status": STATUS}, "statusUpdate"),
        ({"taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"id": "t", "status": STATUS}, "task"),
        ({"messageId": "m"}, "message"),
    ],
)
def test_a_json_rpc_stream_event_is_wrapped_by_its_kind_or_else_its_fields(
    doc: dict[str, Any], key: str
) -> None:
    assert wire03.answer("stream", doc, rest=False) == {key: doc}


@pytest.mark.parametrize(
    "doc",
    [
        {"kind": "push", "id": "t", "status": STATUS},  # a kind 0.3 has not: not told by fields
        {"kind": 7, "messageId": "m"},
        {"taskId": "t"},
        {"status": STATUS},
        {"id": "t"},
        {"artifact": {}},
        {"state": "working"},
    ],
)
def test_a_json_rpc_event_of_no_known_shape_is_passed_on_as_it_is(doc: dict[str, Any]) -> None:
    assert wire03.answer("stream", doc, rest=False) == doc


def test_a_json_rpc_event_already_wrapped_is_not_wrapped_again() -> None:
    doc = {"task": {"id": "t", "status": STATUS}, "kind": "message"}
    assert wire03.answer("stream", doc, rest=False) == doc


def test_a_rest_answer_is_never_told_by_its_fields() -> None:
    doc = {"messageId": "m", "content": []}
    assert wire03.answer("send", doc, rest=True) == doc


def test_a_send_answer_translates_its_message() -> None:
    assert wire03.answer("send", RPC_MESSAGE, rest=False) == {
        "message": {"kind": "message", "messageId": "m-1", "parts": [{"text": "hi"}]}
    }


def test_a_send_answer_holds_a_task_or_a_message_only() -> None:
    """An update in a send answer is left untranslated (engine.remote refuses it)."""
    update = {"taskId": "t", "status": {"state": "working", "message": RPC_MESSAGE}}
    assert wire03.answer("send", {"statusUpdate": update}, rest=False) == {"statusUpdate": update}
    streamed = wire03.answer("stream", {"statusUpdate": update}, rest=False)
    assert isinstance(streamed, dict)
    assert streamed["statusUpdate"]["status"]["message"]["parts"] == [{"text": "hi"}]


def test_a_rest_stream_translates_a_tasks_status_message_and_artifacts() -> None:
    task = {
        "id": "t",
        "status": {"state": "TASK_STATE_WORKING", "message": REST_MESSAGE},
        "artifacts": [{"artifactId": "a", "parts": [{"data": {"data": {"n": 1}}}]}, "odd"],
    }
    out = wire03.answer("stream", {"task": task}, rest=True)
    assert isinstance(out, dict)
    assert out["task"]["status"]["message"]["parts"] == [{"text": "hi"}]
    assert out["task"]["artifacts"] == [{"artifactId": "a", "parts": [{"data": {"n": 1}}]}, "odd"]


def test_a_rest_stream_translates_a_message() -> None:
    message = {**REST_MESSAGE, "content": [{"text": "hi"}, {"data": {"data": {"n": 1}}}]}
    out = wire03.answer("stream", {"message": message}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"text": "hi"}, {"data": {"n": 1}}]
    assert "content" not in out["message"]


def test_a_rest_message_with_parts_keeps_them_over_its_content() -> None:
    message = {**REST_MESSAGE, "parts": [{"text": "kept"}]}
    out = wire03.answer("stream", {"message": message}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"text": "kept"}]
    assert out["message"]["content"] == REST_MESSAGE["content"]


@pytest.mark.parametrize("rest", [False, True])
def test_an_artifact_update_translates_its_artifacts_parts(rest: bool) -> None:
    part = {"data": {"data": {"n": 1}}} if rest else {"kind": "data", "data": {"n": 1}}
    update = {"taskId": "t", "artifact": {"artifactId": "a", "parts": [part, "odd"]}}
    out = wire03.answer("stream", {"artifactUpdate": update}, rest=rest)
    assert out == {
        "artifactUpdate": {
            "taskId": "t",
            "artifact": {"artifactId": "a", "parts": [{"data": {"n": 1}}, "odd"]},
        }
    }


def test_an_artifact_update_without_an_artifact_is_passed_on() -> None:
    update = {"taskId": "t", "artifact": "odd"}
    assert wire03.answer("stream", {"artifactUpdate": update}, rest=False) == {
        "artifactUpdate": update
    }


# --- parts in -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "rest", "expected"),
    [
        ({"kind": "text", "text": "hi"}, False, {"text": "hi"}),
        ({"text": "hi"}, True, {"text": "hi"}),
        # a part's kind decides over its fields
        ({"kind": "data", "text": "hi", "data": {"n": 1}}, False, {"data": {"n": 1}}),
        ({"kind": "text", "data": {"n": 1}}, False, {"kind": "text", "data": {"n": 1}}),
        (
            {"kind": "file", "text": "hi", "file": {"uri": "u"}},
            False,
            {"url": "u"},
        ),
        (
            {"kind": "data", "file": {"uri": "u"}},
            False,
            {"kind": "data", "file": {"uri": "u"}},
        ),
        ({"kind": "file", "data": {"n": 1}}, False, {"kind": "file", "data": {"n": 1}}),
        # files: each dialect's fields, media type and name
        (
            {"kind": "file", "file": {"uri": "u", "mimeType": "image/png", "name": "a.png"}},
            False,
            {"url": "u", "mediaType": "image/png", "filename": "a.png"},
        ),
        ({"file": {"fileWithUri": "u"}}, True, {"url": "u"}),
        ({"kind": "file", "file": {"bytes": "aGk="}}, False, {"raw": "aGk="}),
        ({"file": {"fileWithBytes": b64("aGk=")}}, True, {"raw": "aGk="}),
        ({"file": {"name": "a"}}, True, {"file": {"name": "a"}}),
        # data: 0.3 proto JSON nests it once more; JSON-RPC does not
        ({"data": {"data": {"n": 1}}}, True, {"data": {"n": 1}}),
        ({"data": {}}, True, {"data": {}}),
        ({"kind": "data", "data": {"data": {"n": 1}}}, False, {"data": {"data": {"n": 1}}}),
        ({"data": {"data": 1, "more": 2}}, True, {"data": {"data": 1, "more": 2}}),
        ({"kind": "video"}, False, {"kind": "video"}),
    ],
)
def test_each_03_part_reads_as_its_10_part(
    part: dict[str, Any], rest: bool, expected: dict[str, Any]
) -> None:
    message = {"messageId": "m", ("content" if rest else "parts"): [part]}
    out = wire03.answer("stream", {"message": message}, rest=rest)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [expected]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b64("aGk="), "aGk="),  # base64 of base64: decoded once
        (b64("aGk=") + "!", b64("aGk=") + "!"),  # not base64: kept as received
        (b64("abcd!"), b64("abcd!")),  # decodes to text that is not base64: kept
        (base64.b64encode(b"\xff\xfe").decode(), base64.b64encode(b"\xff\xfe").decode()),
        (7, 7),
    ],
)
def test_rest_file_bytes_are_decoded_once_only_when_that_leaves_base64(
    value: object, expected: object
) -> None:
    part = {"file": {"fileWithBytes": value}}
    out = wire03.answer("stream", {"message": {"content": [part]}}, rest=True)
    assert isinstance(out, dict)
    assert out["message"]["parts"] == [{"raw": expected}]


# --- push configs in -----------------------------------------------------------------------------


def test_a_push_config_read_back_takes_its_first_scheme() -> None:
    doc = {
        "taskId": "t",
        "pushNotificationConfig": {
            "id": "cfg",
            "authentication": {"schemes": ["Bearer", "Basic"], "credentials": "c"},
        },
    }
    assert wire03.answer("push_config", doc, rest=False) == {
        "id": "cfg",
        "authentication": {"scheme": "Bearer", "credentials": "c"},
    }


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ({"schemes": []}, {}),
        ({"schemes": "Bearer"}, {}),
        ({"scheme": "Bearer", "schemes": ["Basic"]}, {"scheme": "Bearer", "schemes": ["Basic"]}),
    ],
)
def test_a_push_configs_authentication_is_flattened_only_from_a_list(
    auth: dict[str, Any], expected: dict[str, Any]
) -> None:
    doc = {
        "name": "tasks/t/pushNotificationConfigs/c",
        "pushNotificationConfig": {"authentication": auth},
    }
    assert wire03.answer("push_config", doc, rest=True) == {"authentication": expected}


# --- pushes --------------------------------------------------------------------------------------


def test_a_03_push_tagged_task_is_a_task_even_without_a_status() -> None:
    assert wire03.push_body({"kind": "task", "id": "t"}) == {"task": {"kind": "task", "id": "t"}}


@pytest.mark.parametrize("tag", [{"kind": "task"}, {}])
def test_a_03_push_is_read_in_the_json_rpc_dialect(tag: dict[str, str]) -> None:
    task = {**tag, "id": "t", "status": {"state": "working", "message": REST_MESSAGE}}
    out = wire03.push_body(task)
    assert isinstance(out, dict)
    assert out["task"]["status"]["message"] == REST_MESSAGE  # no proto ``content`` in a push


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"kind": "status-update", "taskId": "t", "id": "x", "status": STATUS}, "statusUpdate"),
        ({"kind": "artifact-update", "taskId": "t", "artifact": {}}, "artifactUpdate"),
        ({"kind": "message", "messageId": "m"}, "message"),
    ],
)
def test_a_03_push_of_another_kind_is_wrapped_by_it(doc: dict[str, Any], key: str) -> None:
    assert wire03.push_body(doc) == {key: doc}


def test_a_03_push_update_is_read_in_the_json_rpc_dialect() -> None:
    update = {
        "kind": "status-update",
        "taskId": "t",
        "status": {"state": "working", "message": REST_MESSAGE},
    }
    out = wire03.push_body(update)
    assert isinstance(out, dict)
    assert out["statusUpdate"]["status"]["message"] == REST_MESSAGE


@pytest.mark.parametrize(
    "doc",
    [{"status": STATUS}, {"id": "t"}, {"messageId": "m"}, {"foo": 1}, {"kind": 7, "id": "t"}],
)
def test_a_push_without_a_kind_or_a_tasks_fields_is_passed_on_as_it_is(
    doc: dict[str, Any],
) -> None:
    assert wire03.push_body(doc) == doc


# --- REST errors ---------------------------------------------------------------------------------


def test_a_rest_error_body_that_is_not_an_object_is_no_a2a_error() -> None:
    assert wire03.rest_error(409, ["task not cancelable"], "CancelTask") is None


def test_a_body_with_a_json_rpc_error_is_no_rest_error() -> None:
    doc = {"error": {"code": -32001}, "message": "task not found"}
    assert wire03.rest_error(404, doc, "GetTask") is None


def test_a_rest_errors_message_is_cut_to_200_characters() -> None:
    found = wire03.rest_error(409, {"message": "x" * 300}, "CancelTask")
    assert found == (-32002, "x" * 200)
