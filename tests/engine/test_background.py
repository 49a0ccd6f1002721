"""keel's background work at background priority (server/background.py), through real `keel run`s: a detached
host, a unit's worker and the command a unit runs are at nice 10, each with its scheduling group (Linux
autogroup, one per session) lowered too; a foreground `keel run` keeps the priority it was started with, and
KEEL_NICE=0 leaves everything at normal priority."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_helpers import keel, mission_id_of, proc_stat, record, start_keel, wait_for, workers_of, write_mission

from keel.server import background

BASE = os.getpriority(os.PRIO_PROCESS, 0)  # what this test runs at: keel never raises a priority
AUTOGROUPS = background.autogroup_nice() is not None
LEVEL = background.DEFAULT_NICE  # set explicitly: the test run's own default is 0 (tests/conftest.py)


def _mission(tmp_path: Path) -> Path:
    """One unit whose command writes what it runs at (its nice, its autogroup's), then sleeps long enough for
    its worker and host to be looked at."""
    out = tmp_path / "seen"
    # it is lowered right after it starts (by the process that runs the tool, shell.py): it looks a moment later
    cmd = (
        f"sleep 1; cut -d' ' -f19 /proc/self/stat > {out}.nice; cat /proc/self/autogroup > {out}.group 2>/dev/null;"
        f" touch {out}.done"
    )
    steps = [{"tool": "run", "args": {"cmd": cmd}}, {"sleep": 4}]
    return write_mission(tmp_path, [{"id": "u1", "params": {"steps": steps}}])


def _nice(pid: int) -> int:
    return int(proc_stat(pid)[16])  # state ppid pgrp session tty tpgid flags, 4 faults, 4 times, priority, nice


def _group(pid: int) -> int | None:
    return background.autogroup_nice(pid)


def _command(tmp_path: Path) -> tuple[int, int | None]:
    """What the unit's command ran at."""
    seen = tmp_path / "seen"
    wait_for(lambda: (seen.parent / "seen.done").exists(), timeout=60)
    group = (seen.parent / "seen.group").read_text() if (seen.parent / "seen.group").exists() else ""
    return int((seen.parent / "seen.nice").read_text()), int(group.rsplit("nice", 1)[1]) if group else None


def _a_worker(store: Path) -> int:
    workers: dict[int, int] = {}
    wait_for(lambda: bool(workers.update(workers_of(store)) or workers), timeout=60)
    return next(iter(workers))


def _detached(tmp_path: Path, store: Path, nice: str) -> tuple[str, int]:
    """The mission `keel run --detach` started with KEEL_NICE=`nice`, and its host's pid once it has one."""
    ran = keel("run", str(_mission(tmp_path)), "--detach", store=store, env={"KEEL_NICE": nice}, check_rc=0)
    mission = ran.stdout.split()[-1]
    wait_for(lambda: record(store, mission).host is not None, timeout=60)
    host = record(store, mission).host
    assert host is not None
    return mission, host.pid


def test_a_detached_host_its_worker_and_its_command_run_in_the_background(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mission, host = _detached(tmp_path, store, "10")
    worker = _a_worker(store)
    level = max(BASE, LEVEL)
    assert (_nice(host), _nice(worker)) == (level, level)
    nice, group = _command(tmp_path)
    assert nice == level
    if AUTOGROUPS:  # each is the first of a session of its own: its scheduling group is lowered, not only it
        assert (_group(host), _group(worker), group) == (level, level, level)
    wait_for(lambda: record(store, mission).state.value == "completed", timeout=120)


def test_a_foreground_run_keeps_its_priority_and_its_units_work_in_the_background(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = start_keel("run", str(_mission(tmp_path)), store=store, env={"KEEL_NICE": "10"})
    try:
        mission_id_of(proc)
        worker = _a_worker(store)
        level = max(BASE, LEVEL)
        assert (_nice(proc.pid), _nice(worker)) == (BASE, level)
        assert _command(tmp_path)[0] == level
        if AUTOGROUPS:
            assert _group(worker) == level
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_keel_nice_0_leaves_everything_at_normal_priority(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mission, host = _detached(tmp_path, store, "0")
    assert (_nice(host), _nice(_a_worker(store))) == (BASE, BASE)
    nice, group = _command(tmp_path)
    assert nice == BASE
    if AUTOGROUPS:
        assert (_group(host), group) == (0, 0)
    wait_for(lambda: record(store, mission).state.value == "completed", timeout=120)


@pytest.mark.parametrize(("value", "level"), [("", 10), ("5", 5), ("0", 0), ("40", 19), ("-3", 0), ("high", 10)])
def test_keel_nice_is_read_as_a_nice_value(monkeypatch: pytest.MonkeyPatch, value: str, level: int) -> None:
    if value:
        monkeypatch.setenv(background.NICE_VAR, value)
    else:
        monkeypatch.delenv(background.NICE_VAR, raising=False)
    assert background.nice_level() == level
