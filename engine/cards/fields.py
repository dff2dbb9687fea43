"""Typed reads of the fields of a JSON document an agent sent (pure).

An Agent Card (:mod:`.cards.model`) and a task, message or stream event (:mod:`.remote`) are
read with these: a field of the wrong type raises :class:`FieldError` naming its dotted path
(``skills[2].inputModes``) and what it must be, and each reader turns that into its own public
error with the URL the document came from.
"""

from __future__ import annotations

from typing import Any


class FieldError(Exception):
    """A field of a document is wrong: ``path`` (dotted, ``""`` for the document) and what is
    wrong with it."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}" if path else detail)
        self.path = path
        self.detail = detail


def kind(value: object) -> str:
    """What a JSON value is, in words (``an object``, ``null``...), for a refusal's detail."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def join(path: str, key: str) -> str:
    """The path of ``key`` inside the object at ``path``."""
    return f"{path}.{key}" if path else key


def as_object(value: object, path: str, *, required: bool = False) -> dict[str, Any]:
    """``value`` when it is an object; null is refused as ``required`` when it is."""
    if value is None and required:
        raise FieldError(path, "required: an object")
    if not isinstance(value, dict):
        raise FieldError(path, f"must be an object, not {kind(value)}")
    return value


def optional_object(doc: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    """An object field; absent and null read as ``{}``."""
    value = doc.get(key)
    return {} if value is None else as_object(value, join(path, key))


def items(doc: dict[str, Any], key: str, path: str) -> list[tuple[object, str]]:
    """The elements of a list field, each with its path (``artifacts[2]``); absent and null are
    empty."""
    value = doc.get(key)
    if value is None:
        return []
    where = join(path, key)
    if not isinstance(value, list):
        raise FieldError(where, f"must be a list, not {kind(value)}")
    return [(item, f"{where}[{n}]") for n, item in enumerate(value)]


def objects(doc: dict[str, Any], key: str, path: str) -> list[tuple[dict[str, Any], str]]:
    """The elements of a list field that must each be an object, with their paths."""
    return [(as_object(item, at), at) for item, at in items(doc, key, path)]
