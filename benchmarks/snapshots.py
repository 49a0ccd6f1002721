"""Benchmark: what a sandbox file snapshot costs per checkpoint (server/engine/files/trees.py), against git.

    python benchmarks/snapshots.py [--files 20000] [--size 512] [--folders 50] [--rounds 5]

A workspace of N files in F folders; every layout takes a first snapshot of everything, then, in each
round, one file changes and each layout snapshots again, side by side on the same tree:

- keel, folder trees (today): a blob per changed file and one folder blob per folder on its path;
- keel, flat tree (the layout before folder trees, kept here to measure it): the same scan, then every
  entry checked and one tree blob listing every file written whole;
- git: `git add -A && git write-tree` in the same folder (its .git is left out of keel's snapshots).

Time is the snapshot's wall time (keel: scan + one LMDB write transaction with its sync commit; git: both
commands, process start-up included). Bytes are what the snapshot adds: sealed blob records in the
store, loose objects under .git/objects; git also rewrites its index whole, shown apart. Medians over
the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from keel.protocol.records import SandboxTree
from keel.server.engine.files.trees import Scan, Snapshotter
from keel.storage import DB, Store, Txn


def flat_store_txn(txn: Txn, scan: Scan) -> str:
    """The snapshot write before folder trees: new file blobs, an existence check per entry, and one
    tree blob listing every file (rewritten whole when any file changes)."""
    for data in scan.fresh.values():
        txn.put_blob(data)
    for entry in scan.entries:
        if entry.blob not in scan.fresh:
            txn.exists(DB.BLOBS, entry.blob.encode())
    return txn.put_object(SandboxTree(entries=tuple(scan.entries)))


def blob_bytes(store: Store) -> int:
    return store.read(lambda t: sum(len(raw) for _, raw in t.scan_raw(DB.BLOBS, b"")))


def keel_layout(store: Store, root: Path, flat: bool) -> Callable[[], tuple[float, int, int]]:
    snap = Snapshotter()

    def snapshot() -> tuple[float, int, int]:
        before = blob_bytes(store)
        started = time.perf_counter()
        scan = snap.scan(root)
        store.write(lambda t: flat_store_txn(t, scan) if flat else snap.store_txn(t, root, scan))
        return (time.perf_counter() - started) * 1000, blob_bytes(store) - before, 0

    return snapshot


def git_layout(root: Path) -> Callable[[], tuple[float, int, int]]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    objects = root / ".git" / "objects"

    def size() -> int:
        return sum(p.stat().st_size for p in objects.rglob("*") if p.is_file())

    def snapshot() -> tuple[float, int, int]:
        before = size()
        started = time.perf_counter()
        subprocess.run(["git", "add", "-A"], cwd=root, check=True, env=env)
        subprocess.run(["git", "write-tree"], cwd=root, check=True, env=env, capture_output=True)
        elapsed = (time.perf_counter() - started) * 1000
        return elapsed, size() - before, (root / ".git" / "index").stat().st_size

    return snapshot


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--folders", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "box"
        for i in range(args.files):
            path = root / f"d{i % args.folders}" / f"f{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{i}\n".encode() * max(1, args.size // len(f"{i}\n")))
        with Store.open(Path(tmp) / "folders") as folders, Store.open(Path(tmp) / "flat") as flat:
            layouts = {
                "keel, folder trees": keel_layout(folders, root, flat=False),
                "keel, flat tree (before)": keel_layout(flat, root, flat=True),
                "git add -A && write-tree": git_layout(root),
            }
            first = {name: take() for name, take in layouts.items()}
            rounds: dict[str, list[tuple[float, int, int]]] = {name: [] for name in layouts}
            for n in range(args.rounds):
                (root / f"d{n % args.folders}" / f"f{n}.txt").write_text(f"edit {n}\n")
                for name, take in layouts.items():
                    rounds[name].append(take())
    print(f"workspace: {args.files} files of ~{args.size} bytes in {args.folders} folders; one file changed per round")
    print(f"{'':28}{'first (ms)':>11}{'ms/snapshot':>13}{'bytes/snapshot':>16}{'vs git bytes':>14}")
    git_bytes = statistics.median(r[1] for r in rounds["git add -A && write-tree"])
    for name, taken in rounds.items():
        ms, written = statistics.median(r[0] for r in taken), statistics.median(r[1] for r in taken)
        print(f"{name:28}{first[name][0]:11.1f}{ms:13.1f}{written:16,.0f}{written / git_bytes:13.1f}x")
    index = statistics.median(r[2] for r in rounds["git add -A && write-tree"])
    print(f"(git also rewrites its index whole on each add: {index:,.0f} bytes, not counted above)")


if __name__ == "__main__":
    main()
