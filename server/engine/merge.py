"""Unit sandboxes and merging: each running unit works in its own folder, merged into the mission's.

A unit's sandbox is a git worktree on its own branch `keel/<mission>-units/<lane>`, made from the
mission branch as it is when the unit starts (so it sees the merged work of the units it depends on),
or a copy of the mission sandbox when the workspace is not a git repository. A finished unit's changes
are committed on its branch and merged into the mission branch; a copy is merged file by file against
the digests it started from. A conflict merges nothing and is reported to the caller, which asks the
person. Everything happens inside keel's own worktrees: the person's checkout, index, branches and
.git/config are never written (git identity comes from the environment, never from `git config`).
A git command that fails for want of space is a DiskFullError (the mission pauses), never a conflict.
Depends on the engine's sandbox and checkpoint helpers only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from keel.protocol.diskspace import disk_full, nearly_full, says_no_space
from keel.server.engine.checkpoint import _file_digest
from keel.server.engine.sandbox import SandboxError, _keel_files

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "keel", "GIT_AUTHOR_EMAIL": "keel@localhost",
                "GIT_COMMITTER_NAME": "keel", "GIT_COMMITTER_EMAIL": "keel@localhost"}


class MergeConflict(SandboxError):
    """A unit's changes collide with what the mission branch got meanwhile."""

    def __init__(self, unit: str, paths: list[str]) -> None:
        super().__init__(f"unit {unit}'s changes conflict with the mission branch in "
                         f"{', '.join(paths[:10]) or 'some files'}")
        self.paths = paths


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**os.environ, **GIT_IDENTITY})
    if check and proc.returncode != 0:
        _raise_if_disk_full(cwd, proc)
        raise SandboxError(f"git {' '.join(args[:3])} in {cwd} failed: {proc.stderr.strip()[:500]}")
    return proc


def _raise_if_disk_full(cwd: Path, proc: subprocess.CompletedProcess[str]) -> None:
    """A failed git command that says "No space left" (or ran on an all but full filesystem) is a full
    disk, not a unit failure or a merge conflict."""
    output = f"{proc.stderr}\n{proc.stdout}"
    if says_no_space(output) or nearly_full(cwd):
        lines = [line for line in output.splitlines() if says_no_space(line)] or output.strip().splitlines()[-1:]
        raise disk_full(cwd, f"git {' '.join(str(a) for a in proc.args[1:3])}: {' '.join(lines)[:300]}",
                        "the sandbox")


def is_git(sandbox: Path) -> bool:
    return (sandbox / ".git").is_file()  # keel's sandboxes are worktrees: .git is a link file


def _raise_if_no_space(path: Path, exc: OSError) -> None:
    if says_no_space(exc):
        raise disk_full(path, str(exc)[:300], "the sandbox") from None


def unit_branch(mission_id: str, lane: str) -> str:
    return f"keel/{mission_id}-units/{lane.replace('#', '-e')}"


def _base_file(target: Path) -> Path:
    return target.parent / f"{target.name}.base.json"


def create(mission_sandbox: Path, target: Path, branch: str) -> str:
    """A fresh sandbox for a unit (an old one at `target` is removed); returns its base."""
    discard(mission_sandbox, target, branch)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_git(mission_sandbox):
        commit_pending(mission_sandbox)
        git(mission_sandbox, "worktree", "add", "--force", "-B", branch, str(target), "HEAD")
        return git(target, "rev-parse", "HEAD").stdout.strip()
    try:
        shutil.copytree(mission_sandbox, target, symlinks=True, ignore=_keel_files(mission_sandbox))
        base = file_digests(target)
        _base_file(target).write_text(json.dumps(base, sort_keys=True))
    except OSError as exc:
        _raise_if_no_space(target, exc)
        raise
    return "copy"


def commit_pending(mission_sandbox: Path) -> None:
    """Files the mission sandbox holds but its branch does not (a restore with files or a fork put them
    there) are committed on the mission branch, so a unit sandbox made from HEAD starts from them."""
    git(mission_sandbox, "add", "-A")
    if git(mission_sandbox, "diff", "--cached", "--quiet", check=False).returncode != 0:
        git(mission_sandbox, "commit", "-q", "--no-verify", "-m", "keel: mission files as restored")


def discard(mission_sandbox: Path, target: Path, branch: str) -> None:
    if is_git(mission_sandbox):
        git(mission_sandbox, "worktree", "remove", "--force", str(target), check=False)
        git(mission_sandbox, "worktree", "prune", check=False)
        git(mission_sandbox, "branch", "-D", branch, check=False)
    if target.exists():
        shutil.rmtree(target)
    _base_file(target).unlink(missing_ok=True)


def commit_unit(target: Path, unit: str) -> str:
    """Commit a finished unit's changes on its branch; returns the commit ('' for a copy)."""
    if not (target / ".git").is_file():
        return ""
    git(target, "add", "-A")
    if git(target, "diff", "--cached", "--quiet", check=False).returncode != 0:
        git(target, "commit", "-q", "--no-verify", "-m", f"keel: unit {unit}")
    return git(target, "rev-parse", "HEAD").stdout.strip()


def merge_unit(mission_sandbox: Path, target: Path, unit: str, commit: str) -> None:
    """Merge a finished unit into the mission sandbox (idempotent); MergeConflict merges nothing."""
    if is_git(mission_sandbox):
        if git(mission_sandbox, "merge-base", "--is-ancestor", commit, "HEAD", check=False).returncode == 0:
            return
        proc = git(mission_sandbox, "merge", "--no-ff", "--no-edit", "-m", f"keel: merge unit {unit}", commit,
                   check=False)
        if proc.returncode != 0:
            paths = git(mission_sandbox, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
            git(mission_sandbox, "merge", "--abort", check=False)
            if not paths:
                _raise_if_disk_full(mission_sandbox, proc)
            raise MergeConflict(unit, paths)
        return
    try:
        _merge_copy(mission_sandbox, target, unit)
    except OSError as exc:
        _raise_if_no_space(mission_sandbox, exc)
        raise


def carry(mission_sandbox: Path, target: Path, unit: str, commit: str = "") -> None:
    """Bring a unit's work so far, finished or not, into the mission sandbox: committed on its branch
    first (git), then merged like a finished unit's (idempotent); MergeConflict merges nothing."""
    if target.is_dir():
        merge_unit(mission_sandbox, target, unit, commit or commit_unit(target, unit))


def _merge_copy(mission_sandbox: Path, target: Path, unit: str) -> None:
    base = json.loads(_base_file(target).read_text())
    mine = file_digests(target)
    theirs = file_digests(mission_sandbox)
    changes, conflicts = [], []
    for rel in sorted(set(base) | set(mine)):
        if base.get(rel) == mine.get(rel) or theirs.get(rel) == mine.get(rel):
            continue
        if theirs.get(rel) != base.get(rel):
            conflicts.append(rel)
        changes.append(rel)
    if conflicts:
        raise MergeConflict(unit, conflicts)
    for rel in changes:
        dest = mission_sandbox / rel
        if rel not in mine:
            dest.unlink(missing_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".keel-merge")
        shutil.copy2(target / rel, tmp, follow_symlinks=False)
        os.replace(tmp, dest)


def file_digests(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".keel", "__pycache__")]
        for name in filenames:
            if not name.endswith((".keel-tmp", ".keel-merge")):
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = _file_digest(path)
    return out
