"""Recovery does not pay for a unit's history: a host SIGKILLed when its unit's journal holds 20,000 entries
is followed by one whose agent carries on from its last saved state, replaying only the entries after that
save (`InitializeResult.resumes`). A real `keel run` is struck on a condition (the journal's length, and
the agent waiting at a gate file), the strike is checked, then `keel resume` runs the mission to the end
and its own counts say what it replayed and ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.protocol.records import JournalEntry
from keel.protocol.states import MissionState
from keel.storage import DB
from keel.storage import missions as m
from keel.storage.keys import unit_prefix
from tests.engine.engine_helpers import read, record, wait_for, write_mission

pytestmark = pytest.mark.usefixtures("store_backend")

ROUNDS = 2000  # rounds of 9 `now` steps and a save: 20,000 entries before the strike


def _top(store: Path, mission_id: str) -> int:
    return int(read(store, lambda t: t.last_seq(DB.JOURNAL, unit_prefix(mission_id, "u"))))


def _lane(store: Path, mission_id: str, after: int) -> list[JournalEntry]:
    return list(read(store, lambda t: m.journal_entries(t, mission_id, "u", after=after)))


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.lmdb_only("the rule is the engine's, not the store's (the lease's saved_at is spec-tested on both)")
@pytest.mark.timeout(600)
def test_a_host_killed_at_20k_entries_is_followed_by_one_that_replays_only_what_came_after_the_last_save(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    steps = [
        {"repeat": ROUNDS, "steps": [*([{"now": True}] * 9), {"save_state": {"round": True}}]},
        {"now": True},
        {"random": True},  # two entries after the last save: the next run replays these two
        {"wait_file": str(gate)},
        {"now": True},
        {"save_state": {"last": True}},
        {"random": True},
    ]
    mission = write_mission(tmp_path, [{"id": "u", "params": {"steps": steps}}])
    store = tmp_path / "store"
    keel = [sys.executable, "-m", "keel.server.cli"]
    first = subprocess.Popen(
        [*keel, "run", str(mission), "--json", "--store", str(store)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the host, its worker and its agent: one process group to strike
    )
    assert first.stdout is not None
    mission_id = json.loads(first.stdout.readline())["mission"]
    before = ROUNDS * 10 + 2
    wait_for(lambda: first.poll() is not None or _top(store, mission_id) >= before, timeout=500, step=0.2)
    assert first.poll() is None, "the host was still running when the strike came"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert _top(store, mission_id) == before, "struck while the agent waited at the gate, after 20,002 entries"
    assert record(store, mission_id).state == MissionState.RUNNING
    kept = _lane(store, mission_id, ROUNDS * 10)  # the two entries after the last save, as the first host made them

    gate.write_text("go\n")
    resumed = subprocess.run(
        [*keel, "resume", mission_id, "--json", "--store", str(store)], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    exit_event = _events(resumed.stdout)[-1]
    assert exit_event["event"] == "host_exit" and exit_event["state"] == "completed", exit_event
    assert exit_event["replayed"] == 2, f"replayed {exit_event['replayed']} entries: more than came after the save"
    assert exit_event["executed"] == 3  # now, save_state, random: each once

    lane = _lane(store, mission_id, ROUNDS * 10)
    assert [e.seq for e in lane] == list(range(ROUNDS * 10 + 1, before + 4))  # nothing made twice, no gap
    assert lane[:2] == kept
    head = read(store, lambda t: m.head_checkpoint(t, mission_id))
    outputs = head.units["u"].result["outputs"]
    # what an undisturbed run returns: the repeat counted, the replayed answers as first recorded, the rest new
    assert outputs[0] == {"repeated": ROUNDS}
    assert outputs[1:3] == [kept[0].result["time"], kept[1].result["value"]]
    assert outputs[3:] == [None, lane[2].result["time"], None, lane[4].result["value"]]
