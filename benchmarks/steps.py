"""Benchmark: durable step overhead, fresh-process restore, pause acknowledgement; peers if installed.

    python benchmarks/steps.py [--steps 200] [--rounds 3] [--pauses 20] [--peers VENV_PYTHON]

1. keel: a 200-step mission (one unit; each step a journaled `read_file` tool call returning ~2 KiB)
   run by the real host with the scripted agent as subprocesses. Per-step overhead = median interval
   between consecutive journal entries (agent -> host -> tool -> journal commit -> agent -> next request).
   After the run a fresh process (this one; the host has exited) finds every entry the agent received.
2. Restore in a fresh process: open the store, read the mission, HEAD checkpoint, graph and the unit's
   200 journal entries (everything a resume reads before it replays); timed inside that process.
3. Raw LMDB: 200 synchronous commits of the same ~2 KiB result bytes on the same disk (the floor).
4. Pause acknowledgement: a running host is asked to pause (a Control record); time until the store
   shows `pausing`/`paused`; p50/p99 over --pauses trials.
5. Peers (LangGraph SqliteSaver durability "sync", DBOS on SQLite): run by benchmarks/peers.py in a
   separate venv made by benchmarks/setup-peers.sh, when --peers names its python.
6. The commit inside a step, interleaved commit by commit on the same disk: a raw py-lmdb sync commit,
   keel's Store.write of the same value, and the host's JournalWriter alone (it commits on the caller's
   thread) and with a group possible (its writer thread).
Steps 1, 3 and 5 run --rounds times, in turn, because a shared disk's fsync latency drifts: each figure
is the median over rounds of a round's median, and each ratio the median of the ratios within a round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb

from keel.protocol.states import MissionState
from keel.server.engine import control
from keel.server.engine.journal import JournalWriter
from keel.storage import DB, Store, Txn
from keel.storage import missions as m

RESULT = ("x" * 63 + "\n") * 32  # 2 KiB


TOOL_STEP = '{ tool = "read_file", args = { path = "data.txt" } }'
BARE_STEP = "{ now = true }"


def _mission(root: Path, steps: int, sleep: float = 0.0, step: str = TOOL_STEP) -> Path:
    (root / "ws").mkdir(exist_ok=True)
    (root / "ws" / "data.txt").write_text(RESULT)
    body = ", ".join([step] * steps) if not sleep else ", ".join([f"{{ sleep = {sleep} }}"] * steps)
    path = root / "mission.toml"
    path.write_text(
        f'[mission]\nname = "bench"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n\n'
        f'[[units]]\nid = "u"\nparams.steps = [{body}]\n'
    )
    return path


def _keel(*args: str) -> list[str]:
    return [sys.executable, "-m", "keel.server.cli", *args]


def bench_keel(root: Path, steps: int, step: str = TOOL_STEP) -> dict[str, float]:
    root.mkdir()
    store = root / "store"
    started = time.perf_counter()
    subprocess.run(
        _keel("run", str(_mission(root, steps, step=step)), "--store", str(store), "--plain"),
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - started
    with Store.open(store, create=False) as s:
        mid = s.read(m.list_missions)[0].id
        entries = s.read(lambda t: m.journal_entries(t, mid, "u"))
    assert len(entries) == steps, f"expected {steps} entries, found {len(entries)}"
    gaps = [(b.at - a.at) * 1000 for a, b in itertools.pairwise(entries)]
    tool_ms = statistics.median(e.cost.wall_ms for e in entries)
    return {
        "step_ms_median": statistics.median(gaps),
        "step_ms_p99": _pct(gaps, 99),
        "mission_wall_s": wall,
        "tool_ms_median": tool_ms,
        "mission": mid,
    }  # type: ignore[dict-item]


RESTORE = """
import sys, time
t0 = time.perf_counter()
from keel.storage import Store
from keel.storage import missions as m
from keel.server.engine.checkpoint import load_graph
t1 = time.perf_counter()
with Store.open(sys.argv[1], create=False) as s:
    def read(t):
        rec = m.get_mission(t, sys.argv[2])
        head = m.head_checkpoint(t, rec.id)
        graph = load_graph(t, head.graph)
        entries = m.journal_entries(t, rec.id, "u")
        return len(graph), len(entries)
    units, entries = s.read(read)
t2 = time.perf_counter()
print((t2 - t1) * 1000, (t2 - t0) * 1000, entries)
"""


def bench_restore(store: Path, mission_id: str) -> dict[str, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", RESTORE, str(store), mission_id], check=True, capture_output=True, text=True
    ).stdout.split()
    total = (time.perf_counter() - started) * 1000
    return {"restore_ms": float(out[0]), "restore_with_imports_ms": float(out[1]), "process_ms": total}


def bench_lmdb(root: Path, steps: int) -> dict[str, float]:
    env = lmdb.open(str(root / "raw"), map_size=64 << 20, sync=True, metasync=True)
    value = json.dumps({"ok": True, "output": {"text": RESULT}}).encode()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.put(i.to_bytes(8, "big"), value)
        times.append((time.perf_counter() - t0) * 1000)
    env.close()
    return {"commit_ms_median": statistics.median(times), "commit_ms_p99": _pct(times, 99)}


def bench_commit_parts(root: Path, steps: int) -> dict[str, float]:
    """One commit of a ~2 KiB result four ways, interleaved commit by commit on the same disk."""
    env = lmdb.open(str(root / "parts-raw"), map_size=64 << 20, sync=True, metasync=True)
    value = {"ok": True, "output": {"text": RESULT}}
    raw = json.dumps(value).encode()
    times: dict[str, list[float]] = {"raw": [], "store": [], "alone": [], "group": []}

    def put(key: bytes) -> Callable[[Txn], None]:
        return lambda txn: txn.put(DB.META, key, value)

    async def through(writer: JournalWriter, parallel: int, key: bytes) -> float:
        writer.parallel = parallel
        t0 = time.perf_counter()
        await writer.commit(put(key))
        return time.perf_counter() - t0

    async def run(store: Store) -> None:
        writer = JournalWriter(store, window_s=0.002)
        for i in range(steps):
            t0 = time.perf_counter()
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), raw)
            times["raw"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.write(put(b"s%d" % i))
            times["store"].append(time.perf_counter() - t0)
            times["alone"].append(await through(writer, 1, b"a%d" % i))
            times["group"].append(await through(writer, 2, b"g%d" % i))  # urgent: at once, on the writer thread
        await asyncio.to_thread(writer.close)

    with Store.open(root / "parts") as store:
        asyncio.run(run(store))
    env.close()
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def bench_pause(root: Path, trials: int) -> dict[str, float]:
    acks = []
    for i in range(trials):
        folder = root / f"pause{i}"
        folder.mkdir()
        store = folder / "store"
        host = subprocess.Popen(
            _keel("run", str(_mission(folder, 40, sleep=0.05)), "--store", str(store), "--plain"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with _wait_store(store) as s:
            mid = _wait(lambda: (s.read(m.list_missions) or [None])[0]).id

            def state(mid: str = mid) -> MissionState:
                return s.read(lambda t: m.get_mission(t, mid)).state

            _wait(lambda: state() == MissionState.RUNNING or None)
            time.sleep(0.2)
            t0 = time.perf_counter()
            control.request_pause(s, mid, "bench")
            _wait(lambda: state() in (MissionState.PAUSING, MissionState.PAUSED) or None, step=0.0005)
            acks.append((time.perf_counter() - t0) * 1000)
        host.wait(timeout=30)
    return {"pause_ack_ms_p50": statistics.median(acks), "pause_ack_ms_p99": _pct(acks, 99), "pause_trials": trials}


class _wait_store:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Store:
        _wait(lambda: (self.path / "data.mdb").exists() or None)
        self.store = Store.open(self.path, create=False)
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()


def _wait(fn, timeout: float = 30, step: float = 0.005):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError("benchmark condition not reached")


def _pct(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pauses", type=int, default=20)
    parser.add_argument("--peers", metavar="PYTHON", help="python of the peers venv (benchmarks/setup-peers.sh)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-bench-", dir=os.environ.get("KEEL_BENCH_DIR")) as tmp:
        root = Path(tmp)
        rounds = [_round(root / f"round{i}", args) for i in range(args.rounds)]
        restore = bench_restore(root / "round0" / "k" / "store", str(rounds[0]["keel"]["mission"]))
        parts = bench_commit_parts(root, args.steps)
        pause = bench_pause(root, args.pauses) if args.pauses else {}
    results = {**_medians(rounds), "restore": restore, "parts": parts, "pause": pause, "rounds": len(rounds)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    _table(results, args.steps)


def _round(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    root.mkdir()
    out: dict[str, Any] = {
        "keel": bench_keel(root / "k", args.steps),
        "keel_bare": bench_keel(root / "bare", args.steps, BARE_STEP),
    }
    out["lmdb"] = bench_lmdb(root, args.steps)
    out["peers"] = {}
    if args.peers:
        peers = Path(__file__).with_name("peers.py")
        command = [args.peers, str(peers), "--steps", str(args.steps), "--dir", str(root)]
        out["peers"] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return out


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over rounds; per ratio against the floor, the median of in-round ratios."""

    def figure(pick: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> float:
        return statistics.median(pick(r)[key] for r in rounds)

    def per_floor(pick: Callable[[dict[str, Any]], dict[str, Any]]) -> float:
        return statistics.median(pick(r)["step_ms_median"] / r["lmdb"]["commit_ms_median"] for r in rounds)

    def keel_over(name: str) -> float:
        return statistics.median(r["peers"][name]["step_ms_median"] / r["keel"]["step_ms_median"] for r in rounds)

    out: dict[str, Any] = {"lmdb": {k: figure(lambda r: r["lmdb"], k) for k in rounds[0]["lmdb"]}, "peers": {}}
    for name in ("keel", "keel_bare"):
        keys = [k for k in rounds[0][name] if k != "mission"]
        out[name] = {k: figure(lambda r, n=name: r[n], k) for k in keys}  # type: ignore[misc]
        out[name]["vs_floor"] = per_floor(lambda r, n=name: r[n])  # type: ignore[misc]
    for name, peer in rounds[0]["peers"].items():
        if any("error" in r["peers"][name] for r in rounds):
            out["peers"][name] = next(r["peers"][name] for r in rounds if "error" in r["peers"][name])
            continue
        out["peers"][name] = {k: figure(lambda r, n=name: r["peers"][n], k) for k in peer}  # type: ignore[misc]
        out["peers"][name]["vs_floor"] = per_floor(lambda r, n=name: r["peers"][n])  # type: ignore[misc]
        out["peers"][name]["keel_cheaper"] = keel_over(name)
    return out


def _table(r: dict[str, Any], steps: int) -> None:
    k, raw = r["keel"], r["lmdb"]
    print(
        f"{steps}-step mission, each step a journaled tool call with a 2 KiB result (medians of {r['rounds']} rounds)"
    )
    print(f"{'runtime':<44} {'per step ms':>12} {'p99 ms':>8} {'vs raw LMDB':>12}")
    floor = "raw LMDB sync commit (floor)"
    print(f"{floor:<44} {raw['commit_ms_median']:>12.3f} {raw['commit_ms_p99']:>8.3f} {1.0:>11.2f}x")
    rows = [
        ("keel (agent->host->journal commit->agent)", k),
        ("keel, bare journaled step (now), no tool", r["keel_bare"]),
    ]
    for name, row in rows:
        print(f"{name:<44} {row['step_ms_median']:>12.3f} {row['step_ms_p99']:>8.3f} {row['vs_floor']:>11.2f}x")
    print(f"  (the read_file tool itself takes {k['tool_ms_median']:.3f} ms of each keel tool step)")
    for name, peer in r["peers"].items():
        if "error" in peer:
            print(f"{name:<44} did not run: {peer['error']}")
            continue
        print(
            f"{name:<44} {peer['step_ms_median']:>12.3f} {peer['step_ms_p99']:>8.3f} {peer['vs_floor']:>11.2f}x  "
            f"(keel is {peer['keel_cheaper']:.1f}x cheaper)"
        )
    print("every acknowledged keel entry was found by a fresh process after each run")
    c = r["parts"]
    print(
        f"one commit, interleaved: raw LMDB {c['raw']:.3f} ms, Store.write {c['store']:.3f} ms, "
        f"JournalWriter alone (caller's thread) {c['alone']:.3f} ms, through its writer thread {c['group']:.3f} ms"
    )
    rs = r["restore"]
    print(
        f"restore in a fresh process: {rs['restore_ms']:.2f} ms reading ({rs['restore_with_imports_ms']:.1f} ms "
        f"with imports, {rs['process_ms']:.0f} ms with interpreter start)"
    )
    for name, peer in r["peers"].items():
        if "restore_ms" in peer and "error" not in peer:
            print(f"  {name} restore: {peer['restore_ms']:.2f} ms")
    p = r["pause"]
    if p:
        print(
            f"pause acknowledged: p50 {p['pause_ack_ms_p50']:.1f} ms, p99 {p['pause_ack_ms_p99']:.1f} ms "
            f"over {p['pause_trials']} trials"
        )
    print(f"whole keel mission wall time: {k['mission_wall_s']:.2f} s (incl. process starts)")


if __name__ == "__main__":
    main()
