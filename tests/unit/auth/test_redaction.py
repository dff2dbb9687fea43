"""What hides a request's secrets in what the remote sends back (engine/auth/redaction.py): every
form a secret may take there, hidden in text and in an answer's bytes before anything reads them,
with the JSON left valid and the rest of the answer untouched."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cardfence.engine.auth.redaction import ANYWHERE, Redaction, redaction, secret_forms

SECRET = 'tok/en+"bearer é-9d8e7f6a'


def _every_char_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04X}" for c in text)


FORMS = {
    "as sent": SECRET,
    "percent-encoded": quote(SECRET, safe=""),
    "percent-encoded, lower-case hex": quote(SECRET, safe="").lower(),
    "form-encoded": quote_plus(SECRET, safe=""),
    "a query's + kept": SECRET.replace(" ", "+"),
    "base64": base64.b64encode(SECRET.encode()).decode(),
    "URL-safe base64 unpadded": base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("="),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_every_form_of_a_secret_is_hidden_in_text(form: str) -> None:
    assert Redaction([SECRET]).text(f"you sent: {form}.") == "you sent: ***."


@pytest.mark.parametrize(
    "literal",
    [
        json.dumps(SECRET),
        json.dumps(SECRET, ensure_ascii=False),
        json.dumps(SECRET).replace("/", "\\/"),
        '"' + _every_char_escaped(SECRET) + '"',
    ],
    ids=["escaped", "unicode kept", "solidus escaped", "every character escaped"],
)
def test_a_secret_spelled_by_json_escapes_is_hidden_and_the_document_stays_json(
    literal: str,
) -> None:
    body = f'{{"error": {{"code": -32603, "message": {literal}, "n": 1}}}}'.encode()
    hidden = json.loads(Redaction([SECRET]).body(body))
    assert hidden == {"error": {"code": -32603, "message": "***", "n": 1}}


def test_an_answer_without_the_secret_is_left_byte_for_byte() -> None:
    body = b'{"result": {"text": "caf\\u00e9 \\"quoted\\"", "n": [1, 2]}}'
    assert Redaction([SECRET]).body(body) == body


def test_the_longest_form_goes_first_so_a_secret_inside_another_is_hidden_whole() -> None:
    assert Redaction(["abcdefgh", "abcdefgh-ijkl"]).text("x abcdefgh-ijkl y") == "x *** y"


def test_a_short_secret_is_hidden_where_it_stands_alone_never_inside_a_word() -> None:
    short = "x" * (ANYWHERE - 1)
    hide = Redaction([short])
    assert hide.text(f"key {short}, then a{short}b") == f"key ***, then a{short}b"
    assert Redaction(["x" * ANYWHERE]).text("a" + "x" * ANYWHERE + "b") == "a***b"


def test_no_secrets_hide_nothing_and_are_false() -> None:
    empty = redaction(("", ""))
    assert not empty
    assert empty.body(b'"tok"') == b'"tok"'
    assert redaction((SECRET,)) is redaction((SECRET,))  # made once per set of secrets


def test_the_forms_of_the_empty_secret_are_none() -> None:
    assert secret_forms("") == frozenset()


@example(secret="00000000", before="Ő", after="", escape_all=False)  # hiding cut the escape of Ő
@given(
    secret=st.text(min_size=ANYWHERE, max_size=40).filter(lambda s: s.strip() == s),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
    escape_all=st.booleans(),
)
def test_any_secret_repeated_in_any_json_string_never_survives_the_redaction(
    secret: str, before: str, after: str, escape_all: bool
) -> None:
    text = before + secret + after
    literal = '"' + _every_char_escaped(text) + '"' if escape_all else json.dumps(text)
    body = ('{"message": ' + literal + "}").encode("utf-8", "surrogatepass")
    hidden = Redaction([secret]).body(body)
    assert secret not in json.loads(hidden)["message"]


def test_a_secret_spelled_like_the_text_of_an_escape_leaves_the_escape_whole() -> None:
    body = json.dumps({"message": "Ő00000000 and 00000000"}).encode()  # "\u015000000000 ..."
    assert json.loads(Redaction(["00000000"]).body(body)) == {"message": "Ő*** and ***"}


def test_the_property_catches_a_redaction_that_reads_no_json_escapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Redaction, "_piece", lambda self, piece: piece)
    with pytest.raises(AssertionError):
        test_any_secret_repeated_in_any_json_string_never_survives_the_redaction()
