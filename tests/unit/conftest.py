"""Fixtures of the unit tests: a raw HTTP server on 127.0.0.1 to read cards from, the event store
(a SQLite file), the HTTP client, the machine's local zone moved off UTC, and the engine's
deadlines on the virtual clock."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.hostile import RoutedServer
from support.virtual_time import virtual_deadlines

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


@pytest.fixture
def local_zone_is_not_utc() -> Iterator[None]:
    """The machine's local time zone set to UTC+9 (a POSIX TZ string: no tz database needed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "JST-9")
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


@pytest.fixture
def _deadlines_on_the_virtual_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    with virtual_deadlines(monkeypatch):
        yield
