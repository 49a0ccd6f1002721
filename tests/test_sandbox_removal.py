"""Removing a sandbox keel made (files/merge.remove_sandbox, the one place it is done): whatever a killed
git left (a worktree locked while it was being made), the sandbox, its worktree entry and keel's branch go,
and nothing of the person's repository else — a worktree of theirs whose folder is away right now (another
disk, not mounted) keeps its entry: `git worktree prune` would drop it. Real git in tmp_path."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from keel.protocol.records import MissionRecord
from keel.protocol.spec import MissionSpec
from keel.protocol.states import MissionState
from keel.server.engine.files import merge
from keel.server.engine.units.unitgc import remove_mission_sandbox


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def worktrees(repo: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]  # fmt: skip


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A person's repository with a worktree of their own whose folder is away (moved off, as an unmounted
    disk's), and keel's sandbox of mission m1, locked as a killed `git worktree add` leaves it."""
    repo = tmp_path / "ws"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "-c", "user.name=p", "-c", "user.email=p@x", "commit", "-qm", "first")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "theirs"))
    (tmp_path / "theirs").rename(tmp_path / "theirs-away")
    git(repo, "worktree", "add", "-q", "-b", "keel/m1", str(tmp_path / "sandbox"))
    git(repo, "worktree", "lock", str(tmp_path / "sandbox"))
    return repo


def test_a_sandbox_goes_with_its_entry_and_branch_and_nothing_of_the_persons(repo: Path, tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    merge.remove_sandbox(sandbox, repo, "keel/m1")
    assert not sandbox.exists()
    assert worktrees(repo) == [str(repo), str(tmp_path / "theirs")]  # theirs is kept, though away
    assert branches(repo) == ["feature", "main"]


def test_a_deleted_missions_sandbox_leaves_the_persons_worktrees_alone(repo: Path, tmp_path: Path) -> None:
    """keel delete: the mission's own sandbox goes; its branch stays (the work is not lost)."""
    spec = MissionSpec(name="m", agent=("true",))
    now = time.time()
    record = MissionRecord(
        id="m1",
        spec=spec,
        state=MissionState.COMPLETED,
        created_at=now,
        updated_at=now,
        workspace=str(repo),
        sandbox=str(tmp_path / "sandbox"),
    )
    remove_mission_sandbox(tmp_path / "store", record)
    assert not (tmp_path / "sandbox").exists()
    assert worktrees(repo) == [str(repo), str(tmp_path / "theirs")]
    assert branches(repo) == ["feature", "keel/m1", "main"]


def test_a_copy_goes_with_its_base_record_and_a_relative_path_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "f.txt").write_text("x")
    merge.base_file(copy).write_text("{}")
    merge.remove_sandbox(copy)
    assert not copy.exists() and not merge.base_file(copy).exists()
    with pytest.raises(merge.SandboxError, match="not an absolute path"):
        merge.remove_sandbox(Path("relative"))
