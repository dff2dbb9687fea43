"""Test support: a real in-process A2A agent (`Peer`, the demo agent with test-only faults),
the same agent behind real authentication middleware (`AuthPeer`, HTTPS with client
certificates from `make_tls`), a real OAuth 2.0 token server (`TokenServer`), a threaded
uvicorn server, and the official a2a-sdk 0.3 agent in a subprocess of its own venv (`Peer03`).
The demo agent in a process of its own is `agent_process.demo_agent_process`. The benchmarks
(``scripts/bench_*.py``) use these too.

`tests/` is on ``sys.path`` under pytest (``tests/conftest.py`` puts it there), so
tests import this package as ``support``; scripts that add the repository root to
``sys.path`` may import it as ``tests.support``.
"""

from .auth_peer import AuthHit, AuthPeer
from .oauth import Issued, TokenServer
from .peer import CardHit, Peer, ScriptedExecutor, ServerThread, card_etag, select_script
from .peer03 import Peer03, Peer03Error, Venv03Unavailable, a2a03_python
from .tls import TlsFiles, make_tls

__all__ = [
    "AuthHit",
    "AuthPeer",
    "CardHit",
    "Issued",
    "Peer",
    "Peer03",
    "Peer03Error",
    "ScriptedExecutor",
    "ServerThread",
    "TlsFiles",
    "TokenServer",
    "Venv03Unavailable",
    "a2a03_python",
    "card_etag",
    "make_tls",
    "select_script",
]
