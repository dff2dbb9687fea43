"""Remote JSON bytes to a JSON value under one discipline, and the RFC 8785 hashes of cards (pure).

:func:`loads` is the one reader of every JSON document a remote sends (R16): Agent Cards and
their key sets, answers (JSON-RPC envelopes and HTTP+JSON bodies), stream events, push bodies,
token responses and OpenID Connect discovery documents. It reads I-JSON (RFC 7493): UTF-8 only,
no duplicate member names at any depth, no NaN, Infinity or number beyond the double range; a
refusal names the member it is about. :func:`decode` adds what a card is held to besides
(nesting depth, lone surrogates, integers past the largest double), checked iteratively, so
hostile nesting cannot exhaust the stack.

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

from cardfence.engine.cards.fields import FieldError, join

SAFE_INTEGER: Final = 2**53 - 1  # beyond it an integer is written as the double nearest it
DUPLICATE: Final = "duplicate member name"
NON_FINITE: Final = "NaN and Infinity are not JSON numbers"
_BOM: Final = b"\xef\xbb\xbf"


class DuplicateKeys(dict[str, Any]):
    """An object that repeated a member name, as the second read of a refused document marks it."""

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


class _Refused(Exception):
    """Stops the strict read at the first duplicate or non-finite number; where it is is found
    by reading once more (only a refused document pays for that)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise _Refused
    return obj


def _no_constant(name: str) -> object:
    raise _Refused


def _finite(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # out of the double range, as 1e400
        raise _Refused
    return value


# Built once: json.loads given hooks builds a decoder per call (a fifth of a 1 KB read's time).
# A pairs hook is the only way to see a repeated name (the default parser keeps the last value);
# the cheapest one makes the dict, then compares two lengths: a 1 KB answer takes about 1.3 times
# as long as with no hook (3 µs more, timeit), little beside a delivery's append.
_STRICT: Final = json.JSONDecoder(
    object_pairs_hook=_unique, parse_constant=_no_constant, parse_float=_finite
)
_MARKING: Final = json.JSONDecoder(object_pairs_hook=object_pairs, parse_constant=float)


def loads(body: bytes, *, max_depth: int | None = None) -> object:
    """The JSON value of ``body`` read as I-JSON (RFC 7493), or :class:`FieldError` saying why
    not and, for a duplicate member name or a non-finite number, where (``task.status``).

    ``max_depth`` is only named when the parser's own stack gives out first (the caller checks
    the limit itself, as :func:`decode` does)."""
    raw = bytes(body)
    skipped = 3 if raw.startswith(_BOM) else 0  # a leading BOM is tolerated (RFC 8259 §8.1)
    try:
        text = raw[skipped:].decode()
    except UnicodeDecodeError as exc:
        raise FieldError("", f"body is not UTF-8 (byte {exc.start + skipped})") from None
    try:
        return _parse(_STRICT, text, max_depth)
    except _Refused:
        marked = _parse(_MARKING, text, max_depth)
    raise _refusal(marked)


def _parse(decoder: json.JSONDecoder, text: str, max_depth: int | None) -> object:
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise FieldError("", f"body is not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        limit = f"{max_depth} levels" if max_depth else "the parser's stack"
        raise FieldError("", f"nested deeper than {limit}") from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise FieldError("", f"body is not acceptable JSON ({exc})") from None


def _refusal(doc: object) -> FieldError:
    """The duplicate member name or non-finite number in ``doc``, with its path (iteratively)."""
    stack: list[tuple[object, Any]] = [(doc, None)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, DuplicateKeys):
            return FieldError(path_of((at, value.duplicate)), DUPLICATE)
        if isinstance(value, float) and not math.isfinite(value):
            return FieldError(path_of(at), NON_FINITE)
        if isinstance(value, dict):
            stack.extend((child, (at, key)) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((child, (at, index)) for index, child in enumerate(value))
    return FieldError("", "body is not I-JSON")  # not reached: the strict read refused something


def decode(body: bytes, max_depth: int) -> object:
    """A card's (or key set's) JSON value: :func:`loads`, then the card's own limits."""
    doc = loads(body, max_depth=max_depth)
    check_tree(doc, max_depth)
    return doc


def check_tree(doc: object, max_depth: int) -> None:
    """Depth, integers and strings, iteratively (no recursion on hostile nesting); duplicates
    and non-finite numbers were refused by :func:`loads`."""
    # Paths are linked (parent, key) pairs, turned into text only when something is wrong.
    stack: list[tuple[object, Any, int]] = [(doc, None, 1)]
    while stack:
        value, at, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > max_depth:
                raise FieldError(path_of(at), f"nested deeper than {max_depth} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str) and not is_utf8(key):
                    raise FieldError(path_of((at, key)), "key is not valid Unicode")
                stack.append((child, (at, key), depth + 1))
        elif isinstance(value, bool):
            continue
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
