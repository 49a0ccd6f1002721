"""keel serve end to end: capabilities, starting a mission, progress, the mission requests, pushes."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from tests.lsp.conftest import Env

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

COMMANDS = {
    "keel.startMission",
    "keel.pause",
    "keel.resume",
    "keel.pauseAll",
    "keel.answer",
    "keel.restore",
    "keel.verifyStore",
    "keel.fork",
    "keel.apply",
    "keel.export",
    "keel.import",
}


async def test_empty_workspace(env: Env, backend: str) -> None:
    assert await env.request("keel/missions") == []
    result = await env.command("keel.verifyStore")
    # LMDB: no store yet; a PostgreSQL store named by the workspace holds its schema record alone
    assert result == {"ok": True, "records": 0 if backend == "lmdb" else 1, "problems": []}


async def test_start_mission_runs_with_progress_and_views(env: Env) -> None:
    path = env.write_mission(
        "two",
        [
            {"id": "a", "title": "first", "steps": [{"sleep": 0.3}]},
            {"id": "b", "title": "second", "after": ["a"], "steps": [{"sleep": 0.3}]},
        ],
    )
    started = await env.command("keel.startMission", path)
    mid = started["id"]
    assert started["name"] == "two" and started["units"]["total"] == 2
    done = await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    assert done["percentage"] == 100 and done["units"]["done"] == 2
    assert next(c["state"] for c in env.changes if c["id"] == mid) in ("created", "running")

    await asyncio.sleep(0.2)  # the progress `end` follows the notification
    tokens = [t for t in env.client.progress_reports if str(t).startswith(f"keel/mission/{mid}/")]
    assert tokens, env.client.progress_reports
    reports = env.client.progress_reports[tokens[0]]
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].title == "keel: two"
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message == "completed"
    percentages = [r.percentage for r in reports if getattr(r, "percentage", None) is not None]
    assert percentages == sorted(percentages)

    missions = await env.request("keel/missions")
    assert [x["id"] for x in missions] == [mid] and missions[0]["state"] == "completed"
    detail = await env.request("keel/mission", {"id": mid[:6]})
    assert detail["mission"]["id"] == mid
    assert [(u["id"], u["title"], u["state"]) for u in detail["units"]] == [
        ("a", "first", "succeeded"),
        ("b", "second", "succeeded"),
    ]
    assert any(e["kind"] == "state" for e in detail["events"])
    points = await env.request("keel/restorePoints", {"id": mid})
    assert points and points[0]["id"] == "p1" and points[0]["missionId"] == mid
    assert detail["mission"]["restorePoints"] == len(points)
    logs = [m.message for m in env.client.log_messages]
    assert any(line.startswith(f"[{mid}] state") for line in logs), logs
