"""The ``cardfence`` command line: a thin layer over the Python API (``docs/cli.md``).

``app`` holds the typer app, global options and exit codes; ``main`` the entry point and the
store commands; ``tasks`` the task commands; ``render`` the human renderings.

Importing this package imports none of them: the console script's :func:`main` first sets the
signal handlers, so that Ctrl-C while the rest loads ends as it does later (exit 130).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cardfence.engine.cli import _signals as signals

if TYPE_CHECKING:
    from cardfence.engine.cli._app import app
    from cardfence.engine.cli.main import run

__all__ = ["app", "main", "run"]


def main() -> None:
    """Console-script entry point (and ``python -m cardfence``'s)."""
    # First: from here on a signal is recorded, and ends the command (exit 130) as soon as the
    # command line is loaded, as it would later.
    signals.from_start()
    code = _commands().run()
    signals.after_command()
    raise SystemExit(code)


_entry = main


def _commands() -> ModuleType:
    """The command line's module, imported on first use."""
    module = importlib.import_module("cardfence.engine.cli.main")
    globals()["main"] = _entry  # importing the submodule bound its name here
    return module


def __getattr__(name: str) -> Any:
    if name in ("app", "run"):
        return getattr(_commands(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
