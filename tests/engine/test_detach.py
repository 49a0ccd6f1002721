"""A detached host started by the command line is a fork of it (server/hoststart.py): it leaves the
command's session and standard streams, keeps none of its other descriptors, writes to the mission's log,
and runs the mission to the end. A process holding a store open never forks one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import files, keel, read, record, starters_of, wait_for, workers_of, write_mission

from keel.protocol.records import HostInfo
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


def _struck(tmp_path: Path) -> tuple[Path, str, Path, Path, HostInfo]:
    """A detached mission of two commands with a gate between them, its host SIGKILLed while the agent waits at
    the gate: the store, the mission, the gate, the commands' side file, the struck host."""
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
    assert host is not None
    os.killpg(host.pid, signal.SIGKILL)
    wait_for(lambda: _state(host.pid) in ("Z", "X"), timeout=30)
    return store, mid, gate, side, host


def test_a_resume_by_hand_after_a_kill_forks_a_host_that_does_each_effect_once(tmp_path: Path) -> None:
    store, mid, gate, side, host = _struck(tmp_path)
    assert side.read_text().split() == ["one"]
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


STARTER = """
import os, signal, sys, threading
from pathlib import Path
from keel.server.hoststarter import HostStarter
starter = HostStarter.launch()
assert starter is not None
threading.Thread(target=lambda: None).start()  # the caller has threads by the time it starts hosts
print(starter.pid, flush=True)
for line in sys.stdin:
    if line.strip() == "kill":
        os.kill(starter.pid, signal.SIGKILL)
        os.waitpid(starter.pid, 0)
        print("killed", flush=True)
    else:
        print(starter.start(Path(sys.argv[1]), line.strip()), flush=True)
"""


STARTER_TITLE = [b"keel", b"host-starter"]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_host_starter_forks_hosts_for_a_process_with_threads_and_ends_with_it(tmp_path: Path) -> None:
    """A struck mission's host restarted through the starter (as `keel serve` restarts one) is the starter's
    fork, makes each effect once, and the starter leaves with its parent. A starter that is gone is replaced
    by a new interpreter."""
    store, mid, gate, side, _ = _struck(tmp_path)
    caller = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert caller.stdin is not None and caller.stdout is not None
    try:
        starter = int(caller.stdout.readline())
        # it has loaded the host and said so: it is asked from now on (before, a start would not wait for it)
        wait_for(lambda: Path(f"/proc/{starter}/cmdline").read_bytes().split(b"\0")[:2] == STARTER_TITLE, timeout=30)
        # none of its parent's pipes (here its stdin and stdout); two sockets: its own, and the one to the worker
        # starter it keeps ready for the next host it forks (units/workerstarter.py)
        wait_for(lambda: len(starters_of(starter)) == 1, timeout=30)
        spare = starters_of(starter)[0]
        held = _descriptors(starter)
        assert held[0] == held[1] == os.devnull, held
        assert not [f for f in held.values() if f.startswith("pipe:")], held
        assert len([f for f in held.values() if f.startswith("socket:")]) == 2, held
        caller.stdin.write(mid + "\n")
        caller.stdin.flush()
        host = int(caller.stdout.readline())
        assert _parent(host) == starter
        wait_for(lambda: starters_of(starter) not in ([], [spare]), timeout=30)  # a new one for the next host
        wanted = [b"keel", b"resume", mid.encode()]  # ps shows a host, not the process it was forked from
        wait_for(lambda: Path(f"/proc/{host}/cmdline").read_bytes().split(b"\0")[:3] == wanted, timeout=10)
        wait_for(lambda: os.getsid(host) == host, timeout=10)  # it leaves the caller's session first thing
        wait_for(lambda: (r := record(store, mid).host) is not None and r.pid == host, timeout=60)
        # its units' workers: forks of the starter it was handed
        wait_for(lambda: spare in set(workers_of(store).values()), timeout=60)
        gate.write_text("go\n")
        wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
        assert side.read_text().split() == ["one", "two"]
        wait_for(lambda: _state(host) == "X", timeout=30)  # reaped at once: never a zombie a supervisor takes as alive
        caller.stdin.write("kill\n")
        caller.stdin.flush()
        assert caller.stdout.readline().strip() == "killed"
        caller.stdin.write("not-a-mission\n")  # no starter: a new interpreter, which finds no such mission
        caller.stdin.flush()
        assert _parent(int(caller.stdout.readline())) == caller.pid
    finally:
        caller.stdin.close()
        caller.wait(timeout=30)
    again = subprocess.Popen([sys.executable, "-c", STARTER, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert again.stdout is not None
    starter = int(again.stdout.readline())
    again.kill()  # its parent dies without a word: the starter ends too
    again.communicate(timeout=30)
    wait_for(lambda: _state(starter) in ("Z", "X"), timeout=30)


RUNS = """
import json, subprocess, sys, threading, time
from keel.server.hoststarter import HostStarter
starter = HostStarter.launch()
assert starter is not None
threading.Thread(target=lambda: None).start()
store = sys.argv[1]
while (done := starter.run(["-m", "keel.server.cli", "missions", "--json", "--store", store], 30)) is None:
    time.sleep(0.05)  # not ready yet: a caller would have run a new interpreter
report = {"missions": [done.returncode, json.loads(done.stdout)]}
missing = starter.run(["-m", "keel.server.cli", "status", "nope", "--store", store], 30)
report["missing"] = [missing.returncode, missing.stderr]
call = starter.run(["-m", "keel.server.lsp.enginecall", "resume", json.dumps([store, "nope"])], 30)
report["call"] = [call.returncode, json.loads(call.stdout)]
report["other"] = starter.run(["-c", "print(1)"], 30) is None
try:
    starter.run(["-m", "keel.server.cli", "supervise", "--store", store, "--interval", "60"], 1)  # never ends
    report["timeout"] = False
except subprocess.TimeoutExpired:
    report["timeout"] = True
print(json.dumps(report))
"""


def test_a_host_starter_runs_keel_commands_as_forks_with_their_output_and_exit_code(tmp_path: Path) -> None:
    """What the language server's engine calls go through (lsp/enginecall.py): output, errors and exit codes as
    a new interpreter's; only keel's own entry points; a run past its time is stopped."""
    store = tmp_path / "store"
    mid = keel("run", str(write_mission(tmp_path, [{"id": "u", "params": {"steps": []}}])), store=store).stdout
    ran = subprocess.run([sys.executable, "-c", RUNS, str(store)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    code, missions = report["missions"]
    assert code == 0 and [m["state"] for m in missions] == ["completed"], (report, mid)
    code, stderr = report["missing"]
    assert code == 6 and "nope" in stderr, report  # not found: the command line's own exit code and message
    code, answer = report["call"]
    assert code == 1 and "nope" in answer["error"]["message"], report
    assert report["other"] is True and report["timeout"] is True, report
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _serves(p, store)], "the timed-out run"


def _serves(proc: Path, store: Path) -> bool:
    try:
        return f"supervise\0--store\0{store}".encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
