"""Benchmark: where a unit's start goes in a large git workspace, next to `git worktree add` of the same tree.

    python benchmarks/unit_start.py [--files 100000] [--runs 5]

A repository of N files (benchmarks/monorepo.py's: ~400 bytes each, 40 per folder) and a mission sandbox
made from it as a mission host makes it. Then, `--runs` times, alternating A and B:

- A: a unit's sandbox made the way the host makes it (units/placement.py), each part timed: `branch_off`
  (the mission sandbox's pending files committed, `git worktree add --no-checkout`), `fill` (the files
  written: git's parallel checkout; then the first snapshot: only what differs from the base commit), and
  storing that snapshot (the unit's base_tree) in an LMDB store;
- B: `git worktree add` of the same tree, alone.

Printed: the median of each part and of the whole, B's median, and their ratio (issue 25's target: a unit's
sandbox ready in at most the time of `git worktree add`). One unit at a time; benchmarks/monorepo.py times
two units starting together inside a real mission.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monorepo import ENV, make_repo, worktree_add_s

from keel.server.engine.files import merge, places, sandbox, trees
from keel.server.engine.units import placement
from keel.storage import Store
from keel.storage.location import prepare_keel_dir


def unit_start(ws: Path, mission_sandbox: Path, store_path: Path, store: Store, n: int) -> dict[str, float]:
    lane = f"u{n}"
    took: dict[str, float] = {}
    t0 = time.perf_counter()
    merge.commit_pending(mission_sandbox)
    t1 = time.perf_counter()
    placement.branch_off(mission_sandbox, store_path, "mbench", lane)  # commits nothing now: pending is done
    t2 = time.perf_counter()
    path, _ = placement.home(store_path, "mbench", lane)
    merge.check_out(path)  # placement.fill's two parts, timed apart: the files written, then the snapshot
    t3 = time.perf_counter()
    files = trees.Snapshotter()
    scan = files.scan(path, keep_bytes=False, checked_out=True)
    t4 = time.perf_counter()
    store.write(lambda txn: files.store_txn(txn, path, scan))
    t5 = time.perf_counter()
    took["commit pending"] = t1 - t0
    took["worktree --no-checkout"] = t2 - t1
    took["checkout"] = t3 - t2
    took["snapshot"] = t4 - t3
    took["store base"] = t5 - t4
    took["whole"] = t5 - t0
    merge.remove_sandbox(path, mission_sandbox, merge.unit_branch("mbench", lane))
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-unit-start-") as tmp:
        root = Path(tmp)
        ws = make_repo(root, args.files)
        store_path = ws / ".keel" / "store"
        prepare_keel_dir(store_path)
        mission_sandbox = sandbox.ensure_sandbox(ws, places.sandbox_path(store_path, "mbench"), "mbench")
        subprocess.run(["git", "status", "-s"], cwd=mission_sandbox, check=True, env=ENV, capture_output=True)
        parts: dict[str, list[float]] = {}
        alone: list[float] = []
        with Store.open(store_path) as store:
            for n in range(args.runs):
                for name, value in unit_start(ws, mission_sandbox, store_path, store, n).items():
                    parts.setdefault(name, []).append(value)
                alone.append(worktree_add_s(ws))
    print(f"a unit's sandbox in a git workspace of {args.files:,} files: medians of {args.runs} runs, A/B alternating")
    for name, values in parts.items():
        print(f"  {name:<24}{statistics.median(values):8.2f} s")
    whole, wt = statistics.median(parts["whole"]), statistics.median(alone)
    print(f"  {'git worktree add alone':<24}{wt:8.2f} s")
    print(f"unit sandbox / git worktree add = {whole / wt:.2f}x (<= 1x)", file=sys.stdout)


if __name__ == "__main__":
    main()
