"""keel's own agents as forks of their unit's worker (server/engine/units/agentfork.py), through a real `keel run`:
what the fork is (its parent, group, session, directory, command line, what it holds open), that its unit's
effects still happen once each, and that an environment a fork could not honour gets a new interpreter."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
from engine_helpers import kill, mission_id_of, proc_file, proc_stat, start_keel, wait_for, workers_of, write_mission

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

AGENT = [sys.executable.encode(), b"-m", b"keel.agents.scripted"]


def _mission(tmp_path: Path, marks: Path) -> Path:
    """Units that each append their id to `marks` (an effect, journaled), then sleep."""
    steps = [[{"tool": "run", "args": {"cmd": f"echo u{i} >> {marks}"}}, {"sleep": 1.5}] for i in range(3)]
    return write_mission(tmp_path, [{"id": f"u{i}", "params": {"steps": steps[i]}} for i in range(3)], max_parallel=3)


def _agents_of(store: Path) -> dict[int, int]:
    """The live agents of this store's workers: pid -> its worker's pid."""
    workers = workers_of(store)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not (stat := proc_stat(int(entry.name))) or int(stat[1]) not in workers:
            continue
        if proc_file(int(entry.name), "cmdline").rstrip(b"\0").split(b"\0") == AGENT and stat[0] != b"Z":
            found[int(entry.name)] = int(stat[1])
    return found


def _held(pid: int) -> set[str]:
    """What the process holds open. It is running: a file it opens for a moment (a module it imports) may be
    closed between the listing and the look."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return held


def _forked(pid: int) -> bool:
    """A fork shows its command line over the argument block it was forked with (its worker's, kept long for
    titles): NULs pad it. A new interpreter's block is its own command line exactly."""
    raw = proc_file(pid, "cmdline")
    return len(raw) > len(raw.rstrip(b"\0")) + 1


def test_a_keel_agent_is_a_fork_of_its_worker_that_is_what_a_new_interpreter_would_be(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    proc = start_keel("run", str(_mission(tmp_path, marks)), store=store)
    try:
        mission_id_of(proc)
        agents: dict[int, int] = {}
        wait_for(lambda: bool(agents.update(_agents_of(store)) or agents), timeout=60)
        pid, worker = next(iter(agents.items()))
        assert _forked(pid), proc_file(pid, "cmdline")
        stat, worker_stat = proc_stat(pid), proc_stat(worker)
        assert int(stat[2]) == pid, "its own process group: the worker kills the agent and what it started by it"
        assert stat[3] == worker_stat[3], "in its worker's session, as the worker's new process would be"
        assert os.readlink(f"/proc/{pid}/cwd") == os.readlink(f"/proc/{worker}/cwd"), "it works in the sandbox"
        held = _held(pid)
        assert not [h for h in held if str(store) in h or h.endswith(".mdb")], held  # nothing of the store
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        kill(proc)
    assert sorted(marks.read_text().split()) == ["u0", "u1", "u2"]  # each unit's command once


def test_an_agent_environment_a_fork_cannot_honour_gets_a_new_interpreter(tmp_path: Path) -> None:
    """PYTHONHASHSEED (like PYTHONPATH) changes how an interpreter starts: a fork of the worker could not."""
    marks = tmp_path / "marks.txt"
    store = tmp_path / "store"
    proc = start_keel("run", str(_mission(tmp_path, marks)), store=store, env={"PYTHONHASHSEED": "7"})
    try:
        mission_id_of(proc)
        agents: dict[int, int] = {}
        wait_for(lambda: bool(agents.update(_agents_of(store)) or agents), timeout=60)
        pid = next(iter(agents))
        assert not _forked(pid), proc_file(pid, "cmdline")
        assert b"PYTHONHASHSEED=7" in proc_file(pid, "environ").split(b"\0")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        kill(proc)
    assert sorted(marks.read_text().split()) == ["u0", "u1", "u2"]
