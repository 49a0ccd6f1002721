"""A mission sandbox's files, carried in a bundle: captured on export, rebuilt on import.

In a git repository the sandbox is a worktree on branch keel/<id>; what a bundle carries is a binary
patch of the sandbox's whole working tree (untracked files included, ignored files not) against the
commit the sandbox was created from (the base). The patch is made with a temporary index, so the
sandbox's own index is never touched. Without git the sandbox is a copy, and a bundle carries every
file. Import re-creates the sandbox under the importing store (`git worktree add` at the base, then
`git apply --binary`), checking every path first. Depends on storage/bundle.py and keel.server.gitrun; of
the mission engine only on the removal of a sandbox (files/merge.remove_sandbox: the one place that is done).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from keel.protocol.errors import KeelError
from keel.protocol.treepaths import CONFIG, GIT_EXCLUDE_TEMPS, KEEL_DIR, is_temp
from keel.server import gitrun
from keel.server.engine.files import merge
from keel.server.engine.files.sandbox import git_toplevel
from keel.storage.bundle import (
    PATCH_KEY,
    WORKSPACE_DB,
    Bundle,
    BundleError,
    WorkspaceSection,
    check_relative_path,
    snapshot_bases,
)

_SKIP = (".git", ".keel")


def _excludes(sandbox: Path) -> list[str]:
    """What a `git add` of the sandbox's files leaves out: `.git`, keel's temporary files and keel's state
    under `.keel/`, whose `config.toml` is the person's file and is carried (protocol/treepaths.py)."""
    keel_dir = sandbox / KEEL_DIR
    state = sorted(p.name for p in keel_dir.iterdir() if p.name != CONFIG) if keel_dir.is_dir() else []
    return [":(exclude).git", GIT_EXCLUDE_TEMPS, *(f":(exclude,literal){KEEL_DIR}/{name}" for name in state)]


def _git(
    cwd: Path, *args: str, env: dict[str, str] | None = None, data: bytes | None = None, check: str = ""
) -> subprocess.CompletedProcess[bytes]:
    def failed(message: str) -> BundleError:
        return BundleError(f"{check}: git {args[0]} failed: {message}")

    return gitrun.run_bytes(cwd, *args, data=data, env=env, fail=failed if check else None)


def _is_git_worktree(path: Path) -> bool:
    if shutil.which("git") is None or not (path / ".git").exists():
        return False
    proc = _git(path, "rev-parse", "--show-toplevel")
    return proc.returncode == 0 and Path(proc.stdout.decode().strip()).resolve() == path.resolve()


def capture(sandbox: Path, workspace: Path, base: str = "") -> tuple[WorkspaceSection, list[tuple[bytes, bytes]]]:
    """The workspace section and its payloads (key, bytes) for the sandbox as it is now."""
    if not sandbox.is_dir() or not any(sandbox.iterdir()):
        return WorkspaceSection(kind="none"), []
    if _is_git_worktree(sandbox):
        return _capture_git(sandbox, workspace, base)
    return _capture_files(sandbox)


def _capture_git(sandbox: Path, workspace: Path, base: str) -> tuple[WorkspaceSection, list[tuple[bytes, bytes]]]:
    where = f"cannot capture the sandbox {sandbox.name}"
    if not base:
        main = _git(workspace, "rev-parse", "HEAD")
        fork = _git(sandbox, "merge-base", "HEAD", main.stdout.decode().strip()) if main.returncode == 0 else main
        base = fork.stdout.decode().strip() if fork.returncode == 0 else ""
        base = base or _git(sandbox, "rev-parse", "HEAD", check=where).stdout.decode().strip()
    base = _git(sandbox, "rev-parse", "--verify", f"{base}^{{commit}}", check=where).stdout.decode().strip()
    with tempfile.TemporaryDirectory(prefix="keel-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(sandbox, "read-tree", base, env=env, check=where)
        _git(sandbox, "add", "-A", "--", ".", *_excludes(sandbox), env=env, check=where)
        diff = ["diff", "--cached", "--no-renames", "--no-ext-diff", "--no-color"]
        names = _git(sandbox, *diff, "--name-only", "-z", base, env=env, check=where).stdout
        patch = _git(sandbox, *diff, "--binary", "--full-index", base, env=env, check=where).stdout
    paths = tuple(sorted(p.decode("utf-8", "surrogateescape") for p in names.split(b"\0") if p))
    return WorkspaceSection(kind="git", base_commit=base, paths=paths), [(PATCH_KEY, patch)] if paths else []


def _capture_files(sandbox: Path) -> tuple[WorkspaceSection, list[tuple[bytes, bytes]]]:
    payloads: list[tuple[bytes, bytes]] = []
    modes: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(sandbox):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        for name in filenames:
            if is_temp(name):  # a temporary file a killed write left: not the mission's
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(sandbox).as_posix()
            if full.is_symlink():
                modes[rel] = "l"
                payloads.append((rel.encode(), os.readlink(full).encode()))
            elif full.is_file():
                if os.access(full, os.X_OK):
                    modes[rel] = "x"
                payloads.append((rel.encode(), full.read_bytes()))
    payloads.sort()
    section = WorkspaceSection(kind="files", paths=tuple(k.decode() for k, _ in payloads), modes=modes)
    return section, payloads


def check_applicable(bundle: Bundle, workspace: Path) -> None:
    """Everything an import needs of the workspace, checked before anything is written anywhere."""
    ws = bundle.manifest.workspace
    if ws.kind != "git":
        for path, mode in ws.modes.items():
            target = bundle.workspace_payload(path.encode()).decode(errors="replace")
            if mode == "l" and (target.startswith("/") or ".." in target.split("/")):
                raise BundleError(f"bundle workspace symlink {path!r} points outside the workspace ({target!r})")
        return
    if shutil.which("git") is None:
        raise BundleError("bundle carries a git patch but git is not installed here")
    if _git(workspace, "rev-parse", "--show-toplevel").returncode != 0:
        raise BundleError(
            f"workspace {workspace} is not a git repository; the bundle's changes are relative to "
            f"commit {ws.base_commit[:12]}: clone the repository there first"
        )
    if _git(workspace, "cat-file", "-e", f"{ws.base_commit}^{{commit}}").returncode != 0:
        raise BundleError(
            f"workspace {workspace} does not have the bundle's base commit {ws.base_commit[:12]}; "
            "fetch or clone it first"
        )
    for commit in sorted(snapshot_bases(bundle) - {ws.base_commit}):
        if _git(workspace, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            raise BundleError(
                f"workspace {workspace} does not have commit {commit[:12]}, which the bundle's file snapshots "
                "are relative to (they hold only what differs from it); fetch or clone it first"
            )
    if not ws.paths:
        return
    numstat = _git(
        workspace,
        "apply",
        "--numstat",
        "-z",
        "--binary",
        "-",
        data=bundle.workspace_payload(PATCH_KEY),
        check="bundle workspace patch is unreadable",
    ).stdout
    touched = {field.split(b"\t")[-1].decode("utf-8", "surrogateescape") for field in numstat.split(b"\0") if field}
    for path in touched:
        check_relative_path(path)
    if touched != set(ws.paths):
        raise BundleError("bundle workspace patch touches other paths than its manifest lists; refusing it")


def rebuild(bundle: Bundle, workspace: Path, target: Path, mission_id: str) -> None:
    """Create the sandbox at `target` holding the bundle's workspace; on failure nothing is left."""
    ws = bundle.manifest.workspace
    if ws.kind == "none":
        return
    if target.exists() and any(target.iterdir()):
        raise BundleError(f"a sandbox for mission {mission_id} already exists at {target}; nothing was imported")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if ws.kind == "git":
            _rebuild_git(bundle, workspace, target, mission_id)
        else:
            _rebuild_files(bundle, target)
    except BaseException:
        remove(workspace, target, mission_id, git=ws.kind == "git")
        raise


def _rebuild_git(bundle: Bundle, workspace: Path, target: Path, mission_id: str) -> None:
    ws = bundle.manifest.workspace
    branch = f"keel/{mission_id}"
    if _git(workspace, "rev-parse", "--verify", "-q", f"refs/heads/{branch}").returncode == 0:
        raise BundleError(f"workspace {workspace} already has a branch {branch}; nothing was imported")
    _git(
        workspace,
        "worktree",
        "add",
        "--force",
        "-b",
        branch,
        str(target),
        ws.base_commit,
        check=f"cannot create the sandbox {target}",
    )
    if ws.paths:
        _git(
            target,
            "apply",
            "--binary",
            "--whitespace=nowarn",
            "-",
            data=bundle.workspace_payload(PATCH_KEY),
            check="the bundle's changes do not apply to the base commit",
        )
        # committed on the mission branch, as on the exporting side: unit sandboxes branch off from HEAD
        where = f"cannot commit the imported changes in {target}"
        _git(target, "add", "-A", "--", ".", *_excludes(target), check=where)
        _git(
            target,
            "commit",
            "-q",
            "--no-verify",
            "-m",
            f"keel: changes of mission {mission_id} (imported)",
            env=gitrun.IDENTITY,
            check=where,
        )


def _rebuild_files(bundle: Bundle, target: Path) -> None:
    ws = bundle.manifest.workspace
    target.mkdir(parents=True, exist_ok=True)
    for path in ws.paths:
        full = target / path
        full.parent.mkdir(parents=True, exist_ok=True)
        data = bundle.workspace_payload(path.encode())
        if ws.modes.get(path) == "l":
            os.symlink(data.decode(), full)
            continue
        full.write_bytes(data)
        if ws.modes.get(path) == "x":
            full.chmod(0o755)


def remove(workspace: Path, target: Path, mission_id: str, *, git: bool) -> None:
    """Undo `rebuild` (an import that failed after the sandbox was made); what cannot be removed stays,
    and the import's own error is the one raised."""
    with contextlib.suppress(OSError, KeelError):
        merge.remove_sandbox(target, git_toplevel(workspace) if git else None, f"keel/{mission_id}")


__all__ = ["WORKSPACE_DB", "capture", "check_applicable", "rebuild", "remove"]
