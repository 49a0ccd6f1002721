"""Benchmark: a mission's cost in a large git workspace (a step's cost should follow what it changes).

    python benchmarks/monorepo.py [--sizes 200,2000,20000,100000]

For each size N: a git repository of N files (~400 bytes each, 40 per folder), built with `git
fast-import` from a generated stream and checked out; then the mission of two parallel units, each
making 20 `write_file` calls and one `run` (a shell command writing a file), run by the real `keel run`
with the scripted agent. Printed side by side, one row per size:

- mission: wall time of `keel run`;
- step: median gap between consecutive journal entries of an effectful step (a unit's `write_file`
  and `run` results, from the journal's own timestamps);
- unit start: the host's "unit running" event to the unit's first journal entry (its sandbox made and
  snapshotted, its lease granted, its agent started), and the mission's start to that entry (medians of
  the two units); sandbox: that event to the lease's `started_at` (the sandbox made and snapshotted);
- store: bytes of the store's data file after the mission;
- worktree add: `git worktree add` of the same tree, timed alone in the same repository; and two of them
  started at once (the median of their times), as the mission's two units make their sandboxes at once.

Targets (issue 25): a step at the largest size at most 2x the same step at the smallest; the store at
100k files under 5 MB; a unit's start within the time of `git worktree add`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from keel.protocol.records import UnitLease
from keel.storage import Store, leases
from keel.storage import missions as m

PER_FOLDER = 40
ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_SYSTEM": os.devnull,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def content(i: int) -> bytes:
    line = f"file {i}: the quick brown fox jumps over the lazy dog\n".encode()
    return line * (400 // len(line) + 1)


def fast_import_stream(files: int) -> bytes:
    """One commit holding `files` files, 40 per folder, as a `git fast-import` stream."""
    parts = [b"commit refs/heads/main\ncommitter bench <bench@example.invalid> 0 +0000\ndata 5\nbase\n"]
    for i in range(files):
        data = content(i)
        parts.append(b"M 644 inline d%05d/f%07d.txt\ndata %d\n%s\n" % (i // PER_FOLDER, i, len(data), data))
    return b"".join(parts)


def make_repo(root: Path, files: int) -> Path:
    ws = root / "ws"
    subprocess.run(["git", "init", "-q", "-b", "main", str(ws)], check=True, env=ENV)
    subprocess.run(["git", "fast-import", "--quiet"], cwd=ws, input=fast_import_stream(files), check=True, env=ENV)
    subprocess.run(["git", "checkout", "-q", "-f", "main"], cwd=ws, check=True, env=ENV)
    return ws


def worktree_add_s(ws: Path) -> float:
    target = ws.parent / "wt-timed"
    started = time.perf_counter()
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(target), "HEAD"], cwd=ws, check=True, env=ENV)
    took = time.perf_counter() - started
    subprocess.run(["git", "worktree", "remove", "--force", str(target)], cwd=ws, check=True, env=ENV)
    return took


def worktree_pair_s(ws: Path) -> float:
    """Two `git worktree add` of the tree started at once, as the mission's two units start together: the
    median of their own times."""
    targets = [ws.parent / f"wt-pair-{n}" for n in (1, 2)]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(["git", "worktree", "add", "-q", "--detach", str(t), "HEAD"], cwd=ws, env=ENV) for t in targets
    ]
    took = []
    for proc in procs:
        proc.wait()
        took.append(time.perf_counter() - started)
    for target in targets:
        subprocess.run(["git", "worktree", "remove", "--force", str(target)], cwd=ws, check=True, env=ENV)
    return statistics.median(took)


def unit(uid: str, folder: int) -> str:
    """A unit's TOML: 20 `write_file` calls into its own folder, then one `run` writing another file."""
    steps = [
        f'{{ tool = "write_file", args = {{ path = "d{folder:05d}/new{n}.txt", content = "{uid} {n} {"x" * 380}" }} }}'
        for n in range(20)
    ]
    steps.append(f'{{ tool = "run", args = {{ cmd = "echo {uid} > d{folder:05d}/ran.txt" }} }}')
    return f'[[units]]\nid = "{uid}"\nparams.steps = [{", ".join(steps)}]\n'


def mission_toml(root: Path) -> Path:
    path = root / "mission.toml"
    head = '[mission]\nname = "monorepo"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n\n'
    path.write_text(head + unit("u1", 0) + "\n" + unit("u2", 1))
    return path


def run_mission(root: Path) -> dict[str, float]:
    store = root / "store"
    started_wall = time.time()
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", str(mission_toml(root)), "--store", str(store), "--plain"],
        check=True,
        capture_output=True,
        env={**ENV, "KEEL_HOME": str(root / "home")},
    )
    wall = time.perf_counter() - started
    gaps: list[float] = []
    unit_start: list[float] = []
    sandbox: list[float] = []
    mission_start: list[float] = []
    with Store.open(store, create=False) as s:
        mid = s.read(m.list_missions)[0].id
        events = [e for _, e in s.read(lambda t: m.events_after(t, mid))]
        for uid in ("u1", "u2"):
            entries = s.read(partial(m.journal_entries, mission_id=mid, unit_id=uid))
            began = [e.at for e in events if e.kind == "unit" and e.unit == uid and e.state == "running"]
            done = [e for e in entries if e.phase == "done" and e.tool_class == "effectful"]
            assert len(done) == 21, f"{uid}: {len(done)} effectful steps recorded"
            gaps += [(b.at - a.at) * 1000 for a, b in itertools.pairwise(done)]
            unit_start.append(entries[0].at - began[0])
            held: UnitLease | None = s.read(partial(leases.get, mission_id=mid, unit_id=uid))
            sandbox.append((held.started_at if held else float("nan")) - began[0])
            mission_start.append(entries[0].at - started_wall)
    size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    return {
        "mission_s": wall,
        "step_ms": statistics.median(gaps),
        "unit_start_s": statistics.median(unit_start),
        "sandbox_s": statistics.median(sandbox),
        "mission_first_s": statistics.median(mission_start),
        "store_mb": size / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="200,2000,20000,100000", help="workspace sizes in files, comma separated")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[int, dict[str, float]] = {}
    for files in sizes:
        with tempfile.TemporaryDirectory(prefix="keel-monorepo-") as tmp:
            root = Path(tmp)
            made = time.perf_counter()
            ws = make_repo(root, files)
            print(f"{files} files: repository made in {time.perf_counter() - made:.1f} s", file=sys.stderr)
            row = run_mission(root)
            row["worktree_s"] = worktree_add_s(ws)
            row["worktree_pair_s"] = worktree_pair_s(ws)
            rows[files] = row
    print("mission: 2 parallel units x (20 write_file + 1 run) in a git workspace of N files (~400 B, 40/folder)")
    head = ["files", "mission s", "step ms", "unit start s", "sandbox s", "start->1st s", "store MB", "wt add s"]
    head += ["2 wt adds s"]
    print("".join(f"{h:>14}" for h in head))
    for files, r in rows.items():
        cols = [r["mission_s"], r["step_ms"], r["unit_start_s"], r["sandbox_s"], r["mission_first_s"], r["store_mb"]]
        cols += [r["worktree_s"], r["worktree_pair_s"]]
        print(f"{files:>14,}" + "".join(f"{c:14.2f}" for c in cols))
    small, large = rows[min(rows)], rows[max(rows)]
    print(
        f"targets: step at {max(rows):,} / at {min(rows):,} = {large['step_ms'] / small['step_ms']:.2f}x (<= 2x); "
        f"store at {max(rows):,} = {large['store_mb']:.2f} MB (< 5 MB at 100k); "
        f"sandbox / worktree add at {max(rows):,} = {large['sandbox_s'] / large['worktree_s']:.2f}x (<= 1x), "
        f"/ two worktree adds at once = {large['sandbox_s'] / large['worktree_pair_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
