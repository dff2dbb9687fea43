"""A task's artifacts as typed values, and the files they name by URL fetched within R15 and
R16, on a store written before (the fixture of ``support/data``) with the network mocked."""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from cardfence.engine.auth.config import Bearer, CredentialsConfig
from cardfence.engine.client.artifacts import MAX_FETCH_BYTES, TaskArtifact, content_of
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core.parts import Data, File, Text
from cardfence.engine.errors import (
    EndpointUnreachableError,
    FetchRefusedError,
    InvalidAgentResponseError,
)
from cardfence.store.event_store import EventStore

STORED = Path(__file__).parents[2] / "support" / "data" / "store_before_content_out_of_line.sqlite"
PARTS_TASK = "3a311d7b"  # ``echo parts`` at http://127.0.0.1:46149
OWN = "http://127.0.0.1:46149"
OTHER = "http://127.0.0.2:46149"
BEARER_TASK = "9e04fd8d"  # the demo's scenario 5: created with a bearer token (R15)
BEARER_ORIGIN = "http://127.0.0.1:36859"
TOKEN = "s3cret-token-for-the-files"

Handler = Callable[[httpx.Request], httpx.Response]


class Network:
    """The mocked network: what each request got, and the requests made."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.answer: Handler = lambda request: httpx.Response(200, content=b"file body")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)


@pytest.fixture
def network() -> Network:
    return Network()


@pytest.fixture
async def engine(tmp_path: Path, network: Network) -> AsyncIterator[Engine]:
    copied = tmp_path / "before.sqlite"
    shutil.copyfile(STORED, copied)
    credentials = CredentialsConfig.of({BEARER_ORIGIN: {"bearer": Bearer(TOKEN)}})
    config = EngineConfig(credentials=credentials)
    client = httpx.AsyncClient(transport=httpx.MockTransport(network))
    async with client, Engine(EventStore.open(f"sqlite:///{copied}"), client, config) as opened:
        yield opened


def test_an_artifact_record_reads_as_part_types_and_a_truncated_one_has_none() -> None:
    record = {
        "artifact_id": "a",
        "name": "n",
        "parts": [
            {"kind": "text", "text": "hi", "media_type": "text/markdown"},
            {"kind": "raw", "data": base64.b64encode(b"\x00\x01").decode(), "filename": "b"},
            {"kind": "url", "url": "https://x/f"},
            {"kind": "data", "data": {"k": 1}},
            {"kind": "raw", "data": "not base64!"},
        ],
        "bytes": 10,
        "sha256": "d" * 64,
    }
    artifact = TaskArtifact.of(record)
    assert artifact.parts == (
        Text("hi", "text/markdown"),
        File(data=b"\x00\x01", filename="b"),
        File(url="https://x/f"),
        Data({"k": 1}),
    )
    assert (artifact.truncated, artifact.unread) == (False, 1)
    cut = TaskArtifact.of({"artifact_id": "big", "name": None, "truncated": True, "bytes": 9})
    assert (cut.parts, cut.truncated, cut.size) == ((), True, 9)
    assert TaskArtifact.of({"artifact_id": "late", "parts": [], "partial": True}).partial


def test_a_part_s_content_is_what_a_file_of_it_holds() -> None:
    assert content_of(Text("é")) == "é".encode()
    assert content_of(Data({"b": 1, "a": [2]})) == b'{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert content_of(File(data=b"\xff")) == b"\xff"
    assert content_of(File(url="https://x/f")) is None


async def test_the_engine_gives_a_task_s_artifacts_in_the_order_received(engine: Engine) -> None:
    found = await engine.artifacts(PARTS_TASK)
    assert [a.artifact_id for a in found] == ["report", "link", "form", "mixed"]
    assert found[0].parts[1] == File(
        data=found[0].parts[1].data, filename="report.pdf", media_type="application/pdf"
    )
    assert found[2].parts == (Data({"answer": "yes", "count": 3.0, "sure": True}),)


async def test_a_file_at_the_task_s_origin_is_fetched(engine: Engine, network: Network) -> None:
    got = await engine.fetch_files(PARTS_TASK, [File(url=f"{OWN}/files/report.txt")])
    assert got == [b"file body"]
    (request,) = network.requests
    assert (request.method, str(request.url)) == ("GET", f"{OWN}/files/report.txt")
    assert "authorization" not in request.headers  # the task's contract grants none


async def test_every_url_is_checked_before_any_is_sent(engine: Engine, network: Network) -> None:
    files = [File(url=f"{OWN}/files/report.txt"), File(url=f"{OTHER}/files/report.txt")]
    with pytest.raises(FetchRefusedError, match="another origin") as refused:
        await engine.fetch_files(PARTS_TASK, files)
    assert "\n" not in str(refused.value)
    assert network.requests == []
    assert await engine.fetch_files(PARTS_TASK, files, any_origin=True) == [b"file body"] * 2


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254/latest/meta-data/",
        "https://[fe80::1]/x",
        "https://[::ffff:169.254.169.254]/x",
        "https://[fd00:ec2::254]/latest/meta-data/",
        "https://100.100.100.200/latest/meta-data/",
        "http://remote.example/x",  # plain http to another host than loopback (R16)
        "http://user:pw@127.0.0.1:46149/x",  # credentials in the URL
        "ftp://127.0.0.1/x",
    ],
)
async def test_a_url_cardfence_may_not_read_is_refused_whatever_the_origin_rule(
    engine: Engine, network: Network, url: str
) -> None:
    with pytest.raises(FetchRefusedError):
        await engine.fetch_files(PARTS_TASK, [File(url=url)], any_origin=True)
    assert network.requests == []


async def test_a_file_part_holding_bytes_has_nothing_to_fetch(engine: Engine) -> None:
    with pytest.raises(FetchRefusedError, match="holds bytes"):
        await engine.fetch_files(PARTS_TASK, [File(data=b"x", filename="x")])


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (httpx.Response(404), EndpointUnreachableError),
        (httpx.Response(302, headers={"location": "https://elsewhere/"}), EndpointUnreachableError),
        (httpx.Response(200, content=b"x" * (MAX_FETCH_BYTES + 1)), InvalidAgentResponseError),
    ],
)
async def test_a_file_not_answered_whole_with_200_within_the_bound_is_an_error(
    engine: Engine, network: Network, answer: httpx.Response, error: type[Exception]
) -> None:
    network.answer = lambda request: answer
    with pytest.raises(error):
        await engine.fetch_files(PARTS_TASK, [File(url=f"{OWN}/f")])
    assert len(network.requests) == 1  # no redirect followed


async def test_the_task_s_credentials_go_to_its_own_origin_only(
    engine: Engine, network: Network
) -> None:
    own, other = File(url=f"{BEARER_ORIGIN}/files/a"), File(url="http://127.0.0.2:36859/files/a")
    await engine.fetch_files(BEARER_TASK, [own, other], any_origin=True)
    sent, elsewhere = network.requests
    assert sent.headers["authorization"] == f"Bearer {TOKEN}"
    assert "authorization" not in elsewhere.headers
    assert TOKEN not in str(elsewhere.url)
