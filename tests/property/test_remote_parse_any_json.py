"""Any decoded JSON into the answer parsers: a value or InvalidAgentResponseError, nothing else.

What an agent sends (SendMessage/GetTask answers, push deliveries, stream events) is untrusted; a
crash on it would stop the observation path (R12). The property is one function, :func:`escapes`,
checked against the real parsers, against the parsers behind the A2A 0.3 translation
(``engine/wire/_v03.py``, which reads the same untrusted JSON first) and, to show it has teeth,
against planted bugs it must catch.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from cardfence.engine.cards import fields as fields_module
from cardfence.engine.core.answers import PushConfig, RemoteMessage, RemoteTask, StreamUpdate
from cardfence.engine.errors import InvalidAgentResponseError
from cardfence.engine.wire import _v03 as wire03
from cardfence.engine.wire import v10 as remote_module
from cardfence.engine.wire.v10 import (
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
)

# --- strategies ----------------------------------------------------------------------------------

KEYS = [
    "task",
    "message",
    "statusUpdate",
    "artifactUpdate",
    "status",
    "state",
    "id",
    "taskId",
    "contextId",
    "messageId",
    "artifactId",
    "timestamp",
    "generation",
    "artifacts",
    "artifact",
    "parts",
    "text",
    "data",
    "url",
    "raw",
    "file",
    "kind",
    "role",
    # A2A 0.3: HTTP+JSON (protobuf JSON) message parts, file parts and push configs
    "content",
    "fileWithUri",
    "fileWithBytes",
    "mimeType",
    "pushNotificationConfig",
    "authentication",
    "schemes",
]
LEAVES = [
    "TASK_STATE_COMPLETED",
    "TASK_STATE_INPUT_REQUIRED",
    "input-required",
    "status-update",
    "artifact-update",
    "task",
    "message",
    "ROLE_AGENT",
    "2026-11-29T15:26:20.420072Z",
    "2026-11-29T15:26:20+25:00",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:60-23:59",
    "18446744073709551616",
    "",
]

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(LEAVES)
)
keys = st.sampled_from(KEYS) | st.text(max_size=6)
json_values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=20,
)


def field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a well-formed value, 1 in 8 anything at all."""
    return st.integers(0, 7).flatmap(lambda n: good if n else json_values)


def obj(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """An object whose fields may hold anything; ``required`` ones are present 7 times in 8."""
    usual = {k: field(v) for k, v in required.items()}
    maybe = {k: field(v) for k, v in (optional or {}).items()}
    full = st.fixed_dictionaries(usual, optional=maybe)
    sparse = st.fixed_dictionaries({}, optional={**usual, **maybe})
    return st.integers(0, 7).flatmap(lambda n: full if n else sparse)


ids = st.sampled_from(["t-1", "c-1", "x", ""])
states = st.sampled_from([*LEAVES[:3], "TASK_STATE_BOGUS", "cancelled"]) | st.integers(-2, 10)
stamps = st.sampled_from(LEAVES[8:12]) | st.datetimes().map(lambda d: d.isoformat() + "Z")
one_content = st.sampled_from(["text", "data", "url", "raw", "file"]).flatmap(
    lambda key: obj(
        {key: json_values if key == "data" else st.text(max_size=4)},
        {"mediaType": st.text(max_size=4), "kind": st.sampled_from(["text", "file", "data"])},
    )
)
part = one_content | obj(
    {},
    {
        "text": st.text(max_size=4),
        "data": json_values,
        "url": st.text(max_size=4),
        "raw": st.text(max_size=4),
        "kind": st.just("file"),
        "file": obj({}, {"uri": st.text(max_size=4), "bytes": st.text(max_size=4)}),
    },
)
parts = st.lists(part, max_size=3)
message = obj(
    {"messageId": ids, "parts": parts},
    {"role": st.sampled_from([*LEAVES[7:8], "user", "x"]), "kind": st.just("message")},
)
status = obj(
    {"state": states}, {"timestamp": stamps, "message": message, "generation": json_values}
)
artifact = obj({"artifactId": ids, "parts": parts}, {"name": st.text(max_size=3)})
task = obj(
    {"id": ids, "status": status},
    {
        "contextId": ids,
        "artifacts": st.lists(artifact, max_size=2),
        "generation": st.integers() | st.text(max_size=3),
        "kind": st.just("task"),
    },
)
status_update = obj(
    {"taskId": ids, "status": status}, {"contextId": ids, "kind": st.just("status-update")}
)
artifact_update = obj({"taskId": ids, "artifact": artifact}, {"kind": st.just("artifact-update")})
wrappers = {"task": task, "statusUpdate": status_update, "artifactUpdate": artifact_update}
shaped = st.one_of(
    task,
    message,
    status_update,
    artifact_update,
    *(obj({key: strategy}) for key, strategy in [*wrappers.items(), ("message", message)]),
    obj({}, {**wrappers, "message": message}),
)
any_json = st.one_of(json_values, shaped)
# Each parser also sees its own shape more often, so deep fields are reached.
own_shape = {
    "parse_task": task,
    "parse_send_response": obj({"task": task}) | obj({"message": message}),
    "parse_stream_response": st.one_of(*(obj({k: v}) for k, v in wrappers.items())),
}

# --- the property --------------------------------------------------------------------------------

Parser = Callable[..., object]
RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "parse_task": (RemoteTask,),
    "parse_send_response": (RemoteTask, RemoteMessage),
    "parse_stream_response": (StreamUpdate,),
    "parse_push_config": (PushConfig,),
}
PARSERS: list[Parser] = [parse_task, parse_send_response, parse_stream_response]


def escapes(parser: Parser, doc: object) -> str | None:
    """What is wrong with ``parser``'s answer to ``doc``, or None when it is acceptable."""
    try:
        value = parser(doc, url="http://agent.test")
    except InvalidAgentResponseError as exc:
        return None if exc.url == "http://agent.test" else "error lost the URL"
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!r}"[:300]
    expected = RESULT_TYPES[getattr(parser, "__name__", "")]
    if not isinstance(value, expected):
        return f"returned {type(value).__name__}"
    return None


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.__name__)
@given(data=st.data())
def test_any_json_gives_a_value_or_an_invalid_agent_response_error(
    parser: Parser, data: st.DataObject
) -> None:
    doc = data.draw(any_json | own_shape[parser.__name__], label="doc")
    assert escapes(parser, doc) is None


# --- teeth: the same property catches planted bugs -----------------------------------------------


def catches(parser: Parser) -> object:
    """A document on which the property rejects ``parser`` (hypothesis fails the test if none)."""
    # A budget of its own: the profile's (small under `dev`) is for the property, not the hunt.
    budget = settings(max_examples=5000, database=None, deadline=None, derandomize=True)
    return find(any_json, lambda doc: escapes(parser, doc) is not None, settings=budget)


def test_property_catches_a_parser_that_reads_the_state_directly() -> None:
    def broken_parse_task(obj: object, *, url: str = "") -> RemoteTask:
        obj["status"]["state"]  # type: ignore[index]  # the planted bug: trusts the shape
        return parse_task(obj, url=url)

    broken_parse_task.__name__ = "parse_task"
    doc = catches(broken_parse_task)
    assert "escaped" in (escapes(broken_parse_task, doc) or "")


def test_property_catches_a_type_check_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    def trusting_obj(value: object, path: str, *, required: bool = False) -> Any:
        return value  # the planted bug: no isinstance(value, dict)

    monkeypatch.setattr(fields_module, "as_object", trusting_obj)
    doc = catches(parse_stream_response)
    assert "escaped" in (escapes(parse_stream_response, doc) or "")


def test_property_catches_a_timestamp_read_without_a_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def trusting_timestamp(value: object, path: str) -> datetime:
        return datetime.fromisoformat(value)  # type: ignore[arg-type]  # the planted bug

    monkeypatch.setattr(remote_module, "_timestamp", trusting_timestamp)
    doc = catches(parse_task)
    assert "escaped" in (escapes(parse_task, doc) or "")


# --- A2A 0.3: the translation in front of the parsers --------------------------------------------

file_03 = obj(
    {},
    {
        "fileWithUri": st.text(max_size=4),
        "fileWithBytes": st.sampled_from(["YUdrPQ==", "aGk=", "!!"]) | json_values,
        "uri": st.text(max_size=4),
        "bytes": json_values,
        "mimeType": json_values,
    },
)
part_03 = obj({}, {"text": json_values, "file": file_03, "data": json_values, "kind": json_values})
message_03 = obj(
    {"messageId": ids}, {"content": st.lists(part_03, max_size=3), "parts": json_values}
)
status_03 = obj({"state": states}, {"message": message_03})
task_03 = obj(
    {"id": ids, "status": status_03},
    {"artifacts": st.lists(obj({"artifactId": ids, "parts": st.lists(part_03)}), max_size=2)},
)
config_03 = obj(
    {"pushNotificationConfig": obj({"id": ids, "url": ids}, {"authentication": json_values})},
    {"taskId": ids, "name": ids},
)
shaped_03 = st.one_of(
    task_03,
    obj({"task": task_03}),
    obj({"message": message_03}),
    obj({"statusUpdate": obj({"taskId": ids, "status": status_03})}),
    config_03,
)
TRANSLATED: list[tuple[wire03.Answer, Parser]] = [
    ("task", parse_task),
    ("send", parse_send_response),
    ("stream", parse_stream_response),
    ("push_config", parse_push_config),
]


@pytest.mark.parametrize(("kind", "parser"), TRANSLATED, ids=[k for k, _ in TRANSLATED])
@pytest.mark.parametrize("rest", [False, True], ids=["jsonrpc", "rest"])
@given(data=st.data())
def test_any_json_translated_from_03_gives_a_value_or_an_invalid_agent_response_error(
    kind: wire03.Answer, parser: Parser, rest: bool, data: st.DataObject
) -> None:
    doc = data.draw(any_json | shaped_03, label="doc")

    def translated(obj: object, *, url: str) -> object:
        return parser(wire03.answer(kind, obj, rest=rest), url=url)

    translated.__name__ = parser.__name__
    assert escapes(translated, doc) is None


@given(doc=any_json | shaped_03)
def test_any_push_body_read_as_03_or_10_gives_a_value_or_an_invalid_agent_response_error(
    doc: object,
) -> None:
    def pushed(obj: object, *, url: str) -> object:
        return parse_stream_response(wire03.push_body(obj), url=url)

    pushed.__name__ = "parse_stream_response"
    assert escapes(pushed, doc) is None
