"""A store written before events were typed reads back unchanged: chains, projections, audit.

``tests/support/data/store_before_typed_events.sqlite`` was written by the engine as it was when
every event was a ``(type, payload)`` pair: the five ``cardfence demo`` scenarios, then tasks
driven through the engine's own producers (``apply_observation``, the guards, the task log) to
reach every type of the catalogue and the fields any task event may carry (``repeats_ignored``,
``failures_repeated``, ``lease``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cardfence.engine.client.audit import audit, replay
from cardfence.engine.core import events as ev
from cardfence.engine.core.replay import fold_agent, fold_task
from cardfence.store.event_store import EventStore, iter_all

STORED = Path(__file__).parents[2] / "support" / "data" / "store_before_typed_events.sqlite"


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[EventStore]:
    copy = tmp_path / "before.sqlite"
    shutil.copyfile(STORED, copy)  # opening migrates: never the committed file
    with EventStore.open(f"sqlite:///{copy}") as opened:
        yield opened


def test_the_store_holds_every_type_of_the_catalogue(stored: EventStore) -> None:
    assert {event.type for event in iter_all(stored)} == ev.KNOWN_EVENTS


def test_the_store_written_before_audits_clean(stored: EventStore) -> None:
    report = audit(stored)
    assert report.ok, report.violations
    assert report.events_checked == len(list(iter_all(stored)))


def test_every_stream_replays_to_its_stored_projection(stored: EventStore) -> None:
    for stream_id in stored.stream_ids():
        head = stored.stream(stream_id)
        assert head is not None
        assert replay(stream_id, stored.read_stream(stream_id)) == head.state, stream_id


def _stored(payload: Mapping[str, Any]) -> str:
    """The text the store keeps and hashes for a payload (store/_appending.py ``_encode``)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, allow_nan=False)


def test_every_stored_event_reads_as_its_class_and_gives_back_its_payload_byte_for_byte(
    stored: EventStore,
) -> None:
    classes: set[type] = set()
    for event in iter_all(stored):
        typed = ev.stream_event(event.stream_id, event.type, event.data)
        assert not isinstance(typed, ev.UnknownEvent), event
        assert typed.type == event.type
        assert typed.extra == {}, (event.type, typed.extra)  # every key known to its class
        assert _stored(typed.payload()) == event.payload, (event.stream_id, event.version)
        classes.add(type(typed))
    assert len(classes) == len(ev.AGENT_CLASSES) + len(ev.TASK_CLASSES)


def test_every_stream_read_as_classes_replays_to_its_stored_projection(
    stored: EventStore,
) -> None:
    for stream_id in stored.stream_ids():
        head = stored.stream(stream_id)
        assert head is not None
        typed = [ev.stream_event(stream_id, e.type, e.data) for e in stored.read_stream(stream_id)]
        if stream_id.startswith(ev.AGENT_STREAM_PREFIX):
            origin = stream_id.removeprefix(ev.AGENT_STREAM_PREFIX)
            replayed = fold_agent(origin, typed)
        else:
            replayed = fold_task(stream_id.removeprefix(ev.TASK_STREAM_PREFIX), typed)
        assert replayed == head.state, stream_id
