"""The refusal budget of the webhook ingress
(:class:`cardfence.engine.serve._shedding.RefusalBudget`).

The ingress asks :meth:`~RefusalBudget.wait` before reading a delivery and answers 429 while it is
above zero; it calls :meth:`~RefusalBudget.charge` after refusing one. The properties, for any
sources sending refused deliveries at any times:

- **bounded**: over any span of ``T`` seconds, no source has more than ``limit + limit * T /
  window`` deliveries heard and refused (what costs the store a lookup);
- **live**: a source is shed only with its budget spent, and once it has waited the ``wait`` it
  was told, it is heard again;
- **quiet**: a source is reported shed (``charge`` returning True) at most once a window.

Checked against the budget and, to show they have teeth, against planted bugs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hypothesis import example, find, given
from hypothesis import strategies as st
from support.virtual_time import Clock

from cardfence.engine.serve._shedding import RefusalBudget

Step = tuple[str, float]  # (source, seconds since the step before)
steps = st.lists(
    st.tuples(st.sampled_from("abc"), st.floats(0.0, 30.0, allow_nan=False)), max_size=120
)
limits = st.integers(1, 8)
windows = st.sampled_from([1.0, 10.0, 60.0])
Budget = Callable[[int, float, Clock], RefusalBudget]


def real(limit: int, window: float, clock: Clock) -> RefusalBudget:
    return RefusalBudget(limit, window, clock=clock)


def spent(times: list[float], limit: int, rate: float, now: float) -> bool:
    """Whether refusals heard at ``times`` leave a budget of ``limit`` given back at ``rate``
    without room for one more at ``now``: some run of them, from the i-th on, outpaced it."""
    return any(limit - (len(times) - i) + rate * (now - start) < 1 - 1e-9
               for i, start in enumerate(times))  # fmt: skip


def violation(make: Budget, limit: int, window: float, plan: list[Step]) -> str | None:
    """What is wrong with the budget ``make`` builds, fed ``plan`` as the ingress would, or None."""
    clock = Clock()
    budget = make(limit, window, clock)
    heard: dict[str, list[float]] = {}
    told: dict[str, list[float]] = {}
    for source, gap in plan:
        clock.now += gap
        wait = budget.wait(source)
        if wait > 0:
            if not spent(heard.get(source, []), limit, limit / window, clock.now):
                return f"{source} shed ({wait:.3f} s) with its budget unspent"
            # Live: after waiting what it was told, the source is heard.
            clock.now += wait
            if budget.wait(source) > 1e-9:
                return f"{source} still shed {budget.wait(source):.3f} s after waiting {wait:.3f}"
        heard.setdefault(source, []).append(clock.now)
        if budget.charge(source):
            told.setdefault(source, []).append(clock.now)
    for source, times in heard.items():
        for i, start in enumerate(times):
            for j in range(i, len(times)):
                span = times[j] - start
                allowed = limit + limit * span / window + 1e-6
                if j - i + 1 > allowed:
                    many = f"{j - i + 1} refusals heard in {span:.3f} s"
                    return f"{source}: {many} (at most {allowed:.2f})"
    for source, times in told.items():
        for earlier, later in itertools.pairwise(times):
            if later - earlier < window:
                return f"{source} reported shed twice within {later - earlier:.3f} s"
    return None


@given(limit=limits, window=windows, plan=steps)
# A refill that sums to exactly one refusal in decimal falls short of it in binary by 1e-16.
@example(limit=1, window=10.0, plan=[("b", 0.0), ("b", 0.0), ("a", 1.08), ("b", 0.0), ("a", 1.08)])
def test_a_source_is_heard_at_most_its_budget_and_always_again_after_its_wait(
    limit: int, window: float, plan: list[Step]
) -> None:
    assert violation(real, limit, window, plan) is None


def test_a_spent_source_is_told_how_long_to_wait_and_heard_after_it() -> None:
    clock = Clock()
    budget = RefusalBudget(3, 60.0, clock=clock)
    assert [budget.charge("10.0.0.1") for _ in range(3)] == [False, False, True]
    assert budget.wait("10.0.0.1") == 20.0  # one refusal is given back every 60/3 s
    assert budget.wait("10.0.0.2") == 0.0  # another source has its own budget
    assert budget.shed() == 1
    clock.now = 20.0
    assert budget.wait("10.0.0.1") == 0.0
    assert budget.charge("10.0.0.1") is False  # spent again, but already reported this window
    assert budget.shed_total == 1


def test_the_budgets_kept_are_bounded_and_the_least_recently_refused_is_forgotten() -> None:
    budget = RefusalBudget(1, 60.0, sources=2, clock=Clock())
    budget.charge("a")
    budget.charge("b")
    budget.charge("a")  # a is now the most recently refused
    budget.charge("c")  # room for two: b goes
    assert (budget.wait("a") > 0, budget.wait("b"), budget.wait("c") > 0) == (True, 0.0, True)


def test_a_budget_that_would_refuse_everything_is_itself_refused() -> None:
    for arguments in ((0, 60.0, 8), (1, 0.0, 8), (1, 60.0, 0)):
        limit, window, sources = arguments
        try:
            RefusalBudget(limit, window, sources=sources)
        except ValueError:
            continue
        raise AssertionError(f"RefusalBudget{arguments} was accepted")


# --- teeth: the same properties catch planted bugs -----------------------------------------------


class _GivesBackTwiceAsFast(RefusalBudget):
    """The planted bug: refusals are given back at twice the rate (the window read as half)."""

    def __init__(self, limit: int, window: float, *, clock: Clock) -> None:
        super().__init__(limit, window / 2, clock=clock)


class _ForgetsAShedSource(RefusalBudget):
    """The planted bug: a source's budget is restored whenever it is asked about while shed."""

    def wait(self, source: str) -> float:
        if super().wait(source) > 0:
            self._buckets.pop(source, None)
        return 0.0


class _ReportsEverySpend(RefusalBudget):
    """The planted bug: every refusal that leaves the budget spent is reported."""

    def charge(self, source: str) -> bool:
        super().charge(source)
        return self.wait(source) > 0


def planted(budget: type[RefusalBudget]) -> Budget:
    return lambda limit, window, clock: budget(limit, window, clock=clock)


def caught(make: Budget) -> str:
    """What the properties find wrong with the budget ``make`` builds (hypothesis's smallest)."""
    case = find(st.tuples(limits, windows, steps), lambda case: violation(make, *case) is not None)
    return violation(make, *case) or ""


def test_the_bound_catches_a_budget_given_back_too_fast() -> None:
    assert "refusals heard" in caught(planted(_GivesBackTwiceAsFast))


def test_the_bound_catches_a_shed_source_forgotten_when_asked_about() -> None:
    assert "refusals heard" in caught(planted(_ForgetsAShedSource))


def test_quiet_catches_a_budget_that_reports_every_spend() -> None:
    assert "reported shed twice" in caught(planted(_ReportsEverySpend))
