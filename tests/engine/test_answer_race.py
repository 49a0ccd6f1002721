"""A host's last moments, while it has stopped but still holds the mission's lock: an answer given then
is taken up (the host, after letting go of the lock, starts the next host for an answer it did not see);
`keel resume` given then waits for the host to finish stopping and resumes, instead of refusing; a delete
given then waits for it too, so its last writes never bring the mission back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from engine_helpers import files, keel, mission_id_of, record, start_keel, wait_for, write_mission

from keel.protocol.states import MissionState
from keel.server.engine import control
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostLock
from keel.storage import Store, hostlease
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


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


def _paused_host_leaving(tmp_path: Path, fault: str = "HOST_EXIT") -> tuple[subprocess.Popen[str], Path, str, Path]:
    """A mission paused while its unit worked (it waits at a gate until the test opens it), whose host still
    holds the mission's lock for 3 s at fault point `fault` (HOST_RELEASE: still named by the mission's record
    too): (that host, the store, the mission id, the gate)."""
    gate = tmp_path / "gate"
    steps = [{"wait_file": str(gate)}, {"tool": "write_file", "args": {"path": "done.txt", "content": "done\n"}}]
    store, marker = tmp_path / "store", tmp_path / "stopping.pid"
    host = start_keel("run", str(write_mission(tmp_path, [{"id": "a", "params": {"steps": steps}}])), store=store, env={
        f"KEEL_FAULT_{fault}": f"{marker}:3"
    })  # fmt: skip
    mid = mission_id_of(host)
    keel("pause", mid, "--wait", "60", store=store, check_rc=0)
    wait_for(lambda: marker.exists(), timeout=60)  # paused, and the host still holds the lock a while
    assert record(store, mid).state == MissionState.PAUSED
    assert HostLock(places.lock_path(store, mid), mid).held_elsewhere(), "the pausing host let go of its lock"
    return host, store, mid, gate


@pytest.mark.parametrize("how", ["foreground", "detach"])
def test_a_resume_right_after_a_pause_waits_for_the_host_to_stop(tmp_path: Path, how: str) -> None:
    host, store, mid, gate = _paused_host_leaving(tmp_path)
    gate.write_text("go\n")
    if how == "foreground":
        keel("resume", mid, store=store, timeout=120, check_rc=0)
    else:
        keel("resume", mid, "--detach", store=store, check_rc=0)
        wait_for(lambda: record(store, mid).state == MissionState.COMPLETED, timeout=120)
    host.communicate(timeout=60)
    assert record(store, mid).state == MissionState.COMPLETED
    assert files(Path(record(store, mid).sandbox)).get("done.txt") == b"done\n"


def test_a_cancel_right_after_a_pause_waits_for_the_host_to_stop_and_cancels(tmp_path: Path) -> None:
    """The host has paused and holds the lock a while longer: it reads no control any more. `keel cancel`
    waits for it to let go and cancels, instead of leaving the cancel queued for a resume while saying
    `paused`; `keel delete` then forgets the mission."""
    host, store, mid, _ = _paused_host_leaving(tmp_path, "HOST_RELEASE")
    assert host.poll() is None
    cancelled = keel("cancel", mid, "--json", store=store, check_rc=0)
    assert json.loads(cancelled.stdout) == {"mission": mid, "state": "cancelled"}
    assert not HostLock(places.lock_path(store, mid), mid).held_elsewhere(), "cancelled while its host still ran"
    assert host.wait(timeout=60) == 3  # the host's own end: paused
    assert record(store, mid).state == MissionState.CANCELLED
    resumed = keel("resume", mid, store=store)
    assert resumed.returncode == 4 and "units_run=0 state=cancelled" in resumed.stdout  # nothing runs again
    assert keel("delete", mid, store=store, check_rc=0).stdout.strip() == f"mission {mid}: deleted"
    assert json.loads(keel("missions", "--json", store=store, check_rc=0).stdout) == []


def test_a_mission_deleted_while_its_cancelled_host_finishes_stays_deleted(tmp_path: Path) -> None:
    """A person cancels, sees `cancelled`, deletes at once: the host still has its last checkpoint and its
    lease to write. The delete waits for it, so none of the mission's records come back afterwards."""
    steps = [{"sleep": 0.2}] * 50
    store, marker, let_go = tmp_path / "store", tmp_path / "cancelled.pid", tmp_path / "let-go.pid"
    host = start_keel("run", str(write_mission(tmp_path, [{"id": "a", "params": {"steps": steps}}])), store=store, env={
        "KEEL_FAULT_HOST_CANCELLED": f"{marker}:3", "KEEL_FAULT_HOST_LET_GO": f"{let_go}:hold"
    })  # fmt: skip
    mid = mission_id_of(host)
    wait_for(lambda: record(store, mid).state == MissionState.RUNNING and record(store, mid).host is not None)
    with Store.open(store, create=False) as s:
        control.request_cancel(s, mid, "test")
        wait_for(lambda: marker.exists(), timeout=60)  # cancelled, its last records not yet written
        assert s.read(lambda t: m.get_mission(t, mid)).state == MissionState.CANCELLED
        assert HostLock(places.lock_path(store, mid), mid).held_elsewhere(), "the cancelled host already let go"
        control.delete_mission(s, store, mid)
    assert let_go.exists(), "the delete returned before the host let go of the mission"
    let_go.unlink()  # `keel run` reports its mission's end now, after the delete
    out, err = host.communicate(timeout=60)
    assert host.returncode == 4, err  # `keel run`'s exit for a cancelled mission: it wrote its last records
    assert f"mission {mid} ended cancelled and was deleted since" in out + err
    with Store.open(store, create=False) as s:
        assert [r.id for r in s.read(m.list_missions)] == []
        assert s.read(lambda t: (m.head_checkpoint(t, mid), hostlease.get(t, mid))) == (None, None)


def test_a_pause_before_the_first_host_looked_is_honoured(tmp_path: Path) -> None:
    """`keel run` creates the mission, then starts its host; a pause in between is left to that host, which
    pauses first thing and runs nothing. Marked paused at once, it was taken for a mission a person had
    resumed, and ran."""
    gate = tmp_path / "gate"
    steps = [{"wait_file": str(gate)}, {"tool": "write_file", "args": {"path": "done.txt", "content": "done\n"}}]
    store = tmp_path / "store"
    mission = write_mission(tmp_path, [{"id": "a", "params": {"steps": steps}}])
    with Store.open(store) as s:
        mid = control.create_mission(s, mission).id  # what `keel run` does before its host starts
        paused = control.request_pause(s, mid, "test")
        assert paused.state == MissionState.CREATED  # left to the host that is starting
    host = keel("resume", mid, "--json", store=store, timeout=120)  # the host `keel run` starts
    assert host.returncode == 3, host.stderr
    assert record(store, mid).state == MissionState.PAUSED
    with Store.open(store, create=False) as s:
        assert s.read(lambda t: m.journal_lanes(t, mid)) == []  # no unit ran
    gate.write_text("go\n")
    keel("resume", mid, store=store, timeout=120, check_rc=0)  # a person's resume runs it
    assert files(Path(record(store, mid).sandbox)).get("done.txt") == b"done\n"
