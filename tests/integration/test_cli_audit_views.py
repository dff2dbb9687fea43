"""Audits people can read: ``show`` and ``tasks`` as the log stood at a past time or position, and a
task's path as a mermaid diagram, through the real ``cardfence`` console script against a real
a2a-sdk agent (``support/cli.py``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support import Peer
from support.cli import POLL, ROW_KEYS, cardfence, document, failed_with, last_line
from support.engine_fixtures import audited_engine, make_tasks

from cardfence.engine.client.tasklog import AsOf, TaskLog
from cardfence.engine.core import events as ev
from cardfence.engine.errors import UsageError
from cardfence.store.event_store import EventStore


def asked_and_answered(db: str, peer: Peer) -> str:
    """An ``ask`` task driven to input-required, answered, then driven to completed."""

    async def main() -> str:
        async with audited_engine(db) as engine:
            view = await engine.start_task(peer.base_url, skill="ask", text="ask")
            await engine.drive(view.task, until="interrupted", timeout=10)
            await engine.reply(view.task, "42")
            done = await engine.drive(view.task, until="terminal", timeout=10)
            assert done.state == "completed"
            return view.task

    return asyncio.run(main())


def shown(db: str, key: str, *args: str) -> dict[str, Any]:
    result = cardfence(db, "show", key, *args, "--json")
    assert result.returncode == 0, result.stderr
    return dict(document(result))


def changes_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == ev.STATE_CHANGED]


def into_input_required(events: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The transition into input-required and the one after it."""
    changed = changes_of(events)
    index = next(i for i, e in enumerate(changed) if e["data"]["to"] == "input-required")
    return changed[index], changed[index + 1]


# -- show --as-of ----------------------------------------------------------------------------------


def test_show_as_of_a_position_between_two_transitions_shows_the_earlier_state_and_events(
    peer: Peer, db: str
) -> None:
    key = asked_and_answered(db, peer)
    now = shown(db, key)
    asked, after = into_input_required(now["events"])
    point = after["position"] - 1  # after the question, before the answer's transition

    then = shown(db, key[:8], "--as-of", f"@{point}")
    human = cardfence(db, "show", key, "--as-of", f"@{point}")

    assert now["state"] == "completed"
    assert then["as_of"] == f"@{point}"
    assert then["state"] == "input-required"
    assert then["events"] == [e for e in now["events"] if e["position"] <= point]
    assert then["events"][-1]["position"] <= point < after["position"]
    assert asked in then["events"]
    assert (then["task"], then["remote_task_id"]) == (key, now["remote_task_id"])
    assert (then["card_revision"], then["contract_hash"]) == (
        now["card_revision"],
        now["contract_hash"],
    )
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith(f"as of @{point}: ")
    assert "state input-required" in human.stdout
    assert f"{asked['data']['from']} → input-required" in human.stdout
    assert "→ completed" not in human.stdout


def test_show_as_of_a_time_shows_the_state_then_with_a_naive_time_read_as_utc(
    peer: Peer, db: str
) -> None:
    key = asked_and_answered(db, peer)
    now = shown(db, key)
    asked, after = into_input_required(now["events"])
    asked_at = datetime.fromisoformat(asked["recorded_at"])
    after_at = datetime.fromisoformat(after["recorded_at"])
    assert asked_at < after_at
    between = asked_at + (after_at - asked_at) / 2
    naive = between.astimezone(UTC).replace(tzinfo=None).isoformat()  # no offset: UTC
    plus_two = between.astimezone(timezone(timedelta(hours=2))).isoformat()
    asked_elsewhere = asked_at.astimezone(timezone(timedelta(hours=-5, minutes=-30))).isoformat()

    by_naive = shown(db, key, "--as-of", naive)
    by_offset = shown(db, key, "--as-of", plus_two)
    by_instant = shown(db, key, "--as-of", asked_elsewhere)  # recorded_at <= TIME: it is in

    def up_to(moment: datetime) -> list[dict[str, Any]]:
        return [e for e in now["events"] if datetime.fromisoformat(e["recorded_at"]) <= moment]

    assert [then["state"] for then in (by_naive, by_offset, by_instant)] == ["input-required"] * 3
    assert by_naive["events"] == by_offset["events"] == up_to(between)
    assert by_instant["events"] == up_to(asked_at)
    assert by_instant["events"][-1] == asked
    assert by_naive["as_of"] == by_offset["as_of"] == between.astimezone(UTC).isoformat()
    assert by_instant["as_of"] == asked_at.astimezone(UTC).isoformat()


def test_show_as_of_before_the_task_existed_is_a_usage_error(peer: Peer, db: str) -> None:
    [key] = make_tasks(db, peer, ("echo", "echo hi", "terminal"))
    first = shown(db, key)["events"][0]
    before = datetime.fromisoformat(first["recorded_at"]) - timedelta(seconds=1)

    by_time = cardfence(db, "show", key, "--as-of", before.isoformat(), "--json")
    by_position = cardfence(db, "show", key, "--as-of", f"@{first['position'] - 1}")

    for result in (by_time, by_position):
        assert result.returncode == 2, result.stderr
        assert last_line(result).startswith("UsageError: ")
        assert "did not exist yet" in last_line(result)
        assert f"position {first['position']}" in last_line(result)
    assert failed_with(by_time, 2, "UsageError")["error"]["exit_code"] == 2


@pytest.mark.parametrize("value", ["yesterday", "@-1", "2025-13-01"])
def test_a_malformed_as_of_is_a_usage_error_naming_the_accepted_forms(db: str, value: str) -> None:
    for command in (("show", "any-task"), ("tasks",)):
        result = cardfence(db, *command, "--as-of", value, "--json")

        error = failed_with(result, 2, "UsageError")["error"]
        assert "ISO 8601" in error["message"]
        assert "@N" in error["message"]


def test_as_of_reads_times_as_utc_unless_they_say_otherwise() -> None:
    assert AsOf.parse("2025-01-31T12:00:00") == AsOf(time=datetime(2025, 1, 31, 12, tzinfo=UTC))
    assert AsOf.parse("2025-01-31T12:00:00Z") == AsOf(time=datetime(2025, 1, 31, 12, tzinfo=UTC))
    assert AsOf.parse("2025-01-31T14:00+02:00") == AsOf(time=datetime(2025, 1, 31, 12, tzinfo=UTC))
    assert AsOf.parse(" @42 ") == AsOf(position=42)
    assert str(AsOf.parse("@0")) == "@0"
    assert str(AsOf.parse("2025-01-31")) == "2025-01-31T00:00:00+00:00"
    for malformed in ("soon", "@", "@3.5", "@-1", "@ 1 2", "12:00Z+", "2025-02-30"):
        with pytest.raises(UsageError, match=r"ISO 8601 .* @N"):
            AsOf.parse(malformed)


# -- tasks --as-of ---------------------------------------------------------------------------------


def test_tasks_as_of_lists_the_past_states_and_omits_tasks_created_later(
    peer: Peer, db: str
) -> None:
    [first] = make_tasks(db, peer, ("ask", "ask", "interrupted"))
    with EventStore.open(db) as store:
        point = store.last_position()
        moment = store.read_all(after=point - 1, limit=1)[0].recorded_at
    [later] = make_tasks(db, peer, ("echo", "echo later", "terminal"))
    replied = cardfence(db, "reply", first, "--text", "42", "--until", "terminal", *POLL)
    assert replied.returncode == 0, replied.stderr

    now = document(cardfence(db, "tasks", "--json"))
    by_position = document(cardfence(db, "tasks", "--as-of", f"@{point}", "--json"))
    by_time = document(cardfence(db, "tasks", "--as-of", moment.isoformat(), "--json"))
    waiting = cardfence(db, "tasks", "--as-of", f"@{point}", "--state", "input-required", "--json")
    completed = cardfence(db, "tasks", "--as-of", f"@{point}", "--state", "completed", "--json")
    human = cardfence(db, "tasks", "--as-of", f"@{point}")

    assert {r["task"]: r["state"] for r in now["tasks"]} == {
        first: "completed",
        later: "completed",
    }
    for then in (by_position, by_time):
        [row] = then["tasks"]
        assert set(row) == ROW_KEYS
        assert (row["task"], row["state"], row["skill"]) == (first, "input-required", "ask")
        assert datetime.fromisoformat(row["updated_at"]) <= moment
    assert by_position["as_of"] == f"@{point}"
    assert by_time["as_of"] == moment.isoformat()
    assert by_position["tasks"] == by_time["tasks"]
    assert [r["task"] for r in document(waiting)["tasks"]] == [first]
    assert document(completed)["tasks"] == []
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith(f"as of @{point}: ")
    assert first[:12] in human.stdout
    assert later[:12] not in human.stdout
    assert document(cardfence(db, "tasks", "--as-of", "@0", "--json"))["tasks"] == []


def test_tasks_as_of_agrees_with_replaying_each_task_and_ends_at_the_stored_projections(
    peer: Peer, db: str
) -> None:
    asked_and_answered(db, peer)
    make_tasks(db, peer, ("echo", "echo a", "terminal"), ("fail", "fail", "terminal"))

    with EventStore.open(db) as store:
        log = TaskLog(store)
        last = store.last_position()
        keys = [head.key for head in log.all()]
        for position in range(last + 1):
            point = AsOf(position=position)
            one_pass = {h.key: h for h in log.all_as_of(point)}
            each = {}
            for key in keys:
                try:
                    each[key] = log.as_of(key, point)[0]
                except UsageError:
                    continue  # not yet created
            assert one_pass == each, f"at @{position}"
        assert {h.key: h.state for h in log.all_as_of(AsOf(position=last))} == {
            h.key: h.state for h in log.all()
        }


def test_tasks_with_an_unknown_state_is_a_usage_error_listing_the_valid_names(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"  # not the audited fixture: it stays without events
    assert cardfence(db, "migrate").returncode == 0  # `tasks` needs a store already there

    result = cardfence(db, "tasks", "--state", "input_required", "--json")
    unknown = cardfence(db, "tasks", "--state", "unknown", "--json")

    message = failed_with(result, 2, "UsageError")["error"]["message"]
    assert "'input_required'" in message
    for name in ("submitted", "working", "input-required", "auth-required", "completed"):
        assert name in message
    assert unknown.returncode == 0, unknown.stderr  # an A2A name, though no task stays in it
    assert document(unknown) == {"tasks": []}


# -- show --format mermaid -------------------------------------------------------------------------


def test_show_as_mermaid_draws_exactly_the_path_an_asked_and_answered_task_took(
    peer: Peer, db: str
) -> None:
    key = asked_and_answered(db, peer)
    timeline = shown(db, key)
    steps = [(e["data"]["from"], e["data"]["to"], e["data"]["source"]) for e in changes_of(
        timeline["events"]
    )]  # fmt: skip
    ids = {"input-required": "input_required"}

    diagram = cardfence(db, "show", key, "--format", "mermaid")
    as_json = shown(db, key, "--format", "mermaid")
    asked, _after = into_input_required(timeline["events"])
    earlier = shown(db, key, "--format", "mermaid", "--as-of", f"@{asked['position']}")

    assert diagram.returncode == 0, diagram.stderr
    lines = diagram.stdout.splitlines()
    visited = list(dict.fromkeys(["submitted", *(to for _, to, _ in steps)]))
    assert lines == [
        "stateDiagram-v2",
        *(f'    state "{s}" as {ids.get(s, s)}' for s in visited),
        "    [*] --> submitted",
        *(
            f"    {ids.get(a, a)} --> {ids.get(b, b)} : {n} {source}"
            for n, (a, b, source) in enumerate(steps, start=1)
        ),
        "    completed --> [*]",
    ]
    assert steps[0][0] == "submitted"
    assert "input-required" in visited
    assert steps[-1][1] == "completed"
    assert as_json["mermaid"] == diagram.stdout
    assert as_json["events"] == timeline["events"]
    assert earlier["state"] == "input-required"
    order, source = len(changes_of(earlier["events"])), asked["data"]["source"]
    assert earlier["mermaid"].splitlines()[-1].endswith(f"--> input_required : {order} {source}")
    assert "--> [*]" not in earlier["mermaid"]
    assert "completed" not in earlier["mermaid"]


def test_show_with_an_unknown_format_is_a_usage_error(db: str) -> None:
    result = cardfence(db, "show", "any-task", "--format", "svg", "--json")

    assert "text or mermaid" in failed_with(result, 2, "UsageError")["error"]["message"]


def test_show_puts_every_event_of_a_real_task_in_words(peer: Peer, db: str) -> None:
    key = asked_and_answered(db, peer)

    human = cardfence(db, "show", key)

    assert human.returncode == 0, human.stderr
    assert "reply of 2 characters sent" in human.stdout  # ReplySent was raw JSON before
    assert "{" not in human.stdout


# -- the same from Python --------------------------------------------------------------------------


def test_engine_task_and_tasks_as_of_a_position_replay_the_past_like_the_cli(
    db: str, peer: Peer
) -> None:
    key = asked_and_answered(db, peer)
    events = shown(db, key)["events"]
    into, after = into_input_required(events)
    point = AsOf.parse(f"@{into['position']}")

    async def main() -> tuple[str, list[str], str]:
        async with audited_engine(db) as engine:
            then = await engine.task(key[:8], as_of=point)
            listed = [v.state for v in await engine.tasks(as_of=point)]
            return then.state, listed, (await engine.task(key)).state

    then, listed, now = asyncio.run(main())
    assert (then, listed, now) == ("input-required", ["input-required"], "completed")
    assert after["position"] > into["position"]  # the reply came later and is not replayed
