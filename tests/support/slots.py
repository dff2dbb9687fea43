"""Request slots that remember what took them: proof that a read waited its turn among the
engine's requests in flight (``engine.http.pool.RequestSlots``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from cardfence.engine.http.pool import RequestSlots


class RecordedSlots(RequestSlots):
    """Request slots that remember the URL of every slot taken."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @contextlib.asynccontextmanager
    async def held(self, url: str) -> AsyncIterator[None]:
        self.urls.append(url)
        async with super().held(url):
            yield
