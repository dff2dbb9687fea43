"""The house's arrows: each wing of the engine imports only the wings below it, and the pure core
imports no I/O library. Read from the code's own imports (module level, inside functions and
under ``TYPE_CHECKING`` alike: an arrow is an arrow)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each wing may import the wings to its left, never one to its right.
ORDER = (
    "store",
    "errors",
    "cards",
    "core",
    "http",
    "auth",
    "wire",
    "discovery",
    "client",
    "serve",
    "demo",
    "cli",
)
IO_LIBRARIES = frozenset({"asyncio", "httpcore", "httpx", "psycopg", "sqlalchemy", "starlette",
                          "uvicorn"})  # fmt: skip


def wing_of(module: str) -> str | None:
    """The wing a dotted module path lies in (``None``: not cardfence's engine or store)."""
    parts = module.split(".")
    if parts[:2] == ["cardfence", "store"]:
        return "store"
    if parts[:2] != ["cardfence", "engine"] or len(parts) < 3:
        return None
    return parts[2]


def imported(source: str) -> Iterator[str]:
    """Every module path an import statement of ``source`` names, and each name it takes from
    one (which may be a module itself)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def upward_arrows(wing: str, source: str) -> set[str]:
    """The wings ``source``, a module of ``wing``, imports that lie to its right in ORDER."""
    if wing not in ORDER:
        return set()
    return {
        target
        for name in imported(source)
        if (target := wing_of(name)) in ORDER and ORDER.index(target) > ORDER.index(wing)
    }


def modules() -> Iterator[tuple[str, Path]]:
    for top in ("engine", "store"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            dotted = "cardfence." + ".".join(relative.parts).removesuffix(".__init__")
            wing = wing_of(dotted) if top == "engine" else "store"
            if wing is not None:
                yield wing, path


def test_every_wing_imports_only_the_wings_below_it() -> None:
    found = {
        f"{path.relative_to(ROOT)} ({wing}) imports {sorted(targets)}"
        for wing, path in modules()
        if (targets := upward_arrows(wing, path.read_text(encoding="utf-8")))
    }
    assert found == set()


def test_the_wings_named_in_the_order_are_the_engines_folders() -> None:
    folders = {p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file()}
    assert folders | {"errors", "store"} == set(ORDER)


def test_the_pure_core_imports_no_io_library() -> None:
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "engine" / "core").rglob("*.py"))
        for name in imported(path.read_text(encoding="utf-8"))
        if name.split(".")[0] in IO_LIBRARIES
    }
    assert found == set()


@pytest.mark.parametrize(
    ("wing", "source"),
    [
        ("core", "from cardfence.engine.client.engine import Engine"),
        ("cards", "if TYPE_CHECKING:\n    from cardfence.engine.wire import transport"),
        ("store", "def f():\n    import cardfence.engine.errors"),
        ("wire", "from cardfence.engine import discovery"),
    ],
)
def test_an_import_against_the_arrows_is_caught_wherever_it_is_written(
    wing: str, source: str
) -> None:
    assert upward_arrows(wing, source)


def engine_bases(source: str) -> set[str]:
    """The bases of the classes ``source`` defines that are the engine's own classes: defined
    there, or imported from cardfence -- the error tree aside."""
    tree = ast.parse(source)
    ours = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cardfence."):
            errors = (node.module or "").endswith(".errors")
            ours |= {alias.asname or alias.name for alias in node.names if not errors}
    return {
        f"{node.name}({ast.unparse(base)})"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if ast.unparse(base).split(".")[0].split("[")[0] in ours
    }


def test_the_engines_parts_are_held_not_inherited() -> None:
    """The Engine holds its parts: no class of the client wing derives from another of the
    engine's classes (the error tree aside), so no tower of layers comes back."""
    found = {
        f"{path.relative_to(ROOT)}: {sorted(bases)}"
        for path in sorted((ROOT / "engine" / "client").rglob("*.py"))
        if (bases := engine_bases(path.read_text(encoding="utf-8")))
    }
    assert found == set()


def test_a_class_derived_from_another_engine_class_is_caught() -> None:
    source = "from cardfence.engine.client._observing import Observing\nclass C(Observing): ..."
    assert engine_bases(source) == {"C(Observing)"}
    assert engine_bases("class A: ...\nclass B(A): ...") == {"B(A)"}
    errors = "from cardfence.engine.errors import UsageError\nclass E(UsageError): ..."
    assert engine_bases(errors) == set()
