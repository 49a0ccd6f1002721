"""Units' workers as forks of the host's worker starter (server/engine/units/workerstarter.py), through a real
`keel run`: what a fork is (its parent, session, command line, environment, run tag), that a SIGKILLed fork is
seen as killed and its unit run again without repeating its effect, that with the starter gone the workers are
new interpreters, and that the starter ends with its host."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from engine_helpers import (
    keel,
    kill,
    mission_id_of,
    proc_file,
    proc_stat,
    read,
    start_keel,
    starters_of,
    unit_events,
    wait_for,
    workers_of,
    write_mission,
)

from keel.server.engine.units.runtree import TAG_VAR
from keel.storage import missions as m
from tests.hosts import kill_hosts

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def unit_of(worker: int) -> str:
    return proc_file(worker, "cmdline").split(b"--unit\0")[-1].split(b"\0")[0].decode()


def _sleepy(tmp_path: Path, units: int, seconds: float, marks: Path) -> Path:
    """Units that each append their id to `marks` (an effect, journaled), then sleep."""
    return write_mission(
        tmp_path,
        [
            {
                "id": f"u{i}",
                "title": f"unit {i}",
                "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo u{i} >> {marks}"}}, {"sleep": seconds}]},
            }
            for i in range(units)
        ],
        max_parallel=2,
    )


def test_workers_are_forks_of_the_hosts_starter_that_show_what_they_are(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    proc = start_keel("run", str(_sleepy(tmp_path, 6, 0.6, marks)), store=store, env={"LLM_SECRET_KEY": "sk-xyz123"})
    try:
        mission_id_of(proc)
        starter: list[int] = []
        wait_for(lambda: bool(starter.extend(starters_of(proc.pid)) or starter), timeout=30)
        forks: dict[int, bytes] = {}

        def a_fork_seen() -> bool:  # once it shows its tag: it writes it first thing, after its command line
            for pid, parent in workers_of(store).items():
                if parent == starter[0] and f"{TAG_VAR}=".encode() + b"m" in (environ := proc_file(pid, "environ")):
                    forks[pid] = environ
            return bool(forks)

        wait_for(a_fork_seen, timeout=60)
        pid, environ = next(iter(forks.items()))
        stat = proc_stat(pid)
        assert int(stat[3]) == pid, "a fork leads its own session (the host kills it with its session)"
        cmd = proc_file(pid, "cmdline").split(b"\0")
        assert cmd[1:3] == [b"-m", b"keel.server.engine.units.subagent"], cmd
        assert b"--store" in cmd and str(store).encode() in cmd, cmd
        tag = [e for e in environ.split(b"\0") if e.startswith(f"{TAG_VAR}=".encode())]
        assert tag and tag[0].endswith(b"/"), environ  # its run's tag, as runtree finds every process of a run
        assert b"sk-xyz123" not in environ and b"LLM_SECRET_KEY" not in environ
        assert os.readlink(f"/proc/{pid}/cwd").startswith(str(tmp_path)), "it works in the unit's sandbox"
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        kill(proc)
    assert sorted(marks.read_text().split()) == sorted(f"u{i}" for i in range(6))  # each unit's command once
    wait_for(lambda: not starters_of(proc.pid) and not Path(f"/proc/{starter[0]}").exists(), timeout=10)


def test_a_killed_fork_is_a_lost_worker_and_its_unit_runs_again_without_repeating_its_effect(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    proc = start_keel("run", str(_sleepy(tmp_path, 3, 4.0, marks)), store=store)
    try:
        mid = mission_id_of(proc)
        starter: list[int] = []
        wait_for(lambda: bool(starter.extend(starters_of(proc.pid)) or starter), timeout=30)

        def a_fork_past_its_command() -> int | None:
            """A forked worker whose unit's command outcome is journaled (the unit sleeps now)."""
            forks = {unit_of(pid): pid for pid, parent in workers_of(store).items() if parent == starter[0]}
            journals = read(store, lambda t: {u: m.journal_entries(t, mid, u) for u in forks})
            ran = [
                u for u, entries in journals.items() if any(e.kind == "tool/run" and e.phase == "done" for e in entries)
            ]
            return forks[ran[0]] if ran else None

        struck: list[int] = []
        wait_for(lambda: bool((pid := a_fork_past_its_command()) and not struck.append(pid)), timeout=60)
        unit = unit_of(struck[0])
        os.kill(struck[0], signal.SIGKILL)
        wait_for(lambda: any(unit_of(p) == unit for p in workers_of(store) if p != struck[0]), timeout=60)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err
    finally:
        kill(proc)
    assert sorted(marks.read_text().split()) == ["u0", "u1", "u2"]  # the struck unit's command was not run again
    assert read(store, lambda t: m.get_mission(t, mid)).state.value == "completed"
    assert (unit, "succeeded") in unit_events(store, mid)


def test_with_the_starter_gone_workers_are_new_interpreters(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    proc = start_keel("run", str(_sleepy(tmp_path, 4, 0.5, marks)), store=store)
    try:
        mission_id_of(proc)
        starter: list[int] = []
        wait_for(lambda: bool(starter.extend(starters_of(proc.pid)) or starter), timeout=30)
        os.kill(starter[0], signal.SIGKILL)
        wait_for(lambda: not proc_stat(starter[0]) or proc_stat(starter[0])[0] == b"Z", timeout=30)
        forked = set(workers_of(store))  # forked before the strike landed: they run on (or stop) as they were
        parents: set[int] = set()
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            parents |= {parent for pid, parent in workers_of(store).items() if pid not in forked}
            time.sleep(0.02)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
    finally:
        kill(proc)
    assert sorted(marks.read_text().split()) == ["u0", "u1", "u2", "u3"]
    assert parents == {proc.pid}, parents  # every worker seen after the strike was the host's own child


def test_keel_run_detach_returns_at_once_and_its_host_forks_workers_from_the_starter_it_was_handed(
    tmp_path: Path,
) -> None:
    """`keel run --detach` starts a worker starter before it forks the host, and the host takes it over: the
    command's output pipes must not be held by it (a caller reading them would wait for the whole mission)."""
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    try:
        done = keel("run", str(_sleepy(tmp_path, 4, 2.0, marks)), "--detach", store=store, check_rc=0)
        mid = done.stdout.split()[-1]
        assert read(store, lambda t: m.get_mission(t, mid)).state.value in ("created", "running")  # before the end
        wait_for(lambda: read(store, lambda t: m.get_mission(t, mid)).host is not None, timeout=60)
        host = read(store, lambda t: m.get_mission(t, mid)).host.pid
        parents: set[bytes] = set()

        def forked() -> bool:
            parents.update(proc_file(p, "cmdline") for p in workers_of(store).values())
            return b"keel\0worker-starter" in b"".join(parents)

        wait_for(forked, timeout=60)
        wait_for(lambda: read(store, lambda t: m.get_mission(t, mid)).state.value == "completed", timeout=120)
        assert sorted(marks.read_text().split()) == ["u0", "u1", "u2", "u3"]
        wait_for(lambda: not Path(f"/proc/{host}").exists() or proc_stat(host)[0] == b"Z", timeout=30)
        wait_for(lambda: not any(str(store).encode() in proc_file(p, "cmdline") for p in workers_of(store)), timeout=30)
    finally:
        kill_hosts(store)  # a failed check leaves no host behind (on PostgreSQL it would wait for its server)
