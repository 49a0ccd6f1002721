"""Benchmark: an editor action's engine call as a fork of the host starter against a new interpreter.

    python benchmarks/engine_calls.py [--runs 30]

The language server runs the engine's start, resume, answer, restore and rewind verbs in a child
(server/lsp/enginecall.py); under `keel serve` that child is a fork of the server's host starter
(server/hoststarter.py). Here, interleaved run by run on one store holding one completed mission: `keel missions
--json` and an engine call (`resume` of that mission: an error answer, as fast as any) through the starter's
`run`, and the same command lines as a new interpreter (`subprocess.run`, as enginecall does without a
starter). Prints medians of wall time, from the caller's side. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel.server.hoststarter import HostStarter

MISSION = (
    '[mission]\nname = "bench"\nagent = "python -m keel.agents.scripted"\nworkspace = "ws"\n\n[[units]]\nid = "u"\n'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    starter = HostStarter.launch()
    if starter is None:
        raise SystemExit("this process cannot fork a host starter")
    with tempfile.TemporaryDirectory(prefix="keel-bench-calls-") as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        (root / "mission.toml").write_text(MISSION)
        store = str(root / "store")
        keel = [sys.executable, "-m", "keel.server.cli"]
        subprocess.run([*keel, "run", str(root / "mission.toml"), "--store", store, "--plain"], check=True)
        mission = json.loads(subprocess.check_output([*keel, "missions", "--json", "--store", store]))[0]["id"]
        commands = {
            "keel missions --json": ["-m", "keel.server.cli", "missions", "--json", "--store", store],
            "engine call (resume)": ["-m", "keel.server.lsp.enginecall", "resume", json.dumps([store, mission])],
        }
        while starter.run(commands["keel missions --json"], 30) is None:
            time.sleep(0.05)  # until it has loaded keel
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):
            for name, argv in commands.items():
                for way in ("fork of the starter", "new interpreter"):
                    started = time.perf_counter()
                    done = starter.run(argv, 30) if way == "fork of the starter" else None
                    if done is None:
                        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=30)
                    times.setdefault((name, way), []).append((time.perf_counter() - started) * 1000)
                    if name == "keel missions --json" and done.returncode != 0:
                        raise SystemExit(f"{name} by {way} failed: {done.stderr}")
    starter.close()
    print(f"{args.runs} interleaved runs each")
    print(f"{'command':<24} {'way':<22} {'p50 ms':>8}")
    for (name, way), values in times.items():
        print(f"{name:<24} {way:<22} {statistics.median(values):>8.1f}")


if __name__ == "__main__":
    main()
