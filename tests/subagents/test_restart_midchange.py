"""A unit's worker killed while its change is still being made: the host finishes making and recording that
change, and the agent started again is answered the recorded outcome, never made to do it again. Real host,
real SIGKILL of the worker, the order of the two runs fixed by gates (no timing)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from engine_helpers import keel, mission_id_of, read, record, start_keel, wait_for, write_mission
from subagent_helpers import lease

from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_a_change_recorded_after_the_restarted_agent_began_replaying_is_answered_not_made_again(
    tmp_path: Path,
) -> None:
    side, hold, gate = tmp_path / "side.log", tmp_path / "hold", tmp_path / "gate"
    hold.touch()  # the command's effect is made at once; the command ends only once the hold is gone
    gate.touch()  # the agent asks for the command only while the gate exists
    command = f"echo ran >> {side}; while [ -e {hold} ]; do sleep 0.05; done"
    units = [{"id": "a", "params": {"steps": [{"wait_file": str(gate)}, {"tool": "run", "args": {"cmd": command}}]}}]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    try:
        mid = mission_id_of(host)
        wait_for(lambda: side.exists() and side.read_text() == "ran\n")  # the effect is made, its result not yet
        first = lease(store, mid, "a")
        assert first is not None and first.pid
        gate.unlink()  # the agent started again will wait before it asks for the command
        os.kill(first.pid, signal.SIGKILL)  # the unit's worker: the host's change goes on, its agent is gone

        def restarted() -> bool:  # a new worker holds the lease: its agent runs and waits at the gate
            now = lease(store, mid, "a")
            return now is not None and now.epoch > first.epoch and bool(now.pid) and now.pid != first.pid

        wait_for(restarted)
        entry = read(store, lambda t: m.journal_get(t, mid, "a", 1))
        assert entry is not None and entry.phase == "intent", entry  # the strike landed: the change in flight
        hold.unlink()  # the first run's command ends; the host records its result
        wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 1))) is not None and e.phase == "done")
        gate.touch()  # now the agent started again asks for the same command
        assert host.wait(timeout=120) == 0, host.stderr.read() if host.stderr else ""
    finally:
        if host.poll() is None:
            host.kill()
        host.communicate(timeout=10)
    assert record(store, mid).state == "completed"
    assert side.read_text() == "ran\n", "the command ran again after its result was recorded"
    keel("verify", store=store, check_rc=0)
