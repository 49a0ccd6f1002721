"""Benchmark: from a SIGKILLed mission host to the first new journal entry of its mission.

    python benchmarks/recovery.py [--runs 5] [--history 1,2000]

For each history length (journal entries the unit has made before the kill), interleaved run by run:
  - under `keel serve`: a real language server (pygls client over stdio) supervising the mission; the host's
    process group is SIGKILLed and the time runs until the store holds a journal entry newer than any
    before the kill (a replayed entry does not count: it is not new work);
  - by hand: the same kill with no server, then `keel resume ID --detach` at once, as a person would.
The agent is the scripted one, journaling `now` and `random` steps back to back (nothing it does between
them takes time of its own, so a replay costs only keel's answers from the journal). Prints medians and
the ratio of serve to by-hand. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import BaseLanguageClient

from keel.storage import DB, Store
from keel.storage import missions as m
from keel.storage.keys import unit_prefix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml

STEPS = [{"now": True}, {"random": True}] * 2_500  # journaled steps only: a replay re-runs no sleep


def newest_seq(store_path: Path, mission_id: str) -> tuple[int, int]:
    """(the unit's newest journal seq, the host pid) as the store has them now."""
    with Store.open(store_path, readonly=True) as store:

        def read(txn: Any) -> tuple[int, int]:
            record = m.get_mission(txn, mission_id)
            seq = txn.last_seq(DB.JOURNAL, unit_prefix(mission_id, "u"))  # the unit's lane (never restored)
            return seq, record.host.pid if record.host else 0

        return store.read(read)


def wait_until(pred: Any, timeout: float = 300.0, step: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError("condition not reached")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def start_mission(root: Path, store: Path, name: str) -> str:
    path = root / f"{name}.toml"
    path.write_text(mission_toml(name, [{"id": "u", "steps": STEPS}]))
    out = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", str(path), "--detach", "--store", str(store)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[-1]


def kill_and_time(store: Path, mission_id: str, history: int, resume: bool) -> float:
    wait_until(lambda: newest_seq(store, mission_id)[0] >= history and newest_seq(store, mission_id)[1])
    _, pid = newest_seq(store, mission_id)
    begin = time.monotonic()
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid))
    seq = newest_seq(store, mission_id)[0]  # read once the host is dead: nothing it commits counts
    if resume:
        subprocess.run(
            [sys.executable, "-m", "keel.server.cli", "resume", mission_id, "--detach", "--store", str(store)],
            check=True,
            capture_output=True,
        )
    wait_until(lambda: newest_seq(store, mission_id)[0] > seq)
    return (time.monotonic() - begin) * 1000


async def serve_run(root: Path, store: Path, history: int) -> float:
    client = BaseLanguageClient("bench", "1")

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def log_message(params: Any) -> None:
        pass

    @client.feature("keel/missionChanged")
    def changed(params: Any) -> None:
        pass

    @client.feature("keel/activityChanged")
    def activity(params: Any) -> None:
        pass

    await client.start_io(sys.executable, "-m", "keel.server.cli", "serve", "--store", str(store))
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=root.as_uri())
    )
    client.initialized(types.InitializedParams())
    try:
        mission_id = start_mission(root, store, f"serve{history}")
        return await asyncio.to_thread(kill_and_time, store, mission_id, history, False)
    finally:
        kill_hosts(store)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()


def by_hand_run(root: Path, store: Path, history: int) -> float:
    mission_id = start_mission(root, store, f"hand{history}")
    try:
        return kill_and_time(store, mission_id, history, True)
    finally:
        kill_hosts(store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--history",
        default="1,2000",
        help="journal entries before the kill (at least 1: the unit runs), comma-separated",
    )
    args = parser.parse_args()
    histories = [int(h) for h in args.history.split(",")]
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.runs):
        for history in histories:
            with tempfile.TemporaryDirectory(prefix="keel-bench-recovery-") as tmp:
                root = Path(tmp)
                store = root / ".keel" / "store"
                results.setdefault(("keel serve", history), []).append(asyncio.run(serve_run(root, store, history)))
            with tempfile.TemporaryDirectory(prefix="keel-bench-recovery-") as tmp:
                root = Path(tmp)
                store = root / ".keel" / "store"
                results.setdefault(("keel resume", history), []).append(by_hand_run(root, store, history))
    print(
        f"SIGKILL of a host → first new journal entry; {args.runs} runs each, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'recovered by':<14} {'history':>8} {'p50 ms':>8} {'min ms':>8} {'max ms':>8} {'x by hand':>10}")
    for (who, history), values in results.items():
        hand = statistics.median(results[("keel resume", history)])
        p50 = statistics.median(values)
        print(f"{who:<14} {history:>8} {p50:>8.0f} {min(values):>8.0f} {max(values):>8.0f} {p50 / hand:>10.2f}")


if __name__ == "__main__":
    main()
