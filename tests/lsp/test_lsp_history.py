"""`keel serve` following a long mission (30k journal entries, and as much evidence) while its host adds more,
then completes: the server's own memory stays bounded, it answers every request, it is at rest soon after
the end, and supervision never suspects a host that ended the mission itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from keel.protocol.states import MissionState
from tests.historykit import follow, make_mission, mission_id, start_host

SERVE = [sys.executable, "-m", "keel.server.cli", "serve"]
ENTRIES = 30_000


@pytest.mark.lmdb_only("one backend keeps this long history a few seconds of the suite")
async def test_following_a_long_mission_keeps_the_server_light(tmp_path: Path) -> None:
    store, go = tmp_path / ".keel" / "store", tmp_path / "go"
    mid = mission_id(ENTRIES)
    host, record = start_host(store, mid, go, count=1000, per_s=1000)
    try:
        make_mission(store, tmp_path, ENTRIES, state=MissionState.RUNNING, host=record)
        seen = await follow(SERVE, tmp_path, mid, go, pages=2, settle_s=1.0, idle_s=2.0)
    finally:
        go.touch()
        host.wait(timeout=120)
    assert host.returncode == 0
    assert seen.items >= 4000  # two pages of history, and what the host added, pushed as it came
    assert seen.errors == 0
    assert seen.suspects == 0  # its host completed the mission: never a host to replace
    assert seen.peak_anon_mb <= 75, seen
    assert seen.cpu_after_s <= 0.03 * seen.idle_s, seen  # at rest: the sweep reads only what changed
