"""Benchmark: what one tool step writes to PostgreSQL (transactions and rows), measured by the server.

    python benchmarks/pg_writes.py [--steps 40]

A throwaway PostgreSQL cluster (tests/pgserver.py). For each kind of step (a `read_file`, a `write_file`, a
`run` of a command), two missions of one unit are run to completion by `keel run` in the foreground: one of
--steps steps and one of twice as many, each in a schema of its own. The server's counters (pg_stat_database:
transactions committed; pg_stat_user_tables: rows inserted, updated and deleted in keel_records) are read
after each host exited; what one step costs is the difference between the two missions over --steps, so the
mission's fixed costs (its start, its checkpoints at start and end) drop out. Not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from engine_helpers import write_mission

from tests.pgserver import PgServer

KEEL = [sys.executable, "-m", "keel.server.cli"]


def _step(kind: str, n: int) -> dict[str, Any]:
    if kind == "read_file":
        return {"tool": "read_file", "args": {"path": "seed.txt"}}
    if kind == "write_file":
        return {"tool": "write_file", "args": {"path": f"f{n}.txt", "content": f"{n}\n" * 200}}
    return {"tool": "run", "args": {"cmd": f"echo {n} > r{n}.txt"}}


def _counters(server: PgServer, schema: str) -> tuple[int, int, int]:
    """(explicit COMMITs, the server's committed transactions, rows changed in keel_records)."""
    time.sleep(1.5)  # a backend's counters reach the server's view within a second of its last transaction
    with server.connect() as conn:
        commits = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query = 'COMMIT'"
        ).fetchone()
        txns = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'").fetchone()
        rows = conn.execute(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE schemaname = %s"
            " AND relname = 'keel_records'",
            (schema,),
        ).fetchone()
    return (int(commits[0]) if commits else 0), (int(txns[0]) if txns else 0), (int(rows[0]) if rows else 0)


def _mission(server: PgServer, root: Path, kind: str, steps: int) -> tuple[int, int, int]:
    """(commits, server transactions, rows) a mission of `steps` steps of `kind` cost, to its host's exit."""
    folder = root / f"{kind}-{steps}"
    folder.mkdir()
    schema = server.new_schema()
    store = folder / "store"
    store.mkdir()
    (store / "store.url").write_text(server.store_url(schema) + "\n")
    mission = write_mission(folder, [{"id": "u", "params": {"steps": [_step(kind, n) for n in range(steps)]}}])
    (folder / "ws" / "seed.txt").write_text("x" * 2048)
    before = _counters(server, schema)
    done = subprocess.run(
        [*KEEL, "run", str(mission), "--plain", "--store", str(store)], capture_output=True, text=True, cwd=folder
    )
    if done.returncode != 0:
        raise SystemExit(f"pg_writes: the {kind} mission failed: {done.stdout}{done.stderr}")
    after = _counters(server, schema)
    return after[0] - before[0], after[1] - before[1], after[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="steps of the shorter mission (default 40)")
    args = parser.parse_args()
    server = PgServer()
    try:
        with server.connect() as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart_immediate()
        with server.connect() as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        print(f"what one tool step writes to PostgreSQL ({args.steps} and {2 * args.steps} steps, the difference)")
        print("  commits: keel's write transactions (COMMIT statements); server txns: pg_stat_database's count, which")
        print("  also has each LISTENing backend's reading of a commit's NOTIFY")
        print(f"{'step':>12} {'commits':>8} {'server txns':>12} {'rows':>6}")
        with tempfile.TemporaryDirectory(prefix="keel-pgwrites-") as tmp:
            for kind in ("read_file", "write_file", "run"):
                short = _mission(server, Path(tmp), kind, args.steps)
                long = _mission(server, Path(tmp), kind, 2 * args.steps)
                commits, txns, rows = ((b - a) / args.steps for a, b in zip(short, long, strict=True))
                print(f"{kind:>12} {commits:>8.2f} {txns:>12.2f} {rows:>6.2f}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
