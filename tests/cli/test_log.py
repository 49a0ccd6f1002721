"""`keel log`: a real mission (scripted agent, a model call to a fault server on 127.0.0.1), then its
activity on the terminal — every step in order, filters, JSON lines, and `--follow` until the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.activitykit import PRICE_IN, PRICE_OUT, write_activity_mission
from tests.faultserver import FaultServer, ok
from tests.hosts import kill_hosts


def env_for(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}


def keel(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args, "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env_for(tmp_path),
        timeout=timeout,
    )


@pytest.fixture
def model() -> Iterator[FaultServer]:
    server = FaultServer(default=ok("hello from the model")).start()
    yield server
    server.stop()


@pytest.fixture
def finished(tmp_path: Path, model: FaultServer) -> Iterator[str]:
    """The id of the mission, run to its end (failed: unit `bad` fails its verification)."""
    mission = write_activity_mission(tmp_path, model.url)
    proc = keel(tmp_path, "run", str(mission))
    assert proc.returncode != 0 and "bad" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    listed = json.loads(keel(tmp_path, "missions", "--json").stdout)
    yield listed[0]["id"]
    kill_hosts(tmp_path / "store")


def items(tmp_path: Path, mid: str, *flags: str) -> list[dict[str, Any]]:
    proc = keel(tmp_path, "log", mid, "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_every_step_in_order_with_arguments_results_and_diffs(tmp_path: Path, finished: str) -> None:
    edit = items(tmp_path, finished, "--unit", "edit")
    steps = [(i["kind"], i.get("tool", "")) for i in edit if i["kind"] not in ("unit", "restart")]
    assert steps == [
        ("tool", "write_file"),
        ("tool", "apply_diff"),
        ("tool", "read_file"),
        ("tool", "run"),
        ("verification", ""),
        ("model", ""),
        ("step", ""),
        ("note", ""),
    ], steps
    write, patch, read, run = edit[1:5]
    assert write["args"] == {"path": "a.py", "content": "x = 1\n"} and write["effect"] == "done"
    assert write["result"] == "created a.py (6 bytes)" and write["durationMs"] > 0
    [created] = write["files"]
    assert created["path"] == "a.py" and "before" not in created and created["after"]
    assert "+x = 1" in created["diff"]
    [patched] = patch["files"]
    assert patched["before"] == created["after"] and "+y = 2" in patched["diff"]
    assert read["effect"] == "read-only" and run["result"].startswith("exit 0")
    verification = edit[5]
    assert verification["status"] == "passed" and not verification.get("failed")
    call = edit[6]
    assert (call["provider"], call["model"], call["status"]) == ("local", "local-model", "paid")
    assert (call["tokensIn"], call["tokensOut"]) == (7, 3)
    assert call["cost"] == pytest.approx((7 * PRICE_IN + 3 * PRICE_OUT) / 1e6)
    assert "hello from the model" in call["text"]
    assert edit[-1]["title"] == "unit edit succeeded"
    everything = items(tmp_path, finished)
    units = [i["unit"] for i in everything if i.get("unit")]
    assert units == sorted(units, key=["edit", "bad"].index)  # edit's steps, then bad's
    assert len({i["id"] for i in everything}) == len(everything)


def test_failures_only_say_why_and_kinds_filter(tmp_path: Path, finished: str) -> None:
    failures = items(tmp_path, finished, "--failures")
    assert {i.get("unit") for i in failures} == {"bad", None}
    unit = next(i for i in failures if i["kind"] == "unit")
    assert "exit code 3" in unit["text"] and unit["status"] == "failed"
    verification = next(i for i in failures if i["kind"] == "verification")
    assert "broken" in verification["text"] and verification["status"] == "failed"
    assert [i["kind"] for i in items(tmp_path, finished, "--kind", "model")] == ["model"]
    text = keel(tmp_path, "log", finished, "--unit", "bad")
    assert text.returncode == 0
    assert "✗ bad" in text.stdout and 'args      {"cmd": "echo broken; exit 3"' in text.stdout, text.stdout


def test_unknown_unit_kind_and_mission_are_named(tmp_path: Path, finished: str) -> None:
    proc = keel(tmp_path, "log", finished, "--unit", "nope")
    assert proc.returncode == 6 and proc.stderr.strip() == f"keel: mission {finished} has no unit 'nope'"
    proc = keel(tmp_path, "log", "zzz")
    assert proc.returncode == 6 and proc.stderr.strip() == "keel: no mission 'zzz'"
    proc = keel(tmp_path, "log", finished, "--kind", "tools")
    assert proc.returncode == 2 and "invalid choice: 'tools'" in proc.stderr


def test_follow_streams_new_steps_until_the_mission_ends(tmp_path: Path, model: FaultServer) -> None:
    mission = write_activity_mission(tmp_path, model.url, edit_first=[{"sleep": 3.0}])
    run = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "run", str(mission), "--store", str(tmp_path / "store")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env_for(tmp_path),
    )
    try:
        mid = _first_mission(tmp_path)
        started = time.time()
        follow = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keel.server.cli",
                "log",
                mid,
                "--follow",
                "--json",
                "--store",
                str(tmp_path / "store"),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env_for(tmp_path),
        )
        out, _ = follow.communicate(timeout=90)
        assert follow.returncode == 0
        seen = [json.loads(line) for line in out.splitlines()]
        later = [i for i in seen if i["at"] > started and i["kind"] == "model"]
        assert later, "the model call made after `keel log --follow` started was not streamed"
        assert seen[-1]["title"] == "mission running -> failed"  # it stopped by itself at the end
        assert run.wait(timeout=60) != 0
    finally:
        run.kill()
        run.wait()
        kill_hosts(tmp_path / "store")


def _first_mission(tmp_path: Path) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        proc = keel(tmp_path, "missions", "--json")
        listed = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
        if listed:
            return str(listed[0]["id"])
        time.sleep(0.1)
    raise AssertionError("no mission appeared within 30 s")
