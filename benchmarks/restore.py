"""Benchmark: a fresh process reading a long unit journal back, against a raw LMDB scan of the same records.

    python benchmarks/restore.py [--entries 100000] [--runs 7] [--dir DIR]

Writes one unit lane of --entries journal entries (a tool result of ~200 bytes each) into a keel store,
then, interleaved run by run, times fresh processes that (a) open the store with keel and read the lane as
a resume does (`missions.journal_entries`: every record's seal verified and decoded), and (b) open the
same data.mdb with py-lmdb and copy every key and value of the lane out (the floor: no verification, no
decoding). Each child reports its own time from start of work to the last record, and the whole process
is timed too (interpreter and imports included). Prints medians and ratios. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel.protocol.records import JournalEntry
from keel.storage import Store
from keel.storage import missions as m

MISSION, UNIT = "m-bench", "u#1"

KEEL_READ = """
import sys, time
t0 = time.perf_counter()
from keel.storage import Store
from keel.storage import missions as m
t1 = time.perf_counter()
with Store.open(sys.argv[1], readonly=True) as store:
    entries = store.read(lambda t: m.journal_entries(t, sys.argv[2], sys.argv[3]))
t2 = time.perf_counter()
assert len(entries) == int(sys.argv[4]), len(entries)
print((t2 - t1) * 1000, (t1 - t0) * 1000)
"""

RAW_READ = """
import sys, time
t0 = time.perf_counter()
import lmdb
t1 = time.perf_counter()
env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=32, subdir=True)
db = env.open_db(b"journal", create=False)
prefix = (sys.argv[2] + "\\x00" + sys.argv[3] + "\\x00").encode()
out = []
with env.begin(db=db) as txn:
    cur = txn.cursor()
    if cur.set_range(prefix):
        for key, value in cur.iternext():
            if not key.startswith(prefix):
                break
            out.append((key, value))
t2 = time.perf_counter()
assert len(out) == int(sys.argv[4]), len(out)
print((t2 - t1) * 1000, (t1 - t0) * 1000)
"""


def fill(store_path: Path, entries: int) -> None:
    with Store.open(store_path) as store:
        for start in range(1, entries + 1, 5000):

            def write(txn, start: int = start) -> None:  # type: ignore[no-untyped-def]
                for seq in range(start, min(start + 5000, entries + 1)):
                    m.journal_put(
                        txn,
                        MISSION,
                        UNIT,
                        JournalEntry(
                            seq=seq,
                            kind="tool/run",
                            fingerprint=f"{seq:064x}",
                            tool_class="read_only",
                            result={"stdout": "ok " * 60, "exit": 0},
                            summary="run the tests",
                            at=time.time(),
                        ),
                    )

            store.write(write)


def run_child(code: str, store: Path, entries: int) -> tuple[float, float, float]:
    begin = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, str(store), MISSION, UNIT, str(entries)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), (time.perf_counter() - begin) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dir", default=".")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = Path(tmp) / "store"
        fill(store, args.entries)
        size = (store / "data.mdb").stat().st_size
        results: dict[str, list[tuple[float, float, float]]] = {"keel journal_entries": [], "raw lmdb scan": []}
        for code in (KEEL_READ, RAW_READ):
            run_child(code, store, args.entries)  # warm the page cache
        for _ in range(args.runs):
            results["keel journal_entries"].append(run_child(KEEL_READ, store, args.entries))
            results["raw lmdb scan"].append(run_child(RAW_READ, store, args.entries))
    floor = statistics.median(r[0] for r in results["raw lmdb scan"])
    print(
        f"fresh-process read of {args.entries} journal entries ({size / 2**20:.0f} MiB store, warm cache), "
        f"{args.runs} interleaved runs, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'reader':<22} {'read p50 ms':>12} {'x raw':>7} {'imports ms':>11} {'process ms':>11}")
    for name, runs in results.items():
        read = statistics.median(r[0] for r in runs)
        imports = statistics.median(r[1] for r in runs)
        whole = statistics.median(r[2] for r in runs)
        print(f"{name:<22} {read:>12.1f} {read / floor:>7.2f} {imports:>11.1f} {whole:>11.1f}")


if __name__ == "__main__":
    main()
