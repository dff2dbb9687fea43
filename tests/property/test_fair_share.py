"""Evening out the leases between drivers (:func:`cardfence.engine.serve.driver.fair_share`).

The property, for any leases held per owner and any driver: what it takes comes only from other
holders, leaves none of them below the fair share (the ceiling of the mean), never raises the
taker above it, and stops short only at the limit or when nobody above the fair share is left;
and drivers taking turns in any order come to rest within a few rounds (nobody takes anything
any more), with the leases conserved. Checked against the engine and, to show it has teeth,
against a planted bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from hypothesis import find, given
from hypothesis import strategies as st

from cardfence.engine.serve.driver import fair_share

Plan = Callable[[str, Mapping[str, int], int], dict[str, int]]

OWNERS = [f"serve-{n}" for n in range(6)]
holdings = st.dictionaries(st.sampled_from(OWNERS), st.integers(0, 400), max_size=len(OWNERS))
drivers = st.sampled_from([*OWNERS, "newcomer"])
limits = st.integers(1, 300)


def fair_of(counts: Mapping[str, int], me: str) -> int:
    owners = {owner for owner, n in counts.items() if n > 0} | {me}
    return -(-sum(counts.values()) // len(owners))


def one_step_violation(plan: Plan, held: dict[str, int], me: str, limit: int) -> str | None:
    """What is wrong with ``plan``'s moves for ``me``, or None."""
    moves = plan(me, held, limit)
    fair = fair_of(held, me)
    mine = held.get(me, 0)
    if me in moves:
        return f"{me} takes from itself"
    for owner, count in moves.items():
        if count <= 0:
            return f"a move of {count} from {owner}"
        if held.get(owner, 0) - count < fair:
            return f"{owner} left with {held.get(owner, 0) - count}, below the fair share {fair}"
    taken = sum(moves.values())
    if moves and mine + taken > fair:
        return f"{me} raised to {mine + taken}, above the fair share {fair}"
    if taken > limit:
        return f"{taken} taken at once, over the limit {limit}"
    if moves and mine >= fair - max(1, fair // 10):
        return f"{me} takes with {mine}, within the slack of the fair share {fair}"
    short = mine + taken < fair - max(1, fair // 10)
    above = [o for o, n in held.items() if o != me and n - moves.get(o, 0) > fair]
    if short and taken < limit and above:
        return f"{me} stops at {mine + taken} of {fair} while {above} hold more"
    return None


def rounds_violation(plan: Plan, held: dict[str, int], order: list[str]) -> str | None:
    """Drivers ``order`` take turns: what is wrong if they never come to rest, or lose leases."""
    counts = dict(held)
    total = sum(counts.values())
    for _ in range(len(order) + 3):
        moved = False
        for me in order:
            for owner, count in plan(me, counts, 10_000).items():
                counts[owner] -= count
                counts[me] = counts.get(me, 0) + count
                moved = True
        if sum(counts.values()) != total:
            return f"leases not conserved: {held} became {counts}"
        if not moved:
            return None
    return f"never at rest: {held} taking turns {order} ended at {counts}"


@given(holdings, drivers, limits)
def test_a_driver_takes_only_the_surplus_above_the_fair_share(
    held: dict[str, int], me: str, limit: int
) -> None:
    assert one_step_violation(fair_share, held, me, limit) is None


@given(holdings, st.lists(drivers, min_size=1, max_size=7, unique=True))
def test_drivers_taking_turns_in_any_order_come_to_rest(
    held: dict[str, int], order: list[str]
) -> None:
    assert rounds_violation(fair_share, held, order) is None


@pytest.mark.parametrize(
    ("held", "me", "moves"),
    [
        ({"a": 100}, "b", {"a": 50}),  # a newcomer takes half from the one busy driver
        ({"a": 90, "b": 0}, "c", {"a": 45}),  # b holds nothing: it does not count
        ({"a": 60, "b": 30}, "c", {"a": 30}),  # fair share 30: only a is above it
        ({"a": 100, "b": 40}, "b", {"a": 30}),
        ({"a": 55, "b": 45}, "b", {}),  # short by 5, within a tenth of 50: nothing moves
        ({"a": 5}, "b", {"a": 2}),  # fair share 3, a keeps 3
        ({"a": 1}, "b", {}),  # one task: nothing to share
        ({}, "b", {}),
    ],
)
def test_fair_share_examples(held: dict[str, int], me: str, moves: dict[str, int]) -> None:
    assert fair_share(me, held, 256) == moves


def test_fair_share_takes_at_most_the_limit_at_once() -> None:
    assert fair_share("b", {"a": 1000}, 256) == {"a": 256}


# --- teeth: the same properties catch planted bugs -----------------------------------------------


def greedy(me: str, held: Mapping[str, int], limit: int) -> dict[str, int]:
    """The planted bug: the fullest holder gives all the taker wants, down past the fair share."""
    counts = {owner: n for owner, n in held.items() if n > 0}
    mine = counts.setdefault(me, 0)
    fair = -(-sum(counts.values()) // len(counts))
    others = [owner for owner in sorted(counts, key=lambda o: -counts[o]) if owner != me]
    if mine >= fair - max(1, fair // 10) or not others:
        return {}
    return {others[0]: min(fair - mine, limit, counts[others[0]])}


def no_slack(me: str, held: Mapping[str, int], limit: int) -> dict[str, int]:
    """The planted bug: the taker aims one above the fair share, so two drivers pass it back."""
    counts = {owner: n for owner, n in held.items() if n > 0}
    mine = counts.setdefault(me, 0)
    fair = -(-sum(counts.values()) // len(counts)) + 1
    wanted = min(fair - mine, limit)
    moves = {}
    for owner in sorted(counts, key=lambda o: -counts[o]):
        if owner != me and wanted > 0 and counts[owner] > fair - 2:
            moves[owner] = min(counts[owner], wanted)
            wanted -= moves[owner]
    return moves


def test_the_one_step_property_catches_a_taker_that_leaves_a_holder_short() -> None:
    held, me, limit = find(
        st.tuples(holdings, drivers, limits),
        lambda case: one_step_violation(greedy, *case) is not None,
    )
    assert "below the fair share" in (one_step_violation(greedy, held, me, limit) or "")


def test_the_rounds_property_catches_drivers_passing_leases_back_and_forth() -> None:
    held, order = find(
        st.tuples(holdings, st.lists(drivers, min_size=1, max_size=7, unique=True)),
        lambda case: rounds_violation(no_slack, *case) is not None,
    )
    assert "never at rest" in (rounds_violation(no_slack, held, order) or "")
