"""A message a caller sends, checked (engine/core/messages.py), and the message a TaskSubmitted
recorded, read back whichever cardfence wrote it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from cardfence.engine.core.messages import (
    Message,
    json_object,
    outgoing,
    recorded_parts,
    submitted_message,
)
from cardfence.engine.core.parts import Data, File, Text
from cardfence.engine.errors import UsageError

PDF = File(data=b"%PDF-1.7\x00\xff", filename="a.pdf", media_type="application/pdf")
LINK = File(url="https://files.example/b.png", filename="b.png", media_type="image/png")
FORM = Data({"answer": "yes", "n": [1, 2]})


def test_the_text_given_is_the_first_part_then_the_parts_in_their_order() -> None:
    parts, metadata = outgoing("hi", "text/markdown", [PDF, LINK, FORM], {"k": [1]})
    assert parts == (Text("hi", "text/markdown"), PDF, LINK, FORM)
    assert metadata == {"k": [1]}


def test_parts_alone_make_a_message_and_no_metadata_is_none() -> None:
    assert outgoing(None, "text/plain", [FORM]) == ((FORM,), None)


def test_a_message_without_a_part_is_the_callers_error() -> None:
    with pytest.raises(UsageError, match="at least one part"):
        outgoing(None, "text/plain", [])


@pytest.mark.parametrize("part", ["text", {"text": "hi"}, b"bytes"])
def test_a_part_that_is_no_part_type_is_the_callers_error_naming_its_type(part: Any) -> None:
    with pytest.raises(UsageError, match=f"not {type(part).__name__}"):
        outgoing(None, "text/plain", [part])


@pytest.mark.parametrize("data", [[1, 2], "text", 3, None])
def test_a_data_part_sent_must_hold_a_json_object(data: Any) -> None:
    with pytest.raises(UsageError, match="a data part must be a JSON object"):
        outgoing(None, "text/plain", [Data(data)])


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ([1], "must be a JSON object"),
        ({"x": math.nan}, "is not JSON"),
        ({"x": {1, 2}}, "is not JSON"),
        ({1: "a"}, "must be a JSON object with string keys"),
    ],
)
def test_metadata_must_be_a_json_object(metadata: Any, says: str) -> None:
    with pytest.raises(UsageError, match=f"the metadata {says}"):
        outgoing("hi", "text/plain", [], metadata)


def test_a_json_object_is_given_back_as_a_copy() -> None:
    given = {"a": {"b": [1]}}
    copied = json_object(given, "x")
    assert copied == given
    copied["a"]["b"].append(2)
    assert given == {"a": {"b": [1]}}


def test_each_part_is_recorded_inline_with_its_kind_type_and_content() -> None:
    unnamed_type = File(url="https://files.example/b.png", filename="b.png")
    assert recorded_parts([Text("hi"), PDF, unnamed_type, FORM]) == [
        {"kind": "text", "media_type": "text/plain", "text": "hi"},
        {"kind": "file", "media_type": "application/pdf", "bytes": "JVBERi0xLjcA/w==",
         "filename": "a.pdf"},
        {"kind": "url", "media_type": "image/png", "url": "https://files.example/b.png",
         "filename": "b.png"},
        {"kind": "data", "media_type": "application/json", "data": {"answer": "yes", "n": [1, 2]}},
    ]  # fmt: skip


def test_a_submitted_message_reads_back_its_parts_metadata_references_and_modes() -> None:
    doc = {
        "parts": recorded_parts([Text("hi"), PDF, LINK, FORM]),
        "metadata": {"k": 1},
        "references": ["r-1", "r-2"],
        "accepted_output_modes": ["text/*"],
    }
    assert submitted_message(doc) == Message(
        parts=(Text("hi"), PDF, LINK, FORM),
        metadata={"k": 1},
        references=("r-1", "r-2"),
        accepted_output_modes=("text/*",),
    )


def test_a_submitted_message_recorded_before_parts_is_its_one_text_part() -> None:
    old = {"text": "# hi", "media_type": "text/markdown", "skill": "echo"}
    assert submitted_message(old) == Message(parts=(Text("# hi", "text/markdown"),))
    assert submitted_message({"text": "hi"}).parts == (Text("hi", "text/plain"),)


def test_parts_win_over_an_old_text_and_a_part_without_content_is_left_out() -> None:
    outline = {"kind": "file", "media_type": "application/pdf", "size": 3}
    doc = {"text": "old", "parts": [outline, {"kind": "text", "text": "new"}]}
    assert submitted_message(doc).parts == (Text("new"),)
    assert submitted_message({}).parts == ()


def test_a_file_url_carrying_credentials_is_refused_without_naming_them() -> None:
    secret = File(url="https://alice:s3cret@files.example/report.pdf")
    with pytest.raises(UsageError, match="nothing was recorded or sent") as refused:
        outgoing("read this", "text/plain", [secret])
    assert "https://files.example/report.pdf" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    assert "alice" not in str(refused.value)
