"""`cardfence cards` through the real console script, against a real agent whose card changes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import Peer

from cardfence.engine.cli.main import run as cli

CARDFENCE = shutil.which("cardfence", path=str(Path(sys.executable).parent)) or "cardfence"


def _cards(peer: Peer, db: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CARDFENCE, "cards", peer.base_url, "--db", db, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _withdraw_push_and_drop_a_skill(card: dict[str, Any]) -> None:
    card["version"] = "1.1.0"
    card["capabilities"]["pushNotifications"] = False
    card["skills"] = [s for s in card["skills"] if s["id"] != "fail"]


def test_cards_shows_each_revision_and_what_changed_as_the_card_moves(
    peer: Peer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    first = _cards(peer, db, "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["read"]["status"] == 200

    peer.mutate_card(_withdraw_push_and_drop_a_skill)
    second = _cards(peer, db, "--json")
    again = _cards(peer, db, "--json")

    assert second.returncode == again.returncode == 0
    document = json.loads(again.stdout)
    assert document["agent"] == peer.base_url
    assert document["read"]["status"] == 304
    old, new = document["revisions"]
    assert (old["version"], new["version"]) == ("1.0.0", "1.1.0")
    assert old["changes"] == {}
    assert new["changes"]["capabilities"] == {"push_notifications": {"old": True, "new": False}}
    assert new["changes"]["skills"] == {"removed": ["fail"]}
    assert new["etag"] == peer.card_etag


def test_cards_human_output_names_revisions_and_changes(peer: Peer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    _cards(peer, db)
    peer.mutate_card(_withdraw_push_and_drop_a_skill)
    shown = _cards(peer, db)
    assert shown.returncode == 0, shown.stderr
    assert "version 1.1.0" in shown.stdout
    assert "push_notifications" in shown.stdout
    assert '"removed": ["fail"]' in shown.stdout


def test_cards_on_a_card_503_exits_3_and_still_shows_the_recorded_revisions(
    peer: Peer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    _cards(peer, db)
    peer.set_card_fault("503")
    failed = _cards(peer, db, "--json")
    assert failed.returncode == 3
    document = json.loads(failed.stdout)
    assert document["read"] == {
        "ok": False,
        "url": peer.card_url,
        "kind": "http_status",
        "detail": "503",
    }
    assert len(document["revisions"]) == 1
    assert failed.stderr.strip().splitlines()[-1] == (
        f"DiscoveryError: GET {peer.card_url} -> 503 (the revisions already recorded are shown)"
    )


def test_cards_on_an_invalid_card_exits_3_with_card_invalid_error(
    peer: Peer, tmp_path: Path
) -> None:
    peer.set_card_fault("invalid_json")
    failed = _cards(peer, f"sqlite:///{tmp_path / 'c.db'}")
    assert failed.returncode == 3
    assert failed.stderr.strip().splitlines()[-1].startswith("CardInvalidError: ")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://[::1", "http://svc:PASS@127.0.0.1:9"]
)
def test_cards_with_an_agent_url_that_cannot_be_used_exits_2_and_opens_nothing(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"

    code = cli(["cards", url, "--db", f"sqlite:///{db}"])

    err = capsys.readouterr().err
    shown = url.replace("svc:PASS@", "")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"UsageError: agent URL {shown!r}: ")
    assert "PASS" not in err
    assert not db.exists()
