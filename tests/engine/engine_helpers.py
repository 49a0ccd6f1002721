"""Helpers for the engine tests: mission files, the `keel` CLI as a real subprocess, store reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.protocol.records import MissionRecord
from keel.storage import Store, Txn
from keel.storage import missions as m
from tests.hosts import children

AGENT = "python -m keel.agents.scripted"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def write_mission(
    folder: Path,
    units: list[dict[str, Any]],
    *,
    agent: str | list[str] = AGENT,
    name: str = "test",
    workspace: str = "ws",
    **mission: Any,
) -> Path:
    lines = [
        "[mission]",
        f"name = {toml_value(name)}",
        f"agent = {toml_value(agent)}",
        f"workspace = {toml_value(workspace)}",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in mission.items() if not isinstance(v, dict)]
    for key, table in mission.items():
        if isinstance(table, dict):
            lines += ["", f"[{key}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    for unit in units:
        lines += ["", "[[units]]"] + [f"{k} = {toml_value(v)}" for k, v in unit.items()]
    path = folder / "mission.toml"
    path.write_text("\n".join(lines) + "\n")
    (folder / workspace).mkdir(exist_ok=True)
    return path


def keel(
    *args: str, store: Path, timeout: float = 60, env: dict[str, str] | None = None, check_rc: int | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, f"keel {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def start_keel(*args: str, store: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", *args, "--store", str(store), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def mission_id_of(proc: subprocess.Popen[str]) -> str:
    """The id from the first JSON event a foreground `keel run --json` prints."""
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["event"] == "mission", first
    return str(first["mission"])


def read(store: Path, fn: Callable[[Txn], Any]) -> Any:
    with Store.open(store, create=False) as s:
        return s.read(fn)


def record(store: Path, mission_id: str) -> MissionRecord:
    return read(store, lambda t: m.get_mission(t, mission_id))  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], bool], timeout: float = 120, step: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError("condition not reached in time")


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)


def stop_process(pid: int) -> None:
    """SIGSTOP `pid` and return once every thread of it has stopped: the signal is delivered when each
    thread next runs, so a process checked right after `kill` may still take a lock before it stops."""

    def stopped() -> bool:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
        except (FileNotFoundError, ProcessLookupError):
            return True  # gone: nothing of it runs
        return all(state in ("T", "t") for state in states)

    os.kill(pid, signal.SIGSTOP)
    wait_for(stopped, timeout=30, step=0.001)


def unit_events(store: Path, mission_id: str) -> list[tuple[str, str]]:
    events = read(store, lambda t: m.events_after(t, mission_id))
    return [(e.unit, e.state) for _, e in events if e.kind == "unit"]


def files(root: Path) -> dict[str, bytes]:
    """The sandbox's files (no .git, no __pycache__), for comparing two runs."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not {".git", "__pycache__"} & set(rel.parts):
            out[str(rel)] = path.read_bytes()
    return out


def sandbox_of(store: Path, mission_id: str) -> Path:
    return Path(record(store, mission_id).sandbox)


def proc_file(pid: int, name: str) -> bytes:
    """/proc/<pid>/<name>, or b"" once the process is gone."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def proc_stat(pid: int) -> list[bytes]:
    return proc_file(pid, "stat").rpartition(b")")[2].split()  # state, ppid, pgrp, session, ...


def workers_of(store: Path) -> dict[int, int]:
    """The live unit workers of this store: pid -> parent pid (the host, or its worker starter)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmd, stat = proc_file(int(entry.name), "cmdline"), proc_stat(int(entry.name))
            if b"keel.server.engine.units.subagent" in cmd and str(store).encode() in cmd and stat and stat[0] != b"Z":
                found[int(entry.name)] = int(stat[1])
    # a worker's agent, forked a moment ago, shows its worker's command line until it writes its own
    return {pid: parent for pid, parent in found.items() if parent not in found}


def starters_of(parent: int) -> list[int]:
    """The live worker starters `parent` started (units/workerstarter.py)."""
    return children(parent, b"keel\0worker-starter")
