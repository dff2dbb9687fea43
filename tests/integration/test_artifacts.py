"""``cardfence artifacts`` against the real a2a-sdk 1.3 agent returning file artifacts (by bytes
and by URL) and a data artifact: listed, written, and the URLs fetched only as R15 and R16 allow.

The agent (``support.contents``) serves the file its artifacts name by URL on its own origin and
on 127.0.0.2 (another origin), and logs the ``Authorization`` each GET of it presented.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import cardfence, document, failed_with
from support.contents import BIG_FILE, FILE_BODY, FORM_DATA, PDF_BYTES, ContentAgent
from support.engine_fixtures import FAST, assert_audit_ok, events, rotate_to_bearer

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.client.tasklog import task_stream_id
from cardfence.engine.core import events as ev
from cardfence.engine.core.parts import File
from cardfence.engine.errors import FetchRefusedError

TOKEN = "file-token-0123456789abcdef"


@pytest.fixture(scope="module")
def agent() -> Iterator[ContentAgent]:
    with ContentAgent() as running:
        if not running.other_origin_served:
            pytest.skip("127.0.0.2 cannot be bound here: no other origin to fetch from")
        yield running


async def _parts_task(db: str, agent: ContentAgent) -> str:
    async with Engine.connect(db, config=FAST) as engine:
        view = await engine.start_task(agent.base_url, skill="echo", text="parts")
        view = await engine.drive(view.task, until="terminal", timeout=30)
        assert view.state == "completed"
        return view.task


async def test_file_url_and_data_artifacts_are_listed_and_written_and_fetched_from_any_origin(
    agent: ContentAgent, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    key = await _parts_task(db, agent)
    agent.file_requests.clear()
    out = tmp_path / "out"

    listed = cardfence(db, "artifacts", key, "--json")
    assert listed.returncode == 0, listed.stderr
    kinds = [[p["kind"] for p in a["parts"]] for a in document(listed)["artifacts"]]
    assert kinds == [["text", "file"], ["url", "url"], ["data"], ["text", "file", "url", "data"]]

    fetched = cardfence(db, "artifacts", key, "--out", str(out), "--fetch-any", "--json")
    assert fetched.returncode == 0, fetched.stderr
    assert (out / "report.pdf").read_bytes() == PDF_BYTES
    assert (out / "report.txt").read_bytes() == FILE_BODY
    assert (out / "elsewhere.txt").read_bytes() == FILE_BODY
    assert json.loads((out / "form-1.json").read_text()) == FORM_DATA
    assert (out / "passwd").read_bytes() == b"\x00\x01\x02binary"  # "../../etc/passwd", inside
    assert sorted(host for host, _ in agent.file_requests) == [
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.2",
    ]
    paths = [p["path"] for a in document(fetched)["artifacts"] for p in a["parts"]]
    assert all(path is not None and Path(path).parent == out for path in paths)
    audited = cardfence(db, "audit", "--json")
    assert audited.returncode == 0, audited.stdout  # listing and fetching recorded nothing


async def test_fetch_refuses_a_url_at_another_origin_and_sends_nothing(
    agent: ContentAgent, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    key = await _parts_task(db, agent)
    agent.file_requests.clear()
    out = tmp_path / "out"
    result = cardfence(db, "artifacts", key, "--out", str(out), "--fetch", "--json")
    refused = failed_with(result, 2, "FetchRefusedError")
    assert "127.0.0.2" in refused["error"]["message"]
    assert agent.file_requests == []  # not even the files at the task's own origin
    assert not out.exists()


async def test_the_task_s_credentials_go_with_a_fetch_to_its_own_origin_only(
    tmp_path: Path,
) -> None:
    with ContentAgent() as agent:
        if not agent.other_origin_served:
            pytest.skip("127.0.0.2 cannot be bound here: no other origin to fetch from")
        agent.mutate_card(rotate_to_bearer)
        credentials = CredentialsConfig.of({agent.base_url: {"bearer": Bearer(TOKEN)}})
        config = dataclasses.replace(FAST, credentials=credentials)
        db = f"sqlite:///{tmp_path / 'store.db'}"
        async with Engine.connect(db, config=config) as engine:
            view = await engine.start_task(agent.base_url, skill="echo", text="parts")
            view = await engine.drive(view.task, until="terminal", timeout=30)
            (link,) = [a for a in await engine.artifacts(view.task) if a.artifact_id == "link"]
            own, other = link.parts
            assert isinstance(own, File)
            assert isinstance(other, File)
            with pytest.raises(FetchRefusedError):
                await engine.fetch_files(view.task, [own, other])
            assert agent.file_requests == []
            got = await engine.fetch_files(view.task, [own, other], any_origin=True)
            assert got == [FILE_BODY, FILE_BODY]
            assert_audit_ok(engine.store)
        assert agent.file_requests == [("127.0.0.1", f"Bearer {TOKEN}"), ("127.0.0.2", None)]


async def test_a_1_mib_file_artifact_is_kept_whole_out_of_line_and_read_back_byte_for_byte(
    tmp_path: Path,
) -> None:
    # R16, R17: a file artifact is kept whole up to the transport's bound on an answer (it was
    # kept as its size and digest past 256 KiB); its event holds only its outline.
    with ContentAgent() as agent:
        db = f"sqlite:///{tmp_path / 'store.db'}"
        async with Engine.connect(db, config=FAST) as engine:
            view = await engine.start_task(agent.base_url, skill="echo", text="big-file")
            view = await engine.drive(view.task, until="terminal", timeout=30)
            assert view.state == "completed"
            assert "payload_truncated" not in view.flags
            (artifact,) = await engine.artifacts(view.task)
            assert (artifact.artifact_id, artifact.name, artifact.truncated) == (
                "file",
                "file",
                False,
            )
            (part,) = artifact.parts
            assert isinstance(part, File)
            assert (part.filename, part.media_type) == ("big.bin", "application/octet-stream")
            assert part.data == BIG_FILE

            (received,) = [e.data for e in events(engine.store, view.task)
                           if e.type == ev.ARTIFACT_RECEIVED]  # fmt: skip
            (outline,) = received["parts"]
            assert set(outline) == {"kind", "media_type", "size", "sha256"}
            assert (outline["kind"], outline["size"]) == ("file", len(BIG_FILE))
            stored = [json.dumps(e.data) for e in events(engine.store, view.task)]
            assert max(len(text) for text in stored) < 4096  # no event holds the content
            kept = engine.store.contents(task_stream_id(view.task), [outline["sha256"]])
            assert list(kept) == [outline["sha256"]]
            assert_audit_ok(engine.store)

    out = tmp_path / "out"
    written = cardfence(db, "artifacts", view.task, "--out", str(out), "--json")
    assert written.returncode == 0, written.stderr
    assert (out / "big.bin").read_bytes() == BIG_FILE
    audited = cardfence(db, "audit", "--json")
    assert audited.returncode == 0, audited.stdout
