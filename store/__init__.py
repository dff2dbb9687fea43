"""cardfence's event store: an append-only, hash-chained event log on SQLAlchemy 2.x.

It knows nothing of A2A: streams, events, projections and content-addressed snapshots.
"""
