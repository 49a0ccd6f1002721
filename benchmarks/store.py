"""Benchmark: one sealed durable append through keel's store, against the floors it is built on.

    python benchmarks/store.py [--dir DIR] [--n 500] [--verify-records 100000]

Side by side in one run, interleaved step by step on the same disk (DIR, default a temporary folder
under the current directory): a raw write + fdatasync of the same bytes to a file, a raw py-lmdb commit
with sync=True, and keel's Store.write with Txn.append of a ~2 KiB JournalEntry. Then verify_all
throughput over a store of --verify-records events. Prints medians, p99s and ratios. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import msgspec

from keel.protocol.records import Event, JournalEntry
from keel.storage import DB, Store
from keel.storage.keys import log_key, mission_prefix, unit_prefix
from keel.storage.record import Codec, seal
from keel.storage.verify import verify_all

ENTRY = JournalEntry(
    seq=0,
    kind="tool/run",
    fingerprint="f" * 64,
    tool_class="effectful",
    result={"stdout": "x" * 1900, "exit": 0},
    summary="run tests",
)


def bench_appends(folder: Path, n: int) -> dict[str, list[float]]:
    prefix = unit_prefix("m1", "u1")
    payload = seal("journal", log_key(prefix, 1), msgspec.msgpack.encode(ENTRY), Codec.MSGPACK)
    fd = os.open(folder / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    env = lmdb.open(str(folder / "raw-lmdb"), map_size=1 << 30, sync=True, metasync=True)
    store = Store.open(folder / "keel")
    counter = iter(range(1, 10**9))

    def raw_fsync() -> None:
        os.write(fd, payload)
        os.fdatasync(fd)

    def raw_lmdb() -> None:
        with env.begin(write=True) as txn:
            txn.put(log_key(prefix, next(counter)), payload)

    def keel_append() -> None:
        store.write(lambda t: t.append(DB.JOURNAL, prefix, ENTRY))

    steps: dict[str, Callable[[], None]] = {
        "write+fdatasync": raw_fsync,
        "py-lmdb sync commit": raw_lmdb,
        "keel Store.write+append": keel_append,
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    try:
        for i in range(n + 20):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                if i >= 20:  # warm-up
                    times[name].append(time.perf_counter() - start)
    finally:
        os.close(fd)
        env.close()
        store.close()
    return times


def bench_verify(folder: Path, records: int) -> tuple[int, float]:
    with Store.open(folder / "verify") as store:
        for batch in range(0, records, 10_000):

            def fill(t: object, batch: int = batch) -> None:
                for i in range(batch, min(batch + 10_000, records)):
                    t.put(
                        DB.EVENTS,
                        log_key(mission_prefix("m1"), i + 1),  # type: ignore[attr-defined]
                        Event(kind="state", at=float(i), unit="u1", message="unit started"),
                    )

            store.write(fill)
        start = time.perf_counter()
        report = verify_all(store)
        elapsed = time.perf_counter() - start
    assert report.ok, report.problems
    return report.records, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--verify-records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-bench-", dir=args.dir) as tmp:
        times = bench_appends(Path(tmp), args.n)
        count, elapsed = bench_verify(Path(tmp), args.verify_records)
    floor = statistics.median(times["write+fdatasync"])
    lmdb_p50 = statistics.median(times["py-lmdb sync commit"])
    print(
        f"durable append of a {len(msgspec.msgpack.encode(ENTRY))} B JournalEntry, n={args.n}, dir={args.dir.resolve()}"
    )
    print(f"{'':26}{'p50 ms':>9}{'p99 ms':>9}{'x fsync':>9}{'x lmdb':>9}")
    for name, samples in times.items():
        p50 = statistics.median(samples)
        p99 = statistics.quantiles(samples, n=100)[98]
        print(f"{name:26}{p50 * 1e3:9.3f}{p99 * 1e3:9.3f}{p50 / floor:9.2f}{p50 / lmdb_p50:9.2f}")
    print(f"verify_all: {count} records in {elapsed:.2f} s = {count / elapsed:,.0f} records/s")


if __name__ == "__main__":
    main()
