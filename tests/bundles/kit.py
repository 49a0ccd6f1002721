"""Helpers for the bundle tests: git workspaces, mission files, the `keel` CLI as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.protocol.records import CheckpointManifest, MissionRecord
from keel.storage import Store, Txn
from keel.storage import missions as m

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}
BINARY = bytes(range(256)) * 3


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV}, timeout=60
    )
    assert proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout.strip()


def git_workspace(path: Path) -> str:
    """A repository with one commit (a text file and a binary file); returns the commit id."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    (path / "data.bin").write_bytes(BINARY)
    (path / "old.txt").write_text("to be deleted\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return git(path, "rev-parse", "HEAD")


def toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"


def write_mission(folder: Path, units: list[dict[str, Any]], workspace: str = "ws") -> Path:
    lines = [
        "[mission]",
        'name = "bundle-test"',
        'agent = "python -m keel.agents.scripted"',
        f"workspace = {toml(workspace)}",
    ]
    for unit in units:
        lines += ["", "[[units]]"] + [f"{k} = {toml(v)}" for k, v in unit.items()]
    path = folder / "mission.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def keel(
    *args: str, store: Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("KEEL_STORE", "KEEL_SIGNING_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def ok(proc: subprocess.CompletedProcess[str], rc: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == rc, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def read(store: Path, fn: Callable[[Txn], Any]) -> Any:
    with Store.open(store, create=False) as s:
        return s.read(fn)


def record(store: Path, mission_id: str) -> MissionRecord:
    return read(store, lambda t: m.get_mission(t, mission_id))  # type: ignore[no-any-return]


def head(store: Path, mission_id: str) -> CheckpointManifest | None:
    return read(store, lambda t: m.head_checkpoint(t, mission_id))  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def files(root: Path) -> dict[str, bytes]:
    """A sandbox's files (no .git), for comparing two runs."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def unit_results(store: Path, mission_id: str) -> dict[str, Any]:
    manifest = head(store, mission_id)
    assert manifest is not None
    return {uid: (mark.state.value, mark.result) for uid, mark in manifest.units.items()}


def store_snapshot(store: Path) -> list[tuple[str, bytes, bytes]]:
    """Every record of every database but the schema's, for 'nothing was written' checks."""
    from keel.storage import DB
    from keel.storage.location import store_exists

    def all_records(t: Txn) -> list[tuple[str, bytes, bytes]]:
        return [(db.value, k, v) for db in DB for k, v in t.scan_raw(db, b"")]

    if not store_exists(store):
        return []
    return [(db, k, v) for db, k, v in read(store, all_records) if (db, k) != ("meta", b"schema")]
