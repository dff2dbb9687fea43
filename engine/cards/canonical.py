"""Card bytes to a JSON value with every limit checked, and the RFC 8785 hashes (pure).

Split from :mod:`.model`: decoding untrusted bytes (UTF-8, JSON, nesting depth, duplicate
keys, I-JSON numbers, lone surrogates) is checked iteratively, so hostile nesting cannot exhaust
the stack, and every refusal names the field it is about.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Final

import rfc8785

JSON_NUMBER_LIMIT: Final = 2**53 - 1  # I-JSON: integers beyond lose precision as doubles


class Invalid(Exception):
    """Raised inside the parser; parse_card turns it into CardInvalidError with the URL."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.field = path
        self.problem = problem


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
        raise Invalid("", f"body is not UTF-8 (byte {exc.start})") from None
    try:
        # NaN/Infinity become floats here so the tree check can reject them with their path.
        doc = json.loads(text, object_pairs_hook=object_pairs, parse_constant=float)
    except json.JSONDecodeError as exc:
        raise Invalid("", f"body is not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise Invalid("", f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise Invalid("", f"body is not acceptable JSON ({exc})") from None
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
                raise Invalid(path_of(at), f"nested deeper than {max_depth} levels")
            if isinstance(value, DuplicateKeys):
                raise Invalid(path_of((at, value.duplicate)), "duplicate key")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str) and not is_utf8(key):
                    raise Invalid(path_of((at, key)), "key is not valid Unicode")
                stack.append((child, (at, key), depth + 1))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, float) and not math.isfinite(value):
            raise Invalid(path_of(at), "NaN and Infinity are not JSON numbers")
        elif isinstance(value, int | float) and abs(value) > JSON_NUMBER_LIMIT:
            # Floats too: RFC 8785 writes 2.0**60 as integer digits, which would not re-parse.
            raise Invalid(path_of(at), "number outside the I-JSON range ±(2**53-1)")
        elif isinstance(value, str) and not is_utf8(value):
            raise Invalid(path_of(at), "string is not valid Unicode (lone surrogate)")


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


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def canonical(value: Any, path: str) -> bytes:
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, RecursionError, ValueError, TypeError) as exc:
        raise Invalid(path, f"cannot be canonicalised (RFC 8785): {exc}") from None


def sha256(value: Any, path: str) -> str:
    return hashlib.sha256(canonical(value, path)).hexdigest()
