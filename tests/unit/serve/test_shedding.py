"""The ingress refusal budget at its edges (``engine/serve/_shedding.py``): what it refuses to be
made
with, the rounding of a refill, the window of a report, and the count of reports. The property
(any sequence of charges) is in ``tests/property/test_refusal_budget.py``."""

from __future__ import annotations

import pytest
from support.virtual_time import Clock

from cardfence.engine.serve._shedding import _ROUNDING, RefusalBudget

NO_ROOM = "a refusal budget needs a window above 0 and room for 1 source"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"limit": 0}, "a refusal budget must allow at least 1 refusal"),
        (
            {"limit": 1, "window": 0.0},
            "a refusal budget needs a window above 0 and room for 1 source",
        ),
        (
            {"limit": 1, "sources": 0},
            "a refusal budget needs a window above 0 and room for 1 source",
        ),
    ],
)
def test_a_budget_that_could_never_hear_a_source_is_refused_by_name(
    arguments: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        RefusalBudget(**arguments)  # type: ignore[arg-type]


def test_a_budget_for_one_source_keeps_only_the_last_one_charged() -> None:
    clock = Clock()
    budget = RefusalBudget(1, 60.0, sources=1, clock=clock)
    assert budget.charge("a") is True
    assert budget.charge("b") is True  # "a" was forgotten to make room
    assert (budget.wait("a"), budget.shed()) == (0.0, 1)


def test_a_source_refilled_to_within_rounding_of_one_refusal_is_heard() -> None:
    clock = Clock()
    budget = RefusalBudget(1, 1.0, clock=clock)  # one refusal given back a second
    budget.charge("a")
    clock.now = 1.0 - _ROUNDING  # the refill reaches exactly one refusal less the rounding
    assert budget.wait("a") == 0.0


def test_a_source_still_shed_a_whole_window_after_its_report_is_reported_again() -> None:
    clock = Clock()
    budget = RefusalBudget(1, 10.0, clock=clock)
    assert budget.charge("a") is True
    clock.now = 5.0
    assert budget.charge("a") is False  # within the window: not news
    clock.now = 10.0  # exactly a window after the report, and still shed
    assert budget.charge("a") is True


def test_every_report_counts_once_in_the_total() -> None:
    budget = RefusalBudget(1, 60.0, clock=Clock())
    assert [budget.charge(source) for source in ("a", "b", "a", "c")] == [True, True, False, True]
    assert budget.shed_total == 3
