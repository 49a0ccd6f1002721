"""Helpers for the subagent tests: lease reads, process liveness, the person's checkout fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine_helpers import keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission

from keel.protocol.records import UnitLease
from keel.server.processes import process_running
from keel.storage import Store, leases
from keel.storage.writelock import LOCK_NAME, holder_pid


def lease(store: Path, mid: str, unit: str) -> UnitLease | None:
    return read(store, lambda t: leases.get(t, mid, unit))  # type: ignore[no-any-return]


def all_leases(store: Path, mid: str) -> list[UnitLease]:
    return read(store, lambda t: leases.list_leases(t, mid))  # type: ignore[no-any-return]


def alive(pid: int) -> bool:
    """Running (or stopped), not a zombie and not gone."""
    return process_running(pid)


def command_running(marker: str) -> bool:
    """A process whose command line holds `marker` (a test's own path: no other test's process matches)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def running_in(folder: Path) -> bool:
    """A process whose working folder is inside `folder` (a unit's agent, its commands and their children)."""
    inside = str(folder.resolve())
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(inside):
                return True
        except OSError:
            pass
    return False


def writes_blocked_by(store: Path, pid: int) -> bool:
    """Whether process `pid` holds up the store's writers: on LMDB, it holds (or waits at) the writer lock
    (F_GETLK, asked without writing); on PostgreSQL, a write by another process does not get through
    within a generous limit (a process stopped inside a transaction holds its row locks)."""
    if (store / "data.mdb").exists():
        fd = os.open(store / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            return pid in (holder_pid(fd, 0), holder_pid(fd, 1))  # the writer byte and the turnstile
        finally:
            os.close(fd)
    code = (
        "import sys; from keel.storage import Store; s = Store.open(sys.argv[1], create=False); "
        "s.write(lambda t: None); s.close()"
    )
    try:
        subprocess.run([sys.executable, "-c", code, str(store)], timeout=30, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        return True
    return False


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "person",
        "GIT_AUTHOR_EMAIL": "p@example.invalid",
        "GIT_COMMITTER_NAME": "person",
        "GIT_COMMITTER_EMAIL": "p@example.invalid",
    }
    return subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True, check=True, env=env).stdout


def checkout_fingerprint(repo: Path) -> dict[str, Any]:
    """Everything of the person's that a mission must never change: the working tree byte for byte,
    the index, HEAD, .git/config, their refs (keel's own `refs/heads/keel/` branches aside) and
    `git status --porcelain` (read last: status may refresh the index's stat cache)."""
    tree = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] != ".git" and path.is_file():
            tree[str(rel)] = path.read_bytes()
    dot = repo / ".git"
    out = {
        "tree": tree,
        "index": (dot / "index").read_bytes(),
        "HEAD": (dot / "HEAD").read_bytes(),
        "config": (dot / "config").read_bytes(),
        "refs": [
            line
            for line in git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
            if not line.startswith("refs/heads/keel/")
        ],
    }
    out["status"] = git(repo, "status", "--porcelain", "--untracked-files=all")
    return out


def wait_gone(pid: int, timeout: float) -> float:
    """Seconds until the process is gone; AssertionError after `timeout`."""
    start = time.monotonic()
    while alive(pid):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"process {pid} still alive after {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


def open_store(store: Path) -> Store:
    return Store.open(store, create=False)


def uncertain_effect(tmp_path: Path, units: list[dict[str, Any]], side: Path) -> tuple[Path, str]:
    """Run the mission until its `run` command has written its first line to `side`, kill the host there
    (the effect happened, no result is recorded), let the command end, and resume into the question the
    uncertain effect asks. Returns the store and the mission id."""
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: side.exists() and side.read_text() == "ran\n")  # the effect happened, no result yet
    kill(host)
    wait_for(lambda: not running_in(tmp_path), timeout=120)  # the command and the agent of the killed host end
    keel("resume", mid, store=store, check_rc=3)
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", question
    return store, mid
