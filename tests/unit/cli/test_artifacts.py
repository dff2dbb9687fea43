"""``cardfence artifacts``: names that never leave the folder, files never written over, and the
listing of a store written before (no network: nothing is fetched)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cardfence.engine.cli._artifacts import MAX_NAME_BYTES, safe_name, written
from cardfence.engine.cli.main import run as cli

STORED = Path(__file__).parents[2] / "support" / "data" / "store_before_content_out_of_line.sqlite"
PARTS_TASK = "3a311d7b"  # ``echo parts``: report, link, form, mixed
BIG_TASK = "c17b92db"  # ``echo big-artifact``: kept as its size and digest
BUNDLE_TASK = "7499a73a"  # ``echo bundle``: one artifact of three chunks


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("/etc/shadow", "shadow"),
        ("C:\\Windows\\win.ini", "win.ini"),
        ("..", "fallback.bin"),
        (".", "fallback.bin"),
        ("", "fallback.bin"),
        (None, "fallback.bin"),
        ("dir/", "fallback.bin"),
        ("a\x00b.txt", "a_b.txt"),
        ("new\nline.txt", "new_line.txt"),
        (".bashrc", "bashrc"),
        ("...hidden", "hidden"),
        ('what?<>:"|*.txt', "what_______.txt"),
        ("con.txt", "_con.txt"),
        ("NUL", "_NUL"),
    ],
)
def test_a_name_is_reduced_to_a_plain_file_name_inside_the_folder(
    name: str | None, expected: str
) -> None:
    assert safe_name(name, "fallback.bin") == expected


def test_a_fallback_is_made_safe_too() -> None:
    assert safe_name(None, "../x/../../art-1.txt") == "art-1.txt"
    assert safe_name("..", "..") == "part"


def test_a_long_name_is_cut_to_the_bound_its_extension_kept() -> None:
    cut = safe_name("é" * 300 + ".pdf", "f")
    assert len(cut.encode()) <= MAX_NAME_BYTES
    assert cut.endswith(".pdf")
    assert cut.startswith("éé")
    cut.encode().decode()  # never half a character


def test_a_taken_name_gets_a_number_and_nothing_is_written_over(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"mine")
    first = written(tmp_path, "a.txt", b"one")
    second = written(tmp_path, "a.txt", b"two")
    assert (first.name, second.name) == ("a-2.txt", "a-3.txt")
    assert (tmp_path / "a.txt").read_bytes() == b"mine"
    assert (first.read_bytes(), second.read_bytes()) == (b"one", b"two")
    assert written(tmp_path, "README", b"r").name == "README"
    assert written(tmp_path, "README", b"r").name == "README-2"


def test_a_link_in_the_folder_is_never_followed(tmp_path: Path) -> None:
    folder, outside = tmp_path / "out", tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_bytes(b"untouched")
    (folder / "x.txt").symlink_to(outside)
    path = written(folder, "x.txt", b"agent's")
    assert path == folder / "x-2.txt"
    assert outside.read_bytes() == b"untouched"


@pytest.fixture
def db(tmp_path: Path) -> str:
    copied = tmp_path / "before.sqlite"
    shutil.copyfile(STORED, copied)
    return f"sqlite:///{copied}"


def _listed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert cli(["artifacts", *args, "--json"]) == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


def test_the_artifacts_of_a_task_are_listed_with_each_part_s_kind_type_size_and_digest(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _listed(capsys, PARTS_TASK, "--db", db)
    artifacts = document["artifacts"]
    assert isinstance(artifacts, list)
    assert [a["artifact_id"] for a in artifacts] == ["report", "link", "form", "mixed"]
    report = artifacts[0]["parts"]
    assert [(p["kind"], p["media_type"], p["filename"]) for p in report] == [
        ("text", "text/markdown", None),
        ("file", "application/pdf", "report.pdf"),
    ]
    assert report[1]["size"] == 54
    assert len(report[1]["sha256"]) == 64
    assert all(p["path"] is None for a in artifacts for p in a["parts"])  # no --out: no file
    link = artifacts[1]["parts"][0]
    assert (link["kind"], link["size"], link["sha256"]) == ("url", None, None)
    assert link["url"].endswith("/files/report.txt")
    assert artifacts[2]["parts"][0]["kind"] == "data"


def test_an_artifact_kept_only_as_its_size_and_digest_is_listed_without_content(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (big,) = _listed(capsys, BIG_TASK, "--db", db)["artifacts"]  # type: ignore[misc]
    assert big["truncated"] is True
    assert big["parts"] == []
    assert big["size"] > 256 * 1024
    assert len(big["sha256"]) == 64


def test_out_writes_files_under_their_names_text_and_data_under_the_artifact_s(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    document = _listed(capsys, PARTS_TASK, "--out", str(out), "--db", db)
    assert sorted(p.name for p in out.iterdir()) == [
        "form-1.json", "mixed-1.txt", "mixed-4.json", "passwd", "report-1.txt", "report.pdf",
    ]  # fmt: skip
    assert not (tmp_path / "etc").exists()
    assert (out / "report.pdf").read_bytes().startswith(b"%PDF-1.4")
    assert json.loads((out / "form-1.json").read_text()) == {
        "answer": "yes", "count": 3.0, "sure": True,
    }  # fmt: skip
    assert (out / "report-1.txt").read_text() == "# Summary\n\nAll good."
    parts = [p for a in document["artifacts"] for p in a["parts"]]  # type: ignore[attr-defined]
    for part in parts:
        if part["path"] is not None:
            assert Path(part["path"]).parent == out
            content = Path(part["path"]).read_bytes()
            assert len(content) == part["size"]


def test_an_artifact_received_in_chunks_is_listed_whole(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (bundle,) = _listed(capsys, BUNDLE_TASK, "--db", db)["artifacts"]  # type: ignore[misc]
    assert [p["kind"] for p in bundle["parts"]] == ["text", "file", "data"]


def test_fetch_without_out_is_a_usage_error(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["artifacts", PARTS_TASK, "--fetch", "--db", db]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("UsageError: ")


def test_fetch_of_a_url_at_another_origin_refuses_everything_before_anything_is_sent(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = cli(["artifacts", PARTS_TASK, "--out", str(out), "--fetch", "--db", db])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert last.startswith("FetchRefusedError: http://127.0.0.2:"), last
    assert "--fetch-any" in last
    assert not out.exists()  # nothing written


def test_out_naming_a_file_is_a_usage_error(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert cli(["artifacts", PARTS_TASK, "--out", str(taken), "--db", db]) == 2
    assert taken.read_text() == "x"


def test_the_listing_for_people_says_what_each_part_is_and_what_was_kept(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["artifacts", BIG_TASK, "--db", db]) == 0
    big = capsys.readouterr().out
    assert "artifact big: kept only as its size and digest (" in big
    assert cli(["artifacts", PARTS_TASK, "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("task 3a311d7b")
    assert any("file  application/pdf  'report.pdf'  54 B" in line for line in lines)
    assert any(line.strip().startswith("1. url") and "/files/report.txt" in line for line in lines)
