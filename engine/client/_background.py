"""The engine's part that runs work beside a task: re-checks, re-validations and closing reads,
each contained so that it never takes a task down with it (R1), and waited for at the end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from cardfence.engine.client.tasklog import key_of
from cardfence.store.errors import LeaseLostError

# Background failures kept for settle() (every one is logged): the first this many, so an outage
# that fails every re-check does not hold each failure, traceback and all, in memory.
_ERRORS_KEPT = 100
_log = logging.getLogger("cardfence.engine")


class Background:
    """Jobs started beside the tasks, the closing reads among them by task, and their failures."""

    def __init__(self) -> None:
        self.jobs: set[asyncio.Task[None]] = set()
        self.closing: dict[str, asyncio.Task[None]] = {}  # key -> its closing read
        self.errors: list[Exception] = []

    def spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.ensure_future(self.contained(job))
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    def close_with(self, key: str, read: Awaitable[None]) -> None:
        """Start ``read``, the closing read of the task ``key``, kept until it is done."""
        job = asyncio.ensure_future(self.contained(read))
        self.closing[key] = job
        job.add_done_callback(lambda _: self.closing.pop(key, None))

    async def contained(self, job: Awaitable[None]) -> None:
        """A re-check or re-validation never takes the task down with it: a failure there is a
        bug to report (logged, kept for :meth:`settle`), not an input to the task (R1)."""
        try:
            await job
        except asyncio.CancelledError:
            raise
        except LeaseLostError as lost:
            # Decided under a lease since lost: the task ended, or another process drives it
            # now and makes its own checks. Nothing was written; nothing is wrong.
            _log.info(
                "background decision not recorded: the lease was lost",
                extra={"task": key_of(lost.stream_id), "event": "LeaseLost", "reason": str(lost)},
            )
        except Exception as error:
            _log.exception("background card check failed")
            if len(self.errors) < _ERRORS_KEPT:  # each logged; the first kept
                self.errors.append(error)

    async def settle(self) -> None:
        """Wait for background re-checks, re-validations and closing reads; raise the first error
        one of them hit (tests, shutdown). Closing reads included."""
        while self.jobs or self.closing:
            jobs = [*self.jobs, *self.closing.values()]
            await asyncio.gather(*jobs, return_exceptions=True)
        if self.errors:
            raise self.errors.pop(0)

    async def stop(self, timeout: float) -> None:
        """Let the closing reads finish (within ``timeout``), then stop every job left."""
        # Closing reads fetch what a terminal task ended with: let them finish (bounded). Those
        # still waiting their turn then are stopped with the background jobs, before the client
        # and the store they need are closed.
        closing = list(self.closing.values())
        if closing:
            await asyncio.wait(closing, timeout=timeout)
        jobs = [*self.jobs, *self.closing.values()]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
