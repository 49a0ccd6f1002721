"""A worker of a killed host can still record its unit's completion after a new host has read the leases and
before that host has stopped it. The new host decides on the lease as it is once the old run is stopped: the
unit is taken over as finished and merged from its own sandbox, never started again in a fresh sandbox (where a
replay of its journal would answer its file writes without making them, and its files would be lost).

The late completion is written by this test exactly as a worker writes one (its changes committed on the
unit's branch, its files snapshotted, `leases.complete` under its epoch), at the fault point where the new
host holds with the leases read."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgspec
import pytest
from engine_helpers import (
    keel,
    mission_id_of,
    read,
    record,
    start_keel,
    unit_events,
    wait_for,
    write_mission,
)

from keel.protocol.states import LeaseState
from keel.server.engine.files import merge, trees
from keel.server.engine.files.sandbox import SandboxError
from keel.server.engine.units import placement
from keel.storage import Store, leases
from keel.storage import missions as m
from tests.bundles.kit import git, git_workspace

pytestmark = pytest.mark.usefixtures("store_backend")

GATE = "gate.txt"


def _units(gate: Path) -> list[dict[str, object]]:
    return [
        {
            "id": "c",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "c.py", "content": "print('c')\n"}},
                    {"wait_file": str(gate)},
                ]
            },
        },
        {"id": "d", "after": ["c"], "params": {"steps": [{"tool": "read_file", "args": {"path": "c.py"}}]}},
    ]


def _lease(store: Path, mid: str) -> leases.UnitLease:
    held = read(store, lambda t: leases.get(t, mid, "c"))
    assert held is not None
    return held  # type: ignore[no-any-return]


def _write_file_done(store: Path, mid: str) -> bool:
    entries = read(store, lambda t: m.journal_entries(t, mid, "c"))
    return any(e.phase == "done" and e.summary.startswith("write_file") for e in entries)


def _complete_late(store: Path, mid: str, held: leases.UnitLease) -> None:
    """What the old run's worker does last (workerloop._complete): commit, snapshot, record under its epoch."""
    sandbox = Path(held.place.sandbox)
    commit = merge.commit_unit(sandbox, "c")
    files = trees.Snapshotter()
    scan = files.scan(sandbox)
    with Store.open(store, create=False) as s:
        s.write(
            lambda t: leases.complete(
                t, mid, "c", held.epoch, result=None, commit=commit, tree=files.store_txn(t, sandbox, scan)
            )
        )


def test_a_completion_recorded_while_the_new_host_recovers_is_taken_over(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    git_workspace(ws)
    store, gate, mark = tmp_path / "store", tmp_path / GATE, tmp_path / "recover.mark"
    host = start_keel("run", str(write_mission(tmp_path, _units(gate))), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: _write_file_done(store, mid), timeout=120)  # c.py written; the agent waits at its gate
    os.kill(host.pid, signal.SIGKILL)
    host.communicate(timeout=30)
    before = _lease(store, mid)
    assert before.state != LeaseState.DONE and (Path(before.place.sandbox) / "c.py").exists()
    gate.write_text("go\n")  # a unit started again would now run to its end

    resumed = start_keel("resume", mid, store=store, env={"KEEL_FAULT_RECOVER_LEASES": f"{mark}:hold"})
    wait_for(mark.exists, timeout=120)  # the new host has read c's lease: not completed
    assert int(mark.read_text()) == resumed.pid
    _complete_late(store, mid, before)  # the old run's completion lands now
    assert _lease(store, mid).state == LeaseState.DONE
    mark.unlink()
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, f"{out}\n{err}"

    assert record(store, mid).state.value == "completed"
    branch = git(ws, "ls-tree", "-r", "--name-only", "--full-tree", f"keel/{mid}").split()
    assert "c.py" in branch, branch
    after = _lease(store, mid)
    assert after.epoch == before.epoch, "unit c was started again after its completion was recorded"
    assert unit_events(store, mid).count(("c", "succeeded")) == 1
    assert keel("verify", store=store).returncode == 0


def test_a_lane_with_steps_never_gets_a_fresh_sandbox(tmp_path: Path) -> None:
    """Wherever a unit is started again on a lane whose journal holds steps, its sandbox is its own: the one
    it completed in, or, when that folder is gone, one made again from its snapshots; never a fresh one."""
    git_workspace(tmp_path / "ws")
    store, gate = tmp_path / "store", tmp_path / GATE
    gate.write_text("go\n")
    keel("run", str(write_mission(tmp_path, _units(gate))), store=store, timeout=180, check_rc=0)
    mid = read(store, m.list_missions)[0].id
    held = _lease(store, mid)
    assert held.state == LeaseState.DONE and held.place.last_checkpoint > 0
    own = Path(held.place.sandbox)

    kept = placement.reuse(store, mid, "c", held)
    assert kept is not None and Path(kept.sandbox) == own and kept.scan is None  # not made afresh
    assert placement.has_steps("c", held)

    merge.remove_sandbox(own)  # its folder lost: made again from the snapshots its lease names
    assert placement.reuse(store, mid, "c", held) is None
    with Store.open(store, create=False) as s:
        again = placement.remade(s, store, mid, held)
    assert Path(again.sandbox) == own and again.copied and (own / "c.py").read_text() == "print('c')\n"

    unkept = msgspec.structs.replace(held, place=msgspec.structs.replace(held.place, tree="", base_tree=""))
    with Store.open(store, create=False) as s, pytest.raises(SandboxError, match=r"holds .* step"):
        placement.remade(s, store, mid, unkept)
