"""Every event class gives back the payload it was read from, and reads back what it gives.

For each class of the catalogue (``engine/core/events.py``), any instance -- every optional key
set or left out, an optional key that may be null set to null, keys a later cardfence may add --
survives ``from_payload(payload())`` unchanged, and its payload's stored text survives the
other way round.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardfence.engine.core import events as ev

CLASSES = sorted(
    {*ev.AGENT_CLASSES.values(), *ev.TASK_CLASSES.values()}, key=lambda cls: cls.__name__
)

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


def _values(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a field's annotation, as a payload read from JSON holds them."""
    if hint is ev.Absent:
        return st.just(ev.ABSENT)
    if hint is type(None):
        return st.none()
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return st.one_of(*(_values(arm) for arm in typing.get_args(hint)))
    if hint is str:
        return st.text(max_size=12)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(min_value=-(2**53), max_value=2**53)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if origin is Mapping or hint is Mapping:
        return st.dictionaries(st.text(max_size=6), _JSON, max_size=4)
    if origin is Sequence:
        (item,) = typing.get_args(hint)
        return st.lists(_values(item), max_size=3)
    if hint is Any:
        return _JSON
    raise AssertionError(f"no values for {hint!r}")


def instances(cls: type[ev.Recorded]) -> st.SearchStrategy[ev.Recorded]:
    hints = typing.get_type_hints(cls)
    known = {f.metadata.get("key") or f.name for f in fields(cls)}
    extra = st.dictionaries(st.text(max_size=6).filter(lambda k: k not in known), _JSON, max_size=2)
    chosen = {f.name: _values(hints[f.name]) for f in fields(cls) if f.name != "extra"}
    return st.builds(cls, extra=extra, **chosen)


def _stored(payload: Mapping[str, Any]) -> str:
    """The text the store keeps and hashes for a payload (store/_appending.py ``_encode``)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, allow_nan=False)


def reads_back(cls: type[ev.Recorded]) -> None:
    """The property, for one class: any instance survives ``from_payload(payload())``."""

    @settings(max_examples=60, deadline=None)
    @given(instances(cls))
    def round_trip(event: ev.Recorded) -> None:
        payload = event.payload()
        again = cls.from_payload(json.loads(_stored(payload)))
        assert again.payload() == payload
        assert _stored(again.payload()) == _stored(payload)
        if not any(value is None for value in event.extra.values()):
            assert again == event  # (an explicit null in extra is an optional key's)

    round_trip()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_event_reads_back_from_its_payload(cls: type[ev.Recorded]) -> None:
    reads_back(cls)


def test_property_catches_a_reader_that_drops_the_keys_it_does_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted bug: keys a later cardfence wrote are lost when an event is read back."""
    read = ev.Recorded.from_payload.__func__  # type: ignore[attr-defined]

    def forgetful(cls: type[ev.Recorded], data: Mapping[str, Any]) -> ev.Recorded:
        return dataclasses.replace(read(cls, data), extra={})

    monkeypatch.setattr(ev.Recorded, "from_payload", classmethod(forgetful))
    with pytest.raises(AssertionError):
        reads_back(ev.ReplySent)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_a_payload_lacking_a_key_its_type_always_holds_is_refused(cls: type[ev.Recorded]) -> None:
    required = [f for f in fields(cls) if f.name != "extra" and not f.metadata.get("optional")]
    assert required, cls
    for missing in required:
        key = missing.metadata.get("key") or missing.name
        payload = {(f.metadata.get("key") or f.name): "x" for f in required if f is not missing}
        with pytest.raises(KeyError, match=key):
            cls.from_payload(payload)


def test_an_optional_key_stored_as_null_is_given_back_as_null() -> None:
    stored = {"reason": "clock_skew", "detail": "d", "revision": None}
    flagged = ev.FlaggedForReview.from_payload(stored)

    assert flagged.revision is None
    assert flagged.payload() == stored


def test_an_optional_key_that_may_be_null_is_told_from_an_absent_one() -> None:
    base = {"from": "working", "to": "completed", "source": "poll", "remote_timestamp": None}
    absent = ev.StateChanged.from_payload(base)
    null = ev.StateChanged.from_payload({**base, "message": None})

    assert absent.message is ev.ABSENT
    assert null.message is None
    assert "message" not in absent.payload()
    assert null.payload()["message"] is None


def test_a_type_this_cardfence_does_not_know_is_kept_as_it_came() -> None:
    data = {"a": [1, 2]}
    for read in (ev.task_event("FromANewerRelease", data), ev.agent_event("Other", data)):
        assert isinstance(read, ev.UnknownEvent)
        assert read.payload() == data


def test_each_type_is_read_by_its_stream_s_class() -> None:
    assert set(ev.AGENT_CLASSES) == ev.AGENT_EVENTS
    assert set(ev.TASK_CLASSES) == ev.TASK_EVENTS
    assert ev.AGENT_CLASSES[ev.TASK_CREATION_REFUSED] is ev.TaskCreationRefused
    assert ev.TASK_CLASSES[ev.TASK_CREATION_REFUSED] is ev.CreationRefusedRemotely
    for cls in CLASSES:
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert hasattr(cls, "__slots__")
