"""The mission's own folder: a git worktree on branch keel/<id>, or a copy when there is no git repo.

The person's working tree, index and branches are never changed: `git worktree add -b keel/<id>` only
adds a branch and a worktree entry. A copy leaves out `.keel` (keel's own state). Depends on nothing in
keel but the error types and keel.server.gitrun.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from keel.protocol.diskspace import disk_full, says_no_space
from keel.protocol.errors import ErrorCode, KeelError
from keel.server import gitrun
from keel.storage.location import store_exists


class SandboxError(KeelError):
    code = ErrorCode.TOOL


def git_toplevel(workspace: Path) -> Path | None:
    if shutil.which("git") is None:
        return None
    proc = gitrun.run(workspace, "rev-parse", "--show-toplevel")
    if proc.returncode != 0:
        return None
    top = Path(proc.stdout.strip())
    # an empty repository (no commit yet) has nothing to branch from: treat it as a plain folder
    return top if gitrun.run(top, "rev-parse", "--verify", "-q", "HEAD").returncode == 0 else None


def ensure_sandbox(workspace: Path, target: Path, mission_id: str) -> Path:
    """Create the sandbox once; an existing one (a resumed mission) is used as it is, unless a killed
    `git worktree add` left it half made (then it is made again from the mission branch, which holds
    all of the mission's committed work). A copy is made beside the target and renamed into place, so a
    half-made copy is never taken for the sandbox."""
    if target.exists() and any(target.iterdir()) and not _half_made(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    top = git_toplevel(workspace)
    if top is not None:
        if target.exists():
            shutil.rmtree(target)
        branch = f"keel/{mission_id}"
        exists = gitrun.run(top, "rev-parse", "--verify", "-q", f"refs/heads/{branch}").returncode == 0
        # -f -f: a worktree entry a killed `git worktree add` left locked at this path is taken over
        args = (
            ["worktree", "add", "--force", "--force", str(target), branch]
            if exists
            else ["worktree", "add", "--force", "--force", "-b", branch, str(target), "HEAD"]
        )
        gitrun.run(
            top, *args, fail=lambda message: SandboxError(f"cannot create the sandbox worktree {target}: {message}")
        )
        return target
    partial = target.with_name(target.name + ".keel-partial")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        shutil.copytree(workspace, partial, symlinks=True, ignore=_keel_files(target))
    except OSError as exc:
        if says_no_space(exc):
            raise disk_full(target, str(exc)[:300], "the sandbox") from None
        raise
    if target.exists():
        target.rmdir()  # empty: a non-empty one was returned above
    partial.rename(target)
    return target


def worktree_git_dir(sandbox: Path) -> Path | None:
    """A worktree's own git folder (`.git/worktrees/<name>`), read from its `.git` link file; None when
    `sandbox` has no such link."""
    link = sandbox / ".git"
    try:
        text = link.read_text(errors="replace") if link.is_file() else ""
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    path = Path(text.split(":", 1)[1].strip())
    return path if path.is_absolute() else (sandbox / path).resolve()


def _half_made(target: Path) -> bool:
    """A git worktree whose creation was killed: its admin folder is gone or still locked
    "initializing", or it has no checked-out HEAD."""
    if not (target / ".git").is_file():
        return False
    admin = worktree_git_dir(target)
    if admin is None or not admin.is_dir():
        return True
    locked = admin / "locked"
    if locked.exists() and locked.read_text(errors="replace").strip() == "initializing":
        return True
    return gitrun.run(target, "rev-parse", "--verify", "-q", "HEAD").returncode != 0


def _keel_files(target: Path) -> Callable[[str, list[str]], set[str]]:
    """What a copied sandbox leaves out: `.keel`, and keel's own folders wherever the store was put
    (a store given with --store may sit inside the workspace: copying it, or the sandboxes folder the
    copy goes into, would copy keel into itself)."""
    keel_dir = target.parent.parent.resolve()
    own = {keel_dir / name for name in ("sandboxes", "logs", "locks")}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == ".keel"}
        for name in names:
            path = Path(folder, name)
            if path.resolve() in own or store_exists(path):
                skipped.add(name)
        return skipped

    return ignore
