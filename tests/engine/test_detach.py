"""A detached host started by the command line is a fork of it (server/hoststart.py): it leaves the
command's session and standard streams, keeps none of its other descriptors, writes to the mission's log,
and runs the mission to the end. A process holding a store open never forks one."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import files, keel, read, record, wait_for, write_mission

from keel.protocol.states import MissionState
from keel.server.engine.files import places
from keel.storage import Store
from keel.storage import missions as m
from keel.storage.base import held_in_process
from tests.hosts import kill_hosts

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture(autouse=True)
def _no_host_left(tmp_path: Path) -> Iterator[None]:
    yield
    kill_hosts(tmp_path / "store")  # a failed test's host still waits at its gate


def _descriptors(pid: int) -> dict[int, str]:
    found = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found[int(fd.name)] = os.readlink(fd)
        except OSError:
            continue
    return found


def test_a_detached_host_leaves_the_command_and_runs_the_mission(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    steps = [
        {"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
        {"wait_file": str(gate)},
        {"tool": "write_file", "args": {"path": "b.txt", "content": "b\n"}},
    ]
    store = tmp_path / "store"
    # The command's output is a pipe read to its end: had the host kept it, this would wait for the host, which
    # waits at its gate.
    ran = keel("run", str(write_mission(tmp_path, [{"id": "u", "params": {"steps": steps}}])), "--detach", store=store)
    assert ran.returncode == 0, ran.stderr
    mid = ran.stdout.split()[-1]
    wait_for(lambda: (r := record(store, mid)).host is not None and r.host.pid > 0, timeout=60)
    host = record(store, mid).host
    assert host is not None
    pid = host.pid
    assert os.getsid(pid) == pid, "the host leads a session of its own"
    fds = _descriptors(pid)
    log = places.log_path(store, mid).resolve()
    assert fds[0] == os.devnull and fds[1] == str(log) and fds[2] == str(log), fds
    gate.write_text("go\n")
    wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
    sandbox = Path(record(store, mid).sandbox)
    assert files(sandbox).get("a.txt") == b"a\n" and files(sandbox).get("b.txt") == b"b\n"
    assert log.read_text(), "the host wrote nothing to the mission's log"


def test_a_resume_by_hand_after_a_kill_forks_a_host_that_does_each_effect_once(tmp_path: Path) -> None:
    gate, side = tmp_path / "gate", tmp_path / "side.log"
    steps = [
        {"tool": "run", "args": {"cmd": f"echo one >> {side}"}},
        {"wait_file": str(gate)},
        {"tool": "run", "args": {"cmd": f"echo two >> {side}"}},
    ]
    store = tmp_path / "store"
    ran = keel("run", str(write_mission(tmp_path, [{"id": "u", "params": {"steps": steps}}])), "--detach", store=store)
    mid = ran.stdout.split()[-1]
    # struck while the agent waits at the gate: the first command's outcome is in the journal (struck between
    # the command and its record, keel would rightly ask whether it ran instead of running it again)
    wait_for(lambda: _recorded_runs(store, mid) == 1 and record(store, mid).host is not None, timeout=60)
    host = record(store, mid).host
    assert host is not None and side.read_text().split() == ["one"]
    os.killpg(host.pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{host.pid}").exists() or _state(host.pid) == "Z", timeout=30)
    resumed = keel("resume", mid, "--detach", store=store)
    assert resumed.returncode == 0 and resumed.stdout.split()[-1] == mid, resumed.stderr
    gate.write_text("go\n")
    wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
    assert side.read_text().split() == ["one", "two"]
    again = record(store, mid).host
    assert again is None or again.pid != host.pid


def _recorded_runs(store: Path, mission_id: str) -> int:
    entries = read(store, lambda t: m.journal_entries(t, mission_id, "u"))
    return sum(1 for e in entries if e.kind == "tool/run" and e.phase != "intent")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def test_a_store_open_in_this_process_is_seen_and_its_close_too(tmp_path: Path) -> None:
    assert not held_in_process()
    with Store.open(tmp_path / "store") as store:
        assert held_in_process()
        with Store.open(tmp_path / "store") as again:
            again.close()
            assert held_in_process(), "the first store is still open"
        assert store.read(lambda t: True)
    assert not held_in_process()
