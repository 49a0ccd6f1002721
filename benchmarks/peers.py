"""Peers for benchmarks/steps.py, run inside the peers venv (benchmarks/setup-peers.sh), never keel's.

Same workload as keel's: N durable steps, each producing a ~2 KiB result, on SQLite files in --dir.
- LangGraph: a one-node loop graph with SqliteSaver, durability="sync" (a checkpoint per step, committed
  before the next step); restore = get_state from a fresh connection.
- DBOS: one workflow of N @DBOS.step calls on a SQLite system database; restore = reading the
  workflow's recorded steps back through a fresh DBOS launch. With --postgres URL, DBOS alone on that
  PostgreSQL database (benchmarks/postgres.py: DBOS beside keel on the same server).
Prints one JSON object: {name: {step_ms_median, step_ms_p99, restore_ms}}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any, TypedDict

RESULT = ("x" * 63 + "\n") * 32


def _pct(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class State(TypedDict):
    i: int
    last: str


def bench_langgraph(folder: Path, steps: int) -> dict[str, float]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    (folder / "data.txt").write_text(RESULT)
    stamps: list[float] = []

    def tool(state: State) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        return {"i": state["i"] + 1, "last": (folder / "data.txt").read_text()}

    builder = StateGraph(State)
    builder.add_node("tool", tool)
    builder.add_edge(START, "tool")
    builder.add_conditional_edges("tool", lambda s: END if s["i"] >= steps else "tool")
    db = folder / "langgraph.sqlite"
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.execute("PRAGMA synchronous=FULL")
    graph = builder.compile(checkpointer=SqliteSaver(conn))
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": steps * 2 + 10}
    graph.invoke({"i": 0, "last": ""}, config, durability="sync")
    conn.close()
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    t0 = time.perf_counter()
    fresh = sqlite3.connect(db, check_same_thread=False)
    state = builder.compile(checkpointer=SqliteSaver(fresh)).get_state({"configurable": {"thread_id": "bench"}})
    restore = (time.perf_counter() - t0) * 1000
    assert state.values["i"] == steps
    return {"step_ms_median": statistics.median(gaps), "step_ms_p99": _pct(gaps, 99), "restore_ms": restore}


def bench_dbos(folder: Path, steps: int, database_url: str = "") -> dict[str, float]:
    from dbos import DBOS

    (folder / "data.txt").write_text(RESULT)
    stamps: list[float] = []
    DBOS(
        config={
            "name": "keel-bench",
            "system_database_url": database_url or f"sqlite:///{folder / 'dbos.sqlite'}",
            "run_admin_server": False,
        }
    )  # type: ignore[typeddict-unknown-key]

    @DBOS.step()
    def tool(i: int) -> str:
        stamps.append(time.perf_counter())
        return (folder / "data.txt").read_text()

    @DBOS.workflow()
    def mission() -> int:
        total = 0
        for i in range(steps):
            total += len(tool(i))
        return total

    DBOS.launch()
    try:
        handle = DBOS.start_workflow(mission)
        handle.get_result()
        t0 = time.perf_counter()
        recorded = DBOS.list_workflow_steps(handle.workflow_id)
        restore = (time.perf_counter() - t0) * 1000
        assert len(recorded) == steps
    finally:
        DBOS.destroy()
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    return {"step_ms_median": statistics.median(gaps), "step_ms_p99": _pct(gaps, 99), "restore_ms": restore}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--postgres", help="run DBOS alone, on this PostgreSQL database URL")
    args = parser.parse_args()
    root = Path(args.dir)
    out: dict[str, Any] = {}
    peers: tuple[tuple[str, Any], ...] = (
        ("LangGraph SqliteSaver (durability=sync)", bench_langgraph),
        ("DBOS on SQLite", bench_dbos),
    )
    if args.postgres:
        peers = (("DBOS on PostgreSQL", lambda folder, steps: bench_dbos(folder, steps, args.postgres)),)
    for name, fn in peers:
        folder = root / name.split()[0].lower()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            out[name] = fn(folder, args.steps)
        except Exception as exc:  # a peer that does not run is reported, not hidden
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
