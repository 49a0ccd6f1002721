"""Benchmark: from a `keel worker`'s link cut mid-unit to its unit running on another machine's worker.

    sudo python benchmarks/worker_failover.py [--rounds 3] [--ttl 10]

A mission host here (`workers = true`) offers a one-unit mission; machine A and machine B (network
namespaces on this host, tests/postgres/machines.py, in front of a throwaway PostgreSQL cluster) each run
`keel worker`. A starts first and takes the unit; when the unit's command has run there and its next step
is journaled, A's link is cut (its processes run on). Timed from the cut: the host offers the unit again
(`offered`: A's lease lapsed, judged by the database's clock), B's worker holds it (`running on B`), the
unit's completion is recorded (`done`: B replays the journal, then finishes the unit's own work, a 1 s
sleep). Medians over the rounds; the unit lease's ttl is --ttl (keel's default, 10 s). Needs root. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
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

from keel.protocol.states import LeaseState
from keel.storage import Store, leases
from tests.pgserver import PgServer
from tests.postgres.machines import Machine, can_make_machines, markers, remove_all, store_folder

KEEL = [sys.executable, "-m", "keel.server.cli"]


def _round(folder: Path, server: PgServer, ttl: float) -> dict[str, float]:
    schema = server.new_schema()
    a, b = Machine("worker-a", server.port), Machine("worker-b", server.port)
    procs: list[subprocess.Popen[str]] = []
    try:
        side = folder / "side.log"
        steps: list[dict[str, Any]] = [
            {"tool": "write_file", "args": {"path": "u.txt", "content": "u\n"}},
            {"tool": "run", "args": {"cmd": f"echo u-1 >> {side}"}},
            {"now": True},
            {"sleep": 1.0},
        ]
        (folder / "host").mkdir(parents=True)
        mission = write_mission(folder / "host", [{"id": "u", "params": {"steps": steps}}], workers=True)
        store = store_folder(folder / "host" / "ws", server.store_url(schema))
        a.hide, b.hide = [folder / "b", folder / "host"], [folder / "a", folder / "host"]
        store_a = store_folder(folder / "a" / "ws", a.url(schema))
        store_b = store_folder(folder / "b" / "ws", b.url(schema))
        env = {"KEEL_LEASE_TTL_S": str(ttl)}
        host = subprocess.Popen(
            [*KEEL, "run", str(mission), "--json", "--store", str(store)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        procs.append(host)
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]
        procs.append(a.keel("worker", "--store", str(store_a), env=env, stdout=subprocess.DEVNULL))
        observer = Store.open(store)

        def held() -> Any:
            return observer.read(lambda t: leases.get(t, mid, "u"))

        def struck() -> bool:  # the unit's effect ran on A and its last step is journaled
            x = held()
            return bool(markers(side)) and x is not None and x.hostname == "worker-a" and x.place.last_checkpoint >= 3

        while not struck():
            time.sleep(0.005)
        procs.append(b.keel("worker", "--store", str(store_b), env=env, stdout=subprocess.DEVNULL))
        epoch = held().epoch
        cut = time.monotonic()
        a.cut()
        seen: dict[str, float] = {}
        while "done" not in seen:
            now, lease = time.monotonic() - cut, held()
            if lease.epoch > epoch and "offered" not in seen:
                seen["offered"] = now
            if lease.hostname == "worker-b" and lease.state == LeaseState.RUNNING:
                seen.setdefault("running on B", now)
            if lease.state == LeaseState.DONE:
                seen["done"] = now
            if now > 120:
                raise RuntimeError(f"unit u did not complete on machine B: {lease}")
            time.sleep(0.01)
        observer.close()
        seen.setdefault("running on B", seen["done"])
        return seen
    finally:
        remove_all([a, b], procs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=10.0)
    args = parser.parse_args()
    if why := can_make_machines():
        raise SystemExit(f"cannot make machines here: {why}")
    rounds: list[dict[str, float]] = []
    server = PgServer()
    try:
        with tempfile.TemporaryDirectory(prefix="keel-worker-failover-") as tmp:
            for i in range(args.rounds):
                out = _round(Path(tmp) / f"round{i}", server, args.ttl)
                rounds.append(out)
                print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)
    finally:
        server.stop()
    print(f"\nunit lease ttl {args.ttl:g} s; seconds from machine A's link cut, median of {args.rounds} rounds:")
    for key in ("offered", "running on B", "done"):
        print(f"  {key:<13} {statistics.median(r[key] for r in rounds):6.2f}")


if __name__ == "__main__":
    main()
