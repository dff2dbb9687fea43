"""The engine: A2A tasks driven under the rule that card state never gates continuation.

It is laid out in wings, one folder per concern, each importing only the wings before it
(docs/architecture.md): ``errors`` (the error tree), ``cards`` (the Agent Card, pure), ``core``
(the lifecycle, the decisions and the one observation path, pure), ``http``, ``auth`` (R15),
``wire`` (A2A on the wire), ``discovery`` (card reads), ``client`` (the ``Engine``, a facade
over parts it holds, the task log, the audit), ``serve``, ``demo`` and ``cli``.

The public API is offered by the top-level package, each name loaded from its home on first
use: ``from cardfence import Engine``.
"""
