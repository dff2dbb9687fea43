"""The engine's part that waits as an agent asked (R5): a request answered 429 (or a send
answered 503) goes again only after the wait the agent named, capped, within the deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cardfence.engine.client._records import TaskRecords
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.errors import DeadlineExceeded, ThrottledError
from cardfence.engine.http.deadline import left as time_left

# R5: a request the agent answered 429 (or a send answered 503) waits at least this long before
# it goes again, doubling each time: an agent naming no wait is not asked again at once.
ASK_AGAIN_AFTER = 1.0
# Seconds a request asked again is given at least, before the deadline, to be answered in.
_ASK_AGAIN_ROOM = 1.0
_T = TypeVar("_T")


class Asking:
    """The waits an agent asking for time is given (R5), ``Throttled`` recorded once a task."""

    def __init__(self, config: EngineConfig, records: TaskRecords) -> None:
        self.config = config
        self.records = records

    def throttle_wait(self, throttled: ThrottledError) -> float:
        """R5: the seconds before the next request to an endpoint that asked for time: what it
        asked, capped by ``max_retry_after`` and by the time left before the deadline."""
        asked = throttled.retry_after or 0.0
        return max(min(asked, self.config.max_retry_after, time_left()), 0.0)

    async def wait_asked(
        self,
        key: str,
        throttled: ThrottledError,
        during: str,
        pause: float,
        waited: float,
        outcome: str,
    ) -> float:
        """R5: wait as the agent asked before a request it answered with ``throttled`` goes
        again: its ``Retry-After`` capped by ``max_retry_after``, ``pause`` at least (the caller
        doubles it); ``Throttled`` recorded (once per task). Returns the seconds waited. Raises
        :class:`DeadlineExceeded` (saying ``outcome``) when the wait leaves no second to ask
        again before the deadline, and ``throttled`` once the waits, ``waited`` so far, would
        add up to more than ``max_retry_after``: nothing is asked again then."""
        config = self.config
        wait = max(min(throttled.retry_after or 0.0, config.max_retry_after), pause)
        left = time_left()
        late = wait + min(_ASK_AGAIN_ROOM, config.request_timeout) > left
        spent = not late and waited + wait > config.max_retry_after
        await self.records.record_throttled(key, throttled, during, None if late or spent else wait)
        if late:
            state = str((await self.records.state(key))["state"])
            reason = (
                f"the agent answered HTTP {throttled.status} to the {during} and asked to wait; "
                f"waiting {wait:.3g}s leaves no time to ask again within the "
                f"{max(left, 0.0):.3g}s left; {outcome}"
            )
            raise DeadlineExceeded(key, state, max(left, 0.0), reason=reason) from None
        if spent:
            raise throttled
        await asyncio.sleep(wait)
        return wait

    async def asked_again(
        self, key: str, during: str, request: Callable[[], Awaitable[_T]], outcome: str
    ) -> _T:
        """``request()``, made again after the wait the agent asked for while it answers 429:
        a request answered so was not taken (R5). A 503's outcome is unknown: raised."""
        pause, waited = ASK_AGAIN_AFTER, 0.0
        while True:
            try:
                return await request()
            except ThrottledError as throttled:
                if throttled.status != 429:
                    raise
                waited += await self.wait_asked(key, throttled, during, pause, waited, outcome)
            pause = min(pause * 2, self.config.max_retry_after)
