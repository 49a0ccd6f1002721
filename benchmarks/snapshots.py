"""Benchmark: what a sandbox file snapshot costs per checkpoint (server/engine/trees.py).

    python benchmarks/snapshots.py [--files 2000] [--size 4096]

A sandbox of N files; the first snapshot stores everything; then one file changes and a snapshot is
taken again (new bytes in the store: that file's blob + one tree blob); then nothing changes (nothing
new). Scan times are medians of 5 runs with a warm Snapshotter (stat only for unchanged files).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from keel.server.engine.trees import Snapshotter
from keel.storage import DB, Store


def stored_bytes(store: Store) -> int:
    return store.read(lambda t: sum(len(raw) for _, raw in t.scan_raw(DB.BLOBS, b"")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "box"
        for i in range(args.files):
            path = root / f"d{i % 50}" / f"f{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{i}\n".encode() * (args.size // 8))
        with Store.open(Path(tmp) / "store") as store:
            snap = Snapshotter()

            def snapshot() -> tuple[float, int]:
                before = stored_bytes(store)
                started = time.perf_counter()
                scan = snap.scan(root)
                store.write(lambda t: snap.store_txn(t, root, scan))
                return (time.perf_counter() - started) * 1000, stored_bytes(store) - before

            first_ms, first_bytes = snapshot()
            changed, unchanged = [], []
            for n in range(5):
                (root / "d0" / "f0.txt").write_text(f"edit {n}\n")
                changed.append(snapshot())
                unchanged.append(snapshot())
    print(f"sandbox: {args.files} files of {args.size} bytes")
    print(f"first snapshot:        {first_ms:8.1f} ms  {first_bytes:>10} bytes stored")
    print(
        f"one file changed:      {statistics.median(c[0] for c in changed):8.1f} ms  "
        f"{statistics.median(c[1] for c in changed):>10} bytes stored (median of 5)"
    )
    print(
        f"nothing changed:       {statistics.median(u[0] for u in unchanged):8.1f} ms  "
        f"{statistics.median(u[1] for u in unchanged):>10} bytes stored"
    )


if __name__ == "__main__":
    main()
