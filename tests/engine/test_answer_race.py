"""An answer given while the host that asked is still stopping is taken up: the host, after letting go of
the mission's lock, starts the next host for an answer it did not see (the answer itself found the lock
held and left it to that host)."""

from __future__ import annotations

from pathlib import Path

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
