"""The typed field reads that card and answer parsing share (engine/cards/fields.py): each value
read
as what it must be, and every refusal naming the dotted path of the field and what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from cardfence.engine.cards.fields import (
    FieldError,
    as_object,
    items,
    join,
    kind,
    objects,
    optional_object,
)

DOC: dict[str, Any] = {
    "empty": None,
    "status": {"state": "working"},
    "skills": [{"id": "a"}, {"id": "b"}],
    "mixed": [{"id": "a"}, "b"],
    "text": "hi",
}


def refused(read: Any, *args: Any, **options: Any) -> tuple[str, str]:
    with pytest.raises(FieldError) as caught:
        read(*args, **options)
    return caught.value.path, caught.value.detail


@pytest.mark.parametrize(
    ("value", "said"),
    [({}, "an object"), ([], "a list"), ("", "a string"), (True, "a boolean"), (None, "null"),
     (0, "a number"), (1.5, "a number")],
)  # fmt: skip
def test_kind_names_each_json_type(value: object, said: str) -> None:
    assert kind(value) == said


def test_join_nests_a_key_under_its_path_and_the_document_root_has_none() -> None:
    assert join("", "status") == "status"
    assert join("task.status", "state") == "task.status.state"


def test_as_object_takes_an_object_and_refuses_anything_else_with_its_path() -> None:
    assert as_object({"a": 1}, "task") == {"a": 1}
    assert refused(as_object, [], "task.status") == ("task.status", "must be an object, not a list")
    assert refused(as_object, None, "task") == ("task", "must be an object, not null")
    assert refused(as_object, None, "task", required=True) == ("task", "required: an object")


def test_optional_object_reads_absent_and_null_as_empty_and_names_a_wrong_one() -> None:
    assert optional_object(DOC, "absent", "card") == {}
    assert optional_object(DOC, "empty", "card") == {}
    assert optional_object(DOC, "status", "task") == {"state": "working"}
    assert refused(optional_object, DOC, "text", "task") == (
        "task.text", "must be an object, not a string",
    )  # fmt: skip


def test_items_pair_each_element_with_its_path() -> None:
    assert items(DOC, "mixed", "card") == [({"id": "a"}, "card.mixed[0]"), ("b", "card.mixed[1]")]
    assert items(DOC, "absent", "card") == []
    assert items(DOC, "empty", "card") == []
    assert refused(items, DOC, "status", "card") == ("card.status", "must be a list, not an object")


def test_objects_refuse_the_first_element_that_is_not_an_object_by_its_path() -> None:
    assert objects(DOC, "skills", "") == [({"id": "a"}, "skills[0]"), ({"id": "b"}, "skills[1]")]
    assert refused(objects, DOC, "mixed", "card") == (
        "card.mixed[1]", "must be an object, not a string",
    )  # fmt: skip


def test_a_field_error_reads_as_its_path_and_what_is_wrong() -> None:
    assert str(FieldError("skills[1].id", "required: a non-empty string")) == (
        "skills[1].id: required: a non-empty string"
    )
    assert str(FieldError("", "body is not JSON")) == "body is not JSON"
