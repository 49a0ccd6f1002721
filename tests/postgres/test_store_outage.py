"""A store outage is not a host's death: nobody can renew a lease while the database is away, so a supervisor
takes a mission over only on silence it measured while it could reach the store itself (storage/reach.py).

Two machines (network namespaces) share one PostgreSQL server: machine A runs a mission, machine B runs
`keel supervise`. The server is stopped (`pg_ctl stop -m immediate`) while A's unit runs, for longer than
the host lease, with both machines alive, then started again. Either A's host keeps the mission (its
lease's epoch never changes, B starts no host) and completes it; or A is killed as soon as the server is
back, and B takes the mission over and completes it. Every effect once in both.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from pathlib import Path

import pytest
from engine_helpers import keel, read, record, write_mission

from keel.protocol.states import MissionState
from keel.storage import hostlease
from tests.pgserver import PgServer
from tests.postgres.machines import (
    Machine,
    answer_from_side_log,
    can_make_machines,
    git,
    git_workspace,
    markers,
    store_folder,
)

pytestmark = pytest.mark.skipif(bool(can_make_machines()), reason=can_make_machines() or "")

TTL_S = 3.0  # the host lease
OUTAGE_S = 8.0  # longer than the lease


def _units(side: Path) -> list[dict[str, object]]:
    def unit(uid: str, after: list[str]) -> dict[str, object]:
        steps = [
            {"tool": "run", "args": {"cmd": f"echo {uid}-1 >> {side}"}},
            {"sleep": 12.0},
            {"tool": "run", "args": {"cmd": f"echo {uid}-2 >> {side}"}},
            {"now": True},
        ]
        return {"id": uid, "after": after, "params": {"steps": steps}}

    return [unit("a", []), unit("b", ["a"])]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("then", ["hosts-live", "host-dies"])
def test_a_store_outage_longer_than_the_lease_moves_no_mission(tmp_path: Path, then: str) -> None:
    server = PgServer()  # its own: this test stops it
    schema = server.new_schema()
    a, b = Machine("machine-a", server.port), Machine("machine-b", server.port)
    side = tmp_path / "side.log"
    git_workspace(tmp_path / "a" / "ws")
    mission = write_mission(tmp_path / "a", _units(side))
    git(tmp_path, "clone", "-q", str(tmp_path / "a" / "ws"), str(tmp_path / "b" / "ws"))
    a.hide, b.hide = [tmp_path / "b"], [tmp_path / "a"]
    store_a = store_folder(tmp_path / "a" / "ws", a.url(schema))
    store_b = store_folder(tmp_path / "b" / "ws", b.url(schema))
    here = store_folder(tmp_path / "observer", server.store_url(schema))
    env = {"KEEL_HOST_LEASE_TTL_S": str(TTL_S)}
    said = tmp_path / "supervise.out"
    procs: list[subprocess.Popen[str]] = []
    try:
        with said.open("w") as out:
            procs.append(
                b.keel("supervise", "--store", str(store_b), "--interval", "0.2", env=env, stdout=out, stderr=out)
            )
        run = ("run", str(mission), "--json", "--store", str(store_a))
        host = a.keel(*run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(host)
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]
        deadline = time.monotonic() + 60
        while "a-1" not in markers(side):
            assert host.poll() is None and time.monotonic() < deadline, "the mission ended before the outage"
            time.sleep(0.01)
        lease = read(here, lambda t: hostlease.get(t, mid))
        assert lease is not None and lease.hostname == "machine-a", lease

        server.crash()  # the store is away; both machines and every keel process on them stay alive
        stopped = time.monotonic()
        time.sleep(OUTAGE_S)  # the outage itself: how long the store is away, not a wait for a condition
        assert host.poll() is None, "machine A's host did not ride out the outage"
        server.start()
        assert time.monotonic() - stopped >= TTL_S

        if then == "host-dies":
            a.kill()  # right after the outage: now the silence is real, and B measures it
        deadline = time.monotonic() + 180
        while (state := record(here, mid).state) != MissionState.COMPLETED:
            assert time.monotonic() < deadline, f"the mission did not complete (it is {state})"
            held = read(here, lambda t: hostlease.get(t, mid))
            if then == "hosts-live":
                assert held.epoch == lease.epoch and held.hostname == "machine-a", f"the mission moved: {held}"
            elif state == MissionState.WAITING_INPUT:  # A died with an effect in doubt (a busy machine is late)
                answer_from_side_log(b, store_b, here, mid, side)
            time.sleep(0.1)
        final = record(here, mid)
        counts = collections.Counter(markers(side))
        assert sorted(counts) == ["a-1", "a-2", "b-1", "b-2"] and set(counts.values()) == {1}, markers(side)
        if then == "hosts-live":
            assert final.machine == "machine-a" and host.wait(timeout=60) == 0
            assert "host started here" not in said.read_text(), said.read_text()
        else:
            assert final.machine == "machine-b", final.machine
            assert "host started here" in said.read_text(), said.read_text()
        keel("verify", store=here, check_rc=0)
    finally:
        for machine in (a, b):
            machine.remove()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        server.stop()
