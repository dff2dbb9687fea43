"""Fixtures of the wire tests: ``agent(handler, binding, version, **options)``, a transport to an
httpx mock handler (``support.mocked``), every one closed when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support.mocked import Make, mocked_agents


@pytest.fixture
async def agent() -> AsyncIterator[Make]:
    async with mocked_agents() as make:
        yield make
