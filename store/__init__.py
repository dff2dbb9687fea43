"""cardfence's event store: an append-only, hash-chained event log on SQLAlchemy 2.x.

It knows nothing of A2A: streams, events, projections and content-addressed snapshots. Each name
is imported from its own module: ``event_store`` (:class:`EventStore`), ``records`` (what is
appended and read back), ``errors`` (the root of cardfence's error tree and the store's errors),
``leases`` (due work), ``chain`` (the hash chain), ``groupcommit``, ``database`` and ``schema``.
"""
