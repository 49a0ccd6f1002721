"""Benchmark: what reading a long mission costs, at 1k / 20k / 100k journal entries, side by side for two keels.

    python benchmarks/history.py [--sizes 1000,20000,100000] [--other PYTHON] [--dir DIR]

Histories are written straight into a store with keel's own storage functions (tests/historykit.py: one
unit, a tool call with its evidence per entry, a model call every tenth, restore point p1 at the last entry).
Each figure is measured with this checkout's keel and, with --other (e.g. main's .venv/bin/python), with that
interpreter's keel on a copy of the same store, in one run:

  - `keel log ID`: wall time to its first 40 lines; `keel log ID --json`: wall and CPU time for all of it;
  - `keel status ID`, `keel missions`: wall and CPU time (each a fresh process, interpreter included);
  - `keel restore ID p1`: what it adds to data.mdb (pages in use before and after);
  - a fresh process reading the unit's journal (`missions.journal_entries`, what a restore and a resume read)
    against a raw LMDB scan of the same records: CPU time and the ratio;
  - at the largest size: `keel serve` followed by an LSP client paging 10 pages of `keel/activity` while a
    stand-in host adds 5,000 entries at 1,000/s and completes the mission: the server's peak RssAnon, its CPU
    share from 2 to 5 s after the end, supervision's suspicions, errors; and `keel log --follow --json` on
    the same kind of run: how long after the host ended it printed the last entry.
CPU times are the process's own (user + system), so a loaded machine changes them little; wall times are
printed too. Prints a table and asserts nothing. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from keel.protocol.states import MissionState
from tests.historykit import UNIT, follow, make_mission, mission_id, start_host

RAW = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=32)
db = env.open_db(b"journal", create=False)
prefix = (sys.argv[2] + "\\x00" + sys.argv[3] + "\\x00").encode()
t = time.process_time()
out = []
with env.begin(db=db) as txn:
    cur = txn.cursor()
    if cur.set_range(prefix):
        for key, value in cur.iternext():
            if not key.startswith(prefix):
                break
            out.append((key, value))
print(time.process_time() - t)
"""
KEEL = """
import sys, time
from keel.storage import Store
from keel.storage import missions as m
with Store.open(sys.argv[1], readonly=True) as store:
    t = time.process_time()
    entries = store.read(lambda txn: m.journal_entries(txn, sys.argv[2], sys.argv[3]))
    print(time.process_time() - t)
"""


LIMIT_S = 180.0  # a command still running after this long is stopped and reported as such


def run(argv: list[str]) -> tuple[float, float, str] | None:
    """(wall s, CPU s of the process, stdout), or None when it ran past LIMIT_S."""
    began = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, text=True)
        timer = threading.Timer(LIMIT_S, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == -9:
            return None
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
        out.seek(0)
        return time.monotonic() - began, usage.ru_utime + usage.ru_stime, out.read()


def first_screen(keel: list[str]) -> float:
    began = time.monotonic()
    proc = subprocess.Popen(keel, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    timer = threading.Timer(LIMIT_S, proc.kill)
    timer.start()
    for _ in range(40):
        proc.stdout.readline()
    took = time.monotonic() - began
    timer.cancel()
    proc.kill()
    proc.wait()
    return took


def used_mb(store: Path) -> float:
    env = lmdb.open(str(store), readonly=True, lock=False, max_dbs=32)
    try:
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"] / 2**20
    finally:
        env.close()


def measure(python: str, store: Path, mid: str, scratch: Path) -> dict[str, str]:
    keel = [python, "-m", "keel.server.cli"]
    at = ["--store", str(store)]
    out: dict[str, str] = {"log first screen": f"{first_screen([*keel, 'log', mid, *at]) * 1000:.0f} ms wall"}
    ran = run([*keel, "log", mid, "--json", *at])
    out["log --json, all"] = (
        f"{ran[0]:.1f} s wall, {ran[1]:.1f} s CPU ({ran[2].count(chr(10))} items)" if ran else f"> {LIMIT_S:.0f} s"
    )
    for name, argv in (("status ID", ["status", mid]), ("missions", ["missions"])):
        ran = run([*keel, *argv, *at])
        out[name] = f"{ran[0] * 1000:.0f} ms wall, {ran[1] * 1000:.0f} ms CPU" if ran else f"> {LIMIT_S:.0f} s"
    copy = scratch / "restored"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy)
    before = used_mb(copy)
    run([*keel, "restore", mid, "p1", "--store", str(copy)])
    out["restore adds"] = f"{used_mb(copy) - before:.2f} MB"
    keel_s = min(_seconds(run([python, "-c", KEEL, str(store), mid, UNIT])) for _ in range(3))
    raw_s = min(_seconds(run([python, "-c", RAW, str(store), mid, UNIT])) for _ in range(3))
    out["journal read vs raw scan"] = f"{keel_s * 1000:.0f} / {raw_s * 1000:.0f} ms CPU = {keel_s / raw_s:.2f}x"
    return out


def _seconds(ran: tuple[float, float, str] | None) -> float:
    return float(ran[2]) if ran else float("inf")


def live(python: str, root: Path, entries: int) -> dict[str, str]:
    """`keel serve` and `keel log --follow` on a mission whose host writes 5,000 entries at 1,000/s."""
    out: dict[str, str] = {}
    for what in ("serve", "follow"):
        shutil.rmtree(root, ignore_errors=True)
        store, go, mid = root / ".keel" / "store", root / "go", mission_id(entries)
        host, record = start_host(store, mid, go, count=5000, per_s=1000)
        make_mission(store, root, entries, state=MissionState.RUNNING, host=record)
        if what == "serve":
            serve = [python, "-m", "keel.server.cli", "serve"]
            seen = asyncio.run(follow(serve, root, mid, go, pages=10, settle_s=2.0, idle_s=3.0, within=1800))
            out["serve: peak RssAnon"] = f"{seen.peak_anon_mb:.0f} MB"
            out["serve: CPU 2-5 s after the end"] = f"{100 * seen.cpu_after_s / seen.idle_s:.1f} % of a core"
            out["serve: suspected its host"] = f"{seen.suspects} times"
            out["serve: errors"] = str(seen.errors)
        else:
            argv = [python, "-m", "keel.server.cli", "log", mid, "--follow", "--json", "--store", str(store)]
            with tempfile.TemporaryFile("w+") as printed:
                proc = subprocess.Popen(argv, stdout=printed, stderr=subprocess.DEVNULL, text=True)
                time.sleep(1.0)
                go.touch()
                host.wait()
                ended = time.monotonic()
                try:
                    proc.wait(timeout=LIMIT_S)
                    printed.seek(0)
                    lines = printed.read().count("\n")
                    out["log --follow: done after the host"] = f"{time.monotonic() - ended:.1f} s ({lines} items)"
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    out["log --follow: done after the host"] = f"still behind after {LIMIT_S:.0f} s"
        go.touch()
        host.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,20000,100000")
    ap.add_argument("--other", default="", help="another keel's python (e.g. main's .venv/bin/python)")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="keel-history-"))
    keels = {"this": sys.executable, **({"other": args.other} if args.other else {})}
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[str, dict[str, str]] = {}
    for size in sizes:
        where = root / str(size)
        shutil.rmtree(where, ignore_errors=True)
        mid = make_mission(where / "store", where, size)
        for name, python in keels.items():
            for what, figure in measure(python, where / "store", mid, where).items():
                rows.setdefault(f"{what} @ {size}", {})[name] = figure
    for name, python in keels.items():
        for what, figure in live(python, root / "live", sizes[-1]).items():
            rows.setdefault(f"{what} @ {sizes[-1]}", {})[name] = figure
    width = max(map(len, rows))
    print(f"{'':<{width}}  {'this checkout':<40}  {'--other' if args.other else ''}")
    for what, figures in rows.items():
        print(f"{what:<{width}}  {figures.get('this', ''):<40}  {figures.get('other', '')}")


if __name__ == "__main__":
    main()
