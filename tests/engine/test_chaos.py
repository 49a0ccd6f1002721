"""Kill the mission host with SIGKILL at random moments, resume, and compare with an uninterrupted run.

Every iteration: a 3-unit mission (two units in parallel, one after both) with file edits, effectful
commands that append to a side log the test owns (outside the sandbox), verifications, now/random and
saved state. The host is killed at a random time (sometimes again during the resume), then resumed
until it completes. A question about an uncertain effect (the host died between a command's intent and
its result) is answered like a person would: look at the side log, "skip" if the effect is there,
else "rerun". Checked: same files and unit results as the uninterrupted run, every effect exactly
once, no unit started again after it succeeded. KEEL_CHAOS_ITERATIONS sets the count (default 50).
"""

from __future__ import annotations

import os
import random
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

from keel.protocol.states import MissionState
from keel.storage import missions as m

ITERATIONS = int(os.environ.get("KEEL_CHAOS_ITERATIONS", "50"))


def _diff(uid: str) -> str:
    return f"--- a/{uid}.py\n+++ b/{uid}.py\n@@ -1 +1 @@\n-{uid.upper()} = 1\n+{uid.upper()} = 2\n"


def _units(side: Path) -> list[dict[str, Any]]:
    def unit(uid: str, after: list[str]) -> dict[str, Any]:
        return {"id": uid, "after": after, "params": {"steps": [
            {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
            {"tool": "run", "args": {"cmd": f"echo {uid}-1 >> {side}"}},
            {"now": True}, {"random": True},
            {"tool": "apply_diff", "args": {"path": f"{uid}.py", "diff": _diff(uid)}},
            {"tool": "run", "args": {"cmd": f"python -m py_compile {uid}.py && echo {uid}-2 >> {side}",
                                     "verify": True}},
            {"save_state": {"unit": uid}}, {"sleep": 0.02},
            {"tool": "read_file", "args": {"path": f"{uid}.py"}}]}}
    return [unit("a", []), unit("b", []), unit("c", ["a", "b"])]


def _normal(result: Any) -> Any:
    """A unit result with now/random values masked (they differ between two runs, not within one)."""
    return [o if isinstance(o, dict) or o is None else "value" for o in result["outputs"]]


def _person_answers(store: Path, mid: str, side: Path) -> None:
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", question
    entry = read(store, lambda t: m.journal_get(t, mid, question.lane, question.seq))
    marker = entry.result["cmd"].rsplit("echo ", 1)[1].split(" ")[0]
    happened = side.exists() and marker in side.read_text().split()
    keel("answer", mid, "skip" if happened else "rerun", "--no-resume", store=store, check_rc=0)


def _run_to_completion(folder: Path, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    side = folder / "side.log"
    store = folder / "store"
    mission = write_mission(folder, _units(side))
    host = start_keel("run", str(mission), store=store)
    mid = mission_id_of(host)
    kills = 0
    if seed >= 0:
        time.sleep(rng.uniform(0.0, 1.0))
        kills += host.poll() is None
        kill(host)
    else:
        host.communicate(timeout=60)
    for _round in range(10):
        state = record(store, mid).state
        if state == MissionState.COMPLETED:
            break
        if state == MissionState.WAITING_INPUT:
            _person_answers(store, mid, side)
        if seed >= 0 and rng.random() < 0.3:  # sometimes kill the resumed host too
            again = start_keel("resume", mid, store=store)
            time.sleep(rng.uniform(0.0, 0.8))
            kills += again.poll() is None
            kill(again)
            continue
        resumed = keel("resume", mid, store=store, timeout=60)
        assert resumed.returncode in (0, 3), f"seed {seed}: resume exited {resumed.returncode}: {resumed.stderr}"
    assert record(store, mid).state == MissionState.COMPLETED, f"seed {seed}: did not complete"
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    return {"files": files(sandbox_of(store, mid)), "side": side.read_text().split(),
            "results": {u: _normal(mk.result) for u, mk in head.units.items()},
            "events": unit_events(store, mid), "kills": kills}


def _check_events(events: list[tuple[str, str]]) -> None:
    for unit in {u for u, _ in events}:
        states = [s for u, s in events if u == unit]
        assert states.count("succeeded") == 1, f"unit {unit} completed {states.count('succeeded')} times"
        assert states[-1] == "succeeded", f"unit {unit} started again after it succeeded: {states}"


@pytest.mark.slow
def test_sigkill_the_host_at_random_points(tmp_path: Path) -> None:
    (tmp_path / "reference").mkdir()
    reference = _run_to_completion(tmp_path / "reference", -1)
    assert sorted(reference["side"]) == sorted(f"{u}-{k}" for u in "abc" for k in (1, 2))

    def iteration(i: int) -> dict[str, Any]:
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        return _run_to_completion(folder, i)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(iteration, range(ITERATIONS)))
    for i, outcome in enumerate(outcomes):
        assert outcome["files"] == reference["files"], f"iteration {i}: workspace differs"
        assert outcome["results"] == reference["results"], f"iteration {i}: unit results differ"
        assert sorted(outcome["side"]) == sorted(reference["side"]), f"iteration {i}: effects {outcome['side']}"
        _check_events(outcome["events"])
    assert sum(o["kills"] for o in outcomes) >= ITERATIONS // 2  # most iterations really killed a live host
