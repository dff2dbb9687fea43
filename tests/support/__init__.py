"""Test support: a real in-process A2A agent (`Peer`, the demo agent with test-only faults),
a real OAuth 2.0 token server (`TokenServer`) and a threaded uvicorn server.

`tests/` is on ``sys.path`` under pytest (``tests/conftest.py`` puts it there), so
tests import this package as ``support``; scripts that add the repository root to
``sys.path`` may import it as ``tests.support``.
"""

from .oauth import Issued, TokenServer
from .peer import CardHit, Peer, ScriptedExecutor, ServerThread, card_etag, select_script

__all__ = [
    "CardHit",
    "Issued",
    "Peer",
    "ScriptedExecutor",
    "ServerThread",
    "TokenServer",
    "card_etag",
    "select_script",
]
