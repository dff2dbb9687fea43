"""Content out of line (R17): what an event keeps of each part, and the record keeping the rest."""

from __future__ import annotations

import json

from cardfence.engine.core import content
from cardfence.engine.core import events as ev
from cardfence.store.chain import salted_hash

SALT = "ab" * 16


def _bodies(kept: list[content.Kept]) -> list[dict[str, object]]:
    return [json.loads(k.body) for k in kept]


def test_a_message_keeps_each_part_s_outline_and_its_content_and_metadata_in_records() -> None:
    payload = {
        "message_id": "m-1",
        "metadata": {"trace": "t-1"},
        "parts": [
            {"kind": "text", "media_type": "text/plain", "text": "héllo"},
            {"kind": "file", "media_type": "application/pdf", "bytes": "JVBERgA=",
             "filename": "a.pdf"},
        ],
    }  # fmt: skip
    stored, kept = content.outlined(ev.TASK_SUBMITTED, payload, SALT)
    assert "metadata" not in stored
    assert [{k: p[k] for k in ("kind", "media_type", "size")} for p in stored["parts"]] == [
        {"kind": "text", "media_type": "text/plain", "size": 6},
        {"kind": "file", "media_type": "application/pdf", "size": 5},
    ]
    assert [p["sha256"] for p in stored["parts"]] == [k.digest for k in kept]
    assert all(salted_hash(SALT, k.body) == k.digest for k in kept)
    assert _bodies(kept) == [
        {"text": "héllo", "message_metadata": {"trace": "t-1"}},
        {"bytes": "JVBERgA=", "filename": "a.pdf", "message_metadata": {"trace": "t-1"}},
    ]


def test_a_message_given_as_its_one_text_is_one_text_part() -> None:
    payload = {"task": "k", "text": "hi", "media_type": "text/markdown"}
    stored, [kept] = content.outlined(ev.TASK_SUBMITTED, payload, SALT)
    assert "text" not in stored
    assert stored["media_type"] == "text/markdown"
    assert stored["parts"] == [
        {"kind": "text", "media_type": "text/markdown", "size": 2, "sha256": kept.digest}
    ]


def test_a_status_message_leaves_its_text_to_its_parts() -> None:
    payload = {"from": "working", "to": "input-required", "message": "which one?"}
    stored, [kept] = content.outlined(ev.STATE_CHANGED, payload, SALT)
    assert "message" not in stored
    [outline] = stored["message_parts"]
    assert (outline["kind"], outline["sha256"]) == ("text", kept.digest)
    assert json.loads(kept.body) == {"text": "which one?"}


def test_an_artifact_s_name_is_content_and_a_remote_file_by_bytes_is_a_file() -> None:
    payload = {
        "artifact_id": "a1",
        "name": "report of Q3",
        "parts": [{"kind": "raw", "data": "AAEC", "filename": "r.bin"}],
        "source": "poll",
    }
    stored, [kept] = content.outlined(ev.ARTIFACT_RECEIVED, payload, SALT)
    assert stored["name"] is None
    assert stored["parts"] == [{"kind": "file", "size": 3, "sha256": kept.digest}]
    assert json.loads(kept.body) == {
        "bytes": "AAEC", "filename": "r.bin", content.ARTIFACT_NAME: "report of Q3"
    }  # fmt: skip


def test_equal_content_is_one_record_in_a_task_and_another_digest_under_another_salt() -> None:
    part = {"kind": "text", "media_type": "text/plain", "text": "same"}
    stored, kept = content.outlined(ev.REPLY_SENT, {"parts": [part, part]}, SALT)
    assert len(kept) == 1
    assert stored["parts"][0] == stored["parts"][1]
    other, _ = content.outlined(ev.REPLY_SENT, {"parts": [part]}, "cd" * 16)
    assert other["parts"][0]["sha256"] != stored["parts"][0]["sha256"]


def test_an_event_without_content_is_stored_as_it_is() -> None:
    payload = {"from": "working", "to": "completed", "message": None}
    assert not content.carries_content(ev.STATE_CHANGED, payload)
    assert content.outlined(ev.STATE_CHANGED, payload, SALT) == (payload, [])


def test_outlines_read_back_their_content_and_a_missing_record_reads_as_erased() -> None:
    parts = [{"kind": "text", "text": "a"}, {"kind": "data", "data": {"x": 1}}]
    stored, kept = content.outlined(ev.REPLY_SENT, {"parts": parts}, SALT)
    bodies = {k.digest: json.loads(k.body) for k in kept}
    back, around = content.resolved_parts(stored["parts"], bodies)
    assert [{k: v for k, v in p.items() if k not in ("size", "sha256")} for p in back] == parts
    assert around == {}
    del bodies[kept[1].digest]
    back, _ = content.resolved_parts(stored["parts"], bodies)
    assert back[1]["erased"] is True
    assert "data" not in back[1]
    assert content.outline_digests(ev.REPLY_SENT, stored) == [k.digest for k in kept]


def test_an_artifact_kept_as_its_digest_keeps_its_name_apart() -> None:
    payload = {"artifact_id": "a1", "name": "huge", "truncated": True, "bytes": 9, "sha256": "0f"}
    stored, [kept] = content.outlined(ev.ARTIFACT_RECEIVED, payload, SALT)
    assert (stored["name"], stored["name_sha256"]) == (None, kept.digest)
    assert json.loads(kept.body) == {content.ARTIFACT_NAME: "huge"}
    assert content.outline_digests(ev.ARTIFACT_RECEIVED, stored) == [kept.digest]
