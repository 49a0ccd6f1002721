"""A git repository's commits as the bases of sandbox snapshots (storage/snapshots.SandboxBased).

A git sandbox's snapshot holds only what differs from a commit its repository already has: the fork
point of the sandbox's branch from the person's HEAD (`fork_point`), a commit the person has, so that a
bundle's snapshots resolve on any clone holding it. `listing` gives a commit's files by git object id
and size (what a scan compares against); `GitBase.files` gives them as snapshot entries with keel's
content digests (read through one `git cat-file --batch`), and `GitBase.blob` their bytes by that
digest. A commit the repository does not have is a BaseCommitError naming it, never another tree.
Depends on git (through server/gitrun.py), storage/snapshots.py and storage/record.py; nothing of the
mission engine.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from keel.protocol.hashes import sha1
from keel.protocol.records import TreeEntry
from keel.protocol.treepaths import is_persons
from keel.server import gitrun
from keel.storage.record import content_digest
from keel.storage.snapshots import BaseCommitError

_MODES = {b"100644": "f", b"100755": "x", b"120000": "l"}  # gitlinks (submodules) and trees are not files


class Listed(NamedTuple):
    mode: str
    oid: str


def _git(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return gitrun.run_bytes(cwd, *args, data=data)


def is_repo(path: Path) -> bool:
    """A folder inside a git repository."""
    return shutil.which("git") is not None and path.is_dir() and _git(path, "rev-parse", "--git-dir").returncode == 0


def git_oid(data: bytes) -> str:
    """The object id git gives a blob of these bytes."""
    return sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def fork_point(sandbox: Path) -> str:
    """The commit a git sandbox's snapshots are relative to: where its HEAD forked from the HEAD of the
    repository's main worktree (the person's checkout), else its own HEAD; "" without a commit."""
    both = _git(sandbox, "rev-parse", "HEAD^{commit}", "main-worktree/HEAD^{commit}")
    if both.returncode == 0:  # the common case, one command: both HEADs are commits
        head, main = both.stdout.decode().split()
        return head if head == main else _fork(sandbox, main) or head
    alone = _git(sandbox, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    return alone.stdout.decode().strip() if alone.returncode == 0 else ""


def base_of(sandbox: Path) -> str | None:
    """`fork_point`, or None when the sandbox is not in a git repository."""
    if shutil.which("git") is None or not sandbox.is_dir():
        return None
    base = fork_point(sandbox)
    return base if base or is_repo(sandbox) else None


def _fork(sandbox: Path, main: str) -> str:
    fork = _git(sandbox, "merge-base", "HEAD", main)
    return fork.stdout.decode().strip() if fork.returncode == 0 else ""


def changed_since(sandbox: Path, commit: str, head: bool = False) -> set[str]:
    """Paths whose working-tree file may differ from `commit`, by git's own index and stat data (git
    re-reads a file whose stat data changed, and a racily clean one); with `head`, the paths that differ
    between `commit` and HEAD (a worktree just checked out: nothing of its files is looked at)."""
    against = [commit, "HEAD"] if head else [commit]
    proc = _git(sandbox, "diff", "--name-only", "-z", "--no-renames", "--ignore-submodules", *against, "--")
    if proc.returncode != 0:
        raise BaseCommitError(f"git cannot compare {sandbox} with commit {commit[:12]}: {_err(proc)}")
    return {p.decode("utf-8", "surrogateescape") for p in proc.stdout.split(b"\0") if p}


def untracked(sandbox: Path) -> list[str] | None:
    """Every file git does not track in the sandbox, ignored ones included; None when git lists a nested
    repository as a folder (then only a walk sees its files)."""
    proc = _git(sandbox, "ls-files", "--others", "-z")
    if proc.returncode != 0:
        raise BaseCommitError(f"git cannot list the untracked files of {sandbox}: {_err(proc)}")
    paths = [p.decode("utf-8", "surrogateescape") for p in proc.stdout.split(b"\0") if p]
    return None if any(p.endswith("/") for p in paths) else paths


def _err(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode(errors="replace").strip()[:300]


class GitBase:
    """Reads commits of one repository as snapshot bases."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._oids: dict[str, str] = {}  # keel digest -> git object id, for the files handed out
        self._listings: dict[str, dict[str, Listed]] = {}
        self._batch: subprocess.Popen[bytes] | None = None

    def _missing(self, commit: str, why: str) -> BaseCommitError:
        return BaseCommitError(
            f"the snapshot is relative to git commit {commit[:12]}, which the repository at {self.repo} "
            f"does not have ({why}): it was garbage-collected, or its history was rewritten, or this is "
            "another clone; fetch that commit into the repository, or restore a point recorded with it"
        )

    def listing(self, commit: str) -> dict[str, Listed]:
        """Every file of the commit that is one of the person's (protocol/treepaths.py; keel's state a
        repository may track under `.keel/` is not): path -> (mode, object id)."""
        found = self._listings.get(commit)
        if found is not None:
            return found
        proc = _git(self.repo, "ls-tree", "-r", "-z", "--full-tree", f"{commit}^{{commit}}")
        if proc.returncode != 0:
            if not is_repo(self.repo):
                raise self._missing(commit, "it is not a git repository")
            if _git(self.repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
                raise self._missing(commit, "no such commit")
            raise self._missing(commit, _err(proc))
        out: dict[str, Listed] = {}
        for record in proc.stdout.split(b"\0"):
            if not record:
                continue
            meta, _, path = record.partition(b"\t")
            mode, _, oid = meta.split(maxsplit=2)
            rel = path.decode("utf-8", "surrogateescape")
            if mode in _MODES and is_persons(rel):  # what a walk of a sandbox sees (trees.walk)
                out[rel] = Listed(_MODES[mode], oid.decode())
        self._listings = {commit: out}  # one commit at a time: a listing of 100k files is ~20 MB
        return out

    def files(self, commit: str) -> list[TreeEntry]:
        """The commit's files with keel's content digests (every blob read once)."""
        listed = self.listing(commit)
        data = self._read({item.oid for item in listed.values()})
        out = []
        for path, item in listed.items():
            digest = content_digest(data[item.oid])
            self._oids[digest] = item.oid
            out.append(TreeEntry(path=path, mode=item.mode, blob=digest))  # type: ignore[arg-type]
        return out

    def blob(self, digest: str) -> bytes | None:
        """The bytes of a file handed out by `files`, by its keel digest; None for another digest. One
        `git cat-file --batch` answers every call (a restore into an empty folder asks for each file)."""
        oid = self._oids.get(digest)
        if oid is None:
            return None
        if self._batch is None or self._batch.poll() is not None:
            self._batch = gitrun.batch(self.repo, "cat-file", "--batch")
        assert self._batch.stdin is not None and self._batch.stdout is not None
        self._batch.stdin.write(f"{oid}\n".encode())
        self._batch.stdin.flush()
        header = self._batch.stdout.readline().split()
        if len(header) != 3:
            raise BaseCommitError(f"the repository at {self.repo} lacks blob {oid} of a snapshot's base commit")
        data = self._batch.stdout.read(int(header[2]) + 1)[:-1]
        return data

    def close(self) -> None:
        if self._batch is not None:
            self._batch.kill()
            self._batch.wait()
            self._batch = None

    def __del__(self) -> None:
        self.close()

    def _read(self, oids: set[str]) -> dict[str, bytes]:
        order = sorted(oids)
        proc = _git(self.repo, "cat-file", "--batch", data="".join(f"{oid}\n" for oid in order).encode())
        if proc.returncode != 0:
            raise BaseCommitError(f"git cannot read blobs of {self.repo}: {_err(proc)}")
        out: dict[str, bytes] = {}
        raw, at = proc.stdout, 0
        for oid in order:
            end = raw.index(b"\n", at)
            header = raw[at:end].split()
            if len(header) != 3:  # "<oid> missing"
                raise BaseCommitError(f"the repository at {self.repo} lacks blob {oid} of a snapshot's base commit")
            size = int(header[2])
            out[oid] = raw[end + 1 : end + 1 + size]
            at = end + 2 + size
        return out


def for_workspace(workspace: Path) -> GitBase | None:
    """The reader of a mission's workspace repository, or None when the workspace is not a git one."""
    return GitBase(workspace) if is_repo(workspace) else None
