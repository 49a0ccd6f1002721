"""Benchmark: from losing a machine to its mission running on another one, on a shared PostgreSQL store.

    sudo python benchmarks/failover.py [--rounds 3] [--ttl 10]

Two machines on this host (tests/postgres/machines.py: network namespaces with their own node names, a
forwarder in front of a throwaway PostgreSQL cluster). Machine A runs a three-unit mission (each unit: a
file, a command appending to a side log, sleeps); machine B runs `keel supervise --interval 0.5`. When the
first unit's command has run on A, A is struck, alternately:

- `kill`: every process on A SIGKILLed and its link removed (the machine is gone);
- `cut`: A's link taken down while its processes run on (a network partition).

Timed from the strike: B's host holds the host lease (`lease`), B's host writes its first journal entry
(`running`: a unit carries on there), the mission completes (`done`). An effect whose outcome the strike
left unknown is answered from the side log as a person would (counted, not timed out). Medians over the
rounds of each strike; the host lease's ttl is --ttl (keel's default, 10 s). Needs root. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from engine_helpers import write_mission

from keel.protocol.states import MissionState
from keel.storage import Store, hostlease
from keel.storage import missions as m
from tests.pgserver import PgServer
from tests.postgres.machines import Machine, can_make_machines, git, git_workspace, markers, store_folder

UNITS = ("a", "b", "c")


def _mission(folder: Path, side: Path) -> Path:
    def unit(uid: str) -> dict[str, Any]:
        steps = [
            {"tool": "write_file", "args": {"path": f"{uid}.txt", "content": f"{uid}\n"}},
            {"tool": "run", "args": {"cmd": f"echo {uid}-1 >> {side}"}},
            {"sleep": 1.0},
            {"now": True},
            {"sleep": 1.0},
            {"tool": "run", "args": {"cmd": f"echo {uid}-2 >> {side}"}},
        ]
        return {"id": uid, "params": {"steps": steps}}

    return write_mission(folder, [unit(uid) for uid in UNITS], name="failover", max_parallel=3)


def _round(folder: Path, server: PgServer, strike: str, ttl: float) -> dict[str, Any]:
    schema = server.new_schema()
    a, b = Machine("machine-a", server.port), Machine("machine-b", server.port)
    procs: list[subprocess.Popen[str]] = []
    try:
        ws = folder / "a" / "ws"
        git_workspace(ws)
        git(folder, "clone", "-q", str(ws), str(folder / "b" / "ws"))
        a.hide, b.hide = [folder / "b"], [folder / "a"]
        side = folder / "side.log"
        mission = _mission(folder / "a", side)
        store_a, store_b = store_folder(ws, a.url(schema)), store_folder(folder / "b" / "ws", b.url(schema))
        observer = Store.open(store_folder(folder / "observer", server.store_url(schema)))
        env = {"KEEL_HOST_LEASE_TTL_S": str(ttl)}
        procs.append(b.keel("supervise", "--store", str(store_b), env=env, stdout=subprocess.DEVNULL))
        host = a.keel("run", str(mission), "--json", "--store", str(store_a), env=env, stdout=subprocess.PIPE)
        procs.append(host)
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]
        while not markers(side):
            time.sleep(0.005)
        struck = time.monotonic()
        wall = time.time()
        a.kill() if strike == "kill" else a.cut()
        times: dict[str, float] = {}
        answered = 0
        while True:
            record, lease, newest = observer.read(
                lambda t: (
                    m.get_mission(t, mid),
                    hostlease.get(t, mid),
                    max((e.at for u in UNITS for e in m.journal_entries(t, mid, u)), default=0.0),
                )
            )
            now = time.monotonic() - struck
            if "lease" not in times and lease is not None and lease.hostname == "machine-b":
                times["lease"] = now
            if "lease" in times and "running" not in times and newest > wall + times["lease"]:
                times["running"] = now
            if record.state == MissionState.COMPLETED:
                times["done"] = now
                break
            if record.state == MissionState.WAITING_INPUT and record.question is not None:
                question = record.question
                entry = observer.read(lambda t, q=question: m.journal_get(t, mid, q.lane, q.seq))
                marker = str(entry.result.get("cmd", "")).rsplit("echo ", 1)[1].split(" ")[0]
                choice = "skip" if marker in markers(side) else "rerun"
                answer = b.keel("answer", mid, choice, "--store", str(store_b), stdout=subprocess.DEVNULL)
                answer.wait(60)
                answered += 1
                while observer.read(lambda t: m.get_mission(t, mid)).question == question:
                    time.sleep(0.05)
            if now > 300:
                raise RuntimeError(f"{strike}: mission {mid} did not complete on machine B")
            time.sleep(0.02)
        observer.close()
        return {**times, "answered": answered}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        a.remove()
        b.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=10.0, help="the host lease's ttl in seconds (default 10)")
    args = parser.parse_args()
    if why := can_make_machines():
        sys.exit(f"failover: {why}")
    server = PgServer()
    results: dict[str, list[dict[str, Any]]] = {"kill": [], "cut": []}
    try:
        with tempfile.TemporaryDirectory(prefix="keel-failover-") as tmp:
            for i in range(args.rounds):
                for strike in results:
                    out = _round(Path(tmp) / f"{strike}{i}", server, strike, args.ttl)
                    results[strike].append(out)
                    print(f"round {i + 1} {strike}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)
    finally:
        server.stop()
    print(f"\nhost lease ttl {args.ttl:g} s, supervisor interval 0.5 s; seconds from the strike, ", end="")
    print(f"medians of {args.rounds}")
    print(f"{'strike':8} {'lease on B':>11} {'unit running on B':>18} {'mission done':>13}")
    for strike, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in ("lease", "running", "done")}
        print(f"{strike:8} {med['lease']:11.2f} {med['running']:18.2f} {med['done']:13.2f}")


if __name__ == "__main__":
    main()
