"""SIGKILL the host and random subagents at the same moment, at random points; resume; compare.

Every iteration runs a 3-unit mission (two parallel units, one after both; file writes and diffs,
now/random, saved state), kills the host and a random subset of its live subagents together (sometimes
the subagents only), then resumes until the mission completes — sometimes killing again during a
resume. Checked against an undisturbed run: the same mission-branch files and unit results; every
unit's completion recorded exactly once; none lost. KEEL_CHAOS_ITERATIONS sets the count (CI: 30).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    files,
    keel,
    kill,
    mission_id_of,
    read,
    record,
    sandbox_of,
    start_keel,
    unit_events,
    write_mission,
)
from subagent_helpers import all_leases

from keel.protocol.states import MissionState
from keel.storage import missions as m

ITERATIONS = max(30, int(os.environ.get("KEEL_CHAOS_ITERATIONS", "30")))


def _units() -> list[dict[str, Any]]:
    def unit(uid: str, after: list[str]) -> dict[str, Any]:
        diff = f"--- a/{uid}.py\n+++ b/{uid}.py\n@@ -1 +1 @@\n-{uid.upper()} = 1\n+{uid.upper()} = 2\n"
        return {"id": uid, "after": after, "params": {"steps": [
            {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
            {"now": True}, {"random": True}, {"sleep": 0.1},
            {"tool": "apply_diff", "args": {"path": f"{uid}.py", "diff": diff}},
            {"save_state": {"unit": uid}}, {"sleep": 0.1},
            {"tool": "read_file", "args": {"path": f"{uid}.py"}}]}}
    return [unit("a", []), unit("b", []), unit("c", ["a", "b"])]


def _normal(result: Any) -> Any:
    return [o if isinstance(o, dict) or o is None else "value" for o in result["outputs"]]


def _strike(host: subprocess.Popen[str], store: Path, mid: str, rng: random.Random) -> int:
    """Kill a random subset of live subagents and (mostly) the host, all at once; returns kills."""
    workers = [x.pid for x in all_leases(store, mid) if x.state == "running" and x.pid > 0]
    victims = rng.sample(workers, rng.randint(0, len(workers)))
    host_too = rng.random() < 0.8 or not victims
    kills = 0
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
            kills += 1
        except ProcessLookupError:
            pass
    if host_too:
        kills += host.poll() is None
        kill(host)
    else:
        host.communicate(timeout=60)
    return kills


def _run(folder: Path, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    store = folder / "store"
    host = start_keel("run", str(write_mission(folder, _units())), store=store)
    mid = mission_id_of(host)
    kills = 0
    if seed < 0:
        host.communicate(timeout=60)
    else:
        time.sleep(rng.uniform(0.2, 2.0))
        kills += _strike(host, store, mid, rng)
    for _round in range(10):
        state = record(store, mid).state
        if state == MissionState.COMPLETED:
            break
        assert state != MissionState.WAITING_INPUT, f"seed {seed}: unexpected question {record(store, mid).question}"
        if seed >= 0 and rng.random() < 0.3:
            again = start_keel("resume", mid, store=store)
            time.sleep(rng.uniform(0.3, 1.5))
            kills += _strike(again, store, mid, rng)
            continue
        resumed = keel("resume", mid, store=store, timeout=60)
        assert resumed.returncode in (0, 3), f"seed {seed}: resume exited {resumed.returncode}: {resumed.stderr}"
    assert record(store, mid).state == MissionState.COMPLETED, f"seed {seed}: did not complete"
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    return {"files": files(sandbox_of(store, mid)), "events": unit_events(store, mid), "kills": kills,
            "results": {u: _normal(mk.result) for u, mk in head.units.items()},
            "done": {x.unit: (x.state, x.merged) for x in all_leases(store, mid)}}


@pytest.mark.slow
def test_kill_the_host_and_subagents_at_random_points(tmp_path: Path) -> None:
    (tmp_path / "reference").mkdir()
    reference = _run(tmp_path / "reference", -1)
    assert set(reference["files"]) == {"a.py", "b.py", "c.py"}

    def iteration(i: int) -> dict[str, Any]:
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        return _run(folder, i)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(iteration, range(ITERATIONS)))
    for i, outcome in enumerate(outcomes):
        assert outcome["files"] == reference["files"], f"iteration {i}: mission branch differs"
        assert outcome["results"] == reference["results"], f"iteration {i}: unit results differ"
        assert outcome["done"] == {u: ("done", True) for u in "abc"}, f"iteration {i}: {outcome['done']}"
        for unit in "abc":
            states = [s for u, s in outcome["events"] if u == unit]
            assert states.count("succeeded") == 1, f"iteration {i}: unit {unit} completed {states}"
            assert states[-1] == "succeeded", f"iteration {i}: unit {unit} ran again after it succeeded"
    assert sum(o["kills"] for o in outcomes) >= ITERATIONS  # processes really died
