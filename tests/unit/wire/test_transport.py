"""The A2A operations and event streams of engine/wire/transport.py, each outcome compared whole.

Every request is answered by httpx's MockTransport: event streams as ``text/event-stream``
bodies (one that goes silent is an async iterator that stops yielding), and answers no real
agent gives on request (a 300 that says it is a stream, an ``error`` event that is not an A2A
error, an event one byte over the limit). Each test names what an operator would read: the
error's type, the URL asked, the task it is about and every word of its message, or every field
of the request sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
import pytest
from support.cards import agent_card, interface, skill
from support.hostile import completed_event as completed
from support.hostile import working_event as working
from support.mocked import REST, RPC, Body, Handler, Make

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.answers import PushConfig, StreamUpdate, TaskState
from cardfence.engine.core.messages import Message
from cardfence.engine.core.parts import Data, File, Text
from cardfence.engine.errors import (
    EndpointUnreachableError,
    InvalidAgentResponseError,
    MessageTooLargeError,
    OperationUnsupportedError,
    ProtocolMismatchError,
    RemoteRefusedError,
    StreamDroppedError,
    WrongTaskAnswerError,
)
from cardfence.engine.wire.transport import A2ATransport, check_message_size, message_params
from cardfence.engine.wire.v10 import (
    parse_push_config,
    parse_send_response,
    parse_stream_response,
    parse_task,
    parse_task_page,
)

TASK = "t-1"
EVENT_STREAM = {"content-type": "text/event-stream"}
NOT_AN_ANSWER = {"id": 5, "status": "done"}  # no operation's result: an id that is no string
CONFIG = PushConfig(id="cf-1", url="https://hooks.test/w", token="tok")


def _rpc_id(request: httpx.Request) -> int:
    return int(json.loads(request.content)["id"])


def _result(request: httpx.Request, result: object) -> httpx.Response:
    """The answer ``result``: in a JSON-RPC envelope to a JSON-RPC request, bare otherwise."""
    if request.url.path.endswith("/jsonrpc"):
        envelope = {"jsonrpc": "2.0", "id": _rpc_id(request), "result": result}
        return httpx.Response(200, json=envelope)
    return httpx.Response(200, json=result)


def _asked(binding: str, path: str) -> str:
    """The URL a request was sent to: the JSON-RPC endpoint, or the REST operation's path."""
    return RPC if binding == JSONRPC else REST + path


def _invalid(url: str, detail: str) -> str:
    return f"{url}: invalid agent response: {detail} (nothing was changed)"


def _parse_error(parse: Callable[..., object], answer: object, url: str) -> str:
    """What ``parse`` says of ``answer`` read from ``url``: the message the transport must give."""
    with pytest.raises(InvalidAgentResponseError) as refused:
        parse(answer, url=url)
    assert url in str(refused.value)
    return str(refused.value)


def a_message() -> dict[str, Any]:
    parts = [{"text": "done, no task needed"}]
    return {"message": {"messageId": "m-9", "role": "ROLE_AGENT", "parts": parts}}


def _event(data: str | bytes, event: str = "") -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + raw + b"\n\n"


def streamed(events: Callable[[Callable[[object], bytes]], Iterable[bytes]]) -> Handler:
    """An agent answering every request with an event stream; ``events(frame)`` its events,
    ``frame(doc)`` one event of the binding asked (JSON-RPC: a result envelope)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/jsonrpc"):
            rid = _rpc_id(request)

            def frame(doc: object) -> bytes:
                return _event(json.dumps({"jsonrpc": "2.0", "id": rid, "result": doc}))
        else:

            def frame(doc: object) -> bytes:
                return _event(json.dumps(doc))

        return httpx.Response(200, headers=EVENT_STREAM, stream=Body(*events(frame)))

    return handler


async def read_all(updates_of: Any, into: list[StreamUpdate] | None = None) -> list[StreamUpdate]:
    seen = [] if into is None else into
    async with updates_of as updates:
        async for update in updates:
            seen.append(update)
    return seen


# -- operations: the answer read as the URL asked --------------------------------------------------


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_an_invalid_get_task_or_cancel_answer_names_the_url_asked(
    agent: Make, binding: str
) -> None:
    transport = agent(lambda r: _result(r, NOT_AN_ANSWER), binding)
    with pytest.raises(InvalidAgentResponseError) as polled:
        await transport.get_task(TASK)
    with pytest.raises(InvalidAgentResponseError) as canceled:
        await transport.cancel_task(TASK)
    assert (str(polled.value), str(canceled.value)) == (
        _parse_error(parse_task, NOT_AN_ANSWER, _asked(binding, "/tasks/t-1")),
        _parse_error(parse_task, NOT_AN_ANSWER, _asked(binding, "/tasks/t-1:cancel")),
    )


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_an_invalid_send_push_config_or_page_answer_names_the_url_asked(
    agent: Make, binding: str
) -> None:
    page = {"tasks": "none"}
    transport = agent(
        lambda r: _result(
            r, page if r.method == "GET" or b"ListTasks" in r.content else NOT_AN_ANSWER
        ),
        binding,
    )
    with pytest.raises(InvalidAgentResponseError) as sent:
        await transport.send_message(text="hi", message_id="m-1", context_id=None)
    with pytest.raises(InvalidAgentResponseError) as registered:
        await transport.create_push_config(TASK, CONFIG)
    with pytest.raises(InvalidAgentResponseError) as listed:
        await transport.list_tasks(context_id="c-1")
    assert str(sent.value) == _parse_error(
        parse_send_response, NOT_AN_ANSWER, _asked(binding, "/message:send")
    )
    assert str(registered.value) == _parse_error(
        parse_push_config, NOT_AN_ANSWER, _asked(binding, "/tasks/t-1/pushNotificationConfigs")
    )
    assert str(listed.value) == _parse_error(parse_task_page, page, _asked(binding, "/tasks"))


async def test_answers_about_another_task_are_wrong_task_answers_naming_url_and_state(
    agent: Make,
) -> None:
    other = working("t-other")["task"]
    transport = agent(lambda r: _result(r, other))
    reply = agent(lambda r: _result(r, {"task": other}))
    caught: list[WrongTaskAnswerError] = []
    for call in (
        transport.get_task(TASK),
        transport.cancel_task(TASK),
        reply.send_message(text="more", message_id="m-2", context_id="c-1", task_id=TASK),
    ):
        with pytest.raises(WrongTaskAnswerError) as wrong:
            await call
        caught.append(wrong.value)
    for wrong in caught:
        assert str(wrong) == _invalid(RPC, "asked about task t-1, answered t-other")
        assert (wrong.asked, wrong.answered, wrong.answered_state) == (
            TASK,
            "t-other",
            TaskState.WORKING,
        )


async def test_a_task_id_is_one_path_segment_its_slash_escaped(agent: Make) -> None:
    paths: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path)
        return _result(request, working("a/b c")["task"])

    await agent(handler, HTTP_JSON).get_task("a/b c")
    assert paths == [b"/a2a/rest/tasks/a%2Fb%20c?historyLength=0"]


async def test_requests_that_fail_name_their_task_and_a_new_send_names_none(
    agent: Make,
) -> None:
    transport = agent(lambda r: httpx.Response(503, text="busy"))
    tasks = []
    for call in (
        transport.create_push_config(TASK, CONFIG),
        transport.send_message(text="hi", message_id="m-1", context_id=None),
        transport.send_message(text="more", message_id="m-2", context_id="c-1", task_id=TASK),
    ):
        with pytest.raises(EndpointUnreachableError) as failed:
            await call
        assert str(failed.value) == (
            f"{RPC}: HTTP 503 without an A2A error body (nothing was changed)"
        )
        tasks.append(failed.value.task)
    assert tasks == [TASK, "", TASK]


async def test_list_tasks_on_a_0_3_endpoint_is_unsupported_naming_the_endpoint(
    agent: Make,
) -> None:
    sent: list[httpx.Request] = []
    transport = agent(lambda r: sent.append(r) or httpx.Response(500), version="0.3")
    with pytest.raises(OperationUnsupportedError) as caught:
        await transport.list_tasks(context_id="c-1")
    assert caught.value.url == RPC
    assert str(caught.value).startswith(
        f"{RPC}: ListTasks is not part of A2A 0.3, which the endpoint speaks: "
    )
    assert sent == []


async def test_a_page_token_that_repeats_is_named_by_its_first_40_characters(
    agent: Make,
) -> None:
    token = "p" * 40 + "-tail"
    transport = agent(lambda r: _result(r, {"tasks": [], "nextPageToken": token}))
    with pytest.raises(InvalidAgentResponseError) as caught:
        await transport.list_tasks(context_id="c-1")
    assert str(caught.value) == _invalid(RPC, f"nextPageToken {'p' * 40!r} repeats")


async def test_an_extended_card_is_given_as_sorted_compact_utf8_json(agent: Make) -> None:
    card = {"name": "Agent é", "capabilities": {"streaming": True}, "b": [1, 2]}
    raw = await agent(lambda r: _result(r, card)).get_extended_card()
    assert raw == '{"b":[1,2],"capabilities":{"streaming":true},"name":"Agent é"}'.encode()


async def test_an_extended_card_that_is_no_object_is_an_invalid_response(agent: Make) -> None:
    with pytest.raises(InvalidAgentResponseError) as caught:
        await agent(lambda r: _result(r, ["a", "card"])).get_extended_card()
    assert str(caught.value) == _invalid(RPC, "the extended Agent Card is not a JSON object")


# -- SendStreamingMessage: the request ------------------------------------------------------------


async def test_a_streamed_message_sends_its_ids_metadata_and_media_type_and_no_configuration(
    agent: Make,
) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return streamed(lambda frame: [frame(completed())])(request)

    transport = agent(handler, HTTP_JSON)
    await read_all(
        transport.send_streaming_message(
            text="more", message_id="m-2", context_id="c-1", task_id=TASK, metadata={"k": 1}
        )
    )
    await read_all(
        transport.send_streaming_message(
            text="csv", message_id="m-3", context_id=None, media_type="text/csv"
        )
    )
    assert bodies == [
        {
            "message": {
                "messageId": "m-2",
                "role": "ROLE_USER",
                "parts": [{"text": "more", "mediaType": "text/plain"}],
                "contextId": "c-1",
                "taskId": TASK,
                "metadata": {"k": 1},
            }
        },
        {
            "message": {
                "messageId": "m-3",
                "role": "ROLE_USER",
                "parts": [{"text": "csv", "mediaType": "text/csv"}],
            }
        },
    ]


async def test_a_message_of_every_kind_of_part_is_sent_whole_with_its_metadata_refs_and_modes(
    agent: Make,
) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return _result(request, {"task": {"id": TASK, "status": {"state": "TASK_STATE_SUBMITTED"}}})

    message = Message(
        parts=(
            Text("# hi", "text/markdown"),
            File(data=b"%PDF\x00\xff", filename="a.pdf"),
            File(url="https://files.test/b.png", media_type="image/png"),
            Data({"n": [1, 2]}),
        ),
        metadata={"k": "mine", "skillId": "not-ours"},
        references=("r-0", "r-9"),
        accepted_output_modes=("text/*",),
    )
    await agent(handler, HTTP_JSON).send_message(
        message=message, message_id="m-1", context_id="c-1", metadata={"skillId": "echo"}
    )
    assert bodies == [
        {
            "message": {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [
                    {"text": "# hi", "mediaType": "text/markdown"},
                    {"raw": "JVBERgD/", "filename": "a.pdf", "mediaType": "application/pdf"},
                    {"url": "https://files.test/b.png", "mediaType": "image/png"},
                    {"data": {"n": [1, 2]}, "mediaType": "application/json"},
                ],
                "contextId": "c-1",
                "metadata": {"k": "mine", "skillId": "echo"},  # the engine's skillId wins
                "referenceTaskIds": ["r-0", "r-9"],
            },
            "configuration": {"acceptedOutputModes": ["text/*"], "returnImmediately": True},
        }
    ]


def test_a_message_over_the_bound_is_refused_naming_its_size_and_the_bound() -> None:
    message = Message(parts=(File(data=b"x" * 3000),))
    ids = {"message_id": "m-1", "context_id": "c-1"}
    params = message_params(
        message, **ids, task_id=None, metadata=None, return_immediately=True, push_config=None
    )
    size = len(json.dumps(params, separators=(",", ":")).encode())
    check_message_size(message, size, **ids)  # at the bound: sent
    with pytest.raises(MessageTooLargeError) as refused:
        check_message_size(message, size - 1, **ids)
    assert (refused.value.size, refused.value.bound) == (size, size - 1)
    assert str(refused.value) == (
        f"the message is {size} bytes encoded, over the bound of {size - 1} "
        "(max_message_bytes): nothing was recorded or sent"
    )


async def test_a_streamed_message_that_fails_names_its_task_and_a_new_one_names_none(
    agent: Make,
) -> None:
    transport = agent(lambda r: httpx.Response(503, text="busy"))
    tasks = []
    for task_id, context_id in ((TASK, "c-1"), (None, None)):
        with pytest.raises(EndpointUnreachableError) as failed:
            await read_all(
                transport.send_streaming_message(
                    text="t", message_id="m", context_id=context_id, task_id=task_id
                )
            )
        assert str(failed.value) == (
            f"{RPC}: HTTP 503 without an A2A error body (nothing was changed)"
        )
        tasks.append(failed.value.task)
    assert tasks == [TASK, ""]


async def test_a_streamed_message_goes_silent_and_is_dropped_within_its_idle_timeout(
    agent: Make,
) -> None:
    async def silent() -> AsyncIterator[bytes]:
        yield _event(json.dumps(working()))
        await asyncio.sleep(60)

    transport = agent(
        lambda r: httpx.Response(200, headers=EVENT_STREAM, content=silent()),
        HTTP_JSON,
        timeout=30.0,
    )
    async with asyncio.timeout(5):
        with pytest.raises(StreamDroppedError) as caught:
            await read_all(
                transport.send_streaming_message(
                    text="t", message_id="m", context_id=None, idle_timeout=0.1
                )
            )
    assert (caught.value.reason, caught.value.task) == ("idle", TASK)
    assert str(caught.value) == (
        f"{REST}/message:stream: event stream of task t-1 dropped (idle): no byte within 0.1s; "
        "the updates before it were delivered, nothing else was changed"
    )


async def test_a_subscription_that_goes_silent_is_dropped_naming_its_task(agent: Make) -> None:
    async def silent() -> AsyncIterator[bytes]:
        await asyncio.sleep(60)
        yield b""

    transport = agent(
        lambda r: httpx.Response(200, headers=EVENT_STREAM, content=silent()), timeout=30.0
    )
    async with asyncio.timeout(5):
        with pytest.raises(StreamDroppedError) as caught:
            await read_all(transport.subscribe(TASK, idle_timeout=0.1))
    assert str(caught.value) == (
        f"{RPC}: event stream of task t-1 dropped (idle): no byte within 0.1s; "
        "the updates before it were delivered, nothing else was changed"
    )


# -- event streams: how one opens -----------------------------------------------------------------


async def test_a_300_that_says_it_is_an_event_stream_is_no_stream(agent: Make) -> None:
    transport = agent(lambda r: httpx.Response(300, headers=EVENT_STREAM, stream=Body()))
    with pytest.raises(EndpointUnreachableError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == f"{RPC}: HTTP 300 without an A2A error body (nothing was changed)"
    assert (caught.value.task, caught.value.status) == (TASK, 300)


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({}, "no content type"),
        ({"content-type": "application/" + "x" * 70}, "application/" + "x" * 48),
    ],
)
async def test_a_2xx_that_is_no_event_stream_says_what_it_was(
    agent: Make, headers: dict[str, str], said: str
) -> None:
    transport = agent(lambda r: httpx.Response(200, headers=headers, stream=Body(b"hello")))
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == _invalid(RPC, f"answered {said}, not an event stream (not read)")


async def test_a_json_rpc_refusal_opening_a_stream_names_the_url_and_task(agent: Make) -> None:
    error = {"code": 42, "message": "not today"}  # any integer code: JSON-RPC's is authoritative
    transport = agent(
        lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": _rpc_id(r), "error": error})
    )
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == f"{RPC}: agent refused (42: not today)"
    assert caught.value.task == TASK


async def test_a_json_rpc_envelope_opening_a_rest_stream_is_no_refusal(agent: Make) -> None:
    error = {"code": -32001, "message": "Task not found"}
    transport = agent(
        lambda r: httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "error": error}),
        HTTP_JSON,
    )
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == _invalid(
        f"{REST}/tasks/t-1:subscribe", "answered application/json, not an event stream (not read)"
    )


async def test_an_unknown_method_answered_non_2xx_names_the_operation(agent: Make) -> None:
    error = {"code": -32601, "message": "Method not found"}
    transport = agent(
        lambda r: httpx.Response(400, json={"jsonrpc": "2.0", "id": _rpc_id(r), "error": error})
    )
    with pytest.raises(ProtocolMismatchError) as caught:
        await read_all(transport.subscribe(TASK))
    assert caught.value.method == "SubscribeToTask"
    assert str(caught.value).startswith(f"{RPC}: protocol mismatch: the card says A2A 1.0")
    assert "it does not know the method SubscribeToTask" in str(caught.value)


# -- event streams: each event -------------------------------------------------------------------


@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
async def test_an_event_that_is_no_stream_response_names_the_url(agent: Make, binding: str) -> None:
    transport = agent(streamed(lambda frame: [frame(NOT_AN_ANSWER)]), binding)
    url = RPC if binding == JSONRPC else f"{REST}/tasks/t-1:subscribe"
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == _parse_error(parse_stream_response, NOT_AN_ANSWER, url)


async def test_a_rest_event_that_is_not_json_names_the_url(agent: Make) -> None:
    transport = agent(streamed(lambda frame: [_event("{not json")]), HTTP_JSON)
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value).startswith(
        f"{REST}/tasks/t-1:subscribe: invalid agent response: body is not JSON ("
    )


async def test_a_json_rpc_error_event_is_the_refusal_of_the_task_asked_about(agent: Make) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        rid = _rpc_id(request)
        first = {"jsonrpc": "2.0", "id": rid, "result": working()}
        error = {"code": -32001, "message": "Task not found"}
        refusal = {"jsonrpc": "2.0", "id": rid, "error": error}
        events = Body(_event(json.dumps(first)), _event(json.dumps(refusal), "error"))
        return httpx.Response(200, headers=EVENT_STREAM, stream=events)

    seen: list[StreamUpdate] = []
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(agent(handler).subscribe(TASK), seen)
    assert str(caught.value) == f"{RPC}: agent refused (-32001: Task not found)"
    assert caught.value.task == TASK
    assert [u.state for u in seen] == [TaskState.WORKING]


async def test_an_unknown_method_sent_as_an_event_names_the_operation(agent: Make) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        error = {"code": -32601, "message": "Method not found"}
        refusal = json.dumps({"jsonrpc": "2.0", "id": _rpc_id(request), "error": error})
        return httpx.Response(200, headers=EVENT_STREAM, stream=Body(_event(refusal, "error")))

    with pytest.raises(ProtocolMismatchError) as caught:
        await read_all(agent(handler).subscribe(TASK))
    assert (caught.value.method, caught.value.task) == ("SubscribeToTask", TASK)


async def test_a_rest_error_event_is_the_refusal_of_the_task_asked_about(agent: Make) -> None:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND"}
    error = {"error": {"code": 404, "message": "gone", "details": [info]}}
    transport = agent(streamed(lambda frame: [_event(json.dumps(error), "error")]), HTTP_JSON)
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == f"{REST}/tasks/t-1:subscribe: agent refused (-32001: gone)"
    assert caught.value.task == TASK


async def test_a_json_rpc_shaped_error_in_a_rest_event_is_no_a2a_error(agent: Make) -> None:
    doc = {"jsonrpc": "2.0", "id": 1, "error": {"code": 42, "message": "m"}}
    transport = agent(streamed(lambda frame: [_event(json.dumps(doc))]), HTTP_JSON)
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == _parse_error(
        parse_stream_response, doc, f"{REST}/tasks/t-1:subscribe"
    )


async def test_an_error_event_that_is_no_a2a_error_is_an_invalid_response(agent: Make) -> None:
    transport = agent(streamed(lambda frame: [_event_error(frame)]))
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(transport.subscribe(TASK))
    assert str(caught.value) == _invalid(RPC, "an error event that is not an A2A error")


def _event_error(frame: Callable[[object], bytes]) -> bytes:
    """A well-formed update sent as an ``error`` event."""
    return frame(working()).replace(b"data: ", b"event: error\ndata: ", 1)


async def test_events_of_other_types_or_without_data_are_skipped(agent: Make) -> None:
    transport = agent(
        streamed(
            lambda frame: [
                frame(working()),
                _event(json.dumps({"hello": 1}), "ping"),
                b"event: message\ndata:\n\n",
                frame(completed()),
            ]
        )
    )
    seen = await read_all(transport.subscribe(TASK))
    assert [u.state for u in seen] == [TaskState.WORKING, TaskState.COMPLETED]


async def test_an_event_of_exactly_the_limit_is_read_and_one_byte_more_refused(
    agent: Make,
) -> None:
    def padded(size: int) -> Handler:
        event = working()
        event["task"]["metadata"] = {"pad": ""}
        bare = len(json.dumps(event))
        event["task"]["metadata"]["pad"] = "x" * (size - bare)
        assert len(json.dumps(event)) == size
        return streamed(lambda frame: [frame(event), frame(completed())])

    limit = 4096
    seen = await read_all(agent(padded(limit), HTTP_JSON, max_bytes=limit).subscribe(TASK))
    assert [u.size for u in seen] == [limit, len(json.dumps(completed()))]
    with pytest.raises(InvalidAgentResponseError) as caught:
        await read_all(agent(padded(limit + 1), HTTP_JSON, max_bytes=limit).subscribe(TASK))
    assert str(caught.value) == _invalid(
        f"{REST}/tasks/t-1:subscribe",
        f"stream event over the limit of {limit} bytes ({limit + 1}); the stream was closed",
    )


async def test_a_subscription_whose_first_event_is_about_another_task_yields_nothing(
    agent: Make,
) -> None:
    seen: list[StreamUpdate] = []
    transport = agent(streamed(lambda frame: [frame(working("t-other")), frame(completed())]))
    with pytest.raises(WrongTaskAnswerError) as caught:
        await read_all(transport.subscribe(TASK), seen)
    assert str(caught.value) == _invalid(RPC, "asked about task t-1, answered t-other")
    assert seen == []


async def test_a_streamed_message_holds_to_the_task_its_first_event_named(agent: Make) -> None:
    seen: list[StreamUpdate] = []
    transport = agent(streamed(lambda frame: [frame(working("t-new")), frame(completed("t-2"))]))
    with pytest.raises(WrongTaskAnswerError) as caught:
        await read_all(
            transport.send_streaming_message(text="t", message_id="m", context_id=None), seen
        )
    assert str(caught.value) == _invalid(RPC, "asked about task t-new, answered t-2")
    assert [u.task_id for u in seen] == ["t-new"]


async def test_a_bare_message_ends_a_streamed_message_whatever_follows(agent: Make) -> None:
    transport = agent(streamed(lambda frame: [frame(a_message()), frame(working("t-late"))]))
    seen = await read_all(
        transport.send_streaming_message(text="t", message_id="m", context_id=None)
    )
    assert [u.kind for u in seen] == ["message"]


async def test_a_streamed_message_closed_before_any_event_is_dropped_about_no_task(
    agent: Make,
) -> None:
    transport = agent(streamed(lambda frame: []), HTTP_JSON)
    with pytest.raises(StreamDroppedError) as caught:
        await read_all(transport.send_streaming_message(text="t", message_id="m", context_id=None))
    assert (caught.value.reason, caught.value.task) == ("closed", "")
    assert str(caught.value).startswith(f"{REST}/message:stream: event stream dropped (closed): ")


# --------------------------------------------------------------------------------------------------
# The tenant an A2A 1.0 interface names (``AgentInterface.tenant``): read from the card, sent with
# each request as the official SDK's client sends it (JSON-RPC: ``params.tenant``; HTTP+JSON: the
# path's first segment after the interface's URL, escaped), recorded with the endpoint only when
# there is one, and a tenant change on the card is an endpoint move (R9). The extensions a task
# activates are named on each request, in the header of the version the interface speaks (1.0
# ``A2A-Extensions``, 0.3 ``X-A2A-Extensions``). The requests are read as they leave (httpx's
# MockTransport answers them).


TASK_ANSWER = {
    "id": "t-1",
    "contextId": "c-1",
    "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-12-03T10:00:00Z"},
}


def _answer(request: httpx.Request) -> httpx.Response:
    if request.method == "POST" and request.url.path.endswith("/rpc"):
        envelope = json.loads(request.content)
        return httpx.Response(
            200,
            json={
                "jsonrpc": "2.0",
                "id": envelope["id"],
                "result": TASK_ANSWER,
            },
        )
    return httpx.Response(200, json=TASK_ANSWER)


MakeTransport = Callable[[str, str], A2ATransport]


@pytest.fixture
async def seen() -> AsyncIterator[tuple[list[httpx.Request], MakeTransport]]:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return _answer(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:

        def make(binding: str, tenant: str) -> A2ATransport:
            url = "https://agent.test/rpc" if binding == JSONRPC else "https://agent.test/api"
            return A2ATransport(client, Interface(url, binding, "1.0", tenant=tenant))

        yield requests, make


async def test_jsonrpc_names_the_tenant_in_every_requests_params(
    seen: tuple[list[httpx.Request], MakeTransport],
) -> None:
    requests, make = seen
    await make(JSONRPC, "acme").get_task("t-1")

    (request,) = requests
    assert json.loads(request.content)["params"] == {
        "id": "t-1", "historyLength": 0, "tenant": "acme",
    }  # fmt: skip
    assert request.url == "https://agent.test/rpc"


async def test_http_json_puts_the_tenant_first_in_the_path_escaped(
    seen: tuple[list[httpx.Request], MakeTransport],
) -> None:
    requests, make = seen
    await make(HTTP_JSON, "acme").get_task("t-1")
    await make(HTTP_JSON, "a/b c").get_task("t-1")

    assert [r.url.raw_path.split(b"?")[0] for r in requests] == [
        b"/api/acme/tasks/t-1", b"/api/a%2Fb%20c/tasks/t-1",
    ]  # fmt: skip


async def test_no_tenant_leaves_every_request_as_it_was(
    seen: tuple[list[httpx.Request], MakeTransport],
) -> None:
    requests, make = seen
    await make(JSONRPC, "").get_task("t-1")
    await make(HTTP_JSON, "").get_task("t-1")

    assert "tenant" not in json.loads(requests[0].content)["params"]
    assert requests[1].url.path == "/api/tasks/t-1"


def _card(tenant: str | None) -> Any:
    extra = {} if tenant is None else {"tenant": tenant}
    return agent_card(
        supportedInterfaces=[interface("https://agent.test/rpc", **extra)], skills=[skill("s")]
    )


def test_the_cards_tenant_is_recorded_with_the_endpoint_and_none_is_not_recorded() -> None:
    (tenanted,) = _card("acme").interfaces
    (plain,) = _card(None).interfaces

    assert guards.endpoint_of(tenanted) == {
        "url": "https://agent.test/rpc", "binding": "JSONRPC", "protocol_version": "1.0",
        "tenant": "acme",
    }  # fmt: skip
    assert "tenant" not in guards.endpoint_of(plain)


def test_a_card_that_moves_the_task_to_another_tenant_moves_its_endpoint() -> None:
    (old,) = _card("acme").interfaces
    task = {"endpoint": guards.endpoint_of(old)}

    endpoint, moved = guards._endpoint_on(task["endpoint"], _card("acme-eu"), False)
    same, unmoved = guards._endpoint_on(task["endpoint"], _card("acme"), False)

    assert endpoint is not None
    assert endpoint["tenant"] == "acme-eu"
    assert [event.TYPE for event in moved] == [ev.ENDPOINT_MOVED]
    assert (same, unmoved) == (task["endpoint"], ())


@pytest.mark.parametrize(("version", "header", "absent"), [
    ("1.0", "A2A-Extensions", "X-A2A-Extensions"),
    ("0.3.0", "X-A2A-Extensions", "A2A-Extensions"),
])  # fmt: skip
async def test_activated_extensions_are_named_in_the_header_of_the_version_spoken(
    version: str, header: str, absent: str
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(500)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        interface = Interface("https://agent.test/rpc", JSONRPC, version)
        uris = ("https://x.test/a", "https://x.test/b")
        named = A2ATransport(client, interface, extensions=uris)
        plain = A2ATransport(client, interface)
        for transport in (named, plain):
            with pytest.raises(EndpointUnreachableError):
                await transport.get_task("t-1")

    assert requests[0].headers[header] == "https://x.test/a, https://x.test/b"
    assert absent not in requests[0].headers
    assert header not in requests[1].headers
