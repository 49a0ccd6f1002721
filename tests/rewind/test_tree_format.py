"""Snapshot storage: folder trees written once per changed folder, and flat trees from the keel before.

A snapshot is one blob per folder (storage/snapshots.py); an unchanged folder is the same blob in every
snapshot, so one changed file costs its blob and the folders above it. A flat tree blob written by the
previous keel must still restore, and gc and verify must follow both forms.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import SandboxTree, TreeEntry
from keel.server.engine.files import trees
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.errors import CorruptRecordError
from keel.storage.gcsweep import collect
from keel.storage.record import content_digest
from keel.storage.snapshots import load_tree
from keel.storage.verify import verify_all
from tests.storage.test_verify import make_mission

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

MANY = 300


def _make(root: Path) -> None:
    for path, text in {"top.txt": "top\n", "a/b/c.txt": "c\n", "a/d.txt": "d\n", "e/f.txt": "f\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "many").mkdir()
    for i in range(MANY):
        (root / "many" / f"file-{i:04}.txt").write_text(f"{i}\n")


def _checkpoint(txn: Txn, tree: str) -> str:
    """A checkpoint on m1's HEAD naming this snapshot; returns its digest."""
    head = m.head_checkpoint(txn, "m1")
    assert head is not None
    manifest = msgspec.structs.replace(
        head, number=head.number + 1, parent=m.head(txn, "m1") or "", sandbox_tree=tree, created_at=time.time()
    )
    return m.commit_checkpoint(txn, manifest).checkpoint


def _blob_bytes(store: Store) -> dict[str, int]:
    return store.read(lambda t: {k.decode(): len(raw) for k, raw in t.scan_raw(DB.BLOBS, b"")})


def _snapshot(store: Store, snap: trees.Snapshotter, root: Path) -> str:
    scan = snap.scan(root)
    return store.write(lambda t: snap.store_txn(t, root, scan))


def _restored(store: Store, tree: SandboxTree, into: Path) -> trees.Files:
    trees.materialize(into, tree, lambda d: store.read(lambda t: t.get_blob(d)) or b"")
    return trees.current_files(into)


def test_one_changed_file_writes_its_blob_and_the_folders_above_it(tmp_path: Path) -> None:
    root = tmp_path / "box"
    _make(root)
    with Store.open(tmp_path / "store") as store:
        snap = trees.Snapshotter()
        first = _snapshot(store, snap, root)
        before = _blob_bytes(store)
        (root / "a" / "b" / "c.txt").write_text("changed\n")
        second = _snapshot(store, snap, root)
        added = {d: n for d, n in _blob_bytes(store).items() if d not in before}
        # the file, a/b, a and the root: many/ and e/ are shared with the first snapshot
        assert len(added) == 4 and second in added, added
        assert sum(added.values()) < 1500, added  # a flat tree would rewrite all 304 entries (~30 KB)
        assert _snapshot(store, trees.Snapshotter(), root) == second and len(_blob_bytes(store)) == len(before) + 4
        old, new = (store.read(lambda t, d=d: load_tree(t.get_blob, d)) for d in (first, second))
        assert old is not None and new is not None and len(new.entries) == MANY + 4
        assert trees.tree_files(new) == trees.current_files(root)
        assert {e.path for e in old.entries} == {e.path for e in new.entries}


def test_gc_and_verify_follow_folder_trees(tmp_path: Path) -> None:
    root = tmp_path / "box"
    _make(root)
    with Store.open(tmp_path / "store") as store:
        make_mission(store, "m1", checkpoints=1)
        snap = trees.Snapshotter()
        first = _snapshot(store, snap, root)
        store.write(lambda t: _checkpoint(t, first))
        (root / "a" / "b" / "c.txt").write_text("changed\n")
        second = _snapshot(store, snap, root)
        store.write(lambda t: _checkpoint(t, second))
        (root / "e" / "f.txt").write_text("never checkpointed\n")
        third = _snapshot(store, snap, root)  # stored, but its checkpoint never committed
        assert verify_all(store).ok, verify_all(store).problems
        report = collect(store)
        assert report.blobs_removed == 3  # its root, e/ and the new f.txt; a/, many/ and top.txt are shared
        blobs = _blob_bytes(store)
        assert first in blobs and second in blobs and third not in blobs
        for digest in (first, second):
            tree = store.read(lambda t, d=digest: load_tree(t.get_blob, d))
            assert tree is not None and _restored(store, tree, tmp_path / digest) == trees.tree_files(tree)
        assert verify_all(store).ok, verify_all(store).problems
        many = content_digest(_folder_blob_of(store, second, "many"))
        store.write(lambda t: t.delete(DB.BLOBS, many.encode()))
        problems = [p.message for p in verify_all(store).problems]
        assert any(f"refers to missing blob {many[:16]}" in p for p in problems), problems
        with pytest.raises(CorruptRecordError, match="folder many of snapshot"):
            store.read(lambda t: load_tree(t.get_blob, second))


def _folder_blob_of(store: Store, root_digest: str, name: str) -> bytes:
    from keel.protocol.records import SandboxFolder

    top = store.read(lambda t: t.get_object(root_digest, SandboxFolder))
    assert top is not None
    entry = next(e for e in top.entries if e.name == name and e.mode == "d")
    data = store.read(lambda t: t.get_blob(entry.blob.hex()))
    assert data is not None
    return data


def _flat_tree_as_the_previous_keel_wrote_it(txn: Txn, root: Path) -> str:
    """The previous keel's store_txn: one blob per file and one SandboxTree blob listing every path."""
    entries = []
    for rel, mode, full, _ in trees.walk(root):
        entries.append(TreeEntry(path=rel, mode=mode, blob=txn.put_blob(trees.read_bytes(full, mode))))  # type: ignore[arg-type]
    return txn.put_object(SandboxTree(entries=tuple(entries)))


def test_a_flat_tree_written_by_the_previous_keel_still_restores_and_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "box"
    _make(root)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    with Store.open(tmp_path / "store") as store:
        make_mission(store, "m1", checkpoints=1)
        flat = store.write(lambda t: _flat_tree_as_the_previous_keel_wrote_it(t, root))
        old_point = store.write(lambda t: _checkpoint(t, flat))
        want = trees.current_files(root)
        (root / "a" / "d.txt").unlink()
        (root / "new.txt").write_text("after the upgrade\n")
        after = _snapshot(store, trees.Snapshotter(), root)
        store.write(lambda t: _checkpoint(t, after))
        report = collect(store)
        assert flat in _blob_bytes(store) and report.blobs_removed == 0
        assert verify_all(store).ok, verify_all(store).problems
        manifest = store.read(lambda t: m.get_checkpoint(t, old_point))
        tree = store.read(lambda t: trees.point_tree(t, manifest, "the old point"))
        assert _restored(store, tree, root) == want
        trees.verify(root, tree, "the old point")
        gone = next(e.blob for e in tree.entries if e.path == "a/d.txt")
        store.write(lambda t: t.delete(DB.BLOBS, gone.encode()))
        problems = [p.message for p in verify_all(store).problems]
        assert any(f"refers to missing blob {gone[:16]}" in p for p in problems), problems
