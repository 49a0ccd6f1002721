"""Benchmark: the mission page of a 1,000-unit mission while keel's background work loads the machine.

    python benchmarks/page_lag.py [--rounds 2] [--busy 6] [--seconds 240]

Each round runs tests/vscode/test_page_scale.py (real code-server, Chromium and the packaged extension; its own
1,000-unit mission) twice, interleaved: once with every keel process at normal priority (KEEL_NICE=0) and once
at keel's default (background work at nice 10, server/background.py). During each, a detached keel mission of
--busy units keeps the CPUs busy: each unit's command burns a CPU for --seconds. Printed per run: the page's
first paint, the time from the click to the drawn page, the median and the longest update (measured in the
page), and the longest time the page was behind the store, from test-artifacts/vscode/page-scale-timings.json.
Needs the editor tools (scripts/editor-tools.sh; node on PATH). Not a test: a run whose test failed is shown
with its figures all the same (the test fails when the page is far behind).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ROOT / "test-artifacts" / "vscode" / "page-scale-timings.json"


def start_load(root: Path, busy: int, seconds: int, env: dict[str, str]) -> Path:
    """A detached mission of `busy` units, each running a command that burns a CPU for `seconds`; its store."""
    (root / "ws").mkdir(parents=True)
    burn = f"timeout {seconds} {sys.executable} -c 'while True: pass'; true"
    lines = ["[mission]", 'name = "load"', 'agent = "python -m keel.agents.scripted"', 'workspace = "ws"']
    lines.append(f"max_parallel = {busy}")
    for i in range(busy):
        step = f'{{ tool = "run", args = {{ cmd = {json.dumps(burn)}, timeout_s = {seconds + 60} }} }}'
        lines += ["", "[[units]]", f'id = "u{i}"', f"params = {{ steps = [{step}] }}"]
    (root / "load.mission.toml").write_text("\n".join(lines) + "\n")
    store = root / "store"
    cmd = [sys.executable, "-m", "keel.server.cli", "run", str(root / "load.mission.toml"), "--detach"]
    subprocess.run([*cmd, "--store", str(store)], check=True, capture_output=True, env=env, timeout=120)
    return store


def stop_load(store: Path) -> None:
    subprocess.run([sys.executable, "-c", KILL, str(store)], cwd=ROOT, check=False, timeout=60)


KILL = "import sys; from pathlib import Path; from tests.hosts import kill_hosts; kill_hosts(Path(sys.argv[1]))"


def one(mode: str, busy: int, seconds: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_NICE"}
    if mode == "normal priority":
        env["KEEL_NICE"] = "0"
    else:
        env["KEEL_NICE"] = "10"  # the default, said explicitly: the test run's own default is 0 (tests/conftest.py)
    with tempfile.TemporaryDirectory(prefix="keel-page-lag-") as tmp:
        store = start_load(Path(tmp) / "load", busy, seconds, env)
        try:
            TIMINGS.unlink(missing_ok=True)
            test = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/vscode/test_page_scale.py"]
            done = subprocess.run([sys.executable, *test], cwd=ROOT, env=env, capture_output=True, text=True)
        finally:
            stop_load(store)
            shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, Any] = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    return {"mode": mode, "passed": done.returncode == 0, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=240)
    args = parser.parse_args()
    print("| keel processes | paint ms | open s | update median / max ms | behind the store s | test |")
    print("|---|---|---|---|---|---|")
    for _ in range(args.rounds):
        for mode in ("normal priority", "background (default)"):
            r = one(mode, args.busy, args.seconds)
            if "lagS" not in r:
                print(f"| {mode} | - | - | - | - | failed before measuring |")
                continue
            print(
                f"| {mode} | {r['paintMs']:.0f} | {r['openMs'] / 1000:.1f} | "
                f"{r['medianUpdateMs']:.1f} / {r['maxUpdateMs']:.0f} | {r['lagS']:.2f} | "
                f"{'passed' if r['passed'] else 'failed'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
