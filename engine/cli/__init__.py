"""The ``cardfence`` command line: a thin layer over the Python API (``docs/cli.md``).

``_app`` holds the typer app, global options and exit codes; ``main`` the commands' entry point
(:func:`~cardfence.engine.cli.main.run`) and the store commands; ``_tasks`` the task commands;
``_render`` the human renderings.

Importing this package imports none of them but the signal handling: the console script's
:func:`main` first sets the signal handlers, so that Ctrl-C while the rest loads ends as it does
later (exit 130). The command line is then imported by name, on purpose late (for start-up
time, not to break a circle: ``main`` does not import this package's names).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cardfence.engine.cli import _signals as signals

__all__ = ["main"]


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
