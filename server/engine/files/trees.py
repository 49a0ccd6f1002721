"""Sandbox file snapshots: the one walker over a sandbox's files, content-addressed pictures of them in
the store, the tree digest that names them, and putting them back.

`walk` is the only code that lists a sandbox; snapshots, tree digests, `current_files` (restore, fork,
diff, apply) and the copy-merge's file digests all go through it, under one set of rules: only the
person's files count (protocol/treepaths.py: `.git` and keel's state under `.keel/` are left out
everywhere, `.keel/config.toml` is the person's, keel's temporary `.NAME.XXXXXXXX.keel-tmp` files never
count); a file's mode counts (plain, executable, symlink); a file or folder
that vanishes while we look is not part of the picture, and one that cannot be read is an error naming
it (SandboxUnreadableError), never hashed as empty or skipped.

A snapshot is a folder tree in the store (storage/snapshots.py): one blob per file and one SandboxFolder
blob per folder, so an unchanged folder is shared with earlier snapshots and a snapshot writes only the
changed files and the folders above them. In a git sandbox the tree holds only the files that differ
from the sandbox's fork point, named with it in a SandboxBased blob (gitbase.py reads the commit back).
Files are read outside the write transaction (`Snapshotter.scan`) and stored inside it (`store_txn`).
A scan after a keel tool's write looks at the paths the tool wrote; any other walks the sandbox with a
stat cache (size, mtime, ctime, inode and mode per path, as git's index keeps) and re-reads a file only
when its stat changed or when its mtime was not older than the clock at the scan that cached it (a
file rewritten within that tick with the same size: "racy git"). The tree digest of a sandbox (subagent
leases) is the digest its snapshot would have (`Snapshotter.digest`), the same key and rules.
`materialize` makes a folder equal to a tree; `verify` re-hashes every file and raises
SandboxMismatchError naming what differs. Depends on storage, protocol and gitbase.py; nothing of the host.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import NamedTuple

import msgspec

from keel.protocol.diskspace import disk_full, says_no_space
from keel.protocol.errors import ErrorCode, KeelError, NotFoundError
from keel.protocol.hashes import blake2b
from keel.protocol.records import CheckpointManifest, FolderEntry, SandboxBased, SandboxTree, TreeEntry, is_tree_ref
from keel.protocol.treepaths import CONFIG, GIT_DIR, KEEL_DIR, create_temp, is_persons, is_temp, path_problem
from keel.server.engine.files import gitbase
from keel.server.engine.files.gitbase import Listed
from keel.storage import DB, Txn
from keel.storage.record import content_digest
from keel.storage.snapshots import BaseFiles, based_blob, folder_blob, load_tree

SKIP = frozenset({GIT_DIR, KEEL_DIR})  # folders a walk does not enter (of `.keel`, only its config file counts)
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


class UnsafePathError(KeelError):
    """A snapshot names a path outside the person's files (`..`, `.git`, keel's state): never written."""

    code = ErrorCode.CORRUPT_RECORD


class NoSnapshotError(NotFoundError):
    """A restore point without a file snapshot (recorded before snapshots existed, or no sandbox yet)."""


class Scan(msgspec.Struct):
    entries: list[TreeEntry]  # the files that differ from `base` (every file without one), sorted by path
    fresh: dict[str, bytes]  # digest -> bytes read in this scan (files that changed since the last one)
    base: str = ""  # the git commit the snapshot is relative to ("": none, it names every file)
    removed: tuple[str, ...] = ()  # files of `base` the sandbox no longer holds


class _Known(NamedTuple):
    key: tuple[int, int, int, int, str]  # size, mtime_ns, ctime_ns, inode, mode: what git's index keeps
    racy: bool  # modified in the tick the scan began: read again at the next walk, whatever its stat says
    entry: TreeEntry | None  # None: the same bytes and mode as the base commit's file


def walk(root: Path) -> list[tuple[str, str, str, os.stat_result]]:
    """(relative posix path, mode, absolute path, lstat) of every one of the person's files and symlinks
    under root, sorted. Fifos, sockets and devices are not content; an unreadable folder is a
    SandboxUnreadableError."""
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
            if entry.name == KEEL_DIR:
                out += _keel_config(entry, prefix + KEEL_DIR + "/")
                continue
            if entry.name == GIT_DIR or is_temp(entry.name):
                continue
            found = _entry(entry.path, prefix + entry.name, functools.partial(entry.stat, follow_symlinks=False))
            if found is not None and found[1] == "d":
                stack.append((entry.path, found[0] + "/"))
            elif found is not None:
                out.append(found)
    out.sort()
    return out


def _entry(full: str, rel: str, lstat: Callable[[], os.stat_result]) -> tuple[str, str, str, os.stat_result] | None:
    """(rel, mode, full, lstat) of one walked path, mode "d" for a folder; None when it is gone or is
    not content."""
    try:
        st = lstat()
    except _GONE:
        return None
    except OSError as exc:
        raise SandboxUnreadableError(full, exc) from None
    mode = "d" if stat.S_ISDIR(st.st_mode) else _mode(st)
    return (rel, mode, full, st) if mode else None


def _keel_config(folder: os.DirEntry[str], prefix: str) -> list[tuple[str, str, str, os.stat_result]]:
    """Of a `.keel` folder (never one reached through a symlink), the one file that is the person's: its
    `config.toml`."""
    try:
        if not folder.is_dir(follow_symlinks=False):
            return []
    except OSError:
        return []
    full = os.path.join(folder.path, CONFIG)
    found = _entry(full, prefix + CONFIG, lambda: os.lstat(full))
    return [found] if found is not None and found[1] != "d" else []


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
    """Scans one sandbox again and again, re-reading only files that changed since the previous scan
    and re-encoding only folders whose entries changed. A git sandbox's snapshots are relative to its
    fork point (gitbase.fork_point): files equal to that commit's are neither read at the first scan
    (git's index says they are unchanged) nor stored."""

    def __init__(self, base: str | None = None, repo: Path | None = None) -> None:
        self._base = base  # None: chosen at the first scan; "": no base commit
        self._repo = repo  # where the base commit is read (by default the sandbox's own repository)
        self._git = False  # the sandbox is a git work tree: git's index can say what is unchanged
        self._listing: dict[str, Listed] = {}
        self._known: dict[str, _Known] = {}
        self._changed: dict[str, TreeEntry] = {}  # the files that differ from the base
        self._removed: set[str] = set()
        self._walked = False  # the stat cache holds every file (a walk filled it)
        self._seeded = False  # the picture holds every file (a walk, or git, made it)
        self._folders: dict[str, tuple[tuple[object, ...], bytes, str]] = {}

    def scan(
        self, root: Path, *, keep_bytes: bool = True, paths: Collection[str] | None = None, checked_out: bool = False
    ) -> Scan:
        """The sandbox as it is now. `paths`: the only files changed since the previous scan (keel's own
        tools know what they wrote); None walks the whole sandbox (a command may have changed anything).
        The first scan of a git sandbox asks git which files differ from the base commit and reads only
        those (no walk: a fresh worktree is ready as soon as git made it); the first walk fills the stat
        cache the same way. `checked_out`: keel made this worktree from HEAD just now and nothing else has
        written in it: its files are HEAD's, and only the paths where HEAD differs from the base are read."""
        if self._base is None:  # the first scan: whether git knows the sandbox, and its base, in one go
            base = gitbase.base_of(root) if (root / ".git").exists() else None
            self._git, self._base = base is not None, base or ""
        elif not self._seeded:
            self._git = (root / ".git").exists() and gitbase.is_repo(root)
        if self._base and not self._seeded:
            self._listing = gitbase.GitBase(self._repo or root).listing(self._base)
        fresh: dict[str, bytes] = {}
        keep = fresh if keep_bytes else None
        stamp = _stamp(root)
        if not self._seeded and self._base and self._git and self._seed(root, stamp, keep, checked_out):
            pass
        elif paths is None or not self._seeded:
            self._walk(root, stamp, keep)
        else:
            for rel in sorted(set(paths)):
                self._one(root, rel, stamp, keep)
        entries = sorted(self._changed.values(), key=lambda e: e.path)
        return Scan(entries=entries, fresh=fresh, base=self._base, removed=tuple(sorted(self._removed)))

    def _seed(self, root: Path, stamp: int, fresh: dict[str, bytes] | None, checked_out: bool) -> bool:
        """The first picture of a git sandbox from git's index: only the files that differ from the base
        commit (changed, deleted, untracked) are looked at. False when git cannot list them all."""
        found = [] if checked_out else gitbase.untracked(root)
        if found is None:
            return False
        for rel in sorted(gitbase.changed_since(root, self._base or "", head=checked_out) | set(found)):
            self._one(root, rel, stamp, fresh)
        self._seeded = True
        return True

    def _walk(self, root: Path, stamp: int, fresh: dict[str, bytes] | None) -> None:
        found = walk(root)
        seed = not self._walked and bool(self._base) and self._git  # no stat cache: git's index says what is unchanged
        # after the walk: a file changed between git's look and ours has a stat we do not trust below
        suspect = gitbase.changed_since(root, self._base) if seed and self._base else set()
        known: dict[str, _Known] = {}
        for rel, mode, full, st in found:
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode)
            old = self._known.get(rel)
            if old is not None and old.key == key and not old.racy:
                known[rel] = old
                continue
            racy = st.st_mtime_ns >= stamp
            listed = self._listing.get(rel)
            if seed and not racy and listed and listed.mode == mode and rel not in suspect:
                known[rel] = _Known(key, False, None)  # git's index: unchanged from the base commit
                continue
            present, got = self._read(full, rel, mode, fresh)
            if present:
                known[rel] = _Known(key, racy, got)
        self._known = known
        self._changed = {rel: k.entry for rel, k in known.items() if k.entry is not None}
        self._removed = {rel for rel in self._listing if rel not in known}
        self._walked = self._seeded = True

    def _one(self, root: Path, rel: str, stamp: int, fresh: dict[str, bytes] | None) -> None:
        """Look at one path again (a tool wrote or removed it)."""
        if not is_persons(rel):
            return
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except _GONE:
            st = None
        except OSError as exc:
            raise SandboxUnreadableError(full, exc) from None
        mode = "" if st is None else _mode(st)
        present, got = self._read(full, rel, mode, fresh) if st is not None and mode else (False, None)
        if st is None or not present:
            self._known.pop(rel, None)
            self._changed.pop(rel, None)
            if rel in self._listing:
                self._removed.add(rel)
            return
        self._known[rel] = _Known(
            (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode), st.st_mtime_ns >= stamp, got
        )
        self._removed.discard(rel)
        if got is None:
            self._changed.pop(rel, None)
        else:
            self._changed[rel] = got

    def _read(self, full: str, rel: str, mode: str, fresh: dict[str, bytes] | None) -> tuple[bool, TreeEntry | None]:
        """(still there, the file's entry: None when it equals the base commit's file)."""
        data = read_content(full, mode)
        if data is None:
            return False, None
        listed = self._listing.get(rel)
        if listed and listed.mode == mode and gitbase.git_oid(data) == listed.oid:
            return True, None
        entry = TreeEntry(path=rel, mode=mode, blob=content_digest(data))  # type: ignore[arg-type]
        if fresh is not None:
            fresh[entry.blob] = data
        return True, entry

    def digest(self, root: Path) -> str:
        """The sandbox's tree digest: the name its snapshot would have (nothing is stored)."""
        scan = self.scan(root, keep_bytes=False)
        return _top(scan, self._fold(scan.entries)[-1].digest)[1]

    def store_txn(self, txn: Txn, root: Path, scan: Scan) -> str:
        """Write the scan's new file and folder blobs; returns the snapshot's digest (its root folder, or
        the based blob naming it and the commit). A folder blob already in the store is whole (its files
        and subfolders were stored with it)."""
        folders = self._fold(scan.entries)
        data, digest = _top(scan, folders[-1].digest)
        stored = txn.which_exist(DB.BLOBS, [folder.digest.encode() for folder in folders])
        missing = [folder for folder in folders if folder.digest.encode() not in stored]
        named = {e.blob.encode() for folder in missing for e in folder.files if e.blob not in scan.fresh}
        present = txn.which_exist(DB.BLOBS, named)  # one question for them all, not one per file
        for folder in missing:
            for entry in folder.files:
                if entry.blob in scan.fresh:
                    txn.put_blob(scan.fresh[entry.blob])
                elif entry.blob.encode() not in present:
                    self._store_again(txn, root, entry)
            txn.put_blob(folder.data)
        if scan.base:
            txn.put_blob(data)
        return digest

    def _store_again(self, txn: Txn, root: Path, entry: TreeEntry) -> None:
        """A file known from an earlier scan whose checkpoint never committed (or was collected)."""
        full = str(root / entry.path)
        data = read_content(full, entry.mode)
        if data is None or content_digest(data) != entry.blob:
            self._known.pop(entry.path, None)
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


def _top(scan: Scan, folder: str) -> tuple[bytes, str]:
    """A snapshot's own blob and digest: its root folder's, or the based blob naming the commit."""
    if not scan.base:
        return b"", folder
    return based_blob(SandboxBased(base=scan.base, files=folder, removed=scan.removed))


def _stamp(root: Path) -> int:
    """The file system's clock now, in its own granularity (a file's mtime is read from the same clock): the
    root folder's mtime after touching it, as git takes its index file's. A file whose mtime is not
    older than this may still change within the same tick without its stat changing."""
    try:
        os.utime(root)
        return os.stat(root).st_mtime_ns
    except OSError:
        return time.time_ns() - 2_000_000_000  # cannot touch it: treat the last two seconds as racy


def _mode(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "l"
    if stat.S_ISREG(st.st_mode):
        return "x" if st.st_mode & 0o100 else "f"
    return ""


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def tree_digest(root: Path) -> str:
    """A sandbox's tree digest, every file read afresh."""
    return Snapshotter().digest(root)


def digest_as_recorded(root: Path, recorded: str, base: str = "", repo: Path | None = None) -> str:
    """The sandbox's tree digest in the form `recorded` has, to compare the two. A 32-hex digest was
    recorded by a keel before folder trees (a lease written before an upgrade): it is computed that
    keel's way, so an intact sandbox still matches; any other is the digest of a snapshot relative to
    `base`, the commit the recorded one names (storage/snapshots.snapshot_base; "" for none), read in
    `repo`."""
    return _digest_before_folder_trees(root) if len(recorded) == 32 else Snapshotter(base, repo).digest(root)


def _digest_before_folder_trees(root: Path) -> str:
    """What keel recorded as a tree digest before folder trees: BLAKE2b-128 over "path NUL digest LF" of
    each file, in os.walk's order (a folder's files by name, then its subfolders by name), a file's digest
    being an unkeyed BLAKE2b-128 of its bytes (a link's target); modes did not count, `.git` and `.keel`
    were skipped only as folders (a worktree's `.git` file counted; one in a folder holding no other file
    is not found here) and a link to a folder did not count."""
    listed: dict[str, tuple[str, str]] = {}
    for rel, mode, full, _ in walk(root):
        if not (mode == "l" and os.path.isdir(full)) and KEEL_DIR not in rel.split("/"):
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

    total = blake2b(digest_size=16, person=b"keel-tree")
    for rel in sorted(listed, key=walk_order):
        data = read_content(*listed[rel])
        if data is not None:
            total.update(rel.encode() + b"\x00" + file_digest(data).encode() + b"\n")
    return total.hexdigest()


def file_digest(data: bytes) -> str:
    """The short per-file digest of tree digests before folder trees and of copy sandboxes' base files."""
    return blake2b(data, digest_size=16).hexdigest()


def current_files(root: Path) -> Files:
    """Every file of a folder with its mode and content digest, freshly hashed (no cache)."""
    out: Files = {}
    for rel, mode, full, _ in walk(root):
        data = read_content(full, mode)
        if data is not None:
            out[rel] = (mode, content_digest(data))
    return out


def tree_files(tree: SandboxTree) -> Files:
    """A snapshot's files; a temporary file of keel's that an older keel recorded is not one of them."""
    return {e.path: (e.mode, e.blob) for e in tree.entries if not is_temp(_name(e.path))}


def point_tree(txn: Txn, manifest: CheckpointManifest, what: str, base: BaseFiles | None = None) -> SandboxTree:
    """The file snapshot a checkpoint refers to (`base` reads the commit a git sandbox's snapshot is
    relative to); NoSnapshotError when it has none."""
    tree = load_tree(txn.get_blob, manifest.sandbox_tree, base) if is_tree_ref(manifest.sandbox_tree) else None
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


def materialize(root: Path, tree: SandboxTree, blob: Callable[[str], bytes], what: str = "the snapshot") -> list[str]:
    """Make `root` hold exactly the tree's files (.git and keel's state untouched); returns the paths
    changed. A path that is not one of the person's files (protocol/treepaths.path_problem) is an
    UnsafePathError naming `what`, before anything is changed. A file that cannot be written for want of
    space is a DiskFullError (the mission pauses), never a crash."""
    want = tree_files(tree)
    for path in want:
        if problem := path_problem(path):
            raise UnsafePathError(f"{what} holds the path {path!r}, which {problem}; nothing was changed")
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
        try:
            write_file(root, path, mode, blob(digest))
        except OSError as exc:  # a sandbox made again here (a move, a worker, a restore) on a full disk
            if says_no_space(exc):
                raise disk_full(root / path, str(exc), "the sandbox file") from None
            raise
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
    fd, tmp = create_temp(full)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        tmp.chmod(0o755 if mode == "x" else 0o644)
        os.replace(tmp, full)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_temps(root: Path) -> list[str]:
    """Remove the temporary files of keel's a killed write left in `root` (protocol/treepaths.py); returns
    their paths. Only call it when no keel process writes there (a host recovering after a crash)."""
    removed = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP]
        for name in names:
            if is_temp(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                    removed.append(Path(folder, name).relative_to(root).as_posix())
    return sorted(removed)


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
        import difflib  # only for a diff shown to a person

        lines = difflib.unified_diff(
            text_a.splitlines(keepends=True), text_b.splitlines(keepends=True), fromfile=left, tofile=right
        )
        chunks.append(
            header
            + "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        )
    return "".join(chunks)
