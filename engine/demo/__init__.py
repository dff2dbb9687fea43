"""The demo's own A2A agent and the incidents played against it (``cardfence demo``).

``agent`` is a real a2a-sdk 1.3 agent with the switches the incidents need (a live card that can
change or answer 503, push deliveries dropped while registrations are still accepted, an endpoint
that goes away, ``slow`` tasks held until released); ``server`` serves it with uvicorn from a
thread; ``receiver`` is the webhook that hands push deliveries to :meth:`Engine.deliver`;
``scenarios`` plays the incidents. See ``docs/cli.md``.

The modules import a2a-sdk, uvicorn and Starlette, which come with the ``demo`` extra
(``pip install 'cardfence[demo]'``), not with cardfence itself: nothing else in the package imports
them, and this package's ``__init__`` imports none of its modules.
"""

DEMO_EXTRA = "pip install 'cardfence[demo]'"
DEMO_MODULES = frozenset({"a2a", "google", "sse_starlette", "starlette", "uvicorn"})
"""Top-level modules the ``demo`` extra brings; an ImportError naming one means it is missing."""

__all__ = ["DEMO_EXTRA", "DEMO_MODULES"]
