"""`keel pause --wait` waits only while a pause still applies to the mission (protocol/states capabilities):
a mission that waits for a person's answer, or is cancelled, takes the pause control but cannot be paused,
so the command answers at once instead of waiting out its deadline."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from keel.protocol.states import MissionState
from keel.storage import Store
from keel.storage import missions as m
from tests.cli.test_cli import keel
from tests.storage.test_verify import make_mission

WAIT_S = 20.0


@pytest.mark.parametrize("state", [MissionState.WAITING_INPUT, MissionState.CANCELLED])
def test_a_pause_that_cannot_apply_is_not_waited_for(tmp_path: Path, state: MissionState) -> None:
    store = tmp_path / "store"
    with Store.open(store) as s:
        make_mission(s, "m1", checkpoints=1)  # running, with no host
        s.write(lambda t: m.set_mission_state(t, "m1", state))
    started = time.monotonic()
    proc = keel("pause", "m1", "--wait", str(WAIT_S), "--json", "--store", str(store))
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == state.value
    assert took < WAIT_S / 2, f"keel pause waited {took:.1f} s for a pause that cannot apply"
