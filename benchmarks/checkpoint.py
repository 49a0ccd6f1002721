"""Benchmark: the cost of a checkpoint commit as a mission's journal grows.

    python benchmarks/checkpoint.py [--small 1000] [--large 100000] [--commits 200] [--units 20]

Two stores side by side, one whose mission has --small journal entries and one with --large. In each,
interleaved commit by commit, a checkpoint is written the way a host writes one (manifest blob, HEAD and a
restore point in one synced transaction, `missions.commit_checkpoint`) with --units unit marks. Prints the
median and p99 per store and the large/small ratio. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from keel.protocol.records import CheckpointManifest, JournalEntry, UnitMark
from keel.protocol.states import UnitState
from keel.storage import Store
from keel.storage import missions as m

MISSION = "m-bench"


def fill(store: Store, entries: int, units: int) -> None:
    for start in range(0, entries, 5000):

        def write(txn, start: int = start) -> None:  # type: ignore[no-untyped-def]
            for seq in range(start + 1, min(start + 5000, entries) + 1):
                entry = JournalEntry(
                    seq=seq,
                    kind="tool/run",
                    fingerprint=f"{seq:064x}",
                    result={"stdout": "ok " * 60, "exit": 0},
                    summary="run the tests",
                )
                m.journal_put(txn, MISSION, f"u{seq % units}", entry)

        store.write(write)


def manifest(number: int, units: int) -> CheckpointManifest:
    marks = {
        f"u{i}": UnitMark(state=UnitState.SUCCEEDED if i < number % units else UnitState.RUNNING, journal_hwm=number)
        for i in range(units)
    }
    return CheckpointManifest(
        mission_id=MISSION,
        number=number,
        reason="step",
        created_at=time.time(),
        graph="a" * 64,
        units=marks,
        config="b" * 64,
        sandbox_tree="c" * 64,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--units", type=int, default=20)
    parser.add_argument("--dir", default=".")
    args = parser.parse_args()
    times: dict[int, list[float]] = {args.small: [], args.large: []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        stores = {}
        for size in times:
            stores[size] = Store.open(Path(tmp) / f"store{size}")
            fill(stores[size], size, args.units)
        for number in range(1, args.commits + 1):
            for size, store in stores.items():
                made = manifest(number, args.units)
                begin = time.perf_counter()
                store.write(lambda txn, made=made: m.commit_checkpoint(txn, made))  # type: ignore[misc]
                times[size].append((time.perf_counter() - begin) * 1000)
        for store in stores.values():
            store.close()
    print(
        f"checkpoint commit ({args.units} unit marks, synced), {args.commits} interleaved commits, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'journal entries':>16} {'p50 ms':>8} {'p99 ms':>8}")
    for size, values in times.items():
        ordered = sorted(values)
        print(f"{size:>16} {statistics.median(values):>8.3f} {ordered[int(0.99 * (len(ordered) - 1))]:>8.3f}")
    ratio = statistics.median(times[args.large]) / statistics.median(times[args.small])
    print(f"large/small ratio of medians: {ratio:.2f}")


if __name__ == "__main__":
    main()
