"""keel serve end to end: the `keel/subagents` request shows a mission's lease registry while it runs
and after it completes; an unknown mission is a clear error."""

from __future__ import annotations

import asyncio

import pytest

from tests.lsp.conftest import Env

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


async def test_subagents_while_running_and_after(env: Env) -> None:
    path = env.write_mission(
        "parallel",
        [{"id": "a", "steps": [{"now": True}, {"sleep": 1.5}]}, {"id": "b", "steps": [{"now": True}, {"sleep": 1.5}]}],
    )
    mid = (await env.command("keel.startMission", path))["id"]
    running: list[dict[str, object]] = []
    for _ in range(200):
        running = await env.request("keel/subagents", {"id": mid})
        if len(running) == 2 and all(r["pid"] and r["state"] == "running" for r in running):
            break
        await asyncio.sleep(0.05)
    assert sorted(r["unit"] for r in running) == ["a", "b"], running
    for row in running:
        assert row["epoch"] >= 1 and 0 <= row["leaseAge"] < row["ttl"] and row["sandbox"].endswith(row["lane"])
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    done = await env.request("keel/subagents", {"id": mid[:6]})
    assert {(r["unit"], r["state"], r["merged"]) for r in done} == {("a", "done", True), ("b", "done", True)}


async def test_subagents_of_an_unknown_mission(env: Env) -> None:
    with pytest.raises(Exception, match="no mission"):
        await env.request("keel/subagents", {"id": "nope"})
