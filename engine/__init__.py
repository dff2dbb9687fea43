"""The engine: A2A tasks driven under the rule that card state never gates continuation.

The pure core does no I/O: the lifecycle (``lifecycle``), the decisions of rules R2-R11
(``guards``), the one path every remote report takes (``observations``), event types (``events``),
the replay fold (``replay``), what agents' answers say (``answers``) and their reading
(``remote``). The edges touch the world: ``transport`` (on ``exchange``) speaks A2A over httpx
(``bodies`` and ``deadline`` bound what is read and for how long, R16), ``tasklog`` keeps task
streams in the store. Wings have folders of their own: ``engine`` (the facade that ties them
together, made of parts), ``cards`` (the Agent Card model, canonical hashing, diffs and discovery),
``cli`` (the command line and its renderings) and ``demo``.

The public API is re-exported from the top-level package: ``from cardfence import Engine``.
"""
