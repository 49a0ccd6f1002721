"""Benchmark: many missions on one PostgreSQL, waiting for workers, then worked through by `keel worker`s.

    python benchmarks/fleet.py [--missions 10,50] [--workers 1,2,4] [--work-missions 20] [--idle 10]
        [--hosting in-process|process]

A throwaway PostgreSQL cluster on this machine (tests/pgserver.py, max_connections 300). Each mission has
one unit (`workers = true`) of one step: a command that appends to a side log. For each N of --missions, N
missions are started detached (`keel run --detach`) and left waiting for a worker; over --idle seconds the
benchmark reads what the waiting costs: transactions/s committed in the database (pg_stat_database), its
connections (pg_stat_activity), keel's processes and their RSS. Then, for each W of --workers, --work-missions
fresh missions wait and W `keel worker`s are started: seconds until every mission completed, steps/s, and
every effect checked once in the side log. Prints a table. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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

from keel.server.engine import control
from keel.storage import Store, leases
from keel.storage import missions as m
from keel.storage.location import URL_FILE
from tests.pgserver import PgServer

KEEL = [sys.executable, "-m", "keel.server.cli"]


def _store(folder: Path, url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / URL_FILE).write_text(url + "\n")
    return folder


def _start_missions(root: Path, store: Path, count: int, side: Path, hosting: str) -> subprocess.Popen[bytes] | None:
    """`count` missions waiting for workers: each with a host process of its own (`keel run --detach`), or
    queued (`keel run --queue`) for one `keel supervise --in-process` that hosts them all (returned)."""
    with Store.open(store, create=False) as opened:
        for n in range(count):
            folder = root / f"m{n}"
            folder.mkdir(parents=True)
            steps: list[dict[str, Any]] = [{"tool": "run", "args": {"cmd": f"echo m{n} >> {side}"}}]
            mission = write_mission(folder, [{"id": "u", "params": {"steps": steps}}], workers=True)
            if hosting == "process":  # as `keel run --detach` and `keel run --queue` do, without a process each
                control.spawn_host(store, control.create_mission(opened, mission).id)
            else:
                control.queue_mission(opened, mission)
    if hosting == "process":
        return None
    log = (root / "supervise.log").open("ab")
    return subprocess.Popen(
        [*KEEL, "supervise", "--in-process", "--interval", "2", "--store", str(store)], stdout=log, stderr=log, cwd=root
    )


def _states(store: Path) -> dict[str, str]:
    with Store.open(store, create=False) as s:
        return {r.id: str(r.state) for r in s.read(m.list_missions)}


def _db(server: PgServer, sql: str) -> Any:
    with server.connect() as conn:
        row = conn.execute(sql).fetchone()
        return None if row is None else row[0]


def _pids(marker: str) -> list[int]:
    """The processes whose command lines name `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _idle(server: PgServer, root: Path, n: int, seconds: float, hosting: str) -> dict[str, float]:
    store = _store(root / "store", server.store_url(server.new_schema()))
    _start_missions(root, store, n, root / "side.log", hosting)
    _hosted(store, n)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(s == "running" for s in _states(store).values()) < n:
        time.sleep(0.2)
    time.sleep(2.0)  # every host past its start
    commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'"
    before, started = int(_db(server, commits)), time.monotonic()
    time.sleep(seconds)
    after, took = int(_db(server, commits)), time.monotonic() - started
    connections = int(_db(server, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'keel%'"))
    pids = _pids(str(store))
    processes, rss = len(pids), sum(_rss_mb(pid) for pid in pids)
    _kill_all(str(store))  # the throwaway missions' hosts: nothing of them is kept
    return {
        "tps": (after - before) / took,
        "connections": connections,
        "processes": processes,
        "rss_mb": rss,
    }


def _work(server: PgServer, root: Path, n: int, workers: int, hosting: str) -> dict[str, float]:
    store = _store(root / "store", server.store_url(server.new_schema()))
    side = root / "side.log"
    _start_missions(root, store, n, side, hosting)
    _hosted(store, n)
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [*KEEL, "worker", "--store", str(store), "--units", "1", "--interval", "0.5"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=root,
        )
        for _ in range(workers)
    ]
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            states = _states(store)
            if len(states) == n and all(s in ("completed", "failed") for s in states.values()):
                break
            time.sleep(0.2)
        took = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        _kill_all(str(store))
    lines = side.read_text().split() if side.exists() else []
    completed = sum(s == "completed" for s in _states(store).values())
    return {
        "seconds": took,
        "steps_s": n / took,
        "completed": completed,
        "effects": len(lines),
        "duplicates": len(lines) - len(set(lines)),
    }


def _hosted(store: Path, n: int) -> None:
    """Until every mission's host has started it and offered its unit to workers."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with Store.open(store, create=False) as s:
            offered = s.read(lambda t: leases.offers(t, [r.id for r in m.list_missions(t)]))
        if len(offered) >= n:
            return
        time.sleep(0.5)
    raise SystemExit(f"fleet: the {n} missions did not all offer their unit within 600 s")


def _kill_all(marker: str) -> None:
    """SIGKILL every process whose command line names `marker`, and wait until none is left."""
    deadline = time.monotonic() + 60
    while (pids := _pids(marker)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--missions", default="10,50", help="numbers of waiting missions (default 10,50)")
    parser.add_argument("--workers", default="1,2,4", help="numbers of workers (default 1,2,4)")
    parser.add_argument("--work-missions", type=int, default=20, help="missions the workers finish (default 20)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the waiting is measured (default 10)")
    parser.add_argument(
        "--hosting",
        choices=("in-process", "process"),
        default="in-process",
        help="one `keel supervise --in-process` hosts every mission (default), or a host process each",
    )
    args = parser.parse_args()
    server = PgServer()
    try:
        print(f"waiting missions ({args.hosting} hosting): what they cost")
        print(f"{'N':>6} {'txn/s':>8} {'per mission':>12} {'connections':>12} {'processes':>10} {'RSS MB':>8}")
        for n in (int(x) for x in args.missions.split(",") if x):
            with tempfile.TemporaryDirectory(prefix="keel-fleet-") as tmp:
                r = _idle(server, Path(tmp), n, args.idle, args.hosting)
            print(
                f"{n:>6} {r['tps']:>8.1f} {r['tps'] / n:>12.2f} {r['connections']:>12.0f} "
                f"{r['processes']:>10.0f} {r['rss_mb']:>8.0f}",
                flush=True,
            )
        print(f"\n{args.work_missions} missions worked through by W workers")
        print(f"{'W':>6} {'seconds':>8} {'steps/s':>8} {'completed':>10} {'effects':>8} {'duplicates':>10}")
        rates = []
        for w in (int(x) for x in args.workers.split(",") if x):
            with tempfile.TemporaryDirectory(prefix="keel-fleet-") as tmp:
                r = _work(server, Path(tmp), args.work_missions, w, args.hosting)
            rates.append(r["steps_s"])
            print(
                f"{w:>6} {r['seconds']:>8.1f} {r['steps_s']:>8.2f} {r['completed']:>10.0f} "
                f"{r['effects']:>8.0f} {r['duplicates']:>10.0f}",
                flush=True,
            )
        if len(rates) > 1:
            print(
                f"\nsteps/s, last W against first: {rates[-1] / rates[0]:.2f}x (median {statistics.median(rates):.2f})"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
