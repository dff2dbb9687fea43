"""Content kept out of line (R17) reads back byte for byte, and the audit catches any edit of it.

For any message -- parts of every kind (text of any characters, file bytes with or without a
filename, a file by URL, data), with or without metadata -- recorded as a task's first event:
the stored event holds no content, only each part's outline; the content records give every part
and the metadata back exactly as given; the audit passes; and an edit of any one record's body
(one character) is a ``content_mismatch`` at the event that outlines it.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from support.events import submitted
from support.harness import fresh_store

from cardfence.engine.client import audit as audit_module
from cardfence.engine.client.audit import audit
from cardfence.engine.client.tasklog import TaskLog, task_stream_id
from cardfence.engine.core import parts as p
from cardfence.store.schema import contents

_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
PARTS = st.one_of(
    st.builds(p.Text, st.text(max_size=40), st.sampled_from(["text/plain", "text/markdown"])),
    st.builds(
        p.File,
        data=st.binary(max_size=64),
        filename=st.none() | _NAMES,
        media_type=st.none() | st.just("application/pdf"),
    ),
    st.builds(p.File, url=st.just("https://files.example/x.pdf"), filename=st.none() | _NAMES),
    st.builds(p.Data, st.dictionaries(st.text(max_size=6), _JSON, max_size=3)),
)
MESSAGES = st.tuples(
    st.lists(PARTS, min_size=1, max_size=4),
    st.none() | st.dictionaries(st.text(min_size=1, max_size=6), _JSON, min_size=1, max_size=2),
    st.data(),
)


def content_reads_back_and_edits_are_caught() -> None:
    @settings(deadline=None, max_examples=40)
    @given(MESSAGES)
    def holds(message: tuple[list[p.Part], dict[str, Any] | None, st.DataObject]) -> None:
        given_parts, metadata, data = message
        recorded = [p.recorded(part) for part in given_parts]
        with fresh_store() as store:
            log = TaskLog(store)
            first = submitted("t", text=None, parts=recorded, metadata=metadata, card_revision=None)
            log.create("t", [first])
            stored = store.read_stream(task_stream_id("t"))[0]
            outlines = stored.data["parts"]
            assert all(set(o) <= {"kind", "media_type", "size", "sha256"} for o in outlines)
            assert "metadata" not in stored.data

            back = log.first_event("t")
            assert [
                {k: v for k, v in part.items() if k not in ("size", "sha256")}
                for part in back["parts"]
            ] == recorded
            assert back.get("metadata") == metadata
            assert [p.recorded(p.from_recorded(part)) for part in back["parts"]] == recorded  # type: ignore[arg-type]
            assert audit(store).ok

            with store.engine.connect() as conn:
                rows = list(conn.execute(sa.select(contents)))
            row = data.draw(st.sampled_from(rows))
            at = data.draw(st.integers(0, len(row.body) - 1))
            edited = row.body[:at] + ("x" if row.body[at] != "x" else "y") + row.body[at + 1 :]
            with store.engine.begin() as conn:
                conn.execute(
                    contents.update().where(contents.c.digest == row.digest).values(body=edited)
                )
            kinds = {(v.kind, v.position) for v in audit(store).violations}
            assert kinds == {("content_mismatch", stored.position)}

    holds()


def test_content_out_of_line_reads_back_whole_and_an_edit_of_it_is_caught() -> None:
    content_reads_back_and_edits_are_caught()


def test_property_catches_an_audit_that_trusts_content_records_without_hashing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted bug: the audit takes a content record for its digest's without hashing it."""
    monkeypatch.setattr(audit_module, "_hashes_to", lambda salt, body, digest: True)
    with pytest.raises(AssertionError):
        content_reads_back_and_edits_are_caught()
