"""Compiling the declaration: the tables it gives, and the charts it refuses.

Written to kill the mutants of ``engine/core/lifecycle.py`` that ``scripts/mutation`` found alive.
The
module compiles its tables once, at import, before any mutant is switched on; these tests call the
compiling functions again, on the real chart (which must give the documented tables) and on charts
that break the rules the static table relies on (which must be refused).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from statemachine import State, StateChart
from statemachine.exceptions import InvalidDefinition

from cardfence.engine.core import lifecycle
from cardfence.engine.core.lifecycle import page, write_docs

TERMINAL = ("completed", "failed", "canceled", "rejected")
INTERRUPTIBLE = ("working", "input-required", "auth-required")
VALUES = ("submitted", *INTERRUPTIBLE, *TERMINAL)
EVENT_OF = {value: "to_" + value.replace("-", "_") for value in VALUES[1:]}


def _documented_table() -> dict[tuple[str, str], str]:
    """The rule of the module docstring, written out: (from, to) -> the event that takes it."""
    pairs = {("submitted", to) for to in VALUES[1:]}
    pairs |= set(itertools.permutations(INTERRUPTIBLE, 2))
    pairs |= {(active, end) for active in ("submitted", *INTERRUPTIBLE) for end in TERMINAL}
    return {(source, target): EVENT_OF[target] for source, target in pairs}


def test_compiling_the_chart_again_gives_its_states_in_declaration_order() -> None:
    states = lifecycle._declared_states()
    assert [state.value for state in states] == list(VALUES)
    assert [state.value for state in states if state.final] == list(TERMINAL)


def test_compiling_the_chart_again_gives_the_documented_table_with_its_events() -> None:
    assert lifecycle._declared_transitions() == _documented_table()


def test_compiling_the_chart_again_gives_one_event_per_target() -> None:
    assert lifecycle._events_by_target() == EVENT_OF


# -- charts the compiler refuses ------------------------------------------------------------------


class _Compound(StateChart):
    class outer(State.Compound):
        inner = State(initial=True)
        inner_done = State(final=True)
        go = inner.to(inner_done)

    done = State(final=True)
    finish = outer.to(done)


class _Parallel(StateChart):
    both = State(initial=True, parallel=True)
    done = State(final=True)
    finish = both.to(done)


class _NotAStr(StateChart):
    start = State(value=1, initial=True)
    done = State(value="done", final=True)
    finish = start.to(done)


@pytest.mark.parametrize(
    ("chart", "message"),
    [
        (_Compound, "the lifecycle must stay flat; 'outer' is not atomic"),
        (_Parallel, "the lifecycle must stay flat; 'both' is not atomic"),
        (_NotAStr, "state 'start' must persist a str value"),
    ],
    ids=["compound state", "parallel state", "non-str value"],
)
def test_a_chart_that_is_not_flat_or_not_str_valued_is_refused(
    monkeypatch: pytest.MonkeyPatch, chart: type[StateChart], message: str
) -> None:
    monkeypatch.setattr(lifecycle, "TaskLifecycle", chart)
    with pytest.raises(InvalidDefinition, match=f"^{message}$"):
        lifecycle._declared_states()


class _TwoEvents(StateChart):
    start = State(initial=True)
    done = State(final=True)
    start.to(done, event="finish end")


class _Internal(StateChart):
    start = State(initial=True)
    done = State(final=True)
    stay = start.to.itself(internal=True)
    finish = start.to(done)


class _Conditional(StateChart):
    start = State(initial=True)
    done = State(final=True)
    finish = start.to(done, cond="ready")

    def ready(self) -> bool:
        return True


class _Validated(StateChart):
    start = State(initial=True)
    done = State(final=True)
    finish = start.to(done, validators="ready")

    def ready(self) -> None:
        return None


@pytest.mark.parametrize(
    ("chart", "message"),
    [
        (_TwoEvents, "one target and one event, please"),
        (_Internal, "one target and one event, please"),
        (_Conditional, "lifecycle transitions take no guards"),
        (_Validated, "lifecycle transitions take no guards"),
    ],
    ids=["two events", "internal", "cond", "validators"],
)
def test_a_transition_the_static_table_could_not_represent_is_refused(
    monkeypatch: pytest.MonkeyPatch, chart: type[StateChart], message: str
) -> None:
    monkeypatch.setattr(lifecycle, "_DECLARED", tuple(chart.states))
    with pytest.raises(InvalidDefinition, match=f": {message}$"):
        lifecycle._declared_transitions()


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (
            {("a", "c"): "to_c", ("b", "c"): "reach_c"},
            "one event per target state: 'c' has {'(to_c|reach_c)', '(to_c|reach_c)'}",
        ),
        (
            {("a", "b"): "next", ("b", "c"): "next"},
            "one event per target state: 'c' has {'next'}",
        ),
    ],
    ids=["two events into one target", "one event into two targets"],
)
def test_a_table_without_one_event_per_target_is_refused(
    monkeypatch: pytest.MonkeyPatch, pairs: dict[tuple[str, str], str], message: str
) -> None:
    monkeypatch.setattr(lifecycle, "_PAIRS", pairs)
    with pytest.raises(InvalidDefinition, match=f"^{message}$"):
        lifecycle._events_by_target()


# -- the generated page ---------------------------------------------------------------------------


def test_write_docs_writes_the_page_as_utf8(tmp_path: Path) -> None:
    target = tmp_path / "lifecycle.md"
    write_docs(str(target))
    assert target.read_bytes() == page().encode("utf-8")
