"""A fleet on one PostgreSQL: 100 missions queued, hosted by one `keel supervise --in-process`, and worked
through by 4 `keel worker`s. Checked on the product: every mission completes, every unit's effect (a line in a
side log outside every sandbox) is made exactly once, one process hosts every mission (no host process of its
own for any), and keel's connections stay few: a pool per process, not per mission."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import write_mission

from keel.protocol.states import MissionState
from keel.server.engine import control
from keel.storage import Store
from keel.storage import missions as m
from tests.pgserver import PgServer

pytestmark = pytest.mark.xdist_group("fleet")  # four workers and a host of 100 missions: the machine's cores

MISSIONS = 100
WORKERS = 4
KEEL = [sys.executable, "-m", "keel.server.cli"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _queue(store: Path, root: Path, side: Path) -> list[str]:
    """MISSIONS missions of one unit each (`workers = true`), recorded running with no host, as `keel run
    --queue` records them."""
    ids = []
    with Store.open(store, create=False) as opened:
        for n in range(MISSIONS):
            folder = root / f"m{n}"
            folder.mkdir()
            steps: list[dict[str, Any]] = [{"tool": "run", "args": {"cmd": f"echo m{n} >> {side}"}}]
            mission = write_mission(folder, [{"id": "u", "params": {"steps": steps}}], workers=True)
            ids.append(control.queue_mission(opened, mission).id)
    return ids


def _keel_processes(store: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if str(store) in line and "keel.server.cli" in line:
                    found.append(line)
    return found


def test_a_hundred_missions_hosted_in_one_process_and_worked_by_four_workers(
    tmp_path: Path, pg_server: PgServer
) -> None:
    store = pg_server.store_folder(tmp_path / "store")
    side = tmp_path / "side.log"
    began = time.monotonic()
    mission_ids = _queue(store, tmp_path, side)
    queued = time.monotonic() - began
    logs = (tmp_path / "fleet.log").open("ab")
    procs = [
        subprocess.Popen(
            [*KEEL, "supervise", "--in-process", "--interval", "1", "--store", str(store)],
            stdout=logs,
            stderr=logs,
            cwd=tmp_path,
        )
    ]
    procs += [
        subprocess.Popen(
            [*KEEL, "worker", "--units", "3", "--interval", "1", "--store", str(store)],
            stdout=logs,
            stderr=logs,
            cwd=tmp_path,
        )
        for _ in range(WORKERS)
    ]
    most_connections, peak = 0, []
    try:
        deadline = time.monotonic() + 420
        states: dict[str, MissionState] = {}
        while time.monotonic() < deadline:
            with Store.open(store, create=False) as opened:
                states = {r.id: r.state for r in opened.read(m.list_missions)}
            with pg_server.connect() as conn:
                held = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity WHERE application_name LIKE 'keel pid%'"
                    " GROUP BY 1"
                ).fetchall()
            if sum(count for _, count in held) > most_connections:
                most_connections, peak = sum(count for _, count in held), held
            if all(state in (MissionState.COMPLETED, MissionState.FAILED) for state in states.values()):
                break
            time.sleep(1.0)
        processes = _keel_processes(store)
        took = time.monotonic() - began
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
    log = (tmp_path / "fleet.log").read_text(errors="replace")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "fleet.txt").write_text(
        f"{MISSIONS} missions queued in {queued:.1f} s, all ended {took:.1f} s after the first was queued "
        f"({MISSIONS / took:.2f} missions/s with {WORKERS} workers); keel's connections at most {most_connections}\n"
    )
    assert sorted(states) == sorted(mission_ids)
    assert all(state == MissionState.COMPLETED for state in states.values()), (
        f"{sum(s == MissionState.COMPLETED for s in states.values())} of {MISSIONS} completed\n{log[-3000:]}"
    )
    lines = side.read_text().split()
    assert sorted(lines) == sorted(f"m{n}" for n in range(MISSIONS)), "an effect made twice, or missing"
    assert not [line for line in processes if " resume " in line], "a mission got a host process of its own"
    assert len(processes) == 1 + WORKERS, processes
    # a process holds its pool (4 at most) and its listener, however many missions it hosts; a unit's worker
    # process on a `keel worker` (3 units each) its own small one: bounded by the units running, not the missions
    assert all(count <= 5 for _, count in peak), peak
    assert most_connections <= (1 + WORKERS) * 5 + WORKERS * 3 * 2, (peak, processes)
