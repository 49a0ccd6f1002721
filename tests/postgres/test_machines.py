"""A mission outlives the machine it runs on: two machines (network namespaces) share one PostgreSQL store.

Machine A runs the mission; machine B runs `keel supervise`, with a clone of the same git workspace.
The strike comes on a condition: a unit's first effect has run on A (its marker is in the side log, a file
outside every sandbox standing for the world), the mission is unfinished, and A's host holds the host
lease. Then either A is killed whole (every process in its namespace SIGKILLed, its link removed:
`kill`) or its link is cut while everything on it keeps running (`cut`). B's supervisor must see the
lease go silent, start a host on B, which makes the mission's sandboxes on B from the store and
completes the mission, each unit carrying on from its journal in a sandbox made from the store (none
starts again from scratch). For `cut`, A's link then comes back: A's host must find its lease taken and stop
without writing (exit 7).

Checked, on the product: the mission completes on B; every effect ran exactly once (an effect whose
outcome a machine's death left unknown is a question, answered as a person would from the side log);
the mission branch's files on B equal an undisturbed run's; each unit succeeded exactly once; the
store verifies. The time from the strike to B's host holding the lease is written to
test-artifacts/failover-<strike>.txt.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, read, record, unit_events, wait_for, write_mission

from keel.protocol.states import MissionState
from keel.storage import hostlease
from keel.storage import missions as m
from keel.storage.location import URL_FILE
from tests.pgserver import PgServer
from tests.postgres.machines import Machine, can_make_machines

pytestmark = pytest.mark.skipif(bool(can_make_machines()), reason=can_make_machines() or "")

UNITS = {"a": [], "b": [], "c": [], "d": ["a", "b"], "e": ["c", "d"]}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TTL_S = "3"  # the host lease: a silent host is taken over after this long


def _units(side: Path) -> list[dict[str, Any]]:
    def unit(uid: str) -> dict[str, Any]:
        diff = f"--- a/{uid}.py\n+++ b/{uid}.py\n@@ -1 +1 @@\n-{uid.upper()} = 1\n+{uid.upper()} = 2\n"
        return {
            "id": uid,
            "after": UNITS[uid],
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
                    {"tool": "run", "args": {"cmd": f"sleep 0.3; echo {uid}-1 >> {side}"}},
                    {"now": True},
                    {"sleep": 0.5},
                    {"tool": "apply_diff", "args": {"path": f"{uid}.py", "diff": diff}},
                    {"tool": "run", "args": {"cmd": f"echo {uid}-2 >> {side}"}},
                    {"save_state": {"unit": uid}},
                    {"tool": "read_file", "args": {"path": f"{uid}.py"}},
                ]
            },
        }

    return [unit(uid) for uid in UNITS]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _workspace(ws: Path) -> None:
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("two machines\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", "-A")
    _git(ws, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")


def _store(ws: Path, url: str) -> Path:
    folder = ws / ".keel" / "shared"
    folder.mkdir(parents=True)
    (folder / URL_FILE).write_text(url + "\n")
    return folder


def _markers(side: Path) -> list[str]:
    return side.read_text().split() if side.exists() else []


def _reference(folder: Path, server: PgServer) -> dict[str, Any]:
    side = folder / "side.log"
    _workspace(folder / "ws")
    mission = write_mission(folder, _units(side), max_parallel=3)
    store = _store(folder / "ws", server.store_url(server.new_schema()))
    done = keel("run", str(mission), "--json", store=store, timeout=120, check_rc=0)
    mid = json.loads(done.stdout.splitlines()[0])["mission"]
    return {"side": sorted(_markers(side)), "files": files(Path(record(store, mid).sandbox))}


def _answer(machine: Machine, its_store: Path, store: Path, mid: str, side: Path) -> None:
    """An effect whose outcome the strike left unknown: answered from the side log, as a person would."""
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", f"unexpected question: {question}"
    entry = read(store, lambda t: m.journal_get(t, mid, question.lane, question.seq))
    cmd = str(entry.result.get("cmd", ""))
    marker = cmd.rsplit("echo ", 1)[1].split(" ")[0]
    choice = "skip" if marker in _markers(side) else "rerun"
    answered = machine.keel(
        "answer", mid, choice, "--store", str(its_store), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = answered.communicate(timeout=60)
    assert answered.returncode == 0, f"keel answer: {out}{err}"
    wait_for(lambda: record(store, mid).question != question, timeout=60)  # a host on B took the answer up


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("strike", ["kill", "cut"])
def test_mission_moves_to_another_machine_when_its_machine_is_lost(
    tmp_path: Path, pg_server: PgServer, strike: str
) -> None:
    reference = _reference(tmp_path / "reference", pg_server)
    schema = pg_server.new_schema()
    a, b = Machine("machine-a", 1, pg_server.port), Machine("machine-b", 2, pg_server.port)
    try:
        side = tmp_path / "side.log"
        _workspace(tmp_path / "a" / "ws")
        mission = write_mission(tmp_path / "a", _units(side), max_parallel=3)
        _git(tmp_path, "clone", "-q", str(tmp_path / "a" / "ws"), str(tmp_path / "b" / "ws"))
        store_a, store_b = _store(tmp_path / "a" / "ws", a.url(schema)), _store(tmp_path / "b" / "ws", b.url(schema))
        here = _store(tmp_path / "observer", pg_server.store_url(schema))  # this process reads over 127.0.0.1
        env = {"KEEL_HOST_LEASE_TTL_S": TTL_S}
        supervisor = b.keel(
            "supervise", "--store", str(store_b), "--interval", "0.2",
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        host = a.keel(
            "run", str(mission), "--json", "--store", str(store_a),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]

        deadline = time.monotonic() + 60
        while "a-1" not in _markers(side) and "b-1" not in _markers(side):
            assert host.poll() is None and time.monotonic() < deadline, "the mission ended before the strike"
            time.sleep(0.005)
        lease = read(here, lambda t: hostlease.get(t, mid))
        assert record(here, mid).state == MissionState.RUNNING, "the mission is not running: nothing to strike"
        assert lease is not None and lease.hostname == "machine-a", f"machine A's host holds no lease: {lease}"
        before = len(_markers(side))
        struck_at = time.monotonic()
        if strike == "kill":
            killed = a.kill()
            assert host.pid in killed or host.poll() is not None
        else:
            a.cut()

        moved_after = None
        deadline = time.monotonic() + 180
        while (state := record(here, mid).state) != MissionState.COMPLETED:
            assert time.monotonic() < deadline, f"the mission did not complete on machine B (it is {state})"
            held = read(here, lambda t: hostlease.get(t, mid))
            if moved_after is None and held is not None and held.hostname == "machine-b":
                moved_after = time.monotonic() - struck_at
            if state == MissionState.WAITING_INPUT:
                _answer(b, store_b, here, mid, side)
            time.sleep(0.05)
        assert moved_after is not None or read(here, lambda t: hostlease.get(t, mid)).hostname == "machine-b"

        if strike == "cut":  # A's host, cut off all along, hears of the store again: it must stop, fenced
            a.mend()
            out, err = host.communicate(timeout=90)
            assert host.returncode == 7, f"machine A's host was not fenced ({host.returncode}): {err[-2000:]}"
            assert "taken over" in err, err[-2000:]

        final = record(here, mid)
        assert final.machine == "machine-b" and final.state == MissionState.COMPLETED
        assert Path(final.sandbox).is_relative_to(tmp_path / "b" / "ws")
        counts = collections.Counter(_markers(side))
        assert before < len(_markers(side)), "the mission had run all its effects before the strike"
        assert all(n == 1 for n in counts.values()), f"an effect ran twice: {_markers(side)}"
        assert sorted(counts) == reference["side"], f"effects lost: {sorted(counts)}"
        assert files(Path(final.sandbox)) == reference["files"]
        events = unit_events(here, mid)
        for unit in UNITS:
            states = [s for u, s in events if u == unit]
            assert states.count("succeeded") == 1 and states[-1] == "succeeded", (unit, states)
        evidence = [e.kind for _, e in read(here, lambda t: list(m.evidence_after(t, mid)))]
        assert "reexecuted" not in evidence, "a unit started again from scratch: its sandbox did not move"
        keel("verify", store=here, check_rc=0)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"failover-{strike}.txt").write_text(
            f"{strike}: machine B's host held the lease {moved_after:.2f} s after the strike "
            f"(host lease ttl {TTL_S} s, supervisor interval 0.2 s)\n"
            if moved_after is not None
            else f"{strike}: completed before the lease was seen on machine B\n"
        )
    finally:
        for machine in (a, b):
            machine.remove()
        for proc in (locals().get("supervisor"), locals().get("host")):
            if isinstance(proc, subprocess.Popen) and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert os.path.exists(ARTIFACTS / f"failover-{strike}.txt")
