"""Sandbox file snapshots as blobs: both stored forms, read as one flat tree, and the blobs they reach.

A snapshot written today is a folder tree: one SandboxFolder blob per folder (its files and subfolders by
name, a subfolder naming another folder blob), so an unchanged folder is the same blob in every snapshot,
as with git's trees, and a snapshot writes only the folders on the path to what changed. Keels before
it wrote one flat SandboxTree blob per snapshot; both forms are read here (`load_tree` gives the flat
picture either way), so an old restore point still restores, and gc, verify and bundles follow both
(`tree_refs`). A CheckpointManifest.sandbox_tree of 32 hex digits is older still: a digest of the files
that names no blob. Depends on keel.protocol and storage's record and error modules only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import msgspec

from keel.protocol.records import CheckpointManifest, FolderEntry, SandboxFolder, SandboxTree, TreeEntry
from keel.storage.errors import CorruptRecordError
from keel.storage.keys import DB
from keel.storage.record import content_digest

GetBlob = Callable[[str], bytes | None]

_decoder = msgspec.msgpack.Decoder(SandboxTree | SandboxFolder)
_encoder = msgspec.msgpack.Encoder()


def is_tree_ref(value: str) -> bool:
    """A sandbox_tree naming a snapshot blob (checkpoints of older keels hold a 32-hex digest of the
    files instead, which names no blob: those points restore state but not files)."""
    return len(value) == 64


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


def _decode(get_blob: GetBlob, digest: str) -> SandboxTree | SandboxFolder | None:
    data = get_blob(digest)
    if data is None:
        return None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(DB.BLOBS.value, digest.encode(), f"is not a sandbox tree: {exc}") from None


def load_tree(get_blob: GetBlob, digest: str) -> SandboxTree | None:
    """The snapshot named by `digest` as one flat tree sorted by path, whichever form it was stored in;
    None when there is no such blob. A folder blob missing below the root is a CorruptRecordError."""
    top = _decode(get_blob, digest)
    if top is None or isinstance(top, SandboxTree):
        return top
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
