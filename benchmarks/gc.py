"""Benchmark: how long `keel gc` holds the store's write lock, and how long another process's writes wait
meanwhile, on one store collected by each keel given.

    python benchmarks/gc.py [--checkpoints 30] [--files 200] [--changes 10] [--history 120]
                            [--config-bytes 1000000] [--strays 100000] [--keep-last N]
                            [--before /work/main/.venv/bin/python] [--dir DIR]

Builds one LMDB store (tests/storage/gckit.py): a mission of --checkpoints checkpoints over a sandbox of
--files files of which --changes change at each, then --history more checkpoints that all name one config
blob of --config-bytes (gc reads it again for each checkpoint it walks), plus --strays small blobs
nothing names. Each keel (the python of --before, then this one) collects its own copy (whole chains, or
with --keep-last N) while a second process writes a small record as often as it can. Printed per run:
the collection's total time, its write transactions and the longest one (a keel that collects in one
transaction: its whole time), and the other process's longest write and how many writes it made.
Not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, sys, time
from keel.storage import Store
store = Store.open(sys.argv[1], create=False, write_timeout=600)
keep_last = int(sys.argv[2]) if sys.argv[2] else None
began = time.monotonic()
try:
    from keel.storage.gcsweep import collect
except ImportError:  # a keel that collects in one write transaction
    from keel.storage.gc import gc_txn
    report = store.write(lambda t: gc_txn(t, keep_last=keep_last))
    took = time.monotonic() - began
    print(json.dumps({"total_s": took, "transactions": 1, "longest_ms": took * 1000, "removed": report.blobs_removed}))
else:
    report = collect(store, keep_last=keep_last)
    took = time.monotonic() - began
    print(json.dumps({"total_s": took, "transactions": report.transactions, "longest_ms": report.longest_txn_ms,
                      "removed": report.blobs_removed}))
"""


def build(folder: Path, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from keel.storage import Store
    from tests.storage.gckit import grow, long_history, strays

    with Store.open(folder / "store") as store:
        grow(store, "m1", folder / "m1", checkpoints=args.checkpoints, files=args.files, changes=args.changes)
        long_history(store, "m1", args.history, args.config_bytes)
        strays(store, args.strays)


def run(python: str, base: Path, copy: Path, keep_last: str) -> dict[str, float]:
    shutil.copytree(base, copy)
    stop, out = copy / "stop", copy / "writer.json"
    rest = [str(stop), str(out), "0", "0", "0"]  # small writes as often as it can
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.gckit", str(copy / "store"), str(copy / "m1" / "sandbox"), *rest],
        cwd=ROOT,
        env={"KEEL_WRITE_LOCK_TIMEOUT_S": "600", "PATH": "/usr/bin:/bin"},
    )
    time.sleep(1.0)  # the writer is writing
    command = [python, "-c", MEASURE, str(copy / "store"), keep_last]
    measured = subprocess.run(command, capture_output=True, text=True, check=True)
    stop.touch()
    writer.wait()
    return {**json.loads(measured.stdout), **json.loads(out.read_text())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", type=int, default=30)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--changes", type=int, default=10)
    ap.add_argument("--history", type=int, default=120)
    ap.add_argument("--config-bytes", type=int, default=1_000_000)
    ap.add_argument("--strays", type=int, default=100_000)
    ap.add_argument("--keep-last", default="")
    ap.add_argument("--before", default="", help="the python of another keel to compare with")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="keel-gc-"))
    build(root / "base", args)
    size = (root / "base" / "store" / "data.mdb").stat().st_size
    print(
        f"{args.checkpoints} checkpoints x {args.files} files ({args.changes} changed each), {args.history} more "
        f"naming one {args.config_bytes}-byte blob, {args.strays} strays; gc --keep-last {args.keep_last or '-'}"
    )
    print(f"data.mdb {size} bytes; {root}")
    print(f"{'keel':<40} {'gc s':>7} {'txns':>6} {'longest txn ms':>15} {'other writes':>13} {'longest wait ms':>16}")
    for n, python in enumerate([args.before, sys.executable] if args.before else [sys.executable]):
        row = run(python, root / "base", root / f"run{n}", args.keep_last)
        print(
            f"{python:<40} {row['total_s']:>7.2f} {row['transactions']:>6.0f} {row['longest_ms']:>15.0f} "
            f"{row['writes']:>13.0f} {row['longest_s'] * 1000:>16.0f}"
        )


if __name__ == "__main__":
    main()
