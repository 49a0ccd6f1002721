"""Fork leaves the original exactly as it was and runs on its own; apply brings a result into the
person's working tree (or a new branch), refusing on conflicting local edits and naming the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundles.kit import BINARY, git, keel, ok, record
from tests.rewind.kit import (
    AFTER_U1,
    AFTER_U2,
    checkout,
    mission,
    mission_records,
    point_after,
    points,
    run,
    sandbox_files,
)

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_fork_leaves_the_original_identical_and_runs_on_its_own(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    original = mission_records(store, mid)
    sandbox = Path(record(store, mid).sandbox)
    person = checkout(ws)
    p_u1 = point_after(store, mid, "unit succeeded: u1")

    forked = json.loads(ok(keel("fork", mid, p_u1, "--json", store=store)).stdout)
    fid = forked["mission"]
    assert fid != mid and forked["forked_from"] == f"{mid}:{p_u1}" and forked["state"] == "paused"
    assert mission_records(store, mid) == original  # points, journal, events, state: byte for byte
    assert sandbox_files(sandbox) == AFTER_U2
    fork_box = Path(forked["sandbox"])
    assert fork_box != sandbox and sandbox_files(fork_box) == AFTER_U1
    assert git(fork_box, "rev-parse", "--abbrev-ref", "HEAD") == f"keel/{fid}"
    assert checkout(ws) == person

    ok(keel("resume", fid, "--plain", store=store))
    assert record(store, fid).state.value == "completed"
    assert sandbox_files(fork_box) == AFTER_U2
    assert mission_records(store, mid) == original
    assert sandbox_files(sandbox) == AFTER_U2
    assert checkout(ws) == person
    # the fork's history starts at the point: the diff from the original's point is the fork's own work
    fork_points = points(store, fid)
    assert fork_points[0]["reason"] == f"forked from {mid} {p_u1}"
    assert ok(keel("verify", store=store)).returncode == 0


def test_apply_refuses_conflicts_naming_files_then_applies_uncommitted(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    head = git(ws, "rev-parse", "HEAD")
    (ws / "README.md").write_text("my own edit\n")
    (ws / "b.txt").write_text("mine too\n")
    (ws / "unrelated.txt").write_text("not the mission's business\n")
    before = checkout(ws)
    refused = keel("apply", mid, store=store)
    assert refused.returncode == 2, refused.stderr
    assert "README.md, b.txt" in refused.stderr and "unrelated" not in refused.stderr
    assert checkout(ws) == before  # nothing written

    git(ws, "checkout", "--", "README.md")
    (ws / "b.txt").unlink()
    ok(keel("apply", mid, store=store))
    status = _status(ws)
    assert status == [" D old.txt", " M README.md", "?? a.txt", "?? b.txt", "?? sub/s.txt", "?? unrelated.txt"]
    assert git(ws, "rev-parse", "HEAD") == head  # uncommitted: no commit, no branch moved
    tracked = {p: (ws / p).read_bytes() for p in AFTER_U2}
    assert tracked == AFTER_U2 and (ws / "data.bin").read_bytes() == BINARY
    # applying again changes nothing (the files already are the result)
    ok(keel("apply", mid, store=store))
    assert _status(ws) == status


def test_apply_to_a_branch_leaves_the_working_tree_alone(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    (ws / "README.md").write_text("uncommitted edit the branch must not see\n")
    before = checkout(ws)
    out = json.loads(ok(keel("apply", mid, "--branch", "from-keel", "--json", store=store)).stdout)
    assert checkout(ws)["files"] == before["files"] and checkout(ws)["status"] == before["status"]
    assert git(ws, "rev-parse", "HEAD") == before["head"]
    assert git(ws, "rev-parse", "from-keel") == out["commit"]
    assert git(ws, "rev-parse", "from-keel^") == before["head"]
    assert sorted(git(ws, "ls-tree", "-r", "--name-only", "from-keel").splitlines()) == sorted(AFTER_U2)
    assert git(ws, "show", "from-keel:a.txt") + "\n" == AFTER_U2["a.txt"].decode()
    assert git(ws, "ls-tree", "from-keel", "sub/s.txt").startswith("100755")
    again = keel("apply", mid, "--branch", "from-keel", store=store)
    assert again.returncode == 2 and "already exists" in again.stderr


def _status(ws: Path) -> list[str]:
    return sorted(run(["git", "status", "--porcelain", "--untracked-files=all"], ws).stdout.splitlines())


def test_apply_without_git_brings_what_the_agent_wrote_not_its_commands_build_caches(tmp_path: Path) -> None:
    from tests.rewind.kit import mission_toml

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "m.py").write_text("X = 1\n")
    cmd = "python3 -m py_compile m.py && mkdir -p .pytest_cache && echo v > .pytest_cache/v && echo made > out.txt"
    units = [{"id": "u1", "params": {"steps": [{"tool": "run", "args": {"cmd": cmd}}]}}]
    (tmp_path / "mission.toml").write_text(mission_toml(units))
    store = tmp_path / "store"
    ok(keel("run", str(tmp_path / "mission.toml"), "--plain", store=store))
    mid = json.loads(ok(keel("missions", "--json", store=store)).stdout)[0]["id"]
    sandbox = Path(record(store, mid).sandbox)
    assert (sandbox / ".pytest_cache" / "v").exists(), "the command must have left a build cache"
    out = json.loads(ok(keel("apply", mid, "--json", store=store)).stdout)
    assert out["added"] == ["out.txt"], out
    assert sorted(p.name for p in ws.iterdir()) == ["m.py", "out.txt"]
