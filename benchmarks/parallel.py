"""Benchmark: N independent units, each running a command, side by side for N = 1, 2, 4, 8.

    python benchmarks/parallel.py [--rounds 3] [--units 1,2,4,8] [--command-s 3]

Two workloads, each a mission of N units with no dependencies and `max_parallel = N`, run by the real
host (`keel run --plain`) with the scripted agent:
  - commands: each unit runs one `run` of a sleep of --command-s seconds (a sleep, so the two cores are
    not what limits it);
  - mixed: each unit writes a file, runs a sleep of a third of --command-s, three times over, with the
    checkpoint policy `every-step` (a snapshot checkpoint after every step).
Each command writes its own start and end time to a log outside the workspace. Printed per N: the
mission's wall time (from its first checkpoint to its last, as the store records them), the `keel run`
process's wall time, the ratio of the mission's wall time to N = 1's, and from the commands' own
timestamps the span from the first start to the last end against the sum of their durations (1.0: one
after another; 1/N: all at once). Medians over --rounds; the N are interleaved within a round, because
the shared machine's load drifts. Not a test: each run checks that the mission completed, that every
command ran once, and (mixed) that the mission's files are every unit's.
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
from typing import Any, NamedTuple

from keel.protocol.states import MissionState
from keel.storage import Store, Txn
from keel.storage import missions as m


class Run(NamedTuple):
    mission_s: float  # first checkpoint to last, from the manifests' times
    process_s: float  # the `keel run` process, start to exit
    span_s: float  # the commands' own timestamps: first start to last end
    busy_s: float  # the commands' durations, summed


def toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, dict | list) else _table(value)


def _table(value: dict[str, Any] | list[Any]) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"


def timed(cmd: str, log: Path) -> str:
    """`cmd` between two lines of its own timestamps in `log`."""
    return f"echo start $(date +%s.%N) >> {log}; {cmd}; echo end $(date +%s.%N) >> {log}"


def unit_steps(workload: str, uid: str, log: Path, command_s: float) -> list[dict[str, Any]]:
    if workload == "commands":
        return [{"tool": "run", "args": {"cmd": timed(f"sleep {command_s}", log)}}]
    third = round(command_s / 3, 3)
    steps: list[dict[str, Any]] = []
    for i in range(3):
        steps.append({"tool": "write_file", "args": {"path": f"{uid}/w{i}.txt", "content": f"{uid} {i}\n"}})
        steps.append({"tool": "run", "args": {"cmd": timed(f"sleep {third} && echo {i} >> {uid}/r.txt", log)}})
    return steps


def mission_file(root: Path, workload: str, n: int, command_s: float) -> Path:
    lines = [
        "[mission]",
        f'name = "parallel-{workload}-{n}"',
        'agent = "python -m keel.agents.scripted"',
        'workspace = "ws"',
        f"max_parallel = {n}",
    ]
    if workload == "mixed":
        lines += ["", "[checkpoint]", 'policy = "every-step"']
    for i in range(n):
        uid = f"u{i}"
        steps = unit_steps(workload, uid, root / "side" / f"{uid}.log", command_s)
        lines += ["", "[[units]]", f'id = "{uid}"', f"params.steps = {toml(steps)}"]
    path = root / "mission.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def git(cwd: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid", "GIT_COMMITTER_NAME": "b"}
    env |= {"GIT_COMMITTER_EMAIL": "b@example.invalid", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)


def one_run(root: Path, workload: str, n: int, command_s: float) -> Run:
    root.mkdir()
    (root / "side").mkdir()
    ws = root / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("parallel units\n")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    store = root / "store"
    begin = time.perf_counter()
    mission = mission_file(root, workload, n, command_s)
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", str(mission), "--plain", "--store", str(store)],
        capture_output=True,
        text=True,
    )
    process_s = time.perf_counter() - begin
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store.open(store, create=False) as s:
        mission_s, sandbox = s.read(_mission_times)
    starts, ends = _command_times(root / "side", n, 1 if workload == "commands" else 3)
    if workload == "mixed":
        _check_files(Path(sandbox), n)
    busy = sum(e - b for b, e in zip(sorted(starts), sorted(ends), strict=True))
    return Run(mission_s, process_s, max(ends) - min(starts), busy)


def _mission_times(txn: Txn) -> tuple[float, str]:
    record = m.list_missions(txn)[0]
    assert record.state == MissionState.COMPLETED, record.state
    times = [point.created_at for point in m.restore_points(txn, record.id)]
    return max(times) - min(times), record.sandbox


def _command_times(side: Path, n: int, per_unit: int) -> tuple[list[float], list[float]]:
    starts: list[float] = []
    ends: list[float] = []
    for i in range(n):
        lines = (side / f"u{i}.log").read_text().split("\n")
        starts += [float(x.split()[1]) for x in lines if x.startswith("start ")]
        ends += [float(x.split()[1]) for x in lines if x.startswith("end ")]
    assert len(starts) == len(ends) == n * per_unit, f"expected {n * per_unit} commands, saw {len(starts)}"
    return starts, ends


def _check_files(sandbox: Path, n: int) -> None:
    for i in range(n):
        uid = f"u{i}"
        assert (sandbox / uid / "r.txt").read_text() == "0\n1\n2\n", uid
        for k in range(3):
            assert (sandbox / uid / f"w{k}.txt").read_text() == f"{uid} {k}\n", uid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--units", default="1,2,4,8")
    parser.add_argument("--command-s", type=float, default=3.0)
    parser.add_argument("--workloads", default="commands,mixed")
    args = parser.parse_args()
    counts = [int(x) for x in args.units.split(",")]
    workloads = args.workloads.split(",")
    runs: dict[tuple[str, int], list[Run]] = {(w, n): [] for w in workloads for n in counts}
    with tempfile.TemporaryDirectory(prefix="keel-parallel-") as tmp:
        for r in range(args.rounds):
            for w in workloads:
                for n in counts:
                    runs[(w, n)].append(one_run(Path(tmp) / f"{w}-{n}-{r}", w, n, args.command_s))
                    print(f"round {r + 1}: {w} N={n}: {runs[(w, n)][-1].mission_s:.2f} s", file=sys.stderr)
    print(f"parallel units, {args.command_s:g} s of commands per unit, median of {args.rounds} round(s)")
    print(f"{'workload':<9} {'N':>2} {'mission s':>10} {'process s':>10} {'x N=1':>7} {'span/busy':>10}")
    for w in workloads:
        single = statistics.median(x.mission_s for x in runs[(w, counts[0])])
        for n in counts:
            got = runs[(w, n)]
            mission = statistics.median(x.mission_s for x in got)
            process = statistics.median(x.process_s for x in got)
            overlap = statistics.median(x.span_s / x.busy_s for x in got)
            print(f"{w:<9} {n:>2} {mission:>10.2f} {process:>10.2f} {mission / single:>7.2f} {overlap:>10.2f}")


if __name__ == "__main__":
    main()
