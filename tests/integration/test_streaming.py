"""Event streams (SubscribeToTask, SendStreamingMessage) on both bindings: against the real
a2a-sdk 1.3 agent (``peer``), and against scripted streams that misbehave (R16: the remote is
bounded; R12: an event about another task is never observed as this one's)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Literal

import httpx
import pytest
from support import Peer
from support.hostile import Frame, Reply, StreamingAgent, sse
from support.hostile import completed_event as completed
from support.hostile import working_event as working

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.spoken import HTTP_JSON, JSONRPC
from cardfence.engine.core.answers import RemoteTask, StreamUpdate, TaskState
from cardfence.engine.core.observations import from_update
from cardfence.engine.errors import (
    EndpointUnreachableError,
    InvalidAgentResponseError,
    ProtocolMismatchError,
    RemoteRefusedError,
    StreamDroppedError,
    WrongTaskAnswerError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import PIECE
from cardfence.engine.wire.exchange import A2AErrorCode
from cardfence.engine.wire.transport import A2ATransport

BINDINGS = [JSONRPC, HTTP_JSON]
TASK = "t-1"


@pytest.fixture(params=BINDINGS)
def binding(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def transport(peer: Peer, binding: str, client: httpx.AsyncClient) -> A2ATransport:
    url = peer.jsonrpc_url if binding == JSONRPC else peer.rest_url
    return A2ATransport(client, Interface(url, binding, "1.0"), timeout=5.0)


async def send(transport: A2ATransport, text: str, **kwargs: Any) -> RemoteTask:
    answer = await transport.send_message(
        text=text, message_id=f"m-{uuid.uuid4()}", context_id=None, **kwargs
    )
    assert isinstance(answer, RemoteTask)
    return answer


async def poll_until(transport: A2ATransport, task_id: str, state: str) -> None:
    for _ in range(100):
        if (await transport.get_task(task_id)).state == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never {state}")


async def read_all(
    transport: A2ATransport, task_id: str, into: list[StreamUpdate] | None = None, **kwargs: Any
) -> list[StreamUpdate]:
    """Every update of one subscription, kept in ``into`` as they come (so a test sees them
    when the stream then fails)."""
    seen = [] if into is None else into
    async with transport.subscribe(task_id, **kwargs) as updates:
        async for update in updates:
            seen.append(update)
    return seen


# --- the real agent ------------------------------------------------------------------------------


async def test_a_held_task_streams_its_snapshot_then_artifact_then_completed_as_observations(
    transport: A2ATransport, peer: Peer
) -> None:
    peer.hold()
    task = await send(transport, "slow 0")
    await poll_until(transport, task.id, TaskState.WORKING)
    seen: list[StreamUpdate] = []
    async with transport.subscribe(task.id) as updates:
        async for update in updates:
            seen.append(update)
            peer.release()  # the task moves on only once the stream is open
    observations = [from_update(update, "stream") for update in seen]
    assert [update.kind for update in seen] == ["task", "artifact", "status"]
    assert [o.state for o in observations if o is not None] == ["working", None, "completed"]
    assert all(o is not None and o.source == "stream" for o in observations)
    assert all(o is not None and o.remote_task_id == task.id for o in observations)
    artifact = observations[1]
    assert artifact is not None
    assert [part.get("text") for part in artifact.artifacts[0].parts] == ["slept 0s"]


async def test_a_task_waiting_for_input_yields_its_snapshot_and_the_stream_ends_there(
    transport: A2ATransport,
) -> None:
    # a2a-sdk keeps this stream open after the snapshot; the transport stops at the final state.
    task = await send(transport, "ask")
    await poll_until(transport, task.id, TaskState.INPUT_REQUIRED)
    started = time.monotonic()
    seen = await read_all(transport, task.id)
    assert time.monotonic() - started < 2.0
    assert [(u.kind, u.state) for u in seen] == [("task", TaskState.INPUT_REQUIRED)]
    assert seen[0].message is not None
    assert seen[0].message.text == "What is your answer?"


async def test_a_streamed_message_yields_the_new_task_from_submitted_to_completed(
    transport: A2ATransport,
) -> None:
    async with transport.send_streaming_message(
        text="echo streamed", message_id=f"m-{uuid.uuid4()}", context_id=None
    ) as updates:
        seen = [update async for update in updates]
    assert [(u.kind, u.state) for u in seen] == [
        ("task", TaskState.SUBMITTED),
        ("artifact", None),
        ("status", TaskState.COMPLETED),
    ]
    assert len({u.task_id for u in seen}) == 1
    assert seen[1].artifact is not None
    assert seen[1].artifact.parts[0].text == "streamed"


async def test_subscribing_to_an_unknown_task_is_task_not_found(transport: A2ATransport) -> None:
    # REST answers 404 with an ErrorInfo reason: TaskNotFound, not an endpoint gone (R11).
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(transport, "no-such-task")
    assert caught.value.code == A2AErrorCode.TASK_NOT_FOUND
    assert caught.value.task == "no-such-task"


async def test_subscribing_to_a_terminal_task_is_unsupported_operation(
    transport: A2ATransport,
) -> None:
    task = await send(transport, "echo done", return_immediately=False)
    assert task.state == TaskState.COMPLETED
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(transport, task.id)
    assert caught.value.code == A2AErrorCode.UNSUPPORTED_OPERATION


async def test_subscribing_at_an_endpoint_gone_is_unreachable_never_task_not_found(
    transport: A2ATransport, peer: Peer
) -> None:
    peer.set_endpoint_gone(True)
    with pytest.raises(EndpointUnreachableError) as caught:
        await read_all(transport, "any-task")
    assert caught.value.status == 404
    assert not isinstance(caught.value, StreamDroppedError)


# --- scripted streams that misbehave -------------------------------------------------------------


def event_stream(
    chunks: Iterable[bytes | float], end: Literal["done", "cut", "hang"] = "done"
) -> Reply:
    """An answer as sse-starlette sends one: ``text/event-stream``, chunked."""
    return Reply(
        headers={"Content-Type": "text/event-stream; charset=utf-8"}, chunks=chunks, end=end
    )


@pytest.fixture
def agent() -> Iterator[StreamingAgent]:
    with StreamingAgent() as running:
        yield running


def scripted(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient, **kw: Any
) -> A2ATransport:
    url = agent.rpc_url if binding == JSONRPC else agent.rest_url
    return A2ATransport(client, Interface(url, binding, "1.0"), **kw)


async def test_a_scripted_stream_that_ends_well_is_read_whole(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    # The control for the tests below: the same server, well behaved.
    agent.script = lambda frame: event_stream(
        [frame(working()), b": ping\r\n\r\n", frame(completed())]
    )
    seen = await read_all(scripted(agent, binding, client), TASK)
    assert [u.state for u in seen] == [TaskState.WORKING, TaskState.COMPLETED]
    assert agent.requests[0].headers["accept"] == "text/event-stream"
    assert agent.requests[0].headers["a2a-version"] == "1.0"


def huge_event(frame: Frame, size: int) -> Iterator[bytes]:
    """One event ``size`` bytes long, built as it is sent: a task whose metadata is padding."""
    marker = "@PAD@"
    event = working()
    event["task"]["metadata"] = {"pad": marker}
    head, tail = frame(event).split(marker.encode())
    yield head
    left = size
    while left > 0:
        yield b"x" * min(PIECE, left)
        left -= PIECE
    yield tail


async def test_a_9mb_event_is_refused_while_it_streams_and_is_never_held_whole(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    limit = 1024 * 1024  # the answer limit of this transport, so 9 MB is far over it
    agent.script = lambda frame: event_stream(
        itertools.chain([frame(working())], huge_event(frame, 9_000_000))  # made as it is sent
    )
    transport = scripted(agent, binding, client, max_bytes=limit)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidAgentResponseError, match="over the limit") as caught:
            await read_all(transport, TASK)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(caught.value, WrongTaskAnswerError)
    # One event may hold the limit and two pieces before it is refused; decoding it to text and
    # httpx-sse's line buffer cost about as much again (measured: 1.97 MB). Never nine.
    assert peak < 3 * (limit + 2 * PIECE)


async def test_an_event_just_under_the_limit_is_read(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    limit = 256 * 1024
    event = working()
    event["task"]["metadata"] = {"pad": "x" * (limit - 400)}
    agent.script = lambda frame: event_stream([frame(event), frame(completed())])
    seen = await read_all(scripted(agent, binding, client, max_bytes=limit), TASK)
    assert [u.state for u in seen] == [TaskState.WORKING, TaskState.COMPLETED]


async def test_a_stream_cut_inside_an_event_is_dropped_after_the_events_before_it(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    agent.script = lambda frame: event_stream(
        [frame(working()), frame(completed())[:30]], end="cut"
    )
    seen: list[StreamUpdate] = []
    with pytest.raises(StreamDroppedError) as caught:
        await read_all(scripted(agent, binding, client), TASK, seen)
    assert caught.value.reason == "cut"
    assert caught.value.task == TASK
    assert [u.state for u in seen] == [TaskState.WORKING]
    assert isinstance(caught.value, EndpointUnreachableError)  # a network failure, at heart


async def test_a_stream_closed_before_a_final_state_is_dropped(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    agent.script = lambda frame: event_stream([frame(working())])
    with pytest.raises(StreamDroppedError) as caught:
        await read_all(scripted(agent, binding, client), TASK)
    assert caught.value.reason == "closed"


async def test_an_event_about_another_task_is_a_wrong_task_answer_never_yielded(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    agent.script = lambda frame: event_stream([frame(working()), frame(completed("t-other"))])
    seen: list[StreamUpdate] = []
    with pytest.raises(WrongTaskAnswerError) as caught:
        await read_all(scripted(agent, binding, client), TASK, seen)
    assert (caught.value.asked, caught.value.answered) == (TASK, "t-other")
    assert caught.value.answered_state == TaskState.COMPLETED
    assert [u.task_id for u in seen] == [TASK]


async def test_an_error_event_mid_stream_is_the_agents_refusal(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "INTERNAL_ERROR"}

    def script(frame: Frame) -> Reply:
        if binding == JSONRPC:
            rid = json.loads(agent.requests[-1].body)["id"]  # the request being answered
            error = {"code": -32603, "message": "boom", "data": [info]}
            doc = {"jsonrpc": "2.0", "id": rid, "error": error}
        else:
            doc = {"error": {"code": 500, "message": "boom", "details": [info]}}
        return event_stream([frame(working()), sse(json.dumps(doc), event="error")])

    agent.script = script
    with pytest.raises(RemoteRefusedError) as caught:
        await read_all(scripted(agent, binding, client), TASK)
    assert caught.value.code == A2AErrorCode.INTERNAL_ERROR


async def test_a_200_text_html_answer_is_an_invalid_response_not_a_stream(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    page = b"<html><body>Welcome to our portal</body></html>"
    agent.script = lambda frame: Reply(body=page, headers={"Content-Type": "text/html"})
    with pytest.raises(InvalidAgentResponseError, match="text/html, not an event stream"):
        await read_all(scripted(agent, binding, client), TASK)


async def test_a_silent_stream_is_dropped_as_idle_within_its_idle_timeout(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    agent.script = lambda frame: event_stream([frame(working())], end="hang")
    transport = scripted(agent, binding, client, timeout=30.0)
    started = time.monotonic()
    with pytest.raises(StreamDroppedError) as caught:
        await read_all(transport, TASK, idle_timeout=0.3)
    elapsed = time.monotonic() - started
    assert caught.value.reason == "idle"
    assert 0.3 <= elapsed < 2.0


async def test_keep_alive_comments_hold_a_stream_open_until_the_deadline_ends_it(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    pings: list[bytes | float] = [b": ping\r\n\r\n", 0.1] * 100  # ten seconds of keep-alives
    agent.script = lambda frame: event_stream([frame(working()), *pings])
    transport = scripted(agent, binding, client, timeout=30.0)
    started = time.monotonic()
    with deadline.within(0.6), pytest.raises(StreamDroppedError) as caught:
        await read_all(transport, TASK, idle_timeout=0.3)  # pings come faster than that
    elapsed = time.monotonic() - started
    assert caught.value.reason == "deadline"
    assert 0.6 <= elapsed < 2.0


async def test_a_json_rpc_agent_without_the_method_is_a_protocol_mismatch(
    agent: StreamingAgent, client: httpx.AsyncClient
) -> None:
    def script(frame: Frame) -> Reply:
        rid = json.loads(agent.requests[-1].body)["id"]
        error = {"code": -32601, "message": "Method not found"}
        return Reply(body=json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode())

    agent.script = script
    with pytest.raises(ProtocolMismatchError, match="tasks/resubscribe"):
        await read_all(scripted(agent, JSONRPC, client), TASK)


async def test_keep_alive_comments_between_events_never_add_up_to_an_oversized_event(
    agent: StreamingAgent, binding: str, client: httpx.AsyncClient
) -> None:
    limit = 4096
    pings = [b": ping - 2026-12-01 01:45:27.289195+00:00\r\n\r\n"] * 4000  # 180 kB in all
    agent.script = lambda frame: event_stream([frame(working()), *pings, frame(completed())])
    seen = await read_all(scripted(agent, binding, client, max_bytes=limit), TASK)
    assert [u.state for u in seen] == [TaskState.WORKING, TaskState.COMPLETED]
