"""Errors raised by the event store.

The root of cardfence's one error tree, :class:`CardfenceError`, lives here because ``store`` is the
lowest layer: ``engine.errors`` hangs the A2A errors beneath it. The whole tree is drawn in
``engine/errors.py``.
"""

from __future__ import annotations


class CardfenceError(Exception):
    """Base class of every error cardfence raises on purpose."""


class StoreError(CardfenceError):
    """The event store refused or failed an operation; nothing was written."""


class ConcurrencyError(StoreError):
    """Another writer appended to the stream first (optimistic concurrency)."""

    def __init__(self, stream_id: str, expected_version: int, actual_version: int | None) -> None:
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        actual = "unknown" if actual_version is None else str(actual_version)
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, not {expected_version}: "
            "another writer appended first (nothing was written)"
        )


class LeaseLostError(StoreError):
    """An append was made under a lease another process has since claimed (or the work ended)."""

    def __init__(self, stream_id: str, owner: str, epoch: int, held_by: str | None) -> None:
        self.stream_id = stream_id
        self.owner = owner
        self.epoch = epoch
        self.held_by = held_by
        now = "no process (the work ended)" if held_by is None else repr(held_by)
        super().__init__(
            f"stream {stream_id!r}: lease {epoch} of {owner!r} was lost, now held by {now} "
            "(nothing was written)"
        )


class PayloadError(StoreError):
    """An event payload or projection cannot be stored (not JSON, out of range, too large)."""

    def __init__(self, stream_id: str, detail: str) -> None:
        self.stream_id = stream_id
        self.detail = detail
        super().__init__(f"stream {stream_id!r}: {detail} (nothing was written)")


class CorruptRecordError(StoreError):
    """A stored event or projection cannot be read as cardfence wrote it (altered in the store)."""

    def __init__(self, stream_id: str, record: str, detail: str) -> None:
        self.stream_id = stream_id
        self.record = record
        self.detail = detail
        super().__init__(
            f"stream {stream_id!r}, {record}: {detail}: altered in the store? (nothing was "
            "changed; 'cardfence audit' lists every such record)"
        )

    @classmethod
    def in_event(
        cls, stream_id: str, version: int, position: int, type_: str, detail: str
    ) -> CorruptRecordError:
        return cls(stream_id, f"event {version} (position {position}, {type_})", detail)

    @classmethod
    def in_projection(cls, stream_id: str, detail: str) -> CorruptRecordError:
        return cls(stream_id, "its projection", detail)


class SnapshotMismatchError(StoreError):
    """A card snapshot's body does not hash to the key it was offered under."""

    def __init__(self, revision: str, actual: str) -> None:
        self.revision = revision
        self.actual = actual
        super().__init__(
            f"card snapshot offered as {revision[:16]}… hashes to {actual[:16]}… "
            "(nothing was written)"
        )


class ContentMismatchError(StoreError):
    """A content record's body and salt do not hash to the digest it was offered under (R17)."""

    def __init__(self, stream_id: str, digest: str, actual: str) -> None:
        self.stream_id = stream_id
        self.digest = digest
        self.actual = actual
        super().__init__(
            f"content of {stream_id!r} offered as {digest[:16]}… hashes to {actual[:16]}… "
            "(nothing was written)"
        )


class SchemaTooNewError(StoreError):
    """The database was migrated by a newer cardfence than this one."""

    def __init__(self, url: str, revision: str) -> None:
        self.url = url
        self.revision = revision
        super().__init__(
            f"{url}: schema revision {revision!r} is newer than this cardfence knows "
            "(upgrade cardfence; the database was not touched)"
        )


class StoreUnavailableError(StoreError):
    """The database could not be opened or answered with an error."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"{url}: {detail} (nothing was written)")
