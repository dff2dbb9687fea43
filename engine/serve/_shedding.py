"""Shedding the sources that keep sending what is refused. Pure: no I/O.

A push delivery refused for its credentials or its task costs the webhook ingress a store lookup
(the task is found by the remote id the delivery names before its credentials can be checked,
R16), so a flood of forged deliveries takes store time from genuine ones and from the polls.
Each source (the client address the server sees) has a budget of refused deliveries: ``limit``
at once, given back at ``limit`` per ``window`` seconds (a token bucket). A source whose budget
is spent is shed: its deliveries are answered 429 with ``Retry-After`` before anything is read,
until the budget has room for one more. Genuine deliveries from a shed source wait too; push is
never the only way news arrives (R5's safety polls), so shedding delays and loses nothing.

The budgets kept are bounded (``sources``): past that, the source refused least recently is
forgotten, so a flood from more addresses than that is bounded only by the ingress's in-flight
limit -- stopping it is the firewall's or the proxy's work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["REFUSAL_WINDOW", "RefusalBudget"]

REFUSAL_WINDOW = 60.0  # seconds over which a source's budget of refusals is given back
# A budget this close to a whole refusal has room for it: refilling in floating point may fall
# short of 1.0 by a rounding error where the exact sum is 1 (a wait of 1e-15 s is no wait).
_ROUNDING = 1e-9
_SOURCES = 4096  # budgets kept at most


@dataclass(slots=True)
class _Bucket:
    tokens: float  # refusals the source may still have before it is shed
    at: float  # when ``tokens`` was last brought up to date
    told: float = -math.inf  # when its being shed was last reported


class RefusalBudget:
    """Refused deliveries per source: :meth:`wait` before reading one, :meth:`charge` after
    refusing one. Not thread-safe: one event loop calls it."""

    def __init__(
        self,
        limit: int,
        window: float = REFUSAL_WINDOW,
        *,
        sources: int = _SOURCES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError("a refusal budget must allow at least 1 refusal")
        if not window > 0 or sources < 1:
            raise ValueError("a refusal budget needs a window above 0 and room for 1 source")
        self.limit = limit
        self.window = window
        self._rate = limit / window  # refusals given back per second
        self._sources = sources
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}  # least recently charged first
        self.shed_total = 0  # sources reported shed (at most once a window each)

    def wait(self, source: str) -> float:
        """Seconds until ``source`` may be heard again: 0.0 while it has a refusal left."""
        bucket = self._buckets.get(source)
        if bucket is None:
            return 0.0
        tokens = self._refilled(bucket, self._clock())
        return 0.0 if _has_room(tokens) else (1.0 - tokens) / self._rate

    def charge(self, source: str) -> bool:
        """Count one refused delivery against ``source``. True when that spent its budget and
        it was not already reported shed within the window: news, for the caller to log once
        (the 429s that follow, and a source readmitted for one refusal at a time, are not)."""
        now = self._clock()
        bucket = self._buckets.pop(source, None)
        if bucket is None:
            bucket = _Bucket(float(self.limit), now)
            while len(self._buckets) >= self._sources:
                del self._buckets[next(iter(self._buckets))]  # the least recently charged
        bucket.tokens = self._refilled(bucket, now) - 1.0
        bucket.at = now
        self._buckets[source] = bucket  # now the most recently charged
        if _has_room(bucket.tokens) or now - bucket.told < self.window:
            return False
        bucket.told = now
        self.shed_total += 1
        return True

    def shed(self) -> int:
        """Sources shed now (their budget has no room for one more refusal)."""
        now = self._clock()
        return sum(1 for b in self._buckets.values() if not _has_room(self._refilled(b, now)))

    def _refilled(self, bucket: _Bucket, now: float) -> float:
        return min(float(self.limit), bucket.tokens + (now - bucket.at) * self._rate)


def _has_room(tokens: float) -> bool:
    return tokens >= 1.0 - _ROUNDING
