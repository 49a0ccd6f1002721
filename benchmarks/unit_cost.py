"""Benchmark: what one unit costs the machine, beyond its agent's own work.

    python benchmarks/unit_cost.py [--units 100] [--parallel 4] [--rounds 3] [--other PATH/TO/python]

A mission of --units units that do nothing (the scripted agent, one `sleep` of 0 s each), `max_parallel`
--parallel, in a git workspace, run by `keel run --plain` to completion. Printed per interpreter (this one,
and --other's, a venv of another keel tree; interleaved round by round): the CPU time of the whole process
tree (user + system of `keel run` and everything it waited for: the host, the units' workers and agents,
git) per unit, the wall time per unit, and how many git processes a unit ran (counted by GIT_TRACE).
Medians over --rounds. Not a test: each run checks that the mission completed with every unit run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_workspace(root: Path, units: int, parallel: int) -> Path:
    root.mkdir(parents=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    (root / "README.md").write_text("a workspace\n")
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=root, check=True, env=env)
    lines = [
        "[mission]",
        'name = "unit-cost"',
        'agent = "python -m keel.agents.scripted"',
        f"max_parallel = {parallel}",
        "",
    ]
    for i in range(units):
        lines += ["[[units]]", f'id = "u{i:04d}"', f'title = "unit {i}"', "params = { steps = [{ sleep = 0.0 }] }", ""]
    (root / "cost.mission.toml").write_text("\n".join(lines))
    return root


def run_once(python: str, root: Path, units: int) -> tuple[float, int]:
    """(wall s, git processes) of one whole mission."""
    trace = root.parent / f"{root.name}.gittrace"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["GIT_TRACE"] = str(trace)
    began = time.monotonic()
    proc = subprocess.Popen(
        [python, "-m", "keel.server.cli", "run", "cost.mission.toml", "--plain", "--json"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out = proc.communicate()[0]
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"keel run exited {proc.returncode}: {out[-500:]}")
    ran = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    end = next((e for e in reversed(ran) if e.get("event") == "host_exit"), {})
    if end.get("state") != "completed" or end.get("units_run") != units:
        raise SystemExit(f"the mission did not complete with {units} units run: {end}")
    gits = sum(
        1 for line in trace.read_text().splitlines() if "trace: built-in: git" in line or "trace: exec: git" in line
    )
    trace.unlink()
    return wall, gits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--other", help="the python of a venv of another keel tree, run side by side")
    args = parser.parse_args()
    pythons = {"this tree": sys.executable, **({"other": args.other} if args.other else {})}
    figures: dict[str, list[tuple[float, float, int]]] = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory(prefix="keel-unit-cost-") as tmp:
        for round_ in range(args.rounds):
            for name, python in pythons.items():
                root = make_workspace(Path(tmp) / f"{name.replace(' ', '-')}-{round_}", args.units, args.parallel)
                figures[name].append(measure(python, root, args.units))
    print(
        f"a mission of {args.units} empty units, {args.parallel} at a time; medians of {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'keel':<12} {'CPU ms/unit':>12} {'wall ms/unit':>13} {'git/unit':>9}")
    for name, runs in figures.items():
        cpu = statistics.median(r[0] for r in runs) * 1000 / args.units
        wall = statistics.median(r[1] for r in runs) * 1000 / args.units
        gits = statistics.median(r[2] for r in runs) / args.units
        print(f"{name:<12} {cpu:>12.1f} {wall:>13.1f} {gits:>9.1f}")


def measure(python: str, root: Path, units: int) -> tuple[float, float, int]:
    before = os.times()
    wall, gits = run_once(python, root, units)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return cpu, wall, gits


if __name__ == "__main__":
    main()
