"""Benchmark: what the B-tree check every store open makes costs on a store of realistic size.

    python benchmarks/open_check.py [--entries 50000] [--dir DIR] [--runs 7]

Fills a store with --entries journal entries (~500 B each, 20 units), as many events and evidence records,
and a 6 KiB blob every 50 entries, as a long mission leaves it; then times, --runs times each, alternating:
`lmdbtrees.tree_damage` alone (CPU and wall), the quick meta check every open made before it
(`check_data_file`), and a whole read-only `Store.open` + close. Prints medians in milliseconds and the
store's size in pages. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from keel.protocol.records import Event, JournalEntry
from keel.storage import DB, Store, Txn
from keel.storage.keys import log_key, mission_prefix, unit_prefix
from keel.storage.lmdbfile import DataFile, newest
from keel.storage.lmdbtrees import tree_damage
from keel.storage.lmdbwalk import check_data_file


def fill(path: Path, entries: int) -> None:
    with Store.open(path) as store:
        for chunk in range(0, entries, 5000):

            def batch(txn: Txn, chunk: int = chunk) -> None:
                for i in range(chunk, min(chunk + 5000, entries)):
                    unit = unit_prefix("m1", f"u{i % 20}")
                    txn.append(DB.EVENTS, mission_prefix("m1"), Event(kind="tool", at=float(i), message="ran " * 30))
                    entry = JournalEntry(
                        seq=i, kind="tool/run", fingerprint="f" * 64, result={"out": os.urandom(200).hex()}
                    )
                    txn.put(DB.JOURNAL, log_key(unit, i), entry)
                    txn.append(DB.EVIDENCE, unit, Event(kind="evidence", at=float(i), message="x" * 150))
                    if i % 50 == 0:
                        txn.put_blob(os.urandom(6000))

            store.write(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "store"
        fill(path, args.entries)
        data = path / "data.mdb"
        times: dict[str, list[float]] = {"tree check (cpu)": [], "tree check (wall)": [], "meta check": [], "open": []}
        for _ in range(args.runs):
            with DataFile(data) as f:
                meta = newest(f.metas())
                f.measure()
                wall, cpu = time.perf_counter(), time.process_time()
                assert tree_damage(f, meta) is None
                times["tree check (cpu)"].append(time.process_time() - cpu)
                times["tree check (wall)"].append(time.perf_counter() - wall)
            start = time.perf_counter()
            check_data_file(data)
            times["meta check"].append(time.perf_counter() - start)
            start = time.perf_counter()
            Store.open(path, readonly=True).close()
            times["open"].append(time.perf_counter() - start)
        pages = data.stat().st_size // meta.page_size
        size = data.stat().st_size / 1e6
        print(f"{args.entries} entries each of journal, events and evidence: {size:.0f} MB, {pages} pages")
        for name, values in times.items():
            print(f"  {name:18} median {1000 * statistics.median(values):7.1f} ms")


if __name__ == "__main__":
    main()
