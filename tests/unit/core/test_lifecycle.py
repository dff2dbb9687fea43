"""The lifecycle: the compiled table agrees with the declared ``StateChart``, pair by pair.

Measured here (python-statemachine 3.2.2, CPython 3.11): ``is_legal`` ~0.1 µs, a machine ``send``
~75 µs, ``machine_at`` + ``send`` ~210 µs. ``test_reports_the_cost_of_is_legal_against_a_send``
prints the figures for this machine (run with ``-s``).
"""

from __future__ import annotations

import itertools
import timeit
from pathlib import Path

import pytest
from statemachine import State, StateChart
from statemachine.exceptions import InvalidDefinition, TransitionNotAllowed

from cardfence.engine.core import lifecycle
from cardfence.engine.core.lifecycle import (
    ACTIVE,
    EVENTS,
    INTERRUPTED,
    STATES,
    TERMINAL,
    TRANSITIONS,
    TaskLifecycle,
    is_legal,
    machine_at,
    mermaid,
    page,
    terminal,
    write_docs,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "lifecycle.md"
NON_TERMINAL_AFTER_SUBMITTED = ("working", "input-required", "auth-required")
EVERY_PAIR = list(itertools.product(STATES, STATES))


def _reached_by_a_live_machine(from_state: str, to_state: str) -> bool:
    """Whether some event, sent to a machine restored at ``from_state``, lands on ``to_state``.

    Tries every event the chart declares, each on a freshly restored machine; a refused event
    must raise and leave the persisted value where it was.
    """
    reached = False
    for event in machine_at(from_state).events:
        machine = machine_at(from_state)
        try:
            machine.send(event.id)
        except TransitionNotAllowed:
            assert machine.model.state == from_state
            continue
        reached = reached or machine.model.state == to_state
    return reached


@pytest.mark.parametrize(
    ("from_state", "to_state"), EVERY_PAIR, ids=[f"{a}->{b}" for a, b in EVERY_PAIR]
)
def test_the_compiled_table_allows_exactly_what_a_live_machine_allows(
    from_state: str, to_state: str
) -> None:
    assert is_legal(from_state, to_state) == _reached_by_a_live_machine(from_state, to_state)


def test_the_table_is_the_rule_of_the_design() -> None:
    expected = {("submitted", s) for s in STATES if s != "submitted"}
    expected |= set(itertools.permutations(NON_TERMINAL_AFTER_SUBMITTED, 2))
    expected |= {(a, t) for a in ACTIVE for t in TERMINAL}
    assert expected == TRANSITIONS


def test_values_are_the_lower_case_a2a_names() -> None:
    assert STATES == (
        "submitted",
        "working",
        "input-required",
        "auth-required",
        "completed",
        "failed",
        "canceled",
        "rejected",
    )
    assert TaskLifecycle.input_required.value == "input-required"
    assert TaskLifecycle.auth_required.value == "auth-required"
    assert {"completed", "failed", "canceled", "rejected"} == TERMINAL
    assert {"submitted", "working", "input-required", "auth-required"} == ACTIVE
    assert {"input-required", "auth-required"} == INTERRUPTED


def test_a_new_machine_starts_submitted() -> None:
    assert TaskLifecycle().model.state == "submitted"


def test_the_chart_is_configured_strict() -> None:
    assert TaskLifecycle.allow_event_without_transition is False
    assert TaskLifecycle.catch_errors_as_events is False


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_absorb(state: str) -> None:
    assert terminal(state)
    assert not any(is_legal(state, other) for other in STATES)
    machine = machine_at(state)
    for event in machine.events:
        with pytest.raises(TransitionNotAllowed):
            machine.send(event.id)
        assert machine.model.state == state


def test_nothing_returns_to_submitted() -> None:
    assert not any(is_legal(state, "submitted") for state in STATES)
    assert "submitted" not in EVENTS


def test_submitted_may_jump_to_any_other_state() -> None:
    assert all(is_legal("submitted", s) for s in STATES if s != "submitted")


def test_every_non_terminal_pair_is_legal_both_ways() -> None:
    for a, b in itertools.permutations(NON_TERMINAL_AFTER_SUBMITTED, 2):
        assert is_legal(a, b), (a, b)
        assert is_legal(b, a), (b, a)


@pytest.mark.parametrize("state", STATES)
def test_a_same_state_observation_is_not_a_transition(state: str) -> None:
    assert not is_legal(state, state)


@pytest.mark.parametrize(
    "name", ["unknown", "", "WORKING", "input_required", "TASK_STATE_WORKING", "done"]
)
def test_unknown_names_are_never_legal(name: str) -> None:
    assert not terminal(name)
    for state in STATES:
        assert not is_legal(state, name)
        assert not is_legal(name, state)


def test_machine_at_refuses_an_unknown_value() -> None:
    with pytest.raises(ValueError, match="not a lifecycle state"):
        machine_at("input_required")


def test_a_legal_send_moves_the_persisted_value() -> None:
    machine = machine_at("working")
    machine.send("to_input_required")
    assert machine.model.state == "input-required"
    assert list(machine.configuration_values) == ["input-required"]


def test_events_are_named_after_their_target() -> None:
    for state in TaskLifecycle.states:
        if state.value != "submitted":
            assert EVENTS[state.value] == f"to_{state.id}"
    for transition in (t for s in TaskLifecycle.states for t in s.transitions):
        assert [str(e) for e in transition.events] == [EVENTS[transition.target.value]]


def test_a_machine_restored_at_a_final_state_does_not_report_terminated() -> None:
    """A python-statemachine 3.x quirk the engine must not rely on: check ``final`` instead."""
    machine = machine_at("completed")
    assert machine.is_terminated is False
    assert all(state.final for state in machine.configuration)


def test_the_diagram_has_one_line_per_transition() -> None:
    lines = mermaid().splitlines()
    assert lines[0] == "stateDiagram-v2"
    arrows = [line.strip() for line in lines if "-->" in line]
    assert arrows[0] == "[*] --> submitted"
    assert [a for a in arrows if a.endswith("--> [*]")] == [
        f"{s} --> [*]" for s in ("completed", "failed", "canceled", "rejected")
    ]
    assert len([a for a in arrows if "[*]" not in a]) == len(TRANSITIONS)
    assert '    state "input-required" as input_required' in lines
    assert mermaid() == mermaid()


def test_the_committed_docs_page_is_current() -> None:
    committed = DOCS.read_text(encoding="utf-8") if DOCS.exists() else ""
    assert committed == page(), (
        "docs/lifecycle.md is stale; regenerate it with "
        "`.venv/bin/python -m cardfence.engine.core.lifecycle > docs/lifecycle.md`"
    )


def test_reports_the_cost_of_is_legal_against_a_send() -> None:
    """Prints, does not assert, the timings: they depend on the machine."""
    n = 20_000
    legal_ns = timeit.timeit(lambda: is_legal("working", "input-required"), number=n) / n * 1e9
    machine = machine_at("working")

    def round_trip() -> None:
        machine.send("to_input_required")
        machine.send("to_working")

    k = 200
    send_us = timeit.timeit(round_trip, number=k) / (2 * k) * 1e6
    print(f"\nis_legal: {legal_ns:.0f} ns; TaskLifecycle.send: {send_us:.1f} µs")
    assert machine.model.state == "working"


# --------------------------------------------------------------------------------------------------
# Compiling the declaration: the tables it gives, and the charts it refuses.
#
# The module compiles its tables once, at import; these tests call the compiling functions again, on
# the real chart (which must give the documented tables) and on charts that break the rules the
# static table relies on (which must be refused).


TERMINAL_lifecycle = ("completed", "failed", "canceled", "rejected")
INTERRUPTIBLE = ("working", "input-required", "auth-required")
VALUES = ("submitted", *INTERRUPTIBLE, *TERMINAL_lifecycle)
EVENT_OF = {value: "to_" + value.replace("-", "_") for value in VALUES[1:]}


def _documented_table() -> dict[tuple[str, str], str]:
    """The rule of the module docstring, written out: (from, to) -> the event that takes it."""
    pairs = {("submitted", to) for to in VALUES[1:]}
    pairs |= set(itertools.permutations(INTERRUPTIBLE, 2))
    pairs |= {
        (active, end) for active in ("submitted", *INTERRUPTIBLE) for end in TERMINAL_lifecycle
    }
    return {(source, target): EVENT_OF[target] for source, target in pairs}


def test_compiling_the_chart_again_gives_its_states_in_declaration_order() -> None:
    states = lifecycle._declared_states()
    assert [state.value for state in states] == list(VALUES)
    assert [state.value for state in states if state.final] == list(TERMINAL_lifecycle)


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
