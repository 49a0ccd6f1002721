"""Benchmark: what retention gives back — a long mission's store before and after `keel gc --keep-last N
--compact`, against a fresh store holding the same mission.

    python benchmarks/retention.py [--entries 100000] [--units 2] [--keep-last 2] [--dir DIR]

A mission of --units units of the scripted agent reading a file --entries/--units times each, with a
restore point every 300 ms (checkpoint policy `interval`), in a git workspace. Printed: data.mdb's bytes
and the restore points after the run; after `keel gc --keep-last N` (LMDB reuses freed pages but keeps
the file's size); after `--compact`; and the bytes of a fresh store that holds just the mission as gc
left it (exported as a bundle and imported there, then compacted), with the ratio (target: at most 2x).
Every kept point is restored with its files afterwards. Not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KEEL = [sys.executable, "-m", "keel.server.cli"]


def _keel(*args: str, store: Path, cwd: Path | None = None) -> str:
    proc = subprocess.run([*KEEL, *args, "--store", str(store)], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"keel {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _size(store: Path) -> int:
    return (store / "data.mdb").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="keel-retention-"))
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "read-me.txt").write_text("a line a unit reads back, again and again\n" * 20)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-c", "user.name=k", "-c", "user.email=k@k", *cmd], cwd=ws, check=True)
    per_unit = args.entries // args.units
    units = "\n".join(
        f'[[units]]\nid = "u{i}"\nparams.steps = [{{ repeat = {per_unit}, steps = '
        '[{ tool = "read_file", args = { path = "read-me.txt" } }] }]\n'
        for i in range(args.units)
    )
    mission = root / "mission.toml"
    mission.write_text(
        '[mission]\nname = "retention"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n'
        f'max_parallel = {args.units}\n\n[checkpoint]\npolicy = "interval"\ninterval_ms = 300.0\n\n{units}'
    )
    store = root / "store"
    _keel("run", str(mission), "--plain", store=store)
    mission_id = json.loads(_keel("missions", "--json", store=store))[0]["id"]
    rows = [("after the run", _size(store), len(json.loads(_keel("points", mission_id, "--json", store=store))))]
    _keel("gc", "--keep-last", str(args.keep_last), store=store)
    points = json.loads(_keel("points", mission_id, "--json", store=store))
    rows.append((f"gc --keep-last {args.keep_last}", _size(store), len(points)))
    _keel("gc", "--compact", store=store)
    rows.append(("gc --compact", _size(store), len(points)))

    bundle, fresh = root / "mission.keel", root / "fresh" / "store"  # its own sandboxes folder beside it
    _keel("export", mission_id, "-o", str(bundle), store=store)
    subprocess.run(["git", "clone", "-q", str(ws), str(root / "clone")], check=True)
    _keel("import", str(bundle), "--allow-unsigned", store=fresh, cwd=root / "clone")
    _keel("gc", "--compact", store=fresh)
    rows.append(("fresh store, same mission", _size(fresh), len(points)))

    print(f"{args.units} units x {per_unit} read_file entries, a point every 300 ms; {root}")
    print(f"{'store':<28} {'data.mdb bytes':>15} {'points':>7}")
    for name, size, count in rows:
        print(f"{name:<28} {size:>15,} {count:>7}")
    print(f"compacted / fresh: {rows[2][1] / rows[3][1]:.2f}x (target: at most 2x)")
    for point in points:
        _keel("restore", mission_id, point["id"], "--files", store=store)
    print(f"every kept point ({len(points)}) restored with its files")


if __name__ == "__main__":
    main()
