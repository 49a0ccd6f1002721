"""Benchmark: from a SIGKILLed mission host to the first new journal entry of its mission.

    python benchmarks/recovery.py [--runs 5] [--history 1,2000] [--agent plain,saving] [--by serve,hand]

For each history length (journal entries the unit has made before the kill) and agent, interleaved run by run:
  - under `keel serve`: a real language server (pygls client over stdio), up and ready (its host starter and
    that starter's spare worker starter have said so), supervising the mission; the host's process group is
    SIGKILLed mid-mission, once the server watches its exit (holds a pidfd of it), and the time runs until the
    store holds the first journal entry the restarted host made (a replayed entry is not new work);
  - by hand: the same kill with no server, then `keel resume ID --detach` at once, as a person would.
The agent is the scripted one, journaling `now` and `random` steps back to back (nothing it does between
them takes time of its own, so a replay costs only keel's answers from the journal). The "plain" agent
never saves its state, so a restarted one replays its whole history; the "saving" one saves it every tenth
entry, and a restarted one carries on from its last save (`InitializeResult.resumes`). Prints medians and
the ratio of serve to by-hand. Not a test, but each run checks what it times: the host was running the
mission when it was killed, all its threads were gone before the clock could stop, and the entry that stops
it was stamped after the kill by a host other than the killed one.

Why "newer than the newest entry seen after the kill" is not the test: the host commits constantly, and a
commit whose meta page LMDB was writing (an O_DSYNC write) when the kill came is on disk, yet readers do not
see it until the next write transaction of any process moves LMDB's shared txnid (here the orphaned
worker's lease heartbeat, within milliseconds). That entry, the killed host's own, then looked like
recovered work 10 ms after the kill.
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
from typing import Any, NamedTuple

from lsprotocol import types
from pygls.lsp.client import BaseLanguageClient

from keel.protocol.states import MissionState
from keel.storage import DB, Store
from keel.storage import missions as m
from keel.storage.keys import unit_prefix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.hosts import children, kill_hosts, pidfds
from tests.lsp.conftest import mission_toml

TAIL = 5_000  # journaled steps past the kill: the unit is mid-way when it is struck


def steps(agent: str, history: int) -> list[dict[str, Any]]:
    """Journaled steps only (a replay re-runs no sleep): `history` + TAIL entries, a save every tenth for
    the saving agent."""
    rounds = (history + TAIL) // 10 + 1
    if agent == "saving":
        return [{"repeat": rounds, "steps": [*([{"now": True}] * 9), {"save_state": {"round": True}}]}]
    return [{"repeat": rounds * 5, "steps": [{"now": True}, {"random": True}]}]


class Seen(NamedTuple):
    """The mission as the store has it now: the unit's newest journal entry, the host it names, its state."""

    seq: int
    at: float  # when the newest entry was stamped by the host that made it (0: no entry)
    host_pid: int
    state: MissionState


def look(store_path: Path, mission_id: str) -> Seen:
    with Store.open(store_path, readonly=True) as store:

        def read(txn: Any) -> Seen:
            record = m.get_mission(txn, mission_id)
            seq = txn.last_seq(DB.JOURNAL, unit_prefix(mission_id, "u"))  # the unit's lane (never restored)
            entry = m.journal_get(txn, mission_id, "u", seq) if seq else None
            return Seen(seq, entry.at if entry else 0.0, record.host.pid if record.host else 0, record.state)

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
    """Every thread of the process has exited (a zombie leader can outlive its threads' last system calls)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            if Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return False
        except OSError:
            continue
    return True


def warmed(server: int) -> bool:
    """The server's host starter is ready, with a worker starter ready for its next host: a server that has been
    up for a moment, as one that recovers a mission hours into it has."""
    return any(children(starter, b"keel\0worker-starter") for starter in children(server, b"keel\0host-starter"))


def start_mission(root: Path, store: Path, name: str, agent: str, history: int) -> str:
    path = root / f"{name}.toml"
    path.write_text(mission_toml(name, [{"id": "u", "steps": steps(agent, history)}]))
    out = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", str(path), "--detach", "--store", str(store)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[-1]


def kill_and_time(store: Path, mission_id: str, history: int, resume: bool, server: int = 0) -> float:
    """`server`: the strike waits until that language server watches the host's exit (holds a pidfd of it), as a
    server does of a host it has watched for longer than a moment."""
    before = wait_until(
        lambda: (
            (seen := look(store, mission_id)).seq >= history
            and seen.host_pid
            and (not server or seen.host_pid in pidfds(server))
            and seen
        )
    )
    pid = before.host_pid
    assert before.state == MissionState.RUNNING and before.seq < history + TAIL, f"not mid-mission: {before}"
    assert not gone(pid), f"host {pid} was not running"
    begin = time.monotonic()
    os.killpg(pid, signal.SIGKILL)
    killed_at = time.time()  # the killed host stamps no entry after this
    wait_until(lambda: gone(pid))
    if resume:
        subprocess.run(
            [sys.executable, "-m", "keel.server.cli", "resume", mission_id, "--detach", "--store", str(store)],
            check=True,
            capture_output=True,
        )
    after = wait_until(lambda: (seen := look(store, mission_id)).at > killed_at and seen)
    took = (time.monotonic() - begin) * 1000
    assert after.host_pid not in (0, pid), f"entry {after.seq} is not the restarted host's: {after}"
    assert after.seq > before.seq and after.state == MissionState.RUNNING, (before, after)
    return took


async def serve_run(root: Path, store: Path, agent: str, history: int) -> float:
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
        assert client._server is not None
        await asyncio.to_thread(wait_until, lambda: warmed(client._server.pid), 30.0)
        mission_id = start_mission(root, store, f"serve{history}", agent, history)
        return await asyncio.to_thread(kill_and_time, store, mission_id, history, False, client._server.pid)
    finally:
        kill_hosts(store)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()


def by_hand_run(root: Path, store: Path, agent: str, history: int) -> float:
    mission_id = start_mission(root, store, f"hand{history}", agent, history)
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
    parser.add_argument("--agent", default="plain,saving", help="plain (never saves), saving (every 10th entry)")
    parser.add_argument("--by", default="serve,hand", help="serve (keel serve restarts it), hand (keel resume)")
    args = parser.parse_args()
    histories = [int(h) for h in args.history.split(",")]
    agents, ways = args.agent.split(","), args.by.split(",")
    results: dict[tuple[str, str, int], list[float]] = {}
    for _ in range(args.runs):
        for history in histories:
            for agent in agents:
                for way in ways:
                    with tempfile.TemporaryDirectory(prefix="keel-bench-recovery-") as tmp:
                        root = Path(tmp)
                        store = root / ".keel" / "store"
                        took = (
                            asyncio.run(serve_run(root, store, agent, history))
                            if way == "serve"
                            else by_hand_run(root, store, agent, history)
                        )
                        results.setdefault((way, agent, history), []).append(took)
    print(
        f"SIGKILL of a host → first new journal entry; {args.runs} runs each, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'by':<6} {'agent':<7} {'history':>8} {'p50 ms':>8} {'min ms':>8} {'max ms':>8} {'x at 1':>7}")
    for (way, agent, history), values in results.items():
        p50 = statistics.median(values)
        first = results.get((way, agent, histories[0]))
        ratio = f"{p50 / statistics.median(first):>7.2f}" if first else ""
        print(f"{way:<6} {agent:<7} {history:>8} {p50:>8.0f} {min(values):>8.0f} {max(values):>8.0f} {ratio}")


if __name__ == "__main__":
    main()
