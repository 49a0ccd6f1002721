"""keel serve latency: `keel/missions` while 16 missions run (against the floor: a request the server
answers at once, an unknown method), and keel/missionChanged delay after a store change made by another
process.

    python benchmarks/lsp.py [--missions 16] [--requests 400] [--changes 200]

Starts a real `keel serve`, 16 real missions (detached hosts, scripted agent journaling `now` steps in a
loop), then (1) times `keel/missions` round trips, (2) runs a writer process that changes one mission
record every 50 ms stamping the wall time just before its write transaction, and times how long after
that stamp the matching notification arrives (includes the writer's fsync'd commit). Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcMethodNotFound
from pygls.lsp.client import BaseLanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.lsp.conftest import kill_hosts, mission_toml

WRITER = """
import sys, time, msgspec
from keel.storage import Store, missions as m
store, mid, count = Store.open(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(count):
    stamp = time.time()
    text = f"bench {i} {stamp!r}"
    store.write(lambda t: m.put_mission(t, msgspec.structs.replace(m.get_mission(t, mid), error=text)))
    time.sleep(0.05)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="keel-bench-lsp-"))
    store = root / ".keel" / "store"
    client = BaseLanguageClient("bench", "1")
    arrivals: dict[int, float] = {}
    states: dict[str, str] = {}

    @client.feature("keel/missionChanged")
    def changed(params: Any) -> None:
        now = time.time()
        states[params.id] = params.state
        error = getattr(params, "error", None) or ""
        if error.startswith("bench "):
            _, index, stamp = error.split(" ")
            arrivals.setdefault(int(index), now - float(stamp))

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def log_message(params: Any) -> None:
        pass

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def show_message(params: Any) -> None:
        pass

    await client.start_io(sys.executable, "-m", "keel.server.cli", "serve", "--store", str(store))
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=root.as_uri())
    )
    client.initialized(types.InitializedParams())
    ids = []
    try:
        steps = [{"now": True}, {"sleep": 0.05}] * 400
        for i in range(args.missions):
            path = root / f"m{i}.toml"
            path.write_text(mission_toml(f"bench{i}", [{"id": "u", "steps": steps}]))
            reply = await client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="keel.startMission", arguments=[str(path)])
            )
            ids.append(reply["id"])
        deadline = time.monotonic() + 60
        while sum(states.get(i) == "running" for i in ids) < args.missions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        running = sum(states.get(i) == "running" for i in ids)

        latencies, floor = [], []
        for _ in range(args.requests):
            begin = time.perf_counter()
            result = await client.protocol.send_request_async("keel/missions", None)
            latencies.append((time.perf_counter() - begin) * 1000)
            assert len(result) == args.missions
            begin = time.perf_counter()
            with contextlib.suppress(JsonRpcMethodNotFound):
                await client.protocol.send_request_async("keel/noSuchMethod", None)
            floor.append((time.perf_counter() - begin) * 1000)
        still = sum(states.get(i) == "running" for i in ids)

        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(store), ids[0], str(args.changes)
        )
        await writer.wait()
        await asyncio.sleep(0.5)
        delays = [v * 1000 for v in arrivals.values()]
        print(
            f"keel serve benchmark — {args.missions} missions started, {running} running when timing began, "
            f"{still} still running after the requests; {os.cpu_count()} CPUs"
        )
        print(f"{'measure':<42} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        print(
            f"{'keel/missions round trip':<42} {len(latencies):>5} {statistics.median(latencies):>8.1f} "
            f"{pct(latencies, 0.99):>8.1f} {max(latencies):>8.1f}"
        )
        print(
            f"{'floor: an unknown method, answered at once':<42} {len(floor):>5} {statistics.median(floor):>8.1f} "
            f"{pct(floor, 0.99):>8.1f} {max(floor):>8.1f}"
        )
        print(f"keel/missions p50 / floor p50: {statistics.median(latencies) / statistics.median(floor):.1f}x")
        print(
            f"{'missionChanged after another process wrote':<42} {len(delays):>5} "
            f"{statistics.median(delays):>8.1f} {pct(delays, 0.99):>8.1f} {max(delays):>8.1f}"
        )
        print(
            f"notifications received for the writer's {args.changes} changes: {len(delays)} "
            "(changes landing within one 50 ms poll are sent once, as the newest summary)"
        )
    finally:
        with contextlib.suppress(Exception):
            await client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="keel.pauseAll", arguments=[])
            )
        await asyncio.sleep(0.5)
        kill_hosts(store)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--missions", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--changes", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
