"""Sandbox file snapshots: the one walker over a sandbox's files, content-addressed pictures of them in
the store, the tree digest that names them, and putting them back.

`walk` is the only code that lists a sandbox; snapshots, tree digests, `current_files` (restore, fork,
diff, apply) and the copy-merge's file digests all go through it, under one set of rules: `.git` and
`.keel` are left out everywhere; a file's mode counts (plain, executable, symlink); a file or folder
that vanishes while we look is not part of the picture, and one that cannot be read is an error naming
it (SandboxUnreadableError), never hashed as empty or skipped.

A snapshot is a folder tree in the store (storage/snapshots.py): one blob per file and one SandboxFolder
blob per folder, so an unchanged folder is shared with earlier snapshots and a snapshot writes only the
changed files and the folders above them. Files are read outside the write transaction
(`Snapshotter.scan`) and stored inside it (`store_txn`); a file whose size, mtime, ctime and inode did
not change since the last scan is not read again. The tree digest of a sandbox (subagent leases) is
the digest its snapshot's root folder would have (`Snapshotter.digest`), the same key and rules.
`materialize` makes a folder equal to a tree; `verify` re-hashes every file and raises
SandboxMismatchError naming what differs. Depends on storage and protocol; nothing of the host.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec

from keel.protocol.errors import ErrorCode, KeelError, NotFoundError
from keel.protocol.records import CheckpointManifest, FolderEntry, SandboxTree, TreeEntry
from keel.storage import DB, Txn
from keel.storage.bundle import check_relative_path
from keel.storage.record import content_digest
from keel.storage.snapshots import folder_blob, is_tree_ref, load_tree

SKIP = frozenset({".git", ".keel"})
Files = dict[str, tuple[str, str]]  # path -> (mode, blob digest)
_GONE = (FileNotFoundError, NotADirectoryError)  # removed (or replaced) while we looked


class SandboxMismatchError(KeelError):
    """The sandbox's files are not the ones the restore point recorded."""

    code = ErrorCode.CORRUPT_RECORD


class SandboxUnreadableError(KeelError):
    """A file or folder of the sandbox that cannot be read: no snapshot or digest can be made without it."""

    code = ErrorCode.INVALID_STATE

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(f"cannot read {path} in the sandbox: {exc.strerror or exc}")
        self.path = path


class NoSnapshotError(NotFoundError):
    """A restore point without a file snapshot (recorded before snapshots existed, or no sandbox yet)."""


class Scan(msgspec.Struct):
    entries: list[TreeEntry]
    fresh: dict[str, bytes]  # digest -> bytes read in this scan (files that changed since the last one)


def walk(root: Path) -> list[tuple[str, str, str, os.stat_result]]:
    """(relative posix path, mode, absolute path, lstat) of every file and symlink under root, sorted.
    Fifos, sockets and devices are not content; an unreadable folder is a SandboxUnreadableError."""
    out: list[tuple[str, str, str, os.stat_result]] = []
    stack = [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except _GONE:
            continue
        except OSError as exc:
            raise SandboxUnreadableError(folder, exc) from None
        for entry in entries:
            if entry.name in SKIP:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except _GONE:
                continue
            except OSError as exc:
                raise SandboxUnreadableError(entry.path, exc) from None
            rel = prefix + entry.name
            if stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, rel + "/"))
            elif stat.S_ISLNK(st.st_mode):
                out.append((rel, "l", entry.path, st))
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, "x" if st.st_mode & 0o100 else "f", entry.path, st))
    out.sort()
    return out


def read_bytes(full: str, mode: str) -> bytes:
    return os.readlink(full).encode("utf-8", "surrogateescape") if mode == "l" else Path(full).read_bytes()


def read_content(full: str, mode: str) -> bytes | None:
    """A walked file's bytes (a symlink's target); None when it vanished since the walk."""
    try:
        return read_bytes(full, mode)
    except _GONE:
        return None
    except OSError as exc:
        raise SandboxUnreadableError(full, exc) from None


class _Folder(msgspec.Struct):
    path: str  # relative, "" for the root
    data: bytes  # the SandboxFolder blob
    digest: str
    files: list[TreeEntry]


class Snapshotter:
    """Scans one sandbox again and again, re-reading only files that changed since the previous scan and
    re-encoding only folders whose entries changed."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[tuple[int, int, int, int, str, str], TreeEntry]] = {}
        self._folders: dict[str, tuple[tuple[object, ...], bytes, str]] = {}

    def scan(self, root: Path, *, keep_bytes: bool = True) -> Scan:
        entries: list[TreeEntry] = []
        fresh: dict[str, bytes] = {}
        for rel, mode, full, st in walk(root):
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode, rel)
            cached = self._files.get(full)
            if cached is not None and cached[0] == key:
                entries.append(cached[1])  # the same object: _fold compares unchanged folders by identity
                continue
            data = read_content(full, mode)
            if data is None:
                continue  # removed while we looked: it is not part of this snapshot
            entry = TreeEntry(path=rel, mode=mode, blob=content_digest(data))  # type: ignore[arg-type]
            if keep_bytes:
                fresh[entry.blob] = data
            self._files[full] = (key, entry)
            entries.append(entry)
        return Scan(entries=entries, fresh=fresh)

    def digest(self, root: Path) -> str:
        """The sandbox's tree digest: the name its snapshot's root folder has (nothing is stored)."""
        return self._fold(self.scan(root, keep_bytes=False).entries)[-1].digest

    def store_txn(self, txn: Txn, root: Path, scan: Scan) -> str:
        """Write the scan's new file and folder blobs; returns the snapshot's digest (its root folder).
        A folder blob already in the store is whole (its files and subfolders were stored with it)."""
        folders = self._fold(scan.entries)
        for folder in folders:
            if txn.exists(DB.BLOBS, folder.digest.encode()):
                continue
            for entry in folder.files:
                if entry.blob in scan.fresh:
                    txn.put_blob(scan.fresh[entry.blob])
                elif not txn.exists(DB.BLOBS, entry.blob.encode()):
                    self._store_again(txn, root, entry)
            txn.put_blob(folder.data)
        return folders[-1].digest

    def _store_again(self, txn: Txn, root: Path, entry: TreeEntry) -> None:
        """A file known from an earlier scan whose checkpoint never committed (or was collected)."""
        full = str(root / entry.path)
        data = read_content(full, entry.mode)
        if data is None or content_digest(data) != entry.blob:
            self._files.pop(full, None)
            raise SandboxMismatchError(f"{entry.path} changed while the sandbox was being snapshotted")
        txn.put_blob(data)

    def _fold(self, entries: list[TreeEntry]) -> list[_Folder]:
        """The folder blobs of a scan, children before parents (the root last); a folder whose files and
        subfolders are what they were at the previous scan is not encoded again."""
        files: dict[str, list[TreeEntry]] = {}
        for entry in entries:
            files.setdefault(entry.path.rpartition("/")[0], []).append(entry)
        folders: set[str] = set()
        for path in [*files, ""]:
            while path not in folders:
                folders.add(path)
                if not path:
                    break
                path = path.rpartition("/")[0]
        subfolders: dict[str, list[str]] = {}
        for path in sorted(folders):
            if path:
                subfolders.setdefault(path.rpartition("/")[0], []).append(path)
        digests: dict[str, str] = {}
        out: list[_Folder] = []
        for path in sorted(folders, reverse=True):
            own, subs = files.get(path, []), subfolders.get(path, [])
            key = (*own, *((sub, digests[sub]) for sub in subs))
            cached = self._folders.get(path)
            if cached is None or cached[0] != key:
                items = [FolderEntry(_name(e.path), e.mode, bytes.fromhex(e.blob)) for e in own]
                items += [FolderEntry(_name(sub), "d", bytes.fromhex(digests[sub])) for sub in subs]
                items.sort(key=lambda item: item.name)
                cached = (key, *folder_blob(tuple(items)))
                self._folders[path] = cached
            digests[path] = cached[2]
            out.append(_Folder(path=path, data=cached[1], digest=cached[2], files=own))
        return out


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def tree_digest(root: Path) -> str:
    """A sandbox's tree digest, every file read afresh."""
    return Snapshotter().digest(root)


def digest_as_recorded(root: Path, recorded: str) -> str:
    """The sandbox's tree digest in the form `recorded` has, to compare the two. A 32-hex digest was
    recorded by a keel before folder trees (a lease written before an upgrade): it is computed that
    keel's way, so an intact sandbox still matches; any other is `tree_digest`."""
    return _digest_before_folder_trees(root) if len(recorded) == 32 else tree_digest(root)


def _digest_before_folder_trees(root: Path) -> str:
    """What keel recorded as a tree digest before folder trees: BLAKE2b-128 over "path NUL digest LF" of
    each file, in os.walk's order (a folder's files by name, then its subfolders by name), a file's digest
    being an unkeyed BLAKE2b-128 of its bytes (a link's target); modes did not count, `.git` and `.keel`
    were skipped only as folders (a worktree's `.git` file counted; one in a folder holding no other file
    is not found here) and a link to a folder did not count."""
    listed: dict[str, tuple[str, str]] = {}
    for rel, mode, full, _ in walk(root):
        if not (mode == "l" and os.path.isdir(full)):
            listed[rel] = (full, mode)
    folders = {""} | {rel.rpartition("/")[0] for rel in listed}
    for folder in list(folders):
        while folder:
            folder = folder.rpartition("/")[0]
            folders.add(folder)
    for folder in folders:
        for name in SKIP:
            full = os.path.join(root, folder, name)
            if os.path.lexists(full) and not os.path.isdir(full):
                listed[f"{folder}/{name}".lstrip("/")] = (full, "l" if os.path.islink(full) else "f")

    def walk_order(rel: str) -> list[tuple[int, str]]:
        parts = rel.split("/")
        return [(1, part) for part in parts[:-1]] + [(0, parts[-1])]

    total = hashlib.blake2b(digest_size=16, person=b"keel-tree")
    for rel in sorted(listed, key=walk_order):
        data = read_content(*listed[rel])
        if data is not None:
            total.update(rel.encode() + b"\x00" + file_digest(data).encode() + b"\n")
    return total.hexdigest()


def file_digest(data: bytes) -> str:
    """The short per-file digest of tree digests before folder trees and of copy sandboxes' base files."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def current_files(root: Path) -> Files:
    """Every file of a folder with its mode and content digest, freshly hashed (no cache)."""
    out: Files = {}
    for rel, mode, full, _ in walk(root):
        data = read_content(full, mode)
        if data is not None:
            out[rel] = (mode, content_digest(data))
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
