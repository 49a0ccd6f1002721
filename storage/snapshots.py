"""Sandbox file snapshots as blobs: both stored forms, read as one flat tree, and the blobs they reach.

A snapshot written today is a folder tree: one SandboxFolder blob per folder (its files and subfolders by
name, a subfolder naming another folder blob), so an unchanged folder is the same blob in every snapshot,
as with git's trees, and a snapshot writes only the folders on the path to what changed. Keels before
it wrote one flat SandboxTree blob per snapshot; both forms are read here (`load_tree` gives the flat
picture either way), so an old restore point still restores, and gc, verify and bundles follow both
(`tree_refs`). A CheckpointManifest.sandbox_tree of 32 hex digits is older still: a digest of the files
that names no blob.

A snapshot of a git sandbox is a SandboxBased blob: a commit of the workspace's repository, the paths of
it that are gone, and a folder tree holding only the files that differ from it. The store never holds
the commit's own files: `load_tree` reads them through a BaseFiles (server/engine/files/gitbase.py), and
without one, or when the repository lacks the commit, it raises BaseCommitError naming the commit. gc,
verify and bundles follow only what the store holds (`tree_refs`: the based blob and its folder tree).
Depends on keel.protocol and storage's record and error modules only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import msgspec

from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.records import (
    CheckpointManifest,
    FolderEntry,
    SandboxBased,
    SandboxFolder,
    SandboxTree,
    TreeEntry,
    is_tree_ref,
)
from keel.storage.errors import CorruptRecordError
from keel.storage.keys import DB
from keel.storage.record import content_digest

GetBlob = Callable[[str], bytes | None]

Snapshot = SandboxTree | SandboxFolder | SandboxBased
_decoder: msgspec.msgpack.Decoder[Snapshot] = msgspec.msgpack.Decoder(Snapshot)
_encoder = msgspec.msgpack.Encoder()


class BaseCommitError(KeelError):
    """A snapshot relative to a git commit that cannot be read here: no repository was given, or the
    repository does not have the commit (garbage-collected, history rewritten, another clone)."""

    code = ErrorCode.NOT_FOUND


class BaseFiles(Protocol):
    """The files of a commit, as snapshot entries (keel's content digests): a repository's reader."""

    def files(self, commit: str) -> list[TreeEntry]: ...


def manifest_trees(manifest: CheckpointManifest) -> list[str]:
    """The snapshots a checkpoint names: the mission sandbox's, and the own sandboxes of units that had not
    finished (each unit's files and the files it started from)."""
    marks = manifest.units.values()
    found = [manifest.sandbox_tree, *(m.tree for m in marks), *(m.base_tree for m in marks)]
    return list(dict.fromkeys(t for t in found if is_tree_ref(t)))


def folder_blob(entries: tuple[FolderEntry, ...]) -> tuple[bytes, str]:
    """A folder's blob bytes and the digest that names it."""
    data = _encoder.encode(SandboxFolder(entries=entries))
    return data, content_digest(data)


def based_blob(based: SandboxBased) -> tuple[bytes, str]:
    """A based snapshot's blob bytes and the digest that names it."""
    data = _encoder.encode(based)
    return data, content_digest(data)


def base_of_blob(data: bytes) -> str:
    """The commit a blob names when it is a based snapshot; "" for any other blob (a file, a folder)."""
    try:
        found = _decoder.decode(data)
    except msgspec.DecodeError:
        return ""
    return found.base if isinstance(found, SandboxBased) else ""


def snapshot_base(get_blob: GetBlob, digest: str) -> str:
    """The git commit a snapshot is relative to; "" for a snapshot holding every file."""
    top = _decode(get_blob, digest) if is_tree_ref(digest) else None
    return top.base if isinstance(top, SandboxBased) else ""


def _decode(get_blob: GetBlob, digest: str) -> Snapshot | None:
    data = get_blob(digest)
    if data is None:
        return None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(DB.BLOBS.value, digest.encode(), f"is not a sandbox tree: {exc}") from None


def load_tree(get_blob: GetBlob, digest: str, base: BaseFiles | None = None) -> SandboxTree | None:
    """The snapshot named by `digest` as one flat tree sorted by path, whichever form it was stored in;
    None when there is no such blob. A folder blob missing below the root is a CorruptRecordError; a
    snapshot relative to a commit `base` cannot give is a BaseCommitError."""
    top = _decode(get_blob, digest)
    if top is None or isinstance(top, SandboxTree):
        return top
    if isinstance(top, SandboxBased):
        return _based_tree(get_blob, digest, top, base)
    return _folder_tree(get_blob, digest, top)


def _based_tree(get_blob: GetBlob, digest: str, top: SandboxBased, base: BaseFiles | None) -> SandboxTree:
    if base is None:
        raise BaseCommitError(
            f"snapshot {digest[:16]} holds only what differs from git commit {top.base[:12]}; "
            "it needs the mission's git repository to be read"
        )
    gone = set(top.removed)
    files = {e.path: e for e in base.files(top.base) if e.path not in gone}
    changed = _decode(get_blob, top.files)
    if not isinstance(changed, SandboxFolder):
        what = "is missing" if changed is None else "is not a folder"
        raise CorruptRecordError(DB.BLOBS.value, top.files.encode(), f"the files of snapshot {digest[:16]} {what}")
    for entry in _folder_tree(get_blob, top.files, changed).entries:
        files[entry.path] = entry
    return SandboxTree(entries=tuple(sorted(files.values(), key=lambda e: e.path)))


def _folder_tree(get_blob: GetBlob, digest: str, top: SandboxFolder) -> SandboxTree:
    files: list[TreeEntry] = []
    stack: list[tuple[str, SandboxFolder]] = [("", top)]
    while stack:
        prefix, folder = stack.pop()
        for entry in folder.entries:
            if entry.mode != "d":
                files.append(TreeEntry(path=prefix + entry.name, mode=entry.mode, blob=entry.blob.hex()))
                continue
            sub = _decode(get_blob, entry.blob.hex())
            if not isinstance(sub, SandboxFolder):
                what = "is missing" if sub is None else "is a flat tree, not a folder"
                raise CorruptRecordError(
                    DB.BLOBS.value,
                    entry.blob.hex().encode(),
                    f"folder {prefix}{entry.name} of snapshot {digest[:16]} {what}",
                )
            stack.append((f"{prefix}{entry.name}/", sub))
    files.sort(key=lambda e: e.path)
    return SandboxTree(entries=tuple(files))


def tree_refs(get_blob: GetBlob, digest: str, skip: Collection[str] = ()) -> list[str]:
    """The snapshot's blobs: its tree or folder blobs and every file blob they name (files are not read
    here: a missing one is found by whoever copies or checks them; a missing folder is listed, so it is
    found the same way). Folders in `skip` (already followed from another snapshot) are not entered
    again. An absent snapshot gives nothing."""
    top = _decode(get_blob, digest)
    if top is None:
        return []
    if isinstance(top, SandboxTree):
        return [digest, *(entry.blob for entry in top.entries)]
    if isinstance(top, SandboxBased):  # the commit's files are the repository's, not the store's
        if top.files in skip:
            return [digest]
        return [digest, *(tree_refs(get_blob, top.files, skip) or [top.files])]  # a missing one is listed
    out = [digest]
    stack = [top]
    while stack:
        for entry in stack.pop().entries:
            ref = entry.blob.hex()
            if entry.mode != "d":
                out.append(ref)
            elif ref not in skip:
                out.append(ref)
                sub = _decode(get_blob, ref)
                if isinstance(sub, SandboxFolder):
                    stack.append(sub)
    return out
