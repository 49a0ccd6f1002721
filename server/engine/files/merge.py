"""Unit sandboxes and merging: each running unit works in its own folder, merged into the mission's.

A unit's sandbox is a git worktree on its own branch `keel/<mission>-units/<lane>`, made from the
mission branch as it is when the unit starts (so it sees the merged work of the units it depends on),
or a copy of the mission sandbox when the workspace is not a git repository. A finished unit's changes
are committed on its branch and merged into the mission branch; a copy is merged file by file against
the digests it started from. A conflict merges nothing and is reported to the caller, which asks the
person. Everything happens inside keel's own worktrees: the person's checkout, index, branches and
.git/config are never written (git identity comes from the environment, never from `git config`).
A git command that fails for want of space is a DiskFullError (the mission pauses), never a conflict.
Depends on the engine's sandbox and trees modules and on keel.server.gitrun only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from keel.protocol.diskspace import disk_full, failed_for_space, free_or_none, says_no_space
from keel.protocol.treepaths import GIT_EXCLUDE_TEMPS, is_temp, temp_name
from keel.server import gitrun
from keel.server.engine.files import trees
from keel.server.engine.files.sandbox import SandboxError, _keel_files, worktree_git_dir


class MergeConflict(SandboxError):
    """A unit's changes collide with what the mission branch got meanwhile."""

    def __init__(self, unit: str, paths: list[str]) -> None:
        super().__init__(
            f"unit {unit}'s changes conflict with the mission branch in {', '.join(paths[:10]) or 'some files'}"
        )
        self.paths = paths


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """git in keel's own worktree `cwd`, as keel (gitrun.IDENTITY); with `check`, a failure that is not
    a full disk is a SandboxError naming git's message."""

    def failed(message: str) -> SandboxError:
        return SandboxError(f"git {' '.join(args[:3])} in {cwd} failed: {message}")

    return gitrun.run(cwd, *args, env=gitrun.IDENTITY, fail=failed if check else None)


def is_git(sandbox: Path) -> bool:
    return (sandbox / ".git").is_file()  # keel's sandboxes are worktrees: .git is a link file


def _raise_if_no_space(path: Path, exc: OSError) -> None:
    if says_no_space(exc):
        raise disk_full(path, str(exc)[:300], "the sandbox") from None


def unit_branch(mission_id: str, lane: str) -> str:
    return f"keel/{mission_id}-units/{lane.replace('#', '-e')}"


def base_file(target: Path) -> Path:
    """A copied unit sandbox's record of the file digests it started from (next to the folder)."""
    return target.parent / f"{target.name}.base.json"


def create(mission_sandbox: Path, target: Path, branch: str) -> str:
    """A fresh sandbox for a unit (an old one at `target` is removed); returns its base commit ("" for a copy,
    whose base is the file digests kept next to it: `base_file`). A git sandbox is
    made without its files: `check_out` writes them, outside the lock on the mission sandbox, so that the
    units starting together write theirs at the same time."""
    remove_sandbox(target, mission_sandbox, branch)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_git(mission_sandbox):
        commit_pending(mission_sandbox)
        git(
            mission_sandbox, "worktree", "add", "--no-checkout", "--force", "--force", "-B", branch, str(target), "HEAD"
        )
        return git(target, "rev-parse", "HEAD").stdout.strip()
    try:
        shutil.copytree(mission_sandbox, target, symlinks=True, ignore=_keel_files(mission_sandbox))
        base = file_digests(target)
        base_file(target).write_text(json.dumps(base, sort_keys=True))
    except OSError as exc:
        _raise_if_no_space(target, exc)
        raise
    return ""


def check_out(target: Path) -> None:
    """Write a unit's git sandbox's files and index from its HEAD (a no-op for a copy), with as many
    workers as cores (git's parallel checkout): a unit's start is mostly this. A checkout that fails where
    there is less room than its files need failed for want of space: git removes the file it could not
    write, leaving room behind, and may only say it was "unable to write" it."""
    if not is_git(target):
        return
    try:
        git(target, "-c", "checkout.workers=0", "reset", "-q", "--hard", "HEAD")
    except SandboxError as exc:
        if why := failed_for_space(exc.message, free_or_none(target), checkout_bytes(target)):
            raise disk_full(target, f"{exc.message} ({why})", "the sandbox") from None
        raise


def checkout_bytes(sandbox: Path) -> int:
    """The bytes of the files of the worktree's HEAD (0 when git cannot say)."""
    proc = git(sandbox, "ls-tree", "-r", "-l", "-z", "HEAD", check=False)
    if proc.returncode != 0:
        return 0
    total = 0
    for entry in proc.stdout.split("\0"):
        fields = entry.split(None, 4)  # mode, type, object, size (- for a submodule), path
        if len(fields) == 5 and fields[3].isdigit():
            total += int(fields[3])
    return total


def commit_pending(mission_sandbox: Path) -> None:
    """Files the mission sandbox holds but its branch does not (a restore with files or a fork put them
    there) are committed on the mission branch, so a unit sandbox made from HEAD starts from them."""
    commit_all(mission_sandbox, "keel: mission files as restored")


def commit_all(sandbox: Path, message: str) -> None:
    """Commit everything the worktree holds that its branch does not (nothing when nothing changed)."""
    git(sandbox, "add", "-A", "--", ".", GIT_EXCLUDE_TEMPS)  # a temporary file a killed write left is no change
    if git(sandbox, "diff", "--cached", "--quiet", check=False).returncode != 0:
        git(sandbox, "commit", "-q", "--no-verify", "-m", message)


def remove_sandbox(target: Path, repo: Path | None = None, branch: str = "") -> None:
    """Remove a sandbox keel made — a unit's, or a mission's own — whatever state a killed process left it
    in: the one place a sandbox is removed. A git worktree leaves through git, run in `repo` (the top of a
    checkout of its repository, or one of keel's worktrees of it; None or no git there: a copy): unlocked
    and removed; what git left is deleted, and its admin entry with it — only that entry, never `git
    worktree prune`, which would also drop the person's own worktrees whose folders are away right now;
    then keel's `branch`, when named. A copy goes with the record of the digests it started from
    (`base_file`). Never a relative path (that would be wherever this process runs)."""
    if not target.is_absolute():
        raise SandboxError(f"refusing to remove sandbox {str(target)!r}: not an absolute path")
    git_repo = repo if repo is not None and (repo / ".git").exists() else None
    if git_repo is not None and target.exists():  # a folder that is gone: only its admin entry is left (below)
        clear_stale_locks(target)
        admin = worktree_git_dir(target)
        if admin is None or (admin / "locked").exists():
            git(git_repo, "worktree", "unlock", str(target), check=False)
        git(git_repo, "worktree", "remove", "--force", "--force", str(target), check=False)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    if git_repo is not None:
        _forget_worktree(git_repo, target)
        if branch and _may_have_branch(git_repo, branch):
            _clear_ref_lock(git_repo, branch)
            git(git_repo, "branch", "-D", branch, check=False)
    base_file(target).unlink(missing_ok=True)


# -- repairing git state a killed process left behind ---------------------------------------------------
# keel owns its worktrees: when no keel process works in one (a host starting after a crash, a worker
# starting in its unit's sandbox), a lock file in it can only be left by a process that was killed.
_WORKTREE_LOCKS = ("index.lock", "HEAD.lock", "ORIG_HEAD.lock", "AUTO_MERGE.lock", "MERGE_HEAD.lock")
_MERGE_STATE = ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "AUTO_MERGE")


def clear_stale_locks(sandbox: Path) -> list[str]:
    """Remove the lock files a killed git left in keel's own worktree `sandbox`; returns what it removed.
    Only call it when no keel process can be running git there."""
    gitdir = worktree_git_dir(sandbox)
    if gitdir is None or not gitdir.is_dir():
        return []
    removed = []
    for name in _WORKTREE_LOCKS:
        lock = gitdir / name
        if lock.exists():
            lock.unlink(missing_ok=True)
            removed.append(str(lock))
    return removed


def _common_dir(mission_sandbox: Path) -> Path | None:
    """The repository's own git folder, from one of its worktrees or the top of its main checkout."""
    if (mission_sandbox / ".git").is_dir():
        return mission_sandbox / ".git"
    gitdir = worktree_git_dir(mission_sandbox)
    if gitdir is None:
        return None
    common = gitdir / "commondir"
    try:
        return (gitdir / common.read_text().strip()).resolve() if common.exists() else gitdir.parent.parent
    except OSError:
        return None


def _clear_ref_lock(mission_sandbox: Path, branch: str) -> None:
    """A `refs/heads/keel/….lock` of one of keel's own branches, left by a killed `git branch`/`commit`."""
    common = _common_dir(mission_sandbox)
    if common is not None and branch.startswith("keel/"):
        for base in (common, common / "logs"):
            (base / "refs" / "heads" / f"{branch}.lock").unlink(missing_ok=True)


def _may_have_branch(mission_sandbox: Path, branch: str) -> bool:
    """False only when the repository surely has no such branch (no ref file, not in packed-refs, not a lock
    a killed git left): a unit's first start has nothing of its own to delete."""
    common = _common_dir(mission_sandbox)
    if common is None or not (common / "refs").is_dir() or (common / "reftable").exists():
        return True
    if any(
        (base / "refs" / "heads" / f"{branch}{tail}").exists()
        for base in (common, common / "logs")
        for tail in ("", ".lock")
    ):
        return True
    try:
        with open(common / "packed-refs", "rb") as packed:
            return f" refs/heads/{branch}\n".encode() in packed.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _forget_worktree(mission_sandbox: Path, target: Path) -> None:
    """Drop git's entry for keel's worktree at `target` when `git worktree remove` could not (its folder
    is gone, or a killed `git worktree add` left it locked "initializing"). Only that entry: `git worktree
    prune` would also drop the person's own worktrees whose folders are not there right now."""
    common = _common_dir(mission_sandbox)
    if common is None or not (common / "worktrees").is_dir():
        return
    for admin in (common / "worktrees").iterdir():
        try:
            points_at = Path((admin / "gitdir").read_text().strip()).parent
        except OSError:
            continue
        if points_at == target and not (target / ".git").is_file():
            shutil.rmtree(admin, ignore_errors=True)


def settle(mission_sandbox: Path, *, keep_changes: bool = False) -> list[str]:
    """Bring the mission sandbox back to a state git operations can start from after a crash: stale
    locks removed, an interrupted merge forgotten, and, unless `keep_changes` (files a restore put
    there, to be committed), uncommitted leftovers of an interrupted merge reset to the mission branch.
    The mission branch itself is never moved. Returns the paths it reset (for the evidence)."""
    if not is_git(mission_sandbox):
        return []
    clear_stale_locks(mission_sandbox)
    gitdir = worktree_git_dir(mission_sandbox)
    if gitdir is not None:
        for name in _MERGE_STATE:
            (gitdir / name).unlink(missing_ok=True)
    if keep_changes:
        return []
    dirty = git(mission_sandbox, "status", "--porcelain", "--untracked-files=all", check=False).stdout
    paths = [line[3:] for line in dirty.splitlines() if line.strip()]
    if paths:
        git(mission_sandbox, "reset", "-q", "--hard", "HEAD")
        git(mission_sandbox, "clean", "-fdq")
    return paths


def commit_unit(target: Path, unit: str) -> str:
    """Commit a finished unit's changes on its branch; returns the commit ('' for a copy)."""
    if not (target / ".git").is_file():
        return ""
    commit_all(target, f"keel: unit {unit}")
    return git(target, "rev-parse", "HEAD").stdout.strip()


def merge_unit(mission_sandbox: Path, target: Path, unit: str, commit: str) -> None:
    """Merge a finished unit into the mission sandbox (idempotent: a merge a crash interrupted is made
    again once the host has `settle`d the sandbox). Only files changed on both sides raise MergeConflict
    (and merge nothing); a git failure that is not a conflict is a SandboxError naming git's message."""
    copy = base_file(target).exists()  # a copy, or a unit sandbox made again on another machine (moving.py)
    if is_git(mission_sandbox) and not copy:
        if git(mission_sandbox, "merge-base", "--is-ancestor", commit, "HEAD", check=False).returncode == 0:
            return
        proc = git(
            mission_sandbox, "merge", "--no-ff", "--no-edit", "-m", f"keel: merge unit {unit}", commit, check=False
        )
        if proc.returncode != 0:
            paths = git(mission_sandbox, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
            git(mission_sandbox, "merge", "--abort", check=False)
            if paths:
                raise MergeConflict(unit, paths)
            if full := gitrun.full_filesystem_path(mission_sandbox, f"{proc.stderr}\n{proc.stdout}", any_failure=True):
                raise disk_full(full, f"git merge: {(proc.stderr or proc.stdout).strip()[:300]}")
            raise SandboxError(
                f"git merge of unit {unit} ({commit[:12]}) into {mission_sandbox} failed: "
                f"{(proc.stderr or proc.stdout).strip()[:500]}"
            )
        return
    try:
        _merge_copy(mission_sandbox, target, unit)
    except OSError as exc:
        _raise_if_no_space(mission_sandbox, exc)
        raise
    if is_git(mission_sandbox):  # committed at once: uncommitted changes would be reset as a killed merge's
        commit_all(mission_sandbox, f"keel: merge unit {unit}")


def carry(mission_sandbox: Path, target: Path, unit: str, commit: str = "") -> None:
    """Bring a unit's work so far, finished or not, into the mission sandbox: committed on its branch
    first (git), then merged like a finished unit's (idempotent); MergeConflict merges nothing. What was
    carried is then the unit's base: its later work merges onto it (git: the merge is the new merge base;
    a copy: its base file names the carried files)."""
    if not target.is_dir():
        return
    merge_unit(mission_sandbox, target, unit, commit or commit_unit(target, unit))
    if base_file(target).exists():
        tmp = base_file(target).with_suffix(".keel-tmp")
        tmp.write_text(json.dumps(file_digests(target), sort_keys=True))
        os.replace(tmp, base_file(target))


def _merge_copy(mission_sandbox: Path, target: Path, unit: str) -> None:
    base = json.loads(base_file(target).read_text())
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
        tmp = temp_name(dest)
        try:
            shutil.copy2(target / rel, tmp, follow_symlinks=False)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def file_digests(root: Path) -> dict[str, str]:
    """Each file of a copy sandbox with its short digest (trees.walk's rules; caches and keel's temporary
    files left out): what a copy's base file records and its merge compares."""
    return {
        rel: trees.file_digest(data)
        for rel, mode, full, _ in trees.walk(root)
        if counts(rel) and (data := trees.read_content(full, mode)) is not None
    }


def counts(rel: str) -> bool:
    """A file a copy sandbox's merge compares (caches and keel's temporary files do not count)."""
    return "__pycache__" not in rel.split("/") and not is_temp(rel.rpartition("/")[2])
