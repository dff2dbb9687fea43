"""Fixtures of the unit tests that read cards from raw HTTP servers on 127.0.0.1: the server,
the event store the reads are recorded in (a SQLite file), and the HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from support.hostile import RoutedServer

from cardfence.store.event_store import EventStore


@pytest.fixture
def server() -> Iterator[RoutedServer]:
    with RoutedServer() as running:
        yield running


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(f"sqlite:///{tmp_path / 'cards.db'}") as opened:
        yield opened


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared
