"""Sandbox tree snapshots: content-addressed pictures of a sandbox's files, and putting them back.

A snapshot is a SandboxTree blob (sorted (path, mode, blob digest) entries) whose file contents are
blobs of their own, so unchanged files are shared between checkpoints and a checkpoint costs what
changed (plus one entry per file in the tree blob). The sandbox's files are the truth: whatever changed
them (write_file, a shell command, the agent itself) is captured. `.git` and `.keel` are left out,
everywhere. Files are read outside the write transaction (`Snapshotter.scan`) and stored inside it
(`store_txn`); a file whose size, mtime, ctime and inode did not change since the last scan is not read
again. `materialize` makes a folder equal to a tree; `verify` re-hashes every file and raises
SandboxMismatchError naming what differs. Depends on storage and protocol; nothing of the host.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec

from keel.protocol.errors import ErrorCode, KeelError, NotFoundError
from keel.protocol.records import CheckpointManifest, SandboxTree, TreeEntry
from keel.storage import DB, Txn
from keel.storage.bundle import check_relative_path, is_tree_ref, load_tree
from keel.storage.record import content_digest

SKIP = frozenset({".git", ".keel"})
Files = dict[str, tuple[str, str]]  # path -> (mode, blob digest)


class SandboxMismatchError(KeelError):
    """The sandbox's files are not the ones the restore point recorded."""

    code = ErrorCode.CORRUPT_RECORD


class NoSnapshotError(NotFoundError):
    """A restore point without a file snapshot (recorded before snapshots existed, or no sandbox yet)."""


class Scan(msgspec.Struct):
    entries: list[TreeEntry]
    fresh: dict[str, bytes]  # digest -> bytes read in this scan (files that changed since the last one)


def walk(root: Path) -> list[tuple[str, str, str, os.stat_result]]:
    """(relative posix path, mode, absolute path, lstat) of every file and symlink under root, sorted."""
    out: list[tuple[str, str, str, os.stat_result]] = []
    stack = [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name in SKIP:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed while we looked
            rel = prefix + entry.name
            if stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, rel + "/"))
            elif stat.S_ISLNK(st.st_mode):
                out.append((rel, "l", entry.path, st))
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, "x" if st.st_mode & 0o100 else "f", entry.path, st))
            # fifos, sockets, devices: not content
    out.sort()
    return out


def read_bytes(full: str, mode: str) -> bytes:
    return os.readlink(full).encode("utf-8", "surrogateescape") if mode == "l" else Path(full).read_bytes()


class Snapshotter:
    """Scans one sandbox again and again, re-reading only files that changed since the previous scan."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int, int, int], str]] = {}

    def scan(self, root: Path) -> Scan:
        entries: list[TreeEntry] = []
        fresh: dict[str, bytes] = {}
        for rel, mode, full, st in walk(root):
            try:
                key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                cached = self._cache.get(full)
                if cached is not None and cached[0] == key:
                    digest = cached[1]
                else:
                    data = read_bytes(full, mode)
                    digest = content_digest(data)
                    fresh[digest] = data
                    self._cache[full] = (key, digest)
            except OSError:
                continue  # removed while we looked: it is not part of this snapshot
            entries.append(TreeEntry(path=rel, mode=mode, blob=digest))  # type: ignore[arg-type]
        return Scan(entries=entries, fresh=fresh)

    def store_txn(self, txn: Txn, root: Path, scan: Scan) -> str:
        """Write the scan's new file blobs and its tree blob; returns the tree's digest."""
        for data in scan.fresh.values():
            txn.put_blob(data)
        for entry in scan.entries:
            if entry.blob not in scan.fresh and not txn.exists(DB.BLOBS, entry.blob.encode()):
                # known from an earlier scan whose checkpoint never committed (or was collected): read it now
                full = root / entry.path
                data = read_bytes(str(full), entry.mode)
                if content_digest(data) != entry.blob:
                    self._cache.pop(str(full), None)
                    raise SandboxMismatchError(f"{entry.path} changed while the sandbox was being snapshotted")
                txn.put_blob(data)
        return txn.put_object(SandboxTree(entries=tuple(scan.entries)))


def current_files(root: Path) -> Files:
    """Every file of a folder with its mode and content digest, freshly hashed (no cache)."""
    out: Files = {}
    for rel, mode, full, _ in walk(root):
        try:
            out[rel] = (mode, content_digest(read_bytes(full, mode)))
        except OSError:
            continue
    return out


def tree_files(tree: SandboxTree) -> Files:
    return {e.path: (e.mode, e.blob) for e in tree.entries}


def point_tree(txn: Txn, manifest: CheckpointManifest, what: str) -> SandboxTree:
    """The file snapshot a checkpoint refers to; NoSnapshotError when it has none."""
    tree = load_tree(txn.get_blob, manifest.sandbox_tree) if is_tree_ref(manifest.sandbox_tree) else None
    if tree is None:
        if manifest.reason.startswith("failover:"):  # host.checkpoint_soon: taken in the middle of a call
            raise NoSnapshotError(
                f"{what} has no snapshot of the sandbox's files: it marks a failover, recorded in the middle "
                "of a model call; use the restore point before or after it"
            )
        raise NoSnapshotError(
            f"{what} has no snapshot of the sandbox's files (it was recorded before the "
            "mission had a sandbox, or by a keel that did not keep file snapshots)"
        )
    return tree


def materialize(root: Path, tree: SandboxTree, blob: Callable[[str], bytes]) -> list[str]:
    """Make `root` hold exactly the tree's files (.git and .keel untouched); returns the paths changed."""
    want = tree_files(tree)
    have = current_files(root) if root.exists() else {}
    changed = sorted(p for p in have if p not in want)
    for path in changed:
        os.unlink(root / path)
    _prune_empty_dirs(root, {str(Path(p).parent) for p in want})
    for path, (mode, digest) in want.items():
        if have.get(path) == (mode, digest):
            continue
        if have.get(path, ("", ""))[1] == digest and mode != "l" and have[path][0] != "l":
            (root / path).chmod(0o755 if mode == "x" else 0o644)
            changed.append(path)
            continue
        check_relative_path(path)
        write_file(root, path, mode, blob(digest))
        changed.append(path)
    return sorted(set(changed))


def _prune_empty_dirs(root: Path, keep: set[str]) -> None:
    for dirpath, _, _ in os.walk(root, topdown=False):
        rel = Path(os.path.relpath(dirpath, root)).as_posix()
        if rel == "." or set(Path(rel).parts) & SKIP:
            continue
        if not any(k == rel or k.startswith(rel + "/") for k in keep):
            with contextlib.suppress(OSError):  # not empty: holds something outside the snapshot (.git, .keel)
                os.rmdir(dirpath)


def write_file(root: Path, path: str, mode: str, data: bytes) -> None:
    full = root / path
    for parent in reversed(Path(path).parents[:-1]):  # a file where a folder must be: replace it
        p = root / parent
        if p.is_symlink() or p.is_file():
            p.unlink()
    full.parent.mkdir(parents=True, exist_ok=True)
    if full.is_symlink() or full.is_file():
        full.unlink()
    elif full.is_dir():
        shutil.rmtree(full)
    if mode == "l":
        os.symlink(data.decode("utf-8", "surrogateescape"), full)
        return
    tmp = full.with_name(full.name + ".keel-restore")
    tmp.write_bytes(data)
    tmp.chmod(0o755 if mode == "x" else 0o644)
    os.replace(tmp, full)


def differences(want: Files, have: Files) -> list[str]:
    """`path: what` for each file that differs between a snapshot and a folder."""
    out = []
    for path in sorted(set(want) | set(have)):
        if path not in have:
            out.append(f"{path}: missing")
        elif path not in want:
            out.append(f"{path}: not in the snapshot")
        elif want[path][1] != have[path][1]:
            out.append(f"{path}: content differs")
        elif want[path][0] != have[path][0]:
            out.append(f"{path}: mode {have[path][0]}, snapshot has {want[path][0]}")
    return out


def verify(root: Path, tree: SandboxTree, what: str) -> None:
    """Re-hash every file of the sandbox; any difference from the tree is an error naming the files."""
    diffs = differences(tree_files(tree), current_files(root))
    if diffs:
        shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        raise SandboxMismatchError(f"sandbox {root} does not match {what}: {shown}")


def unified_diff(
    old: Files,
    new: Files,
    old_blob: Callable[[str], bytes],
    new_blob: Callable[[str], bytes],
    old_name: str = "a",
    new_name: str = "b",
) -> str:
    """A unified diff (git style headers) between two file sets; binary files are named, not shown."""
    chunks: list[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        header = f"diff --keel {old_name}/{path} {new_name}/{path}\n"
        if a is not None and b is not None and a[1] == b[1]:
            chunks.append(header + f"mode {a[0]} -> {b[0]}\n")
            continue
        before = old_blob(a[1]) if a else b""
        after = new_blob(b[1]) if b else b""
        left = f"{old_name}/{path}" if a else "/dev/null"
        right = f"{new_name}/{path}" if b else "/dev/null"
        try:
            text_a, text_b = before.decode(), after.decode()
        except UnicodeDecodeError:
            chunks.append(header + f"Binary files {left} and {right} differ\n")
            continue
        lines = difflib.unified_diff(
            text_a.splitlines(keepends=True), text_b.splitlines(keepends=True), fromfile=left, tofile=right
        )
        chunks.append(
            header
            + "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        )
    return "".join(chunks)
