"""One host per mission on every machine sharing the store: the host lease (storage/hostlease.py).

Another machine is played by writing the lease record as another machine's host would (its host name,
its pid): the flock of this machine knows nothing of it, only the store does. Checked: a live lease of
another machine refuses a second host; a silent one (heartbeat older than its ttl, by the store's clock)
is taken over with the next epoch; a host whose lease was taken stops at its next write, writing nothing,
and exits 7; a host that stops releases its lease, so the next host anywhere need not wait.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission

from keel.protocol.records import HostLease
from keel.protocol.states import MissionState
from keel.storage import Store, Txn, hostlease
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _units(side: Path, gate: Path | None = None) -> list[dict]:
    """Three units, each running a command, then another; with `gate`, each waits for that file between."""
    return [
        {
            "id": f"u{i}",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo u{i}-1 >> {side}"}},
                    {"wait_file": str(gate)} if gate else {"sleep": 0.5},
                    {"now": True},
                    {"sleep": 0.5},
                    {"tool": "run", "args": {"cmd": f"echo u{i}-2 >> {side}"}},
                ]
            },
        }
        for i in range(3)
    ]


def _as_other_machine(store: Path, mid: str, *, heard_s_ago: float) -> HostLease:
    """Claim the mission's lease as a host on another machine would have (next epoch)."""

    def claim(txn: object) -> HostLease:
        t = txn  # type: ignore[assignment]
        old = hostlease.get(t, mid)
        lease = HostLease(
            mission=mid,
            epoch=(old.epoch + 1) if old else 1,
            host_id="elsewhere",
            pid=4242,
            hostname="another-machine",
            heartbeat=t.clock() - heard_s_ago,
            ttl_s=3.0,
        )
        t.put(hostlease.DB.LEASES, mid.encode(), lease)
        return lease

    with Store.open(store, create=False) as s:
        return s.write(claim)  # type: ignore[arg-type]


def _paused_mission(tmp_path: Path) -> tuple[Path, str, Path]:
    """A mission paused while its units wait for a gate, which is opened once it is paused."""
    side, store, gate = tmp_path / "side.log", tmp_path / "store", tmp_path / "gate"
    host = start_keel("run", str(write_mission(tmp_path, _units(side, gate))), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: side.exists() and "u0-1" in side.read_text())
    keel("pause", mid, "--wait", "60", store=store, check_rc=0)
    host.communicate(timeout=60)
    assert record(store, mid).state == MissionState.PAUSED
    gate.touch()
    return store, mid, side


def test_a_host_that_stops_releases_its_lease(tmp_path: Path) -> None:
    store, mid, _ = _paused_mission(tmp_path)
    lease = read(store, lambda t: hostlease.get(t, mid))
    assert lease is not None and lease.epoch == 1 and lease.heartbeat == 0.0
    assert read(store, lambda t: hostlease.live(t, mid)) is None


def test_a_live_lease_of_another_machine_refuses_a_host_and_a_silent_one_is_taken_over(tmp_path: Path) -> None:
    store, mid, side = _paused_mission(tmp_path)
    _as_other_machine(store, mid, heard_s_ago=0.0)
    for how in (("--plain",), ()):  # the host in this process, or a detached one
        refused = keel("resume", mid, *how, store=store)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "already running (host pid 4242 on another-machine, heard from" in refused.stderr
    assert record(store, mid).state == MissionState.PAUSED  # the refused host wrote nothing

    _as_other_machine(store, mid, heard_s_ago=10.0)  # silent for longer than its ttl (3 s)
    keel("resume", mid, "--plain", store=store, timeout=120, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    lease = read(store, lambda t: hostlease.get(t, mid))
    assert lease.epoch == 4 and lease.hostname != "another-machine"  # 1 first run, 2 and 3 the other machine
    assert sorted(side.read_text().split()) == sorted(f"u{i}-{k}" for i in range(3) for k in (1, 2))


def test_a_host_whose_lease_was_taken_stops_without_writing(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, _units(side))), store=store)
    try:
        mid = mission_id_of(host)
        wait_for(lambda: side.exists() and "u0-1" in side.read_text())
        assert host.poll() is None and record(store, mid).state == MissionState.RUNNING
        taken = _as_other_machine(store, mid, heard_s_ago=0.0)
        before = read(store, lambda t: (m.head_checkpoint(t, mid), [e for _, e in m.events_after(t, mid)]))
        _, err = host.communicate(timeout=30)
    finally:
        kill(host)
    assert host.returncode == 7, err
    assert f"this host's lease (epoch {taken.epoch - 1}) was taken over" in err
    after = read(store, lambda t: (m.head_checkpoint(t, mid), [e for _, e in m.events_after(t, mid)]))
    assert after == before  # no checkpoint, no event since the lease was taken
    assert read(store, lambda t: hostlease.get(t, mid)) == taken  # not released by the fenced host
    assert record(store, mid).state == MissionState.RUNNING  # for the lease's holder to carry on


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("unshare") is None, reason="a node name of its own needs root")
def test_a_mission_resumed_under_another_node_name_moves_only_on_a_shared_store(tmp_path: Path, backend: str) -> None:
    """A container gets a new node name each time it starts: an LMDB mission resumed there is the same
    machine's (its sandboxes are on this disk) and carries on in place; a PostgreSQL mission moves (its
    sandboxes are made again from the store), and both finish with every effect once."""
    side = tmp_path / "side.log"
    mission = write_mission(tmp_path, _units(side))
    store = tmp_path / "store"
    host = start_keel("run", str(mission), store=store, env={"KEEL_HOST_LEASE_TTL_S": "1"})
    mid = mission_id_of(host)

    def first_effects_recorded(t: Txn) -> bool:
        return all(getattr(m.journal_get(t, mid, f"u{i}", 1), "phase", "") == "done" for i in range(3))

    wait_for(lambda: read(store, first_effects_recorded))  # none in doubt: nothing to ask about
    kill(host)
    # under another name, the killed host's lease is another machine's: it is waited out (its ttl)
    wait_for(lambda: read(store, lambda t: hostlease.live(t, mid)) is None)
    before = record(store, mid)
    assert before.state == MissionState.RUNNING and before.machine == os.uname().nodename
    renamed = subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname renamed-node && exec "$@"', "sh",
         sys.executable, "-m", "keel.server.cli", "resume", mid, "--store", str(store), "--plain"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert renamed.returncode == 0, renamed.stdout + renamed.stderr
    after = record(store, mid)
    assert after.state == MissionState.COMPLETED and after.machine == "renamed-node"
    moved = "moves here" in renamed.stdout
    assert moved == (backend == "postgresql"), renamed.stdout
    assert (after.sandbox == before.sandbox) or backend == "postgresql"
    lines = side.read_text().split()
    assert sorted(lines) == sorted(f"u{i}-{k}" for i in range(3) for k in (1, 2)), lines
