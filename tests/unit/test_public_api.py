"""The public API is pinned: what ``__all__`` promises exists, nothing public is missing, and
each name has one home: no module of the engine or the store re-exports another's names."""

from __future__ import annotations

import ast
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import cardfence
from cardfence import store
from cardfence.engine import errors
from cardfence.engine.auth import config as credentials_config
from cardfence.engine.auth import credentials
from cardfence.engine.cards import (
    interfaces,
    keys,
    model,
    signature_policy,
    signatures,
    spoken,
    urls,
)
from cardfence.engine.core import answers
from cardfence.engine.wire import v10

ROOT = Path(__file__).resolve().parents[2]

# Modules cut along a seam (each holds its own part, and only that).
SEAMS = [
    credentials,
    credentials_config,
    signatures,
    signature_policy,
    keys,
    model,
    interfaces,
    spoken,
    urls,
    v10,
    answers,
]


@pytest.mark.parametrize("module", [cardfence, errors, *SEAMS], ids=lambda m: m.__name__)
def test_all_is_sorted_and_every_name_exists(module: types.ModuleType) -> None:
    names = module.__all__
    # isort style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then the rest.
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    for name in names:
        assert hasattr(module, name), name


def test_every_public_name_is_exported() -> None:
    public = {
        name
        for name, value in vars(cardfence).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(cardfence.__all__)


def test_the_store_package_offers_no_names_of_its_own_modules() -> None:
    assert not hasattr(store, "__all__")
    assert {
        name
        for name, value in vars(store).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } == set()


def test_every_error_derives_from_the_one_root() -> None:
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, cardfence.CardfenceError), name


def test_the_error_tree_is_drawn_in_the_module_docstring() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        assert name in doc, f"{name} missing from the drawn tree"


def test_the_public_api_offers_each_name_from_its_home() -> None:
    for name in sorted(set(cardfence.__all__) - {"__version__"}):
        home = getattr(cardfence, name).__module__
        assert name in defined_names(module_path(home)), f"{name} offered from {home}"


def test_the_version_is_one_value_in_the_package_and_its_metadata() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text("utf-8"))
    assert project["project"]["version"] == cardfence.__version__ == "0.2.0"


def defined_names(path: Path) -> set[str]:
    """The names ``path``'s module binds at its top level itself: by ``def``, ``class`` or an
    assignment (anywhere in its top-level statements), never by an import."""
    found: set[str] = set()
    for statement in ast.parse(path.read_text(encoding="utf-8")).body:
        for node in ast.walk(statement):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
    return found


def exported_names(path: Path) -> list[str]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    return []


def module_path(dotted: str) -> Path:
    relative = Path(*dotted.split(".")[1:])
    package = ROOT / relative / "__init__.py"
    return package if package.is_file() else (ROOT / relative).with_suffix(".py")


def engine_and_store_modules() -> Iterator[tuple[str, Path]]:
    for top in ("engine", "store"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield "cardfence." + ".".join(parts).removesuffix(".__init__"), path


MODULES = dict(engine_and_store_modules())


@pytest.mark.parametrize("dotted", sorted(MODULES))
def test_no_module_re_exports_a_name_defined_elsewhere(dotted: str) -> None:
    path = MODULES[dotted]
    elsewhere = set(exported_names(path)) - defined_names(path)
    assert elsewhere == set()
