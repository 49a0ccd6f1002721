"""A unit run's processes (server/engine/units/runtree.py): a child that left its process group and session
(a double fork and setsid) is found and killed by the run's cgroup, by its tag where no cgroup may be made,
and by the worker it was orphaned to (a subreaper); another run's processes are left alone. Real processes,
real SIGKILL, this machine's cgroup2 hierarchy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import wait_for
from subagent_helpers import alive

from keel.server.engine.units import runtree

# a run's worker, as subagent.main starts: it enters the cgroup (and becomes a subreaper), then starts a
# command that leaves a detached grandchild behind and writes its pid; with argv[3], it ends all below it
WORKER = """
import subprocess, sys, time
from keel.server.engine.units import runtree
assert runtree.enter(sys.argv[1]) == "", "the worker must enter its cgroup"
subprocess.run(["sh", "-c", "( setsid sleep 300 >/dev/null 2>&1 & echo $! > " + sys.argv[2] + " )"], check=True)
if len(sys.argv) > 3:
    runtree.end_descendants()
    print("ended", flush=True)
time.sleep(300)
"""


@pytest.fixture(params=["cgroup", "no-cgroup"])
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    runtree.cgroup_root.cache_clear()
    if request.param == "no-cgroup":
        monkeypatch.setenv(runtree.ROOT_VAR, "")
    elif runtree.cgroup_root() is None:
        pytest.skip("keel may make no cgroup on this machine")
    yield request.param
    runtree.cgroup_root.cache_clear()


def _start(tree: runtree.RunTree, pidfile: Path, *extra: str) -> subprocess.Popen[str]:
    group = tree.prepare()
    env = {**os.environ, runtree.TAG_VAR: tree.tag}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(group or ""), str(pidfile), *extra],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _detached(pidfile: Path) -> int:
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", timeout=30)
    pid = int(pidfile.read_text())
    assert alive(pid)
    return pid


def test_a_detached_grandchild_is_killed_with_its_run(tmp_path: Path, containment: str) -> None:
    key = runtree.unit_key(tmp_path / "store", "m1", "u1")
    mine, other = runtree.RunTree(key, 1), runtree.RunTree(key, 2)
    first, second = _start(mine, tmp_path / "a"), _start(other, tmp_path / "b")
    try:
        orphan, spared = _detached(tmp_path / "a"), _detached(tmp_path / "b")
        os.kill(first.pid, 9)  # the worker dies first: its grandchild is init's now, out of its session
        first.wait()
        assert alive(orphan), "the strike must leave the detached grandchild running"
        other.end_others()  # as before an effect in doubt is judged: every run of the unit but this one
        assert not alive(orphan), f"a detached process of run 1 outlived it ({containment})"
        assert alive(second.pid) and alive(spared), "the run that judges must keep its own processes"
        other.end()
        assert not alive(second.pid) and not alive(spared)
        if containment == "cgroup":
            assert mine.cgroup is not None and not mine.cgroup.parent.exists(), "emptied cgroups are removed"
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
        runtree.end_runs(key)


def test_a_worker_kills_what_its_agent_orphaned_on_its_way_out(tmp_path: Path) -> None:
    tree = runtree.RunTree(runtree.unit_key(tmp_path / "store", "m1", "u1"), 1)
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, "", str(tmp_path / "a"), "end"], stdout=subprocess.PIPE, text=True
    ) as worker:  # no cgroup, no tag: only the subreaper holds the orphan
        try:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ended"
            orphan = int((tmp_path / "a").read_text())
            assert not alive(orphan), "the subreaper's way out must kill what was orphaned to it"
        finally:
            worker.kill()
            runtree.end_runs(tree.key)


def test_emptied_cgroups_a_killed_host_left_are_removed_and_a_live_run_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtree.cgroup_root.cache_clear()
    if runtree.cgroup_root() is None:
        pytest.skip("keel may make no cgroup on this machine")
    left, live = runtree.RunTree("m0-left", 1), runtree.RunTree("m0-live", 1)
    assert left.prepare() is not None
    worker = _start(live, tmp_path / "a")
    try:
        _detached(tmp_path / "a")
        monkeypatch.setattr(runtree, "PRUNE_S", 0.0)  # both are older than that now
        runtree.RunTree("m0-next", 1).prepare()
        assert left.cgroup is not None and not left.cgroup.parent.exists(), "an emptied leftover must go"
        assert live.cgroup is not None and live.cgroup.exists(), "a run with processes keeps its cgroup"
    finally:
        worker.kill()
        worker.wait()
        for key in ("m0-left", "m0-live", "m0-next"):
            runtree.end_runs(key)
