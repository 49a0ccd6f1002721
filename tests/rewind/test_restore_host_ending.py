"""A restore (and a fork, an apply: they take the same lock) right after a mission finished: its host may still
hold the mission's lock while it writes its last checkpoint and exits. That host is waited for; a host still at
work is an error at once, saying the mission's state and what to do."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.server.engine.control import STOPPING_WAIT_S
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostBusyError
from keel.server.exits import exit_for
from tests.bundles.kit import git_workspace, keel, ok, record, wait_for
from tests.hosts import kill_hosts
from tests.rewind.kit import mission, mission_toml, points

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

HOLD = """
import sys, time
from keel.server.engine.hostlock import HostLock
lock = HostLock(__import__("pathlib").Path(sys.argv[1]), sys.argv[2])
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""


def _hold(store: Path, mission_id: str, seconds: float) -> subprocess.Popen[str]:
    """A process holding the mission's host lock for `seconds`, as a host on its way out does."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(places.lock_path(store, mission_id)), mission_id, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_restore_waits_for_the_host_of_a_finished_mission_to_exit(tmp_path: Path) -> None:
    _, store, mid = mission(tmp_path)
    assert record(store, mid).state.value == "completed"
    holder = _hold(store, mid, 2.0)
    try:
        restored = ok(keel("restore", mid, points(store, mid)[0]["id"], store=store))
        assert holder.poll() is not None, "the restore ran while the finishing host held the lock"
        assert "restored to" in restored.stdout
        assert record(store, mid).state.value == "paused"
    finally:
        holder.kill()
        holder.wait()


def test_a_restore_of_a_mission_whose_host_is_at_work_is_an_error_at_once(tmp_path: Path) -> None:
    git_workspace(tmp_path / "ws")
    (tmp_path / "mission.toml").write_text(mission_toml([{"id": "slow", "params": {"steps": [{"sleep": 60}]}}]))
    store = tmp_path / "store"
    mid = ok(keel("run", str(tmp_path / "mission.toml"), "--detach", store=store)).stdout.split()[-1]
    try:
        wait_for(lambda: record(store, mid).state.value == "running" and bool(points(store, mid)), timeout=60)
        began = time.monotonic()
        refused = ok(keel("restore", mid, points(store, mid)[0]["id"], store=store), rc=exit_for(HostBusyError("")))
        assert time.monotonic() - began < STOPPING_WAIT_S / 2, "a host at work is not waited for"
        assert f"mission {mid} is running; pause it before a restore" in refused.stderr
    finally:
        kill_hosts(store)
