"""R15's choice among security alternatives, for any requirements and any configured set.

For random requirement lists (alternatives drawn over a few scheme names, the empty alternative
and repeats included), random ``securitySchemes`` declarations and random configured sets,
:func:`cardfence.engine.auth.credentials.choose`:

- returns an alternative only if every scheme in it is declared and configured;
- returns the FIRST such alternative (every earlier one lacks a scheme, and says which);
- returns None only when the list is not empty and no alternative is fully covered;
- requires security exactly when the list is not empty (an empty list chooses ``()``).

The property is one function, :func:`violation`, checked against ``choose`` and, to show it has
teeth, against planted bugs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from cardfence.engine.auth import credentials
from cardfence.engine.auth.credentials import Choice, Gap
from cardfence.engine.cards.model import SecurityRequirement

NAMES = ("api", "bearer", "basic", "oauth", "mtls")
DECLARATION = {"httpAuthSecurityScheme": {"scheme": "bearer"}}


@dataclass(frozen=True, slots=True)
class World:
    requirements: tuple[SecurityRequirement, ...]
    declared: frozenset[str]
    configured: frozenset[str]


def requirement(names: frozenset[str], scopes: tuple[str, ...]) -> SecurityRequirement:
    return SecurityRequirement(tuple(sorted((name, scopes) for name in names)))


names = st.frozensets(st.sampled_from(NAMES))
alternatives = st.builds(requirement, names, st.sampled_from([(), ("read",), ("a2a", "write")]))
worlds = st.builds(
    World,
    requirements=st.lists(alternatives, max_size=5).map(tuple),
    declared=names,
    configured=names,
)


def covered(alternative: SecurityRequirement, world: World) -> bool:
    return all(n in world.declared and n in world.configured for n, _ in alternative.schemes)


def violation(world: World) -> str | None:
    """What is wrong with ``credentials.choose``'s answer in this world, or None."""
    choice = credentials.choose(
        world.requirements,
        dict.fromkeys(world.declared, DECLARATION),
        world.configured.__contains__,
    )
    if choice.required != bool(world.requirements):
        return f"required={choice.required} for {len(world.requirements)} alternative(s)"
    first = next((i for i, alt in enumerate(world.requirements) if covered(alt, world)), None)
    if not world.requirements:
        return None if choice.chosen == () and not choice.refused else "empty list not free"
    if choice.chosen is None:
        if first is not None:
            return f"chose nothing although alternative {first} is fully covered"
        if len(choice.gaps) != len(world.requirements):
            return "refused without a gap for every alternative"
        return None
    if first is None:
        return f"chose {choice.chosen} although no alternative is fully covered"
    expected = world.requirements[first]
    if choice.requirement != expected:
        return f"chose {choice.requirement} instead of the first covered, {expected}"
    if choice.chosen != tuple(sorted(n for n, _ in expected.schemes)):
        return f"chosen names {choice.chosen} are not the alternative's, sorted"
    if not all(n in world.configured and n in world.declared for n in choice.chosen):
        return f"chose {choice.chosen} with a scheme not declared or not configured"
    if len(choice.gaps) != first:
        return f"{len(choice.gaps)} gap(s) for the {first} alternative(s) before the chosen one"
    for gap, alternative in zip(choice.gaps, world.requirements[:first], strict=True):
        if not gap.not_configured and not gap.not_declared:
            return f"a gap for {alternative} that names nothing missing"
    return None


@given(worlds)
def test_choose_picks_the_first_fully_covered_alternative_or_none(world: World) -> None:
    assert violation(world) is None


@pytest.mark.parametrize(
    "world",
    [
        World((), frozenset(), frozenset()),
        World((requirement(frozenset(), ()),), frozenset(), frozenset()),
        World((requirement(frozenset({"api", "mtls"}), ()),), frozenset(NAMES), frozenset({"api"})),
        World(
            (requirement(frozenset({"oauth"}), ()), requirement(frozenset({"bearer"}), ())),
            frozenset({"bearer"}),
            frozenset(NAMES),
        ),
    ],
    ids=["empty", "anonymous", "partial", "undeclared"],
)
def test_choose_on_the_edges(world: World) -> None:
    assert violation(world) is None


# --- teeth: the same property catches planted bugs ------------------------------------------------


def catches() -> World:
    """A world on which the property rejects ``choose`` (hypothesis fails the test if none)."""
    hunt = settings(
        max_examples=2000,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
    )
    return find(worlds, lambda world: violation(world) is not None, settings=hunt)


Have = Callable[[str], bool]


def test_property_catches_a_choice_that_takes_partial_coverage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def partial(
        requirements: Sequence[SecurityRequirement], schemes: Mapping[str, object], have: Have
    ) -> Choice:
        for requirement in requirements:
            names = tuple(sorted(n for n, _ in requirement.schemes))
            if not names or any(n in schemes and have(n) for n in names):  # the planted bug
                return Choice(True, names, requirement, ())
        return Choice(bool(requirements), None if requirements else (), None, ())

    monkeypatch.setattr(credentials, "choose", partial)
    world = catches()
    assert any(not covered(alternative, world) for alternative in world.requirements)


def test_property_catches_a_choice_that_takes_the_last_covered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = credentials.choose

    def last(
        requirements: Sequence[SecurityRequirement], schemes: Mapping[str, object], have: Have
    ) -> Choice:
        return real(tuple(reversed(requirements)), schemes, have)  # the planted bug

    monkeypatch.setattr(credentials, "choose", last)
    problem = violation(catches())
    assert problem is not None
    assert "instead of the first covered" in problem or "gap" in problem


def test_property_catches_a_choice_that_ignores_declarations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = credentials.choose

    def trusting(
        requirements: Sequence[SecurityRequirement], schemes: Mapping[str, object], have: Have
    ) -> Choice:
        everything = dict.fromkeys(NAMES, DECLARATION)  # the planted bug: all declared
        return real(requirements, everything, have)

    monkeypatch.setattr(credentials, "choose", trusting)
    world = catches()
    assert world.declared != frozenset(NAMES)


def test_a_gap_is_printable() -> None:
    gap = Gap(("a", "b"), ("a",), ("b",))
    assert str(gap) == "[a + b]: a not configured; b not declared in securitySchemes"
