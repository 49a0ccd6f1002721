"""Benchmark: keel's own time per unit when `keel worker`s run a mission's units, and where it goes.

    python benchmarks/worker_units.py [--units 12] [--workers 1,4] [--rounds 1]

A mission of --units units that do nothing but one journaled step (`now`), so that all the time a unit
takes is keel's: offered by its host, claimed by a worker (its sandbox made from the stored snapshots),
its worker process and agent started, the step journaled, its completion recorded, its files brought to
the host and merged. Run with `workers = true` and 1, 4, … real `keel worker` processes on this machine
(LMDB store), and once run by its host alone for comparison. Prints, per run: the wall time, the time per
unit (wall * parallel units / units), and, per unit (medians), the phases as the store's timestamps tell:

  launched→step     from the host's launch of the unit (its offer) to the unit's first journaled step:
                    the claim, the sandbox made on the worker, the worker process and the agent started
  step→merged       from that step to the unit's success recorded by its host: the completion, the host
                    seeing it, making its files here, merging, checkpointing

and the floor: `python -c pass`, importing the subagent module, importing the scripted agent.
Figures only; not a test.
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

from keel.protocol.records import Event, JournalEntry
from keel.storage import Store, leases
from keel.storage import missions as m

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
from engine_helpers import write_mission

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _keel(*args: str) -> list[str]:
    return [sys.executable, "-m", "keel.server.cli", *args]


def _mission(folder: Path, units: int, workers: bool, parallel: int) -> Path:
    spec = [{"id": f"u{i:02d}", "params": {"steps": [{"now": True}]}} for i in range(units)]
    return write_mission(folder, spec, workers=workers, max_parallel=parallel)


def _run(root: Path, units: int, workers: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(dir=root))
    store = folder / "store"
    mission = _mission(folder, units, workers > 0, max(workers, 1))
    Store.open(store).close()  # workers start before the host: the store must be there for them
    procs = [
        subprocess.Popen(_keel("worker", "--store", str(store), "--units", "1"), env=ENV, stdout=subprocess.DEVNULL)
        for _ in range(workers)
    ]
    try:
        started = time.monotonic()
        run = _keel("run", str(mission), "--json", "--store", str(store))
        done = subprocess.run(run, env=ENV, capture_output=True, text=True)
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    if done.returncode != 0:
        raise SystemExit(f"the mission failed: {done.stdout}{done.stderr}")
    mid = json.loads(done.stdout.splitlines()[0])["mission"]
    return {"wall": wall, "per_unit": wall * max(workers, 1) / units, "phases": _phases(store, mid)}


def _phases(store_path: Path, mid: str) -> dict[str, float]:
    """Medians of each unit's phases, from the events and the journal (the store's timestamps)."""
    with Store.open(store_path, create=False, readonly=True) as store:
        events: list[Event] = store.read(lambda t: [e for _, e in m.events_after(t, mid)])
        lanes = store.read(lambda t: {x.lane: x for x in leases.list_leases(t, mid)})
        firsts: dict[str, float] = {}
        for lane, lease in lanes.items():
            entries: list[JournalEntry] = store.read(lambda t, lane=lane: m.journal_entries(t, mid, lane))
            if entries:
                firsts[lease.unit] = min(e.at for e in entries)
    by_unit: dict[str, dict[str, float]] = {}
    for event in events:
        if not event.unit:
            continue
        marks = by_unit.setdefault(event.unit, {})
        if event.kind == "unit" and event.state == "running":
            marks.setdefault("offered", event.at)
        elif event.kind == "lease" and event.state == "running":
            marks.setdefault("claimed", event.at)
        elif event.kind == "unit" and event.state == "succeeded":
            marks["merged"] = event.at
    phases: dict[str, list[float]] = {"launched→step": [], "step→merged": [], "launched→merged": []}
    for unit, marks in by_unit.items():
        if "offered" in marks and "merged" in marks and unit in firsts:
            phases["launched→step"].append(firsts[unit] - marks["offered"])
            phases["step→merged"].append(marks["merged"] - firsts[unit])
            phases["launched→merged"].append(marks["merged"] - marks["offered"])
    return {name: statistics.median(values) for name, values in phases.items() if values}


def _floor() -> dict[str, float]:
    out = {}
    for name, code in (
        ("python -c pass", "pass"),
        ("import subagent", "import keel.server.engine.units.subagent"),
        ("import scripted agent", "import keel.agents.scripted"),
    ):
        times = []
        for _ in range(5):
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.monotonic() - started)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=12)
    parser.add_argument("--workers", default="1,4", help="comma-separated worker counts (0: the host alone)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    counts = [0, *(int(x) for x in args.workers.split(","))]
    with tempfile.TemporaryDirectory(prefix="keel-bench-workers-") as tmp:
        results: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
        for _ in range(args.rounds):
            for n in counts:
                results[n].append(_run(Path(tmp), args.units, n))
    print(f"{args.units} units of one journaled step each; medians over {args.rounds} round(s)")
    base = statistics.median(r["wall"] for r in results[counts[1]]) if len(counts) > 1 else 0.0
    for n in counts:
        wall = statistics.median(r["wall"] for r in results[n])
        per = statistics.median(r["per_unit"] for r in results[n])
        phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in results[n]) for k in results[n][0]["phases"]}
        who = "host alone" if n == 0 else f"{n} worker{'s' if n > 1 else ''}"
        speed = f"  speed-up vs 1 worker {base / wall:.2f}x" if n and base else ""
        shown = "  ".join(f"{k} {v:.2f} s" for k, v in phases.items())
        print(f"  {who:<11} wall {wall:6.2f} s  keel per unit {per:.2f} s{speed}\n               per unit: {shown}")
    print("  floor: " + "  ".join(f"{k} {v:.2f} s" for k, v in _floor().items()))


if __name__ == "__main__":
    main()
