"""Benchmark: how long the `keel` command takes to start, against a bare interpreter.

    python benchmarks/startup.py [--runs 30] [--missions 20] [--other PATH/TO/keel]

Side by side in one run, interleaved run by run: `python -c pass` (the floor), `python -S -c pass`, and the
installed `keel` script for `--help`, `missions` and `status` over a store holding --missions missions.
Prints medians of wall time and of CPU time (user + system of the child: steadier than wall time on a
shared machine) and their ratios to the floor. The children run with bytecode caching on (an installed keel
has its .pyc files; PYTHONDONTWRITEBYTECODE, if set here, is dropped for them), warmed by one run each.
Not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel.server.engine.control import create_mission
from keel.storage import Store
from keel.storage.location import prepare_keel_dir


def make_store(root: Path, missions: int) -> Path:
    store_path = root / ".keel" / "store"
    prepare_keel_dir(store_path)
    for i in range(missions):
        path = root / f"m{i}.toml"
        path.write_text(
            f'[mission]\nname = "bench{i}"\nworkspace = "."\nagent = ["true"]\n\n'
            f'[[units]]\nid = "u"\ntitle = "nothing"\n'
        )
        with Store.open(store_path) as store:
            create_mission(store, path)
    return store_path


CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one run."""
    cpu, begin = _cpu(), time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV)
    return (time.perf_counter() - begin) * 1000, (_cpu() - cpu) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--missions", type=int, default=20)
    parser.add_argument(
        "--other", metavar="KEEL", help="another keel script to time alongside (e.g. an older checkout's)"
    )
    args = parser.parse_args()
    keel = str(Path(sys.executable).parent / "keel")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        store = make_store(Path(tmp).resolve(), args.missions)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -S -c pass": [sys.executable, "-S", "-c", "pass"],
            "keel --help": [keel, "--help"],
            f"keel missions ({args.missions})": [keel, "missions", "--store", str(store)],
            "keel status": [keel, "status", "--store", str(store)],
        }
        if args.other:
            cases["other keel --help"] = [args.other, "--help"]
            cases["other keel missions"] = [args.other, "missions", "--store", str(store)]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for argv in cases.values():  # warm the page cache once
            time_once(argv)
        for _ in range(args.runs):
            for name, argv in cases.items():
                times[name].append(time_once(argv))

    def median(name: str, which: int) -> float:
        return statistics.median(run[which] for run in times[name])

    wall, cpu = median("python -c pass", 0), median("python -c pass", 1)
    print(f"keel start-up — {args.runs} interleaved runs each, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'command':<24} {'wall p50 ms':>11} {'x python':>9} {'cpu p50 ms':>11} {'x python':>9}")
    for name in times:
        w, c = median(name, 0), median(name, 1)
        print(f"{name:<24} {w:>11.1f} {w / wall:>9.2f} {c:>11.1f} {c / cpu:>9.2f}")


if __name__ == "__main__":
    main()
