"""Card bytes to a JSON value with every limit checked, and the RFC 8785 hashes (pure).

Split from :mod:`.model`: decoding untrusted bytes (UTF-8, JSON, nesting depth, duplicate
keys, finite numbers, lone surrogates) is checked iteratively, so hostile nesting cannot exhaust
the stack, and every refusal names the field it is about.

RFC 8785 numbers are IEEE-754 doubles written as ECMAScript's ``Number.prototype.toString``
writes them (``1e21`` as ``1e+21``, ``1e20`` as ``100000000000000000000``, ``4.50`` as ``4.5``).
An integer beyond ±(2**53-1) is the double nearest it, as ``JSON.parse`` reads it:
``9007199254740993`` is written ``9007199254740992``. Only a number no double holds (NaN,
Infinity, an integer past the largest double) is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Final

import rfc8785

from cardfence.engine.fields import FieldError, join

SAFE_INTEGER: Final = 2**53 - 1  # beyond it an integer is written as the double nearest it


class DuplicateKeys(dict[str, Any]):
    """An object that repeated a key; reported with its path by the tree check."""

    duplicate: str = ""


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = DuplicateKeys(obj)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.duplicate = key
            break
        seen.add(key)
    return marked


def decode(body: bytes, max_depth: int) -> object:
    try:
        text = bytes(body).decode("utf-8-sig")  # a leading BOM is tolerated (RFC 8259 §8.1)
    except UnicodeDecodeError as exc:
        raise FieldError("", f"body is not UTF-8 (byte {exc.start})") from None
    try:
        # NaN/Infinity become floats here so the tree check can reject them with their path.
        doc = json.loads(text, object_pairs_hook=object_pairs, parse_constant=float)
    except json.JSONDecodeError as exc:
        raise FieldError("", f"body is not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise FieldError("", f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise FieldError("", f"body is not acceptable JSON ({exc})") from None
    check_tree(doc, max_depth)
    return doc


def check_tree(doc: object, max_depth: int) -> None:
    """Depth, numbers and strings, iteratively (no recursion on hostile nesting)."""
    # Paths are linked (parent, key) pairs, turned into text only when something is wrong.
    stack: list[tuple[object, Any, int]] = [(doc, None, 1)]
    while stack:
        value, at, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > max_depth:
                raise FieldError(path_of(at), f"nested deeper than {max_depth} levels")
            if isinstance(value, DuplicateKeys):
                raise FieldError(path_of((at, value.duplicate)), "duplicate key")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str) and not is_utf8(key):
                    raise FieldError(path_of((at, key)), "key is not valid Unicode")
                stack.append((child, (at, key), depth + 1))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, float) and not math.isfinite(value):
            raise FieldError(path_of(at), "NaN and Infinity are not JSON numbers")
        elif isinstance(value, int) and abs(value) > SAFE_INTEGER and not is_double(value):
            raise FieldError(
                path_of(at), "number beyond the largest double (±1.7976931348623157e+308)"
            )
        elif isinstance(value, str) and not is_utf8(value):
            raise FieldError(path_of(at), "string is not valid Unicode (lone surrogate)")


def is_double(number: int) -> bool:
    try:
        float(number)
    except OverflowError:
        return False
    return True


def is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def path_of(at: Any) -> str:
    keys: list[str | int] = []
    while at is not None:
        at, key = at
        keys.append(key)
    text = ""
    for key in reversed(keys):
        text = f"{text}[{key}]" if isinstance(key, int) else join(text, key)
    return text


def canonical(value: Any, path: str) -> bytes:
    """RFC 8785 bytes of ``value``; see the module docstring for numbers."""
    try:
        try:
            return bytes(rfc8785.dumps(value))
        except rfc8785.IntegerDomainError:  # rfc8785 refuses integers past ±(2**53-1)
            return bytes(rfc8785.dumps(as_doubles(value)))
    except (
        rfc8785.CanonicalizationError,
        RecursionError,
        ValueError,
        TypeError,
        OverflowError,  # an integer past the largest double
    ) as exc:
        raise FieldError(path, f"cannot be canonicalised (RFC 8785): {exc}") from None


def as_doubles(value: Any) -> Any:
    """A copy of ``value`` with each integer beyond ±(2**53-1) made the double nearest it."""
    if isinstance(value, dict):
        return {key: as_doubles(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [as_doubles(child) for child in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > SAFE_INTEGER:
        return float(value)  # round half to even, as ECMAScript reads the literal
    return value


def sha256(value: Any, path: str) -> str:
    return hashlib.sha256(canonical(value, path)).hexdigest()
