"""Secrets a remote sends back, hidden before anything reads them (R15: never leak, never persist).

A hostile or careless agent may repeat what a request carried: an ``Authorization`` header in a
JSON-RPC error message, an API key from the query string in an echo of the URL, a webhook token
in the stored push configuration it answers with. The hash-chained log cannot forget, so the
secrets are taken out of the answer's bytes as they arrive -- before the answer is decoded, cut,
parsed into an error, recorded, logged or shown -- in every form the remote may have given them:

- as sent;
- percent-encoded (``%2F`` or ``%2f``; ``+`` for a space);
- JSON-escaped (``\\"``, ``\\/``, ``\\u00e9`` or the character itself, and any other spelling
  of a JSON string: each string of the answer that holds an escape is decoded and read again);
- base64, standard or URL-safe, with or without its padding (Basic's ``user:password`` is one
  of the secrets it is asked to hide, so its base64 is too).

A secret of :data:`ANYWHERE` characters or more is hidden wherever it appears; a shorter form
only where it stands alone (not inside a longer word or token), or every short secret would
maim what the answer says. The longest form goes first, so one containing another is hidden
whole. Pure: no I/O.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, quote_plus

__all__ = ["ANYWHERE", "Redaction", "redaction", "secret_forms"]

ANYWHERE: Final = 8
# RFC 7235's token68 and word characters: what a short secret must not touch to stand alone.
_TOKEN_CHARACTER: Final = r"[\w.~+/=-]"
_PERCENT: Final = re.compile(r"%[0-9A-F]{2}")
# An answer cut into its JSON strings and what lies between them (exact for a JSON document).
_TOKENS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[^"]+|"', re.DOTALL)


def secret_forms(secret: str) -> frozenset[str]:
    """Every spelling of ``secret`` that :class:`Redaction` hides (see the module docstring)."""
    if not secret:
        return frozenset()
    # A query's "+" read back by a server that decodes percent-escapes only is a space no more.
    spellings = {secret, secret.replace(" ", "+")}
    forms = set(spellings)
    for spelling in spellings:
        for quoted in (quote(spelling, safe=""), quote_plus(spelling, safe="")):
            forms |= {quoted, _PERCENT.sub(lambda m: m.group().lower(), quoted)}
    for escaped in (json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]):
        forms |= {escaped, escaped.replace("/", "\\/")}
    raw = secret.encode("utf-8", "surrogatepass")
    for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        forms |= {encoded, encoded.rstrip("=")}
    return frozenset(forms)


class Redaction:
    """What hides a set of secrets in text and in an answer's bytes; false when there are none.

    Made by :func:`redaction` (cached per set of secrets: a task's requests share theirs).
    """

    __slots__ = ("_bytes", "_mark", "_text")

    def __init__(self, secrets: Iterable[str], mark: str = "***") -> None:
        forms = sorted(set().union(*map(secret_forms, secrets)), key=lambda f: (-len(f), f))
        alternatives = [_alternative(form) for form in forms]
        self._mark = mark
        self._text = re.compile("|".join(alternatives)) if forms else None
        pattern = "|".join(alternatives).encode("utf-8", "surrogatepass")
        self._bytes = re.compile(pattern) if forms else None

    def __bool__(self) -> bool:
        return self._text is not None

    def text(self, text: str) -> str:
        """``text`` with every form of every secret replaced by the mark."""
        return text if self._text is None else self._text.sub(self._mark, text)

    def body(self, raw: bytes) -> bytes:
        """An answer's bytes (JSON or not) with every form of every secret replaced by the mark.

        Where the answer holds JSON escapes, each JSON string is read on its own: one holding an
        escape is decoded, hidden and encoded again (its escapes may spell a secret no form
        holds, and hiding a form in its escaped spelling could cut an escape in two), so a JSON
        document stays the same JSON but for the secrets. Only a JSON string's content is ever
        shown or kept; what does not decode is hidden as bytes."""
        if self._bytes is None:
            return raw
        if b"\\" not in raw:
            return self._bytes.sub(self._mark.encode(), raw)
        return b"".join(self._piece(token.group()) for token in _TOKENS.finditer(raw))

    def _piece(self, piece: bytes) -> bytes:
        if len(piece) > 1 and piece[:1] == b'"' and b"\\" in piece:
            try:
                value = json.loads(piece)
            except ValueError:  # not a string of a JSON document after all
                value = None
            if isinstance(value, str):
                hidden = self.text(value)
                return piece if hidden == value else json.dumps(hidden).encode()
        return self._bytes.sub(self._mark.encode(), piece) if self._bytes else piece


@functools.lru_cache(maxsize=256)
def redaction(secrets: tuple[str, ...], mark: str = "***") -> Redaction:
    """The :class:`Redaction` of ``secrets`` (empty strings ignored), made once per set."""
    return Redaction((s for s in secrets if s), mark)


def _alternative(form: str) -> str:
    escaped = re.escape(form)
    if len(form) >= ANYWHERE:
        return escaped
    return rf"(?<!{_TOKEN_CHARACTER}){escaped}(?!{_TOKEN_CHARACTER})"
