"""cardfence's event store: an append-only, hash-chained event log on SQLAlchemy 2.x.

It knows nothing of A2A: streams, events, projections and content-addressed snapshots.
"""

from cardfence.store.chain import ChainBreak, verify_chain
from cardfence.store.database import normalise_url
from cardfence.store.errors import (
    CardfenceError,
    ConcurrencyError,
    CorruptRecordError,
    LeaseLostError,
    PayloadError,
    SchemaTooNewError,
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
)
from cardfence.store.event_store import EventStore, iter_all
from cardfence.store.groupcommit import CommitStats, GroupCommit
from cardfence.store.leases import DueRow, DueWork
from cardfence.store.records import (
    GENESIS_HASH,
    CardSnapshot,
    Lease,
    NewEvent,
    Projection,
    RecordedEvent,
    StreamRecord,
)

__all__ = [
    "GENESIS_HASH",
    "CardSnapshot",
    "CardfenceError",
    "ChainBreak",
    "CommitStats",
    "ConcurrencyError",
    "CorruptRecordError",
    "DueRow",
    "DueWork",
    "EventStore",
    "GroupCommit",
    "Lease",
    "LeaseLostError",
    "NewEvent",
    "PayloadError",
    "Projection",
    "RecordedEvent",
    "SchemaTooNewError",
    "SnapshotMismatchError",
    "StoreError",
    "StoreUnavailableError",
    "StreamRecord",
    "iter_all",
    "normalise_url",
    "verify_chain",
]
