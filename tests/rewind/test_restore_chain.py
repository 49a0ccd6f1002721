"""Restores of restores: a lane is never reused, so a replay only ever sees entries up to its point.

The mission: a, b and c in parallel, then d after all three; c writes in several steps and deletes a file,
d gathers everything. Every step is a restore point (policy every-step), so points fall inside units."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bundles.kit import git, git_workspace, keel, ok, record, toml
from tests.rewind.kit import points, sandbox_files

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

UNITS: list[dict[str, Any]] = [
    {"id": "a", "params": {"steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}}]}},
    {"id": "b", "params": {"steps": [{"tool": "write_file", "args": {"path": "b.txt", "content": "b\n"}}]}},
    {
        "id": "c",
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "c.txt", "content": "c1\n"}},
                {"tool": "run", "args": {"cmd": "rm old.txt && echo c2 >> c.txt"}},
                {"tool": "write_file", "args": {"path": "c2.txt", "content": "two\n"}},
                {"tool": "run", "args": {"cmd": "echo c3 >> c.txt"}},
            ]
        },
    },
    {
        "id": "d",
        "after": ["a", "b", "c"],
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "d.txt", "content": "d\n"}},
                {"tool": "run", "args": {"cmd": "cat a.txt b.txt c.txt d.txt > all.txt"}},
            ]
        },
    },
]


def _mission(tmp: Path) -> tuple[Path, str]:
    git_workspace(tmp / "ws")
    lines = ["[mission]", 'name = "chain"', 'agent = "python -m keel.agents.scripted"', 'workspace = "ws"']
    lines += ["", "[checkpoint]", 'policy = "every-step"']
    for unit in UNITS:
        lines += ["", "[[units]]"] + [f"{k} = {toml(v)}" for k, v in unit.items()]
    (tmp / "mission.toml").write_text("\n".join(lines) + "\n")
    store = tmp / "store"
    ok(keel("run", str(tmp / "mission.toml"), "--plain", store=store))
    missions = json.loads(ok(keel("missions", "--json", store=store)).stdout)
    return store, str(missions[0]["id"])


def _restore_and_resume(store: Path, mid: str, point: str) -> None:
    ok(keel("restore", mid, point, "--files", store=store))
    ok(keel("resume", mid, "--plain", store=store, timeout=120))


def test_a_restore_to_a_point_a_restore_made_replays_only_what_that_point_holds(tmp_path: Path) -> None:
    store, mid = _mission(tmp_path)
    sandbox = Path(record(store, mid).sandbox)
    undisturbed = sandbox_files(sandbox)
    assert undisturbed["all.txt"] == b"a\nb\nc1\nc2\nc3\nd\n" and "old.txt" not in undisturbed
    first_run = [p["id"] for p in sorted(points(store, mid), key=lambda p: p["time"])]
    reasons = {p["id"]: p["reason"] for p in points(store, mid)}
    s = next(p for p in first_run if reasons[p] == "unit succeeded: a")

    _restore_and_resume(store, mid, s)
    r = next(p["id"] for p in points(store, mid) if p["reason"] == f"restored to {s}")
    assert sandbox_files(sandbox) == undisturbed
    for p in first_run[first_run.index(s) + 1 :]:  # every later point of the first run, restored and resumed
        _restore_and_resume(store, mid, p)
        assert sandbox_files(sandbox) == undisturbed, f"after restoring {p} ({reasons[p]})"

    _restore_and_resume(store, mid, r)
    assert record(store, mid).state.value == "completed"
    assert sandbox_files(sandbox) == undisturbed
    ok(keel("verify", store=store))


def test_gc_removes_the_sandboxes_and_branches_of_lanes_a_restore_superseded(tmp_path: Path) -> None:
    store, mid = _mission(tmp_path)
    s = next(p["id"] for p in points(store, mid) if p["reason"] == "unit succeeded: a")
    _restore_and_resume(store, mid, s)
    ws = tmp_path / "ws"
    units = store.parent / "sandboxes" / f"{mid}-units"
    if not units.is_dir():  # a PostgreSQL store's folder holds no files: keel's files are under the workspace
        units = ws / ".keel" / "sandboxes" / f"{mid}-units"
    before = sorted(p.name for p in units.iterdir())
    assert any("-e" not in name for name in before), f"the first run's lanes are there: {before}"

    first = json.loads(ok(keel("gc", "--json", store=store)).stdout)["units"]
    removed = {(item["kind"], Path(item["name"]).name) for item in first["removed"]}
    listed = {(("base record", n) if n.endswith(".base.json") else ("sandbox", n)) for n in before}
    assert listed <= removed, first
    assert first["kept"] == []
    assert not units.exists() or not any(units.iterdir())
    branches = git(ws, "for-each-ref", "--format=%(refname)", f"refs/heads/keel/{mid}-units/")
    assert branches == "", branches

    again = json.loads(ok(keel("gc", "--json", store=store)).stdout)["units"]
    assert again["removed"] == [] and again["kept"] == []
    ok(keel("resume", mid, "--plain", store=store))  # a completed mission: nothing to do, nothing missing
    ok(keel("verify", store=store))
