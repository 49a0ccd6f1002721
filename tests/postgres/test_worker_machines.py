"""A `keel worker` cut off mid-unit: its unit completes on a worker on another machine, and its late
completion is rejected when its link comes back.

The mission host runs here (`workers = true`: it offers its units); two machines (network namespaces,
tests/postgres/machines.py) each run a `keel worker` on the same PostgreSQL store. The strike comes on a
condition: a unit held by machine A's worker has made its effect (its marker is in the side log, a file
outside every sandbox standing for the world) and journaled its last step, so its agent is working
without the store (until the test opens a gate file, after the cut) and will complete the unit after
it. Then A's link is cut, with every process on A still running. The unit's lease must lapse, the host
offer it again, B's worker take it and carry it on from its journal in a sandbox made from the store;
the mission completes. A's agent finishes meanwhile and its worker process tries to record the
completion: when the link comes back, that completion must be rejected (a `lease`/`rejected` event),
and nothing A does changes the result.

Checked, on the product: every effect exactly once, the mission sandbox's files equal those of the same
mission run by its host alone, each unit succeeded once, the rejection recorded, the store verifies. The
time from the cut to the unit running on B is written to test-artifacts/failover-worker-cut.txt.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, read, record, start_keel, unit_events, wait_for, write_mission

from keel.protocol.states import LeaseState, MissionState
from keel.storage import leases
from keel.storage import missions as m
from tests.pgserver import PgServer
from tests.postgres.machines import Machine, can_make_machines, markers, remove_all, store_folder

pytestmark = pytest.mark.skipif(bool(can_make_machines()), reason=can_make_machines() or "")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TTL_S = "3"
UNITS = ("u1", "u2", "u3")


def _units(side: Path, gate: Path) -> list[dict[str, Any]]:
    def unit(uid: str) -> dict[str, Any]:
        steps = [
            {"tool": "write_file", "args": {"path": f"{uid}.txt", "content": f"{uid}\n"}},
            {"tool": "run", "args": {"cmd": f"echo {uid}-1 >> {side}"}},
            {"now": True},
            {"wait_file": str(gate)},  # the agent's own work, nothing journaled: the cut comes here
        ]
        return {"id": uid, "params": {"steps": steps}}

    cmd = f"cat {' '.join(f'{u}.txt' for u in UNITS)} > all.txt; echo end-1 >> {side}"
    end = {"id": "end", "after": list(UNITS), "params": {"steps": [{"tool": "run", "args": {"cmd": cmd}}]}}
    return [*(unit(uid) for uid in UNITS), end]


def _reference(folder: Path) -> dict[str, Any]:
    folder.mkdir()
    side, gate = folder / "side.log", folder / "gate"
    gate.touch()
    store = folder / "store"
    done = keel(
        "run", str(write_mission(folder, _units(side, gate), max_parallel=3)), "--json", store=store, timeout=120
    )
    mid = json.loads(done.stdout.splitlines()[0])["mission"]
    assert record(store, mid).state == MissionState.COMPLETED, done.stdout + done.stderr
    return {"side": sorted(markers(side)), "files": files(Path(record(store, mid).sandbox))}


def _answer(store: Path, mid: str, side: Path, env: dict[str, str]) -> None:
    """An effect whose outcome the cut left unknown: answered from the side log, as a person would; the
    answer starts a host again."""
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", f"unexpected question: {question}"
    lane, seq = question.lane, question.seq
    entry = read(store, lambda t: m.journal_get(t, mid, lane, seq))
    marker = str(entry.result.get("cmd", "")).rsplit("echo ", 1)[1].split(" ")[0]
    keel("answer", mid, "skip" if marker in markers(side) else "rerun", store=store, env=env, check_rc=0)
    wait_for(lambda: record(store, mid).question != question, timeout=60)


def _held_on(store: Path, mid: str, hostname: str) -> list[Any]:
    held = read(store, lambda t: leases.list_leases(t, mid))
    return [x for x in held if x.hostname == hostname and x.state == LeaseState.RUNNING]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_cut_workers_unit_completes_on_another_machine_and_its_late_completion_is_rejected(
    tmp_path: Path, pg_server: PgServer
) -> None:
    reference = _reference(tmp_path / "reference")
    schema = pg_server.new_schema()
    side, gate = tmp_path / "side.log", tmp_path / "gate"  # the gate opens once A's link is cut
    (tmp_path / "host").mkdir()
    mission = write_mission(tmp_path / "host", _units(side, gate), max_parallel=3, workers=True)
    store = store_folder(tmp_path / "host" / "ws", pg_server.store_url(schema))
    env = {"KEEL_LEASE_TTL_S": TTL_S}
    a, b = Machine("worker-a", pg_server.port), Machine("worker-b", pg_server.port)
    procs: list[subprocess.Popen[str]] = []
    try:
        a.hide, b.hide = [tmp_path / "b", tmp_path / "host"], [tmp_path / "a", tmp_path / "host"]
        store_a = store_folder(tmp_path / "a" / "ws", a.url(schema))
        store_b = store_folder(tmp_path / "b" / "ws", b.url(schema))
        host = start_keel("run", str(mission), store=store, env=env)
        procs.append(host)
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]

        def worker(machine: Machine, its_store: Path) -> subprocess.Popen[str]:
            args = ("worker", "--store", str(its_store), "--units", "3")
            proc = machine.keel(*args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(proc)
            return proc

        worker(a, store_a)

        def struck_unit() -> str:  # a unit on A whose effect ran and whose last step is journaled
            for held in _held_on(store, mid, "worker-a"):
                if f"{held.unit}-1" in markers(side) and held.place.last_checkpoint >= 3:
                    return held.unit
            return ""

        deadline = time.monotonic() + 90
        while not (unit := struck_unit()):
            assert time.monotonic() < deadline, "no unit of machine A's worker reached the strike condition"
            time.sleep(0.01)
        worker(b, store_b)
        assert record(store, mid).state == MissionState.RUNNING, "nothing to strike"
        epoch = read(store, lambda t: leases.get(t, mid, unit)).epoch
        cut_at = time.monotonic()
        a.cut()
        gate.touch()  # A's agents finish their work without the store; B's carry theirs on

        elsewhere = None
        deadline = time.monotonic() + 180
        while (state := record(store, mid).state) != MissionState.COMPLETED:
            assert time.monotonic() < deadline, f"the mission did not complete without machine A (it is {state})"
            if state == MissionState.WAITING_INPUT:  # another of A's units was cut off with its effect in doubt
                _answer(store, mid, side, env)
                continue
            assert state == MissionState.RUNNING, f"the mission stopped: {record(store, mid)}"
            if elsewhere is None and any(x.unit == unit for x in _held_on(store, mid, "worker-b")):
                elsewhere = time.monotonic() - cut_at
            time.sleep(0.05)
        host.wait(timeout=60)  # 0, or 3 when a question stopped it (a host `keel answer` started finished it)
        assert elsewhere is not None, f"unit {unit} was never seen running on machine B"

        a.mend()  # A's worker process hears of the store again: its completion must be refused

        def rejected() -> bool:
            events = read(store, lambda t: [e for _, e in m.events_after(t, mid) if e.kind == "lease"])
            return any(e.unit == unit and e.state == "rejected" and f"epoch {epoch}" in e.message for e in events)

        wait_for(rejected, timeout=120, step=0.2)
    finally:
        remove_all([a, b], procs)

    counts = collections.Counter(markers(side))
    assert all(n == 1 for n in counts.values()), f"an effect ran twice: {markers(side)}"
    assert sorted(counts) == reference["side"], f"effects lost: {sorted(counts)}"
    final = record(store, mid)
    assert files(Path(final.sandbox)) == reference["files"]
    events = unit_events(store, mid)
    for uid in (*UNITS, "end"):
        states = [s for u, s in events if u == uid]
        assert states.count("succeeded") == 1 and states[-1] == "succeeded", (uid, states)
    held = read(store, lambda t: leases.get(t, mid, unit))
    assert held.epoch > epoch and held.state == LeaseState.DONE, held
    keel("verify", store=store, check_rc=0)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "failover-worker-cut.txt").write_text(
        f"worker cut: unit {unit} ran on machine B {elsewhere:.2f} s after machine A's link was cut "
        f"(unit lease ttl {TTL_S} s)\n"
    )
