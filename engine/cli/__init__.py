"""The ``cardfence`` command line: a thin layer over the Python API (``docs/cli.md``).

``app`` holds the typer app, global options and exit codes; ``main`` the entry point and the
store commands; ``tasks`` the task commands; ``render`` the human renderings.
"""

from cardfence.engine.cli.main import app, main, run

__all__ = ["app", "main", "run"]
