"""Benchmark: journal throughput of 8 subagents writing at once, group commit vs one commit per entry.

    python benchmarks/group_commit.py [--subagents 8] [--entries 200] [--window-ms 2] [--runs 3]

Each subagent is an asyncio task that does what a running unit does per step: build a journal entry,
hand it to the host's writer and wait until it is durable before taking the next step (an agent never
gets a result before its entry is committed). Every write checks the unit's lease epoch in the same
transaction, as the host does.
- group:    the host's `JournalWriter` (its writer thread: cheap entries share a commit within the window,
            which closes as soon as every subagent has an entry waiting)
- per-entry: the same transaction function, one synchronous LMDB commit per entry (from a thread each)
Both run in this one process, on the same disk, one after the other. After each mode the store is
reopened in a fresh process and every acknowledged entry is checked to be there. Prints medians of
--runs and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel.protocol.records import JournalEntry
from keel.server.engine.journal import JournalWriter, fingerprint
from keel.storage import Store, Txn, leases
from keel.storage import missions as m

MISSION = "mbench"
RESULT = {"time": 1735732800.0, "note": "x" * 200}


def _prepare(store: Store, subagents: int) -> dict[str, int]:
    def grant(txn: Txn) -> dict[str, int]:
        return {
            f"u{i}": leases.grant(txn, MISSION, f"u{i}", lane=f"u{i}", host_id="bench", ttl_s=60).epoch
            for i in range(subagents)
        }

    return store.write(grant)


def _entry_fn(unit: str, epoch: int, seq: int):  # type: ignore[no-untyped-def]
    entry = JournalEntry(seq=seq, kind="now", fingerprint=fingerprint("now", None), result=RESULT, at=time.time())

    def write(txn: Txn) -> None:
        leases.recorded(txn, MISSION, unit, epoch, mark=seq)
        m.journal_put(txn, MISSION, unit, entry)

    return write


async def _group(store: Store, epochs: dict[str, int], entries: int, window_s: float) -> tuple[float, int, int]:
    writer = JournalWriter(store, window_s)
    writer.parallel = len(epochs)
    acked = 0

    async def subagent(unit: str, epoch: int) -> None:
        nonlocal acked
        for seq in range(1, entries + 1):
            await writer.commit(_entry_fn(unit, epoch, seq), urgent=False)
            acked += 1

    start = time.perf_counter()
    await asyncio.gather(*(subagent(u, e) for u, e in epochs.items()))
    elapsed = time.perf_counter() - start
    await asyncio.to_thread(writer.close)
    return elapsed, acked, writer.commits


async def _per_entry(store: Store, epochs: dict[str, int], entries: int) -> tuple[float, int, int]:
    acked = 0

    async def subagent(unit: str, epoch: int) -> None:
        nonlocal acked
        for seq in range(1, entries + 1):
            await asyncio.to_thread(store.write, _entry_fn(unit, epoch, seq))
            acked += 1

    start = time.perf_counter()
    await asyncio.gather(*(subagent(u, e) for u, e in epochs.items()))
    return time.perf_counter() - start, acked, acked


def _durable(path: Path) -> int:
    """Entries found by a fresh process (what survives this one)."""
    code = (
        "import sys; from keel.storage import Store, DB; s = Store.open(sys.argv[1], create=False); "
        "print(s.read(lambda t: sum(1 for _ in t.scan_raw(DB.JOURNAL, b'mbench\\x00')))); s.close()"
    )
    return int(
        subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    )


def _one(mode: str, folder: Path, args: argparse.Namespace) -> tuple[float, int, int]:
    path = folder / mode
    with Store.open(path) as store:
        epochs = _prepare(store, args.subagents)
        if mode == "group":
            elapsed, acked, commits = asyncio.run(_group(store, epochs, args.entries, args.window_ms / 1000))
        else:
            elapsed, acked, commits = asyncio.run(_per_entry(store, epochs, args.entries))
    durable = _durable(path)
    if durable < acked:
        raise SystemExit(f"{mode}: {acked} entries acknowledged but only {durable} durable")
    return acked / elapsed, commits, durable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subagents", type=int, default=8)
    parser.add_argument("--entries", type=int, default=200, help="entries per subagent")
    parser.add_argument("--window-ms", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"group": [], "per-entry": []}
    commits: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp:
        for run in range(args.runs):
            for mode in ("group", "per-entry"):
                folder = Path(tmp) / f"run{run}"
                folder.mkdir(exist_ok=True)
                rate, commits[mode], _durable_count = _one(mode, folder, args)
                rates[mode].append(rate)
    total = args.subagents * args.entries
    print(
        f"{args.subagents} subagents x {args.entries} entries = {total} entries per run; "
        f"median of {args.runs} runs; every acknowledged entry found durable by a fresh process"
    )
    print(f"{'mode':<10} {'entries/s':>10} {'commits':>8}")
    for mode, values in rates.items():
        print(f"{mode:<10} {statistics.median(values):>10.0f} {commits[mode]:>8}")
    ratio = statistics.median(rates["group"]) / statistics.median(rates["per-entry"])
    print(f"group commit / one commit per entry: {ratio:.1f}x")


if __name__ == "__main__":
    main()
