"""`keel apply`: bring a mission's result into the person's working tree, or onto a new branch.

The mission's changes are the difference between its first file snapshot (the sandbox as it was
created; for a fork, the original's) and its sandbox now, freshly hashed. Build caches the agents'
commands left (`__pycache__/`, `*.pyc`, `.pytest_cache/`: files/digest.is_cache) are left out everywhere; in a
git workspace, so are the files git ignores. Into the working tree: each changed file must still be
what the mission started from (or already the result); otherwise nothing is written and the error names
every conflicting file. With `--branch NAME` (git only) the working tree, index and HEAD are not
touched: a commit on top of HEAD is made with a temporary index and NAME points at it (refused when NAME
exists or HEAD's version of a changed file is not the one the mission started from).
Depends on storage, the engine's sandbox/trees modules and keel.server.gitrun.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import msgspec

from keel.protocol.errors import ErrorCode, KeelError, NotFoundError
from keel.protocol.records import SandboxTree, is_tree_ref
from keel.protocol.states import MissionState
from keel.server import gitrun
from keel.server.engine.files import gitbase, places, trees
from keel.server.engine.files.digest import is_cache
from keel.server.engine.files.sandbox import git_toplevel
from keel.server.engine.hostlock import host_alive
from keel.storage import Store, Txn
from keel.storage import missions as m
from keel.storage.record import content_digest
from keel.storage.snapshots import BaseFiles, load_tree

_GIT_MODES = {"f": "100644", "x": "100755", "l": "120000"}


class ApplyConflictError(KeelError):
    """The person's files changed where the mission's changes would go; nothing was written."""

    code = ErrorCode.INVALID_STATE


class ApplyReport(msgspec.Struct, frozen=True):
    mission: str
    target: str
    added: list[str]
    modified: list[str]
    removed: list[str]
    branch: str = ""
    commit: str = ""


def base_tree(txn: Txn, mission_id: str, base: BaseFiles | None = None) -> SandboxTree:
    """The oldest file snapshot in the mission's checkpoint chain: the files it started from (kept in the
    record once retention removed the checkpoint that held it; `base` reads the commit a git sandbox's
    snapshot is relative to)."""
    found = m.get_mission(txn, mission_id).start_tree
    digest = m.head(txn, mission_id)
    manifest = m.get_checkpoint(txn, digest) if digest and not found else None
    while manifest is not None:
        found = manifest.sandbox_tree if is_tree_ref(manifest.sandbox_tree) else found
        manifest = m.parent_checkpoint(txn, manifest)
    tree = load_tree(txn.get_blob, found, base) if found else None
    if tree is None:
        raise NotFoundError(f"mission {mission_id} has no file snapshot to compare its sandbox with")
    return tree


def apply_result(store: Store, store_path: Path, mission_id: str, *, branch: str = "") -> ApplyReport:
    record = store.read(lambda t: m.get_mission(t, mission_id))
    if record.state in (MissionState.RUNNING, MissionState.PAUSING) and host_alive(record):
        raise ApplyConflictError(f"mission {mission_id} is running; pause it before applying its result")
    sandbox = Path(record.sandbox or places.sandbox_path(store_path, mission_id))
    if not sandbox.is_dir():
        raise NotFoundError(f"mission {mission_id} has no sandbox at {sandbox}")
    repo = gitbase.for_workspace(sandbox)
    base = trees.tree_files(store.read(lambda t: base_tree(t, mission_id, repo)))
    result = trees.current_files(sandbox)
    top = git_toplevel(Path(record.workspace))
    changed = sorted(p for p in set(base) | set(result) if base.get(p) != result.get(p) and not is_cache(p))
    if top is not None:
        changed = _not_ignored(sandbox, changed)
    target = top or Path(record.workspace)
    report = ApplyReport(
        mission=mission_id,
        target=str(target),
        added=[p for p in changed if p not in base],
        modified=[p for p in changed if p in base and p in result],
        removed=[p for p in changed if p not in result],
    )
    if branch:
        if top is None:
            raise ApplyConflictError(f"--branch needs a git workspace; {record.workspace} is not one")
        commit = _to_branch(top, branch, changed, base, result, sandbox, mission_id)
        return msgspec.structs.replace(report, branch=branch, commit=commit)
    _to_worktree(target, changed, base, result, sandbox)
    return report


def _state(path: Path) -> tuple[str, str] | None:
    """(mode, digest) of a file in the person's tree, or None."""
    try:
        if path.is_symlink():
            return "l", content_digest(os.readlink(path).encode("utf-8", "surrogateescape"))
        if not path.is_file():
            return None
        return ("x" if path.stat().st_mode & 0o100 else "f"), content_digest(path.read_bytes())
    except OSError:
        return None


def _to_worktree(target: Path, changed: list[str], base: trees.Files, result: trees.Files, sandbox: Path) -> None:
    conflicts = [p for p in changed if _state(target / p) not in (base.get(p), result.get(p))]
    if conflicts:
        raise ApplyConflictError(
            f"not applied: the working tree has local changes to {len(conflicts)} file(s) the mission also "
            f"changed: {', '.join(conflicts)}; commit or stash them, or use --branch NAME"
        )
    for path in changed:
        full = target / path
        if path not in result:
            if full.is_symlink() or full.exists():
                full.unlink()
            continue
        if _state(full) != result[path]:
            mode = result[path][0]
            trees.write_file(target, path, mode, trees.read_bytes(str(sandbox / path), mode))


def _git(
    cwd: Path, *args: str, data: bytes | None = None, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    def failed(message: str) -> ApplyConflictError:
        return ApplyConflictError(f"git {args[0]} failed: {message}")

    return gitrun.run_bytes(cwd, *args, data=data, env=env, fail=failed if check else None)


def _not_ignored(sandbox: Path, paths: list[str]) -> list[str]:
    if not paths:
        return paths
    proc = _git(
        sandbox, "check-ignore", "-z", "--stdin", data=b"\0".join(p.encode() for p in paths) + b"\0", check=False
    )
    ignored = {p.decode() for p in proc.stdout.split(b"\0") if p}
    return [p for p in paths if p not in ignored]


def _to_branch(
    top: Path, branch: str, changed: list[str], base: trees.Files, result: trees.Files, sandbox: Path, mission_id: str
) -> str:
    if _git(top, "check-ref-format", "--branch", branch, check=False).returncode != 0:
        raise ApplyConflictError(f"{branch!r} is not a valid branch name")
    if _git(top, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False).returncode == 0:
        raise ApplyConflictError(f"branch {branch} already exists; choose another name")
    at_head = _head_files(top, changed)
    conflicts = [p for p in changed if at_head.get(p) not in (base.get(p), result.get(p))]
    if conflicts:
        raise ApplyConflictError(
            f"not applied: HEAD's version of {', '.join(conflicts)} is not the one the mission started from"
        )
    with tempfile.TemporaryDirectory(prefix="keel-apply-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(top, "read-tree", "HEAD", env=env)
        for path in changed:
            if path not in result:
                _git(top, "update-index", "--force-remove", "--", path, env=env)
                continue
            mode = result[path][0]
            sha = _git(top, "hash-object", "-w", "--stdin", data=trees.read_bytes(str(sandbox / path), mode))
            _git(
                top,
                "update-index",
                "--add",
                "--cacheinfo",
                f"{_GIT_MODES[mode]},{sha.stdout.decode().strip()},{path}",
                env=env,
            )
        tree = _git(top, "write-tree", env=env).stdout.decode().strip()
    who = (
        {}
        if _git(top, "config", "user.email", check=False).returncode == 0
        else {
            "GIT_AUTHOR_NAME": "keel",
            "GIT_AUTHOR_EMAIL": "keel@localhost",
            "GIT_COMMITTER_NAME": "keel",
            "GIT_COMMITTER_EMAIL": "keel@localhost",
        }
    )
    commit = _git(top, "commit-tree", tree, "-p", "HEAD", "-m", f"keel mission {mission_id}", env=who)
    sha1 = commit.stdout.decode().strip()
    _git(top, "update-ref", f"refs/heads/{branch}", sha1, "")
    return sha1


def _head_files(top: Path, paths: list[str]) -> trees.Files:
    """(mode, digest) of each path in HEAD's commit (absent paths left out), with one git process."""
    if not paths:
        return {}
    listing = _git(top, "ls-tree", "-r", "-z", "HEAD", "--", *paths).stdout
    modes = {"100644": "f", "100755": "x", "120000": "l"}
    found: dict[str, str] = {}
    for row in listing.split(b"\0"):
        if row:
            meta, name = row.split(b"\t", 1)
            git_mode = meta.split()[0].decode()
            if git_mode in modes:
                found[name.decode()] = modes[git_mode]
    if not found:
        return {}
    batch = _git(top, "cat-file", "--batch", data="".join(f"HEAD:{p}\n" for p in found).encode()).stdout
    out: trees.Files = {}
    offset = 0
    for path, mode in found.items():
        header_end = batch.index(b"\n", offset)
        size = int(batch[offset:header_end].split()[2])
        data = batch[header_end + 1 : header_end + 1 + size]
        offset = header_end + 1 + size + 1
        out[path] = (mode, content_digest(data))
    return out
