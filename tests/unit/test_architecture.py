"""The house's arrows: each wing of the engine imports only the wings below it, no module imports
round a circle, no private name or private module is imported from another wing, the pure core
imports no I/O library, and the cards wing reads no file and opens no connection. Read from the
code's own imports (module level, inside functions and under ``TYPE_CHECKING`` alike: an arrow
is an arrow)."""

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


def private(dotted: str) -> bool:
    """Whether a dotted path names a private module or name (``_x``, not ``__init__``)."""
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def private_crossings(wing: str, source: str) -> set[str]:
    """The private modules and names ``source``, a module of ``wing``, imports from another."""
    return {
        name
        for name in imported(source)
        if (target := wing_of(name)) is not None and target != wing and private(name)
    }


def dotted_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = relative.parts[1:] if relative.parts[0] == "cardfence" else relative.parts
    return ".".join(("cardfence", *parts)).removesuffix(".__init__")


def package_modules() -> dict[str, Path]:
    """Every module of the package: its own files and the three folders it links to."""
    found = {dotted_name(path): path for path in sorted((ROOT / "cardfence").glob("*.py"))}
    for top in ("engine", "store", "migrations"):
        found.update({dotted_name(path): path for path in sorted((ROOT / top).rglob("*.py"))})
    return found


def import_graph(
    sources: dict[str, str], packages: frozenset[str] = frozenset()
) -> dict[str, set[str]]:
    """Each module's imports among ``sources`` (dotted name -> its text; ``packages`` are those
    that are packages): ``from a import b`` is an arrow to ``a.b`` when that is a module, else
    to ``a``; relative imports are resolved."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        package = module if module in packages else module.rpartition(".")[0]
        arrows: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                arrows.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                for alias in node.names:
                    name = f"{base}.{alias.name}"
                    arrows.add(name if name in sources else base)
        graph[module] = {target for target in arrows if target in sources and target != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of more than one module
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            part = [stack.pop()]
            while part[-1] != module:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


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


# The cards wing parses URLs with httpx's parser, and that is all it may do with httpx.
URL_PARSING = frozenset({"URL", "InvalidURL"})
FILE_READS = frozenset({"open", "read_bytes", "read_text"})


def cards_io(source: str) -> set[str]:
    """What ``source`` does that a pure cards module may not: an I/O library (or ``tomllib``)
    imported, httpx used for more than parsing a URL, a file opened or read."""
    found = {
        name
        for name in imported(source)
        if name.split(".")[0] in (IO_LIBRARIES - {"httpx"}) | {"tomllib", "socket"}
    }
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "httpx"
            and node.attr not in URL_PARSING
        ):
            found.add(f"httpx.{node.attr}")
        called = node.func if isinstance(node, ast.Call) else None
        if isinstance(called, ast.Name) and called.id in FILE_READS:
            found.add(f"{called.id}()")
        elif isinstance(called, ast.Attribute) and called.attr in FILE_READS:
            found.add(f".{called.attr}()")
    return found


def test_the_cards_wing_reads_no_file_and_opens_no_connection() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {sorted(io)}"
        for path in sorted((ROOT / "engine" / "cards").rglob("*.py"))
        if (io := cards_io(path.read_text(encoding="utf-8")))
    }
    assert found == set()


@pytest.mark.parametrize(
    "source",
    [
        "import tomllib",
        "def f(p):\n    return p.read_bytes()",
        "def f(p):\n    with open(p) as h:\n        return h",
        "import httpx\nasync def f():\n    return await httpx.AsyncClient().get('x')",
    ],
)
def test_io_in_the_cards_wing_is_caught(source: str) -> None:
    assert cards_io(source)


def test_parsing_a_url_in_the_cards_wing_is_no_io() -> None:
    assert not cards_io("import httpx\ndef f(u):\n    return httpx.URL(u)")


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


def test_no_private_module_or_name_is_imported_from_another_wing() -> None:
    found = {
        f"{path.relative_to(ROOT)} ({wing}) imports {sorted(names)}"
        for wing, path in modules()
        if (names := private_crossings(wing, path.read_text(encoding="utf-8")))
    }
    assert found == set()


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


@pytest.mark.parametrize(
    ("wing", "source"),
    [
        ("client", "from cardfence.engine.discovery import _agent_stream"),
        ("client", "from cardfence.engine.discovery.reads import _now"),
        ("serve", "def f():\n    from cardfence.engine.client._records import TaskRecords"),
        ("cli", "import cardfence.store._base"),
    ],
)
def test_a_private_import_from_another_wing_is_caught(wing: str, source: str) -> None:
    assert private_crossings(wing, source)


def test_a_private_import_within_a_wing_is_the_wings_own_business() -> None:
    assert not private_crossings(
        "discovery", "from cardfence.engine.discovery import _signed_reads"
    )


def test_no_module_of_the_package_imports_round_a_circle() -> None:
    found = package_modules()
    sources = {module: path.read_text(encoding="utf-8") for module, path in found.items()}
    packages = frozenset(module for module, path in found.items() if path.name == "__init__.py")
    assert circles(import_graph(sources, packages)) == []


def test_the_graph_holds_every_module_of_the_package() -> None:
    found = package_modules()
    assert {"cardfence", "cardfence.engine.core.guards", "cardfence.store.leases"} <= set(found)
    assert "cardfence.migrations.env" in found


@pytest.mark.parametrize(
    "second",
    [
        "from cardfence.a import x",
        "if TYPE_CHECKING:\n    from cardfence.a import x",
        "def f():\n    import cardfence.a",
        "from cardfence import a",
        "from . import a",
    ],
)
def test_a_circle_is_caught_however_its_imports_are_written(second: str) -> None:
    sources = {"cardfence.a": "from cardfence.b import y", "cardfence.b": second}
    assert circles(import_graph(sources)) == [["cardfence.a", "cardfence.b"]]


def test_a_circle_through_three_modules_is_named_whole() -> None:
    sources = {
        "cardfence.a": "import cardfence.b",
        "cardfence.b": "import cardfence.c",
        "cardfence.c": "from cardfence.a import x",
        "cardfence.d": "import cardfence.a",
    }
    assert circles(import_graph(sources)) == [["cardfence.a", "cardfence.b", "cardfence.c"]]


def test_a_class_derived_from_another_engine_class_is_caught() -> None:
    source = "from cardfence.engine.client._observing import Observing\nclass C(Observing): ..."
    assert engine_bases(source) == {"C(Observing)"}
    assert engine_bases("class A: ...\nclass B(A): ...") == {"B(A)"}
    errors = "from cardfence.engine.errors import UsageError\nclass E(UsageError): ..."
    assert engine_bases(errors) == set()
