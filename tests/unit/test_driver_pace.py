"""The driver's schedule (``serve``: every live task kept moving), read exactly on a virtual clock
(``support.virtual_time``): R5's bound -- no live task goes longer than ``max_poll_interval``
without a safety poll, confirmed push or not -- for every task of many over five virtual minutes;
a task picked up after the driver started (another process's ``run``) followed at its next scan;
and pushes arriving every second, each webhook confirmed, spacing no poll.

Incident 001 is a client that waited six hours on a push the agent had stopped sending. Here the
bound is not sampled by a test that sleeps: each task's polls are the times the engine asked for.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from support.cards import ORIGIN, card_document
from support.mocked import rpc_result, task_answer
from support.virtual_time import run_virtual, virtual_deadlines, virtual_engine

from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core import events as ev
from cardfence.engine.serve.driver import Driver

CONFIG = EngineConfig(first_poll_interval=0.5, max_poll_interval=4.0, follow_streams=False)


@pytest.fixture(autouse=True)
def _deadlines_on_the_virtual_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    with virtual_deadlines(monkeypatch):
        yield


class Agent:
    """A mock agent whose every task stays `working`: a new remote id per send; each GetTask
    answered for the task asked about (``retry_after``: answered 429 with it), its time kept
    (:attr:`polls`, by remote id)."""

    def __init__(self, retry_after: str | None = None) -> None:
        self.retry_after = retry_after
        self.ids = (f"r-{n}" for n in itertools.count())
        self.polls: defaultdict[str, list[float]] = defaultdict(list)

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.method == "GET":
                card = card_document()
                card["capabilities"]["pushNotifications"] = True
                return httpx.Response(200, json=card)
            call = json.loads(request.content)
            if call["method"] == "SendMessage":
                return rpc_result(
                    call, {"task": {**task_answer("submitted"), "id": next(self.ids)}}
                )
            if call["method"] == "CreateTaskPushNotificationConfig":
                return rpc_result(call, call["params"])  # stored as asked
            remote = call["params"]["id"]
            self.polls[remote].append(asyncio.get_running_loop().time())
            if self.retry_after is not None:
                return httpx.Response(429, headers={"Retry-After": self.retry_after})
            return rpc_result(call, {**task_answer("working"), "id": remote})

        return httpx.MockTransport(handler)


def _driving(agent: Agent, seconds: float, meanwhile: Callable[[Engine], Awaitable[None]]) -> None:
    """Drive every live task for ``seconds`` of virtual time, with ``meanwhile(engine)`` run
    beside the driver from its start."""

    async def job() -> None:
        async with virtual_engine(agent.transport(), CONFIG) as engine:
            driver = Driver(engine, workers=8, scan_interval=0.5)
            running = asyncio.ensure_future(driver.run())
            await driver.ready()
            await meanwhile(engine)
            await asyncio.sleep(seconds - engine.clock())
            driver.stop()
            await running

    run_virtual(job())


def _gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


async def _started(engine: Engine, count: int) -> None:
    for _ in range(count):
        await engine.start_task(ORIGIN, skill="echo", text="hi")


def test_no_live_task_goes_longer_than_max_poll_interval_without_a_poll() -> None:
    agent = Agent()
    _driving(agent, 300.0, lambda engine: _started(engine, 30))
    assert len(agent.polls) == 30
    for times in agent.polls.values():
        # The first at once, then backing off to the bound, and the bound kept to the end.
        assert times[0] <= CONFIG.first_poll_interval
        assert max(_gaps(times)) <= CONFIG.max_poll_interval
        assert times[-1] >= 300.0 - CONFIG.max_poll_interval
        assert _gaps(times)[-1] == CONFIG.max_poll_interval


def test_a_task_started_while_the_driver_runs_is_polled_at_once_then_backs_off() -> None:
    agent = Agent()

    async def later(engine: Engine) -> None:
        await _started(engine, 1)  # before the driver's first poll: r-0
        await asyncio.sleep(100.0)
        await _started(engine, 1)  # another process's `run`, a hundred seconds in: r-1

    _driving(agent, 200.0, later)
    late = agent.polls["r-1"]
    assert 100.0 <= late[0] <= 100.0 + 0.5  # picked up by the next scan of the log
    assert _gaps(late)[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(_gaps(agent.polls["r-0"])) <= CONFIG.max_poll_interval


def test_a_task_whose_pushes_arrive_every_second_is_still_polled_at_the_bound() -> None:
    # R5: push confirmed or not, the safety polls go on; a confirmed webhook never spaces them.
    agent = Agent()
    confirmed: list[str] = []
    pushers: list[asyncio.Future[None]] = []

    async def pushing(engine: Engine) -> None:
        webhooks = []
        for _ in range(5):
            key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
            outcome = await engine.register_webhook(key, "https://hooks.example/w")
            assert outcome.token is not None
            assert outcome.authorization is not None
            headers = {
                "content-type": "application/json",
                "x-a2a-notification-token": outcome.token,
                "authorization": outcome.authorization,
            }
            webhooks.append(
                (key, str((await engine.records.state(key))["remote_task_id"]), headers)
            )

        async def deliveries() -> None:
            for second in range(1, 120):
                await asyncio.sleep(second - asyncio.get_running_loop().time())
                for _, remote, headers in webhooks:
                    status = {
                        "state": "TASK_STATE_WORKING",
                        "timestamp": f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z",
                    }
                    update = {"taskId": remote, "contextId": "c-1", "status": status}
                    body = json.dumps({"statusUpdate": update}).encode()
                    delivered = await engine.deliver(body, headers)
                    assert delivered.status == 200, delivered
            for key, _, _ in webhooks:
                if (await engine.records.state(key))["webhook"]["status"] == "confirmed":
                    confirmed.append(key)

        pushers.append(asyncio.ensure_future(deliveries()))

    _driving(agent, 121.0, pushing)
    assert pushers[0].done()
    assert pushers[0].exception() is None  # every delivery answered 200
    assert len(confirmed) == 5
    for times in agent.polls.values():
        assert max(_gaps(times)) <= CONFIG.max_poll_interval
        assert times[-1] >= 121.0 - CONFIG.max_poll_interval


def test_an_agent_asking_for_time_is_polled_no_sooner_even_when_news_prompts_a_poll() -> None:
    # R5: its Retry-After (10 s) outweighs the bound (4 s), and the news of a registration.
    agent = Agent(retry_after="10")
    keys: list[str] = []

    async def later(engine: Engine) -> None:
        keys.append((await engine.start_task(ORIGIN, skill="echo", text="hi")).task)
        await asyncio.sleep(15.0)  # between two polls, 10 s apart
        await engine.register_webhook(keys[0], "https://hooks.example/w")
        await asyncio.sleep(44.0)
        stream = engine.store.read_stream(f"task:{keys[0]}")
        assert [e.type for e in stream].count(ev.THROTTLED) == 1

    _driving(agent, 60.0, later)
    polls = agent.polls["r-0"]
    assert len(polls) == 6
    assert set(_gaps(polls)) == {10.0}


def test_a_webhook_registered_elsewhere_prompts_a_poll_and_the_backoff_starts_over() -> None:
    # Another process's registration (or reply) is news about the task: the driver polls it at
    # its next scan of the log, and looks again soon after, as for a task just started.
    agent = Agent()

    async def later(engine: Engine) -> None:
        key = (await engine.start_task(ORIGIN, skill="echo", text="hi")).task
        await asyncio.sleep(101.0)  # between two polls at the bound (100 and 104)
        await engine.register_webhook(key, "https://hooks.example/w")

    _driving(agent, 130.0, later)
    polls = agent.polls["r-0"]
    before = [when for when in polls if when <= 101.0]
    after = [when for when in polls if when > 101.0]
    assert before[-2:] == [96.0, 100.0]  # at the bound until then
    assert after[0] <= 101.0 + 0.5  # the next scan, not the next poll at the bound (104)
    assert _gaps(after)[:4] == [0.5, 1.0, 2.0, 4.0]
