"""``run`` and ``reply`` with a message of any parts (docs/cli.md, "Message parts" and
"Conversations"), through the command line in-process against the real a2a-sdk 1.3 agent: the
parts and metadata reach it and come back, a conversation and its references, and every bad
input's one-line typed error, with nothing recorded or sent."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.engine_fixtures import calls
from support.events import read_back

from cardfence.engine.cli.main import run as cli
from cardfence.engine.core.parts import Data, File, Text, from_recorded
from cardfence.store.event_store import EventStore

FAST = ("--max-poll-interval", "0.2", "--max-card-age", "0.3", "--card-timeout", "1")


def _with_parts_skill(card: dict[str, Any]) -> None:
    card["skills"].append(
        {"id": "parts", "name": "Parts", "description": "Sends back what it got.",
         "tags": ["test"], "inputModes": ["*/*"], "outputModes": ["*/*"]}
    )  # fmt: skip


def _json(capsys: pytest.CaptureFixture[str], code: int, *argv: str) -> dict[str, Any]:
    got = cli([*argv, "--json"])
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    return dict(json.loads(out))


def _error(capsys: pytest.CaptureFixture[str], code: int, *argv: str) -> str:
    """Run, assert the exit code, and give the last stderr line (the typed error)."""
    got = cli(list(argv))
    _, err = capsys.readouterr()
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line
    return lines[0]


def _parts(artifact: dict[str, Any]) -> list[Any]:
    return [from_recorded(p) for p in artifact["parts"]]


def test_run_sends_texts_files_urls_data_and_metadata_in_order_and_they_come_back(
    peer: Peer, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peer.mutate_card(_with_parts_skill)
    scan = tmp_path / "scan.png"
    scan.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    raw = tmp_path / "notes"
    raw.write_bytes(b"\x00\x01")
    form = tmp_path / "form.json"
    form.write_text('{"answer": "yes"}')
    task = _json(
        capsys, 0, "run", peer.base_url, "--skill", "parts", "--text", "one", "--text", "two",
        "--file", str(scan), "--file", f"{raw};type=application/x-notes",
        "--file-url", "https://files.example/a/report.pdf", "--data", f"@{form}",
        "--metadata", '{"trace": "t-1"}', "--until", "terminal", "--db", db, *FAST,
    )  # fmt: skip
    assert task["state"] == "completed"
    assert task["references"] == []
    parts, request = task["artifacts"]
    assert _parts(parts) == [
        Text("one"),
        Text("two"),
        File(data=scan.read_bytes(), filename="scan.png", media_type="image/png"),
        File(data=b"\x00\x01", filename="notes", media_type="application/x-notes"),
        File(url="https://files.example/a/report.pdf", filename="report.pdf",
             media_type="application/pdf"),
        Data({"answer": "yes"}),
    ]  # fmt: skip
    assert _parts(request)[0].data["metadata"] == {"trace": "t-1", "skillId": "parts"}


def test_run_continues_a_conversation_and_names_its_references_and_show_gives_them(
    peer: Peer, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    peer.mutate_card(_with_parts_skill)
    first = _json(capsys, 0, "run", peer.base_url, "--skill", "echo", "--text", "one",
                  "--until", "terminal", "--db", db, *FAST)  # fmt: skip
    second = _json(
        capsys, 0, "run", peer.base_url, "--skill", "parts", "--text", "two",
        "--context", first["task"][:8], "--reference", first["task"], "--accept", "text/*",
        "--until", "terminal", "--db", db, *FAST,
    )  # fmt: skip
    assert second["context_id"] == first["context_id"]
    assert second["references"] == [first["task"]]
    request = _parts(second["artifacts"][1])[0].data
    assert request["referenceTaskIds"] == [first["remote_task_id"]]
    assert request["acceptedOutputModes"] == ["text/*"]
    shown = _json(capsys, 0, "show", second["task"], "--db", db)
    assert shown["references"] == [first["task"]]


def test_reply_answers_with_data_and_a_file(
    peer: Peer, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _json(capsys, 0, "run", peer.base_url, "--skill", "ask", "--text", "ask form",
                  "--db", db, *FAST)  # fmt: skip
    assert asked["state"] == "input-required"
    signed = tmp_path / "signed.pdf"
    signed.write_bytes(b"%PDF")
    done = _json(
        capsys, 0, "reply", asked["task"], "--data", '{"answer": "42"}', "--file", str(signed),
        "--metadata", '{"round": 1}', "--until", "terminal", "--db", db,
    )  # fmt: skip
    assert done["state"] == "completed"
    with EventStore.open(db) as store:
        (reply,) = [e.data for e in store.read_stream(f"task:{asked['task']}")
                    if e.type == "ReplySent"]  # fmt: skip
    with EventStore.open(db) as store:
        parts = read_back(store, asked["task"], reply["parts"])  # R17: content out of line
        kept = {d: r.data for d, r in store.contents(f"task:{asked['task']}").items()}
    assert parts == [  # the files first, then the data (docs/cli.md)
        {"kind": "file", "media_type": "application/pdf",
         "bytes": base64.b64encode(b"%PDF").decode(), "filename": "signed.pdf"},
        {"kind": "data", "media_type": "application/json", "data": {"answer": "42"}},
    ]  # fmt: skip
    assert reply["chars"] == 0
    assert [kept[part["sha256"]]["message_metadata"] for part in reply["parts"]] == [
        {"round": 1}
    ] * 2


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ((), "UsageError: a message needs at least one part"),
        (("--file", "{missing}"), "UsageError: --file {missing}: cannot be read (No such file"),
        (("--file", "{dir}"), "UsageError: --file {dir}: cannot be read (Is a directory)"),
        (("--file", "{dir}/f;type=png"), "UsageError: --file ...;type= 'png': not a media type"),
        (("--file-url", "not a url"), "UsageError: --file-url 'not a url': not a URL"),
        (("--data", "{"), "UsageError: --data: not JSON"),
        (("--data", "[1, 2]"), "UsageError: --data: must be a JSON object, not an array"),
        (("--data", "@{missing}"), "UsageError: --data @{missing}: cannot be read"),
        (("--text", "hi", "--metadata", '"x"'), "UsageError: --metadata: must be a JSON object"),
        (("--text", "hi", "--media-type", "text"), "UsageError: --media-type 'text': not a media"),
        (("--text", "hi", "--accept", "png"), "UsageError: --accept 'png': not a media type"),
        (("--file", "{dir}/f", "--max-message-bytes", "10"),
         "MessageTooLargeError: the message is 12 bytes encoded, over the bound of 10"),
        (("--text", "x" * 200, "--max-message-bytes", "100"),
         "MessageTooLargeError: the message is "),
    ],
)  # fmt: skip
def test_every_bad_input_to_run_exits_2_with_one_line_and_nothing_recorded_or_sent(
    peer: Peer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: tuple[str, ...],
    says: str,
) -> None:
    (tmp_path / "f").write_bytes(b"twelve bytes")
    where = {"{missing}": str(tmp_path / "missing"), "{dir}": str(tmp_path)}

    def placed(text: str) -> str:
        for name, path in where.items():
            text = text.replace(name, path)
        return text

    argv = [placed(o) for o in options]
    db = tmp_path / "store.db"
    line = _error(capsys, 2, "run", peer.base_url, "--skill", "echo", *argv,
                  "--db", f"sqlite:///{db}")  # fmt: skip
    assert line.startswith(placed(says)), line
    assert calls(peer, "SendMessage") == 0
    if db.exists():  # opened only once the message is whole: then nothing in it
        with EventStore.open(f"sqlite:///{db}") as store:
            assert [s for s in store.stream_ids() if s.startswith("task:")] == []


def test_a_bad_reply_exits_2_and_a_part_the_skill_refuses_exits_3_sending_nothing(
    peer: Peer, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _json(capsys, 0, "run", peer.base_url, "--skill", "ask", "--text", "ask",
                  "--db", db, *FAST)  # fmt: skip
    with EventStore.open(db) as store:
        before = store.last_position()
    line = _error(capsys, 2, "reply", asked["task"], "--data", "1", "--db", db)
    assert line == "UsageError: --data: must be a JSON object, not a number"
    line = _error(capsys, 2, "reply", asked["task"], "--db", db)
    assert line.startswith("UsageError: a message needs at least one part")
    with EventStore.open(db) as store:
        assert store.last_position() == before
    sends = calls(peer, "SendMessage")

    line = _error(capsys, 3, "run", peer.base_url, "--skill", "echo", "--data", "{}",
                  "--db", db, *FAST)  # fmt: skip
    assert line.startswith("SkillUnavailableError: ")
    assert "does not accept application/json" in line
    line = _error(capsys, 3, "run", peer.base_url, "--text", "hi", "--db", db, *FAST)
    assert line.startswith("SkillUnavailableError: ")
    assert "was not named, and the card offers" in line
    line = _error(capsys, 2, "run", "http://127.0.0.9:1", "--text", "hi",
                  "--context", asked["task"], "--db", db, *FAST)  # fmt: skip
    assert "a conversation goes on at one agent" in line
    assert calls(peer, "SendMessage") == sends
