"""``python -m engine`` runs the cardfence command line."""

from engine.cli import main

if __name__ == "__main__":
    main()
