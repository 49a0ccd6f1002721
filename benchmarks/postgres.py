"""Benchmark: keel on PostgreSQL against keel on LMDB, and DBOS on the same PostgreSQL, in one run.

    python benchmarks/postgres.py [--steps 200] [--rounds 3] [--commits 200] [--peers VENV_PYTHON] [--url URL]

A throwaway PostgreSQL cluster is started (Debian's binaries, 127.0.0.1, fsync on; tests/pgserver.py)
unless --url names one. Each round runs, in turn:

1. Durable step: a 200-step mission (one unit; each step a journaled `read_file` tool call returning
   ~2 KiB) run by the real host and scripted agent, once per backend. Per-step cost = median interval
   between consecutive journal entries.
2. Checkpoint commit: a checkpoint written as a host writes one (manifest blob, HEAD and restore point,
   20 unit marks, `missions.commit_checkpoint`), --commits times per backend, interleaved.
3. The floor of each backend: a raw py-lmdb sync commit of ~2 KiB, and a raw psycopg INSERT + COMMIT of
   ~2 KiB (synchronous_commit on), interleaved.
4. Journal throughput with 8 workers: 8 subagents x 200 entries through the host's JournalWriter (group
   commit), per backend; every acknowledged entry found by a fresh process.
5. DBOS on the same PostgreSQL server (its own database): one workflow of 200 @DBOS.step calls, through
   benchmarks/peers.py in the peers' venv (benchmarks/setup-peers.sh), when --peers names its python.

Figures are medians over rounds of each round's median; ratios are taken within a round. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import group_commit
from checkpoint import manifest
from steps import RESULT, _keel, _mission

from keel.storage import Store
from keel.storage import missions as m
from keel.storage.location import URL_FILE
from tests.pgserver import PgServer

BACKENDS = ("lmdb", "postgresql")


class Stores:
    """Makes store folders on either backend (a fresh schema per PostgreSQL store)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0

    def folder(self, path: Path, backend: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if backend == "postgresql":
            self.count += 1
            schema = f"bench_{int(time.time() * 1000)}_{self.count}"
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            sep = "&" if "?" in self.url else "?"
            (path / URL_FILE).write_text(f"{self.url}{sep}options=-csearch_path%3D{schema}\n")
        return path


def step_cost(root: Path, store: Path, steps: int) -> float:
    subprocess.run(
        _keel("run", str(_mission(root, steps)), "--store", str(store), "--plain"), check=True, capture_output=True
    )
    with Store.open(store, create=False) as s:
        mid = s.read(m.list_missions)[0].id
        entries = s.read(lambda t: m.journal_entries(t, mid, "u"))
    assert len(entries) == steps, f"expected {steps} entries, found {len(entries)}"
    return statistics.median((b.at - a.at) * 1000 for a, b in itertools.pairwise(entries))


def checkpoint_costs(stores: dict[str, Store], commits: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in stores}
    for n in range(1, commits + 1):
        for name, store in stores.items():
            made = manifest(n, 20)
            t0 = time.perf_counter()
            store.write(lambda t, made=made: m.commit_checkpoint(t, made))
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def floors(root: Path, url: str, commits: int) -> dict[str, float]:
    value = json.dumps({"ok": True, "output": {"text": RESULT}}).encode()
    env = lmdb.open(str(root / "raw-lmdb"), map_size=64 << 20, sync=True, metasync=True)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (k bigint PRIMARY KEY, v bytea)")
    conn.execute("TRUNCATE bench_raw")
    times: dict[str, list[float]] = {"lmdb": [], "postgresql": []}
    try:
        for i in range(commits):
            t0 = time.perf_counter()
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), value)
            t1 = time.perf_counter()
            with conn.transaction():
                conn.execute("INSERT INTO bench_raw VALUES (%s, %s)", (i, value))
            t2 = time.perf_counter()
            times["lmdb"].append((t1 - t0) * 1000)
            times["postgresql"].append((t2 - t1) * 1000)
    finally:
        env.close()
        conn.close()
    return {name: statistics.median(values) for name, values in times.items()}


def throughput(path: Path) -> float:
    with Store.open(path) as store:
        epochs = group_commit._prepare(store, 8)
        elapsed, acked, _ = asyncio.run(group_commit._group(store, epochs, 200, 0.002))
    durable = group_commit._durable(path)
    if durable < acked:
        raise SystemExit(f"{acked} entries acknowledged but only {durable} durable")
    return acked / elapsed


def dbos(peers: str, url: str, root: Path, steps: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS keel_bench_dbos")
    dsn = url.rsplit("/", 1)[0] + "/keel_bench_dbos"
    out = subprocess.run(
        [peers, str(Path(__file__).parent / "peers.py"), "--steps", str(steps), "--dir", str(root), "--postgres", dsn],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out)).get("DBOS on PostgreSQL", {"error": "not run"})


def one_round(root: Path, stores: Stores, args: argparse.Namespace, url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in BACKENDS:
        folder = root / f"steps-{backend}"
        folder.mkdir()
        out[f"step {backend}"] = step_cost(folder, stores.folder(folder / "store", backend), args.steps)
    opened = {b: Store.open(stores.folder(root / f"ckpt-{b}", b)) for b in BACKENDS}
    try:
        for backend, ms in checkpoint_costs(opened, args.commits).items():
            out[f"checkpoint {backend}"] = ms
    finally:
        for store in opened.values():
            store.close()
    for backend, ms in floors(root, url, args.commits).items():
        out[f"floor {backend}"] = ms
    for backend in BACKENDS:
        out[f"8 workers {backend}"] = throughput(stores.folder(root / f"group-{backend}", backend))
    if args.peers:
        result = dbos(args.peers, url, root / "dbos", args.steps)
        if "error" in result:
            print(f"DBOS on PostgreSQL did not run: {result['error']}", file=sys.stderr)
        else:
            out["step DBOS on PostgreSQL"] = result["step_ms_median"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--peers", help="the peers' venv python (benchmarks/setup-peers.sh), for DBOS")
    parser.add_argument("--url", help="an existing PostgreSQL server (default: a throwaway one)")
    args = parser.parse_args()
    server = None if args.url else PgServer()
    url = args.url or (server.base_url if server else "")
    try:
        rounds = []
        with tempfile.TemporaryDirectory(prefix="keel-bench-pg-") as tmp:
            for n in range(args.rounds):
                root = Path(tmp) / f"round{n}"
                root.mkdir()
                rounds.append(one_round(root, Stores(url), args, url))
    finally:
        if server is not None:
            server.stop()
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}

    def ratio(a: str, b: str) -> str:
        return f"{statistics.median(r[a] / r[b] for r in rounds):.2f}x"

    print(f"medians of {args.rounds} rounds; ratios within a round")
    print(f"{'':<34}{'LMDB':>10}{'PostgreSQL':>12}{'PG/LMDB':>9}")
    for label, key, unit in (
        ("durable tool step (ms)", "step", "ms"),
        ("checkpoint commit, 20 units (ms)", "checkpoint", "ms"),
        ("raw commit floor, 2 KiB (ms)", "floor", "ms"),
        ("8 workers' journal (entries/s)", "8 workers", "/s"),
    ):
        a, b = med[f"{key} lmdb"], med[f"{key} postgresql"]
        fmt = "{:>10.0f}{:>12.0f}" if unit == "/s" else "{:>10.3f}{:>12.3f}"
        print(f"{label:<34}" + fmt.format(a, b) + f"{ratio(f'{key} postgresql', f'{key} lmdb'):>9}")
    if "step DBOS on PostgreSQL" in med:
        print(
            f"DBOS on the same PostgreSQL, one @DBOS.step (ms): {med['step DBOS on PostgreSQL']:.3f}; "
            f"keel on PostgreSQL / DBOS: {ratio('step postgresql', 'step DBOS on PostgreSQL')}"
        )


if __name__ == "__main__":
    main()
