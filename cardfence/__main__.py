"""``python -m cardfence`` runs the cardfence command line."""

from cardfence.engine.cli import main

if __name__ == "__main__":
    main()
