"""A first look at the event store: a scripted task timeline appended, read back and verified.

The incident demo against a real A2A agent (`cardfence demo`) arrives with the engine; this shows
the foundation it stands on: the hash-chained log, projections and content-addressed card
snapshots.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from store import CardSnapshot, EventStore, NewEvent, Projection
from store.chain import content_hash

CARD = json.dumps(
    {"name": "echo-agent", "version": "1.0.0", "capabilities": {"pushNotifications": True}},
    separators=(",", ":"),
    sort_keys=True,
)


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="cardfence-demo-"))
    url = f"sqlite:///{folder / 'demo.db'}"
    with EventStore.open(url) as store:
        snapshot = CardSnapshot(
            revision=content_hash(CARD),
            body=CARD,
            source_url="http://127.0.0.1:9999/.well-known/agent-card.json",
            etag='W/"demo"',
            http_status=200,
            fetched_at=datetime.now(UTC),
        )
        store.append(
            "agent:http://127.0.0.1:9999",
            0,
            [NewEvent("CardFetched", {"revision": snapshot.revision, "status": 200})],
            projection=Projection({"revision": snapshot.revision}, category="agent"),
            snapshots=[snapshot],
        )
        timeline = [
            ("TaskSubmitted", {"skill": "echo", "card_revision": snapshot.revision}, "submitted"),
            ("StateChanged", {"from": "submitted", "to": "working", "source": "send"}, "working"),
            ("DiscoveryUnavailable", {"kind": "http_status", "detail": "503"}, "working"),
            ("StateChanged", {"from": "working", "to": "completed", "source": "poll"}, "completed"),
        ]
        for version, (kind, data, state) in enumerate(timeline):
            store.append(
                "task:demo-1",
                version,
                [NewEvent(kind, data)],
                projection=Projection({"state": state}, category="task", status=state),
            )

        print(f"store: {url}  (schema {store.schema_revision()})\n")
        for event in store.read_all():
            print(
                f"  #{event.position:<3} {event.stream_id:<30} v{event.version:<3} "
                f"{event.type:<22} {event.payload}"
            )
        print()
        for head in store.streams():
            broken = store.verify_stream(head.stream_id)
            verdict = "chain verified" if broken is None else f"BROKEN: {broken}"
            print(f"  {head.stream_id:<30} version {head.version}  {head.state}  {verdict}")
        print(f"\n  card snapshots: {store.snapshot_revisions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
