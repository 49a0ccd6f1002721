"""Benchmark: a mission host's resident memory as its journal grows, and after a restart on a long history.

    python benchmarks/host_memory.py [--units 3] [--entries 100000] [--dir DIR]

A mission of --units parallel units of the scripted agent, each reading a file --entries/--units times (a
`read_file` whose result, ~1 KB, is journaled). `keel run` is the host; its VmRSS is read from /proc while
the store is read (in another process) for how many entries the journal holds. Prints the host's RSS at
1k, 10k and every further tenth of the entries, and the growth from 1k to the end (target: within 20 MB).
The first host is SIGKILLed at 90% of the entries; a resumed host then replays that history and finishes,
and its RSS is printed the same way. Not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel.storage import DB, Store
from keel.storage.keys import mission_prefix

READ_ME = "line of text that a unit reads back, again and again\n" * 20  # ~1 KB of result per entry


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory: VmRSS in all, RssAnon the process's own (RssFile is the store's mapped pages,
    which the kernel drops under pressure)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _entries(store: Path) -> int:
    """Journal entries of the store's one mission (the last sequence number of each lane, summed)."""
    with Store.open(store, create=False, readonly=True) as s:

        def count(t) -> int:  # type: ignore[no-untyped-def]
            lanes: dict[bytes, int] = {}
            for mission_key, _ in t.scan_raw(DB.MISSIONS, b""):
                prefix = mission_prefix(mission_key.decode())
                for unit in ("a", "b", "c", "d", "e", "f", "g", "h"):
                    lane = prefix + unit.encode() + b"\x00"
                    lanes[lane] = t.last_seq(DB.JOURNAL, lane)
            return sum(lanes.values())

        return int(s.read(count))


def _follow(cmd: list[str], store: Path, total: int, label: str, kill_at: int | None = None) -> None:
    marks = [1000, 10_000] + [total * k // 10 for k in range(2, 11)]
    marks = sorted({m for m in marks if m <= (kill_at or total)})
    host = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[tuple[int, float, float]] = []
    last, peak, rss, anon = 0, 0.0, 0.0, 0.0
    while host.poll() is None:
        rss, anon = _rss_mb(host.pid) or rss, _rss_mb(host.pid, "RssAnon") or anon
        peak = max(peak, rss)
        try:
            n = _entries(store) if store.exists() else 0
        except Exception:  # the store is being made: try again
            n = last
        last = n
        while marks and n >= marks[0] and rss:
            seen.append((marks.pop(0), rss, anon))
        if kill_at is not None and n >= kill_at:
            host.kill()
            host.wait()
            break
        time.sleep(0.2)
    if host.returncode not in (0, -9):
        raise SystemExit(f"{label}: keel exited {host.returncode}: {host.stderr.read() if host.stderr else ''}")
    print(f"\n{label}")
    print(f"{'entries':>10} {'host RSS MB':>12} {'of it anon':>11}")
    for n, total_mb, anon_mb in seen:
        print(f"{n:>10} {total_mb:>12.1f} {anon_mb:>11.1f}")
    if len(seen) >= 2:
        grew, grew_anon = seen[-1][1] - seen[0][1], seen[-1][2] - seen[0][2]
        print(f"growth from {seen[0][0]} to {seen[-1][0]} entries: {grew:+.1f} MB ({grew_anon:+.1f} MB anon)")
    print(f"peak RSS {peak:.1f} MB, last seen {rss:.1f} MB ({anon:.1f} MB anon)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="keel-mem-"))
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "read-me.txt").write_text(READ_ME)
    per_unit = args.entries // args.units
    units = "\n".join(
        f'[[units]]\nid = "{chr(ord("a") + i)}"\nparams.steps = [{{ repeat = {per_unit}, steps = '
        '[{ tool = "read_file", args = { path = "read-me.txt" } }] }]\n'
        for i in range(args.units)
    )
    mission = root / "mission.toml"
    mission.write_text(
        f'[mission]\nname = "memory"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n'
        f"max_parallel = {args.units}\n\n{units}"
    )
    store = root / "store"
    keel = [sys.executable, "-m", "keel.server.cli"]
    total = per_unit * args.units
    print(f"{args.units} units x {per_unit} read_file entries, store {store}")
    run = [*keel, "run", str(mission), "--plain", "--store", str(store)]
    _follow(run, store, total, "first host (SIGKILLed at 90%)", kill_at=total * 9 // 10)
    mission_id = json.loads(subprocess.check_output([*keel, "missions", "--json", "--store", str(store)]))[0]["id"]
    resume = [*keel, "resume", mission_id, "--plain", "--store", str(store)]
    _follow(resume, store, total, "resumed host (replays 90%, runs the rest)")


if __name__ == "__main__":
    main()
