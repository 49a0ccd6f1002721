"""A host's last moments, while it has stopped but still holds the mission's lock: an answer given then
is taken up (the host, after letting go of the lock, starts the next host for an answer it did not see);
`keel resume` given then waits for the host to finish stopping and resumes, instead of refusing."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import files, keel, mission_id_of, record, start_keel, wait_for, write_mission

from keel.protocol.states import MissionState
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostLock


def test_an_answer_that_finds_the_asking_host_still_stopping_is_taken_up(tmp_path: Path) -> None:
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"ask": "Ship it?", "choices": ["yes", "no"]},
                    {"tool": "write_file", "args": {"path": "shipped.txt", "content": "yes\n"}},
                ]
            },
        }
    ]
    store, marker = tmp_path / "store", tmp_path / "stopping.pid"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store, env={
        "KEEL_FAULT_HOST_EXIT": f"{marker}:4"
    })  # fmt: skip
    mid = mission_id_of(host)
    wait_for(lambda: marker.exists(), timeout=120)  # the host asked, stopped, and holds the lock a while
    assert record(store, mid).state == MissionState.WAITING_INPUT
    assert HostLock(places.lock_path(store, mid), mid).held_elsewhere(), "the asking host let go of its lock"
    keel("answer", mid, "yes", store=store, check_rc=0)
    host.communicate(timeout=60)
    wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
    assert files(Path(record(store, mid).sandbox)).get("shipped.txt") == b"yes\n"


@pytest.mark.parametrize("how", ["foreground", "detach"])
def test_a_resume_right_after_a_pause_waits_for_the_host_to_stop(tmp_path: Path, how: str) -> None:
    steps = [{"sleep": 0.2}] * 10 + [{"tool": "write_file", "args": {"path": "done.txt", "content": "done\n"}}]
    store, marker = tmp_path / "store", tmp_path / "stopping.pid"
    host = start_keel("run", str(write_mission(tmp_path, [{"id": "a", "params": {"steps": steps}}])), store=store, env={
        "KEEL_FAULT_HOST_EXIT": f"{marker}:3"
    })  # fmt: skip
    mid = mission_id_of(host)
    keel("pause", mid, "--wait", "60", store=store, check_rc=0)
    wait_for(lambda: marker.exists(), timeout=60)  # paused, and the host still holds the lock a while
    assert record(store, mid).state == MissionState.PAUSED
    assert HostLock(places.lock_path(store, mid), mid).held_elsewhere(), "the pausing host let go of its lock"
    if how == "foreground":
        keel("resume", mid, store=store, timeout=120, check_rc=0)
    else:
        keel("resume", mid, "--detach", store=store, check_rc=0)
        wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
    host.communicate(timeout=60)
    assert record(store, mid).state == MissionState.COMPLETED
    assert files(Path(record(store, mid).sandbox)).get("done.txt") == b"done\n"
