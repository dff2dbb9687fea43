"""The A2A v1.0 task lifecycle, declared once (docs/rules.md, "The lifecycle").

``TaskLifecycle`` is the declaration: a python-statemachine ``StateChart`` whose states persist
A2A's lower-case names (``input-required``, not ``input_required``). Polls see snapshots, so
observations may skip states:

- from ``submitted`` to any other state;
- between ``working``, ``input-required`` and ``auth-required`` in any direction;
- from any non-terminal state to any terminal one (``completed``, ``failed``, ``canceled``,
  ``rejected``).

Nothing leaves a terminal state, nothing returns to ``submitted``, and a same-state observation
is not a transition. ``unknown`` is not a lifecycle state: it changes nothing, so ``is_legal``
answers ``False`` for it like for any other unknown name.

There is one event per target state, named ``to_<state id>`` (``to_input_required`` enters
``input-required``); ``EVENTS`` maps each target value to its event.

The hot path never runs the machine: a ``send`` costs ~75 µs (restoring a machine ~140 µs
more), an ``is_legal`` lookup ~0.1 µs. At import the declaration is compiled, by introspection,
into plain data (``TRANSITIONS``, ``STATES``, ``TERMINAL``, ``ACTIVE``, ``INTERRUPTED``,
``EVENTS``); the unit tests prove, pair by pair, that the table allows exactly what a live machine
allows. The diagram in ``docs/lifecycle.md`` is generated from the same declaration:
``python -m cardfence.engine.core.lifecycle`` prints the page.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from statemachine import State, StateChart
from statemachine.exceptions import InvalidDefinition

__all__ = [
    "ACTIVE",
    "EVENTS",
    "INTERRUPTED",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "TaskLifecycle",
    "is_legal",
    "machine_at",
    "mermaid",
    "page",
    "terminal",
    "write_docs",
]


class TaskLifecycle(StateChart[Any]):
    """The A2A task lifecycle. One event per target state: ``to_<state id>``.

    Restore one from a persisted value with ``machine_at``. A machine restored at a final state
    reports ``is_terminated == False`` in python-statemachine 3.x: check
    ``configuration`` / ``final`` instead.
    """

    allow_event_without_transition = False
    catch_errors_as_events = False

    submitted = State(value="submitted", initial=True)
    working = State(value="working")
    input_required = State(value="input-required")
    auth_required = State(value="auth-required")
    completed = State(value="completed", final=True)
    failed = State(value="failed", final=True)
    canceled = State(value="canceled", final=True)
    rejected = State(value="rejected", final=True)

    to_working = working.from_(submitted, input_required, auth_required)
    to_input_required = input_required.from_(submitted, working, auth_required)
    to_auth_required = auth_required.from_(submitted, working, input_required)
    to_completed = completed.from_(submitted, working, input_required, auth_required)
    to_failed = failed.from_(submitted, working, input_required, auth_required)
    to_canceled = canceled.from_(submitted, working, input_required, auth_required)
    to_rejected = rejected.from_(submitted, working, input_required, auth_required)


# -- compiled once, at import: the hot path reads only these --------------------------------------


def _declared_states() -> tuple[State, ...]:
    states = tuple(TaskLifecycle.states)
    for state in states:
        if state.states or state.history or state.parallel:
            raise InvalidDefinition(f"the lifecycle must stay flat; {state.id!r} is not atomic")
        if not isinstance(state.value, str):
            raise InvalidDefinition(f"state {state.id!r} must persist a str value")
    return states


def _declared_transitions() -> dict[tuple[str, str], str]:
    """Every (from, to) pair the chart declares, by value, with the event that takes it."""
    table: dict[tuple[str, str], str] = {}
    for state in _DECLARED:
        for transition in state.transitions:
            events = [str(event) for event in transition.events]
            targets = transition.targets
            if len(targets) != 1 or len(events) != 1 or transition.internal:
                raise InvalidDefinition(f"{transition!r}: one target and one event, please")
            if any(True for _ in transition.cond) or any(True for _ in transition.validators):
                # A guard would make the static table lie about what the machine allows.
                raise InvalidDefinition(f"{transition!r}: lifecycle transitions take no guards")
            pair = (str(transition.source.value), str(targets[0].value))
            table[pair] = events[0]
    return table


_DECLARED: Final = _declared_states()
_ORDER: Final = {str(state.value): index for index, state in enumerate(_DECLARED)}
_PAIRS: Final = _declared_transitions()

STATES: Final[tuple[str, ...]] = tuple(str(state.value) for state in _DECLARED)
"""Every state value, in declaration order (``submitted`` first)."""

TERMINAL: Final[frozenset[str]] = frozenset(str(s.value) for s in _DECLARED if s.final)
"""The final states: nothing leaves them."""

ACTIVE: Final[frozenset[str]] = frozenset(STATES) - TERMINAL
"""The non-terminal states, ``submitted`` included."""

INTERRUPTED: Final[frozenset[str]] = frozenset(
    {str(TaskLifecycle.input_required.value), str(TaskLifecycle.auth_required.value)}
)
"""The non-terminal states in which the remote agent waits for the client."""

TRANSITIONS: Final[frozenset[tuple[str, str]]] = frozenset(_PAIRS)
"""The legal (from, to) pairs, by state value."""


def _events_by_target() -> dict[str, str]:
    events: dict[str, set[str]] = {}
    for (_source, target), event in _PAIRS.items():
        events.setdefault(target, set()).add(event)
    owners: dict[str, str] = {}
    for target, names in events.items():
        if len(names) != 1 or next(iter(names)) in owners:
            raise InvalidDefinition(f"one event per target state: {target!r} has {names}")
        owners[next(iter(names))] = target
    return {target: next(iter(names)) for target, names in events.items()}


EVENTS: Final[Mapping[str, str]] = MappingProxyType(
    dict(sorted(_events_by_target().items(), key=lambda item: _ORDER[item[0]]))
)
"""Target state value -> the event that enters it (``"input-required"`` -> ``"to_input_required"``).
``submitted`` has none: nothing enters it."""


def is_legal(from_state: str, to_state: str) -> bool:
    """Whether observing ``to_state`` after ``from_state`` is a lifecycle transition.

    Same-state pairs and unknown names (``unknown`` included) are not.
    """
    return (from_state, to_state) in TRANSITIONS


def terminal(state: str) -> bool:
    """Whether ``state`` is a final state (``False`` for unknown names)."""
    return state in TERMINAL


class _Record:
    """The least a stored task gives back: its persisted state value."""

    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


def machine_at(state: str) -> TaskLifecycle:
    """A live machine restored at the persisted ``state`` value, as a stored task would be.

    No entry action runs (the task is not re-entered). Its model holds the value in ``state``.

    Raises:
        ValueError: ``state`` is not a lifecycle state value. (The library itself accepts any
            value on a restored model without complaint.)
    """
    if state not in _ORDER:
        raise ValueError(f"not a lifecycle state: {state!r} (expected one of {STATES})")
    return TaskLifecycle(model=_Record(state))


# -- the generated documentation ------------------------------------------------------------------


def mermaid() -> str:
    """A mermaid ``stateDiagram-v2`` of the declaration, labelled with the persisted values.

    Deterministic: states and transitions in declaration order.
    """
    by_value = {str(state.value): state.id for state in _DECLARED}
    lines = ["stateDiagram-v2"]
    lines += [f'    state "{state.value}" as {state.id}' for state in _DECLARED]
    initial = TaskLifecycle.initial_state
    assert initial is not None  # a chart with states has one
    lines.append(f"    [*] --> {initial.id}")
    for source, target in sorted(TRANSITIONS, key=lambda p: (_ORDER[p[0]], _ORDER[p[1]])):
        lines.append(f"    {by_value[source]} --> {by_value[target]}")
    lines += [f"    {state.id} --> [*]" for state in _DECLARED if state.final]
    return "\n".join(lines) + "\n"


_PAGE_HEAD: Final = """\
# The task lifecycle

<!-- Generated from engine/core/lifecycle.py: `python -m cardfence.engine.core.lifecycle >
docs/lifecycle.md`.
     Do not edit: tests/unit/core/test_lifecycle.py fails when this page is stale. -->

Every A2A v1.0 task the engine follows moves through these states. `engine/core/lifecycle.py`
declares
them once, as a python-statemachine `StateChart`; the engine checks each observed status against
a table compiled from that declaration, and this diagram is generated from it too.

Polls see snapshots, so observations may skip states. Legal: from `submitted` to any other state;
between `working`, `input-required` and `auth-required` in any direction; from any non-terminal
state to any terminal state (`completed`, `failed`, `canceled`, `rejected`). Illegal: anything out
of a terminal state, anything back to `submitted`. A same-state observation is not a transition,
and `unknown` changes nothing.

Events are named after their target: `to_working`, `to_input_required`, and so on.

"""


def page() -> str:
    """The whole of ``docs/lifecycle.md``."""
    return f"{_PAGE_HEAD}```mermaid\n{mermaid()}```\n"


def write_docs(path: str | Path) -> None:
    """Write ``page()`` to ``path`` (normally ``docs/lifecycle.md``)."""
    Path(path).write_text(page(), encoding="utf-8")


if __name__ == "__main__":
    sys.stdout.write(page())
