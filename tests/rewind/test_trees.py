"""Sandbox snapshots on real files and a real store: what is captured, sharing between snapshots, and
putting a folder back exactly (symlinks, modes, a file where a folder was and the other way round)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from keel.protocol.errors import DiskFullError
from keel.protocol.records import SandboxTree
from keel.server.engine.files import trees
from keel.storage import DB, Store
from keel.storage.snapshots import load_tree
from tests.tmpfs import fill, mounted

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _tree(store: Store, snap: trees.Snapshotter, root: Path) -> tuple[str, SandboxTree]:
    scan = snap.scan(root)
    digest = store.write(lambda t: snap.store_txn(t, root, scan))
    tree = store.read(lambda t: load_tree(t.get_blob, digest))
    assert tree is not None
    return digest, tree


def _blobs(store: Store) -> int:
    return store.read(lambda t: sum(1 for _ in t.scan_raw(DB.BLOBS, b"")))


def _make(root: Path) -> None:
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "pkg" / "deep" / "x.py").write_text("x = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("pkg/deep/x.py", root / "link")
    (root / ".git").write_text("gitdir: elsewhere\n")
    (root / ".keel").mkdir()
    (root / ".keel" / "state").write_text("keel's own\n")
    (root / "blob.bin").write_bytes(bytes(range(256)))


def test_snapshot_captures_files_modes_links_and_skips_git_and_keel(tmp_path: Path) -> None:
    root = tmp_path / "box"
    root.mkdir()
    _make(root)
    with Store.open(tmp_path / "store") as store:
        snap = trees.Snapshotter()
        first, tree = _tree(store, snap, root)
        assert [(e.path, e.mode) for e in tree.entries] == [
            ("blob.bin", "f"),
            ("link", "l"),
            ("pkg/deep/x.py", "f"),
            ("run.sh", "x"),
        ]
        count = _blobs(store)
        assert _tree(store, trees.Snapshotter(), root)[0] == first and _blobs(store) == count  # all shared
        (root / "run.sh").write_text("#!/bin/sh\necho changed\n")
        second, _ = _tree(store, snap, root)
        assert second != first and _blobs(store) == count + 2  # one new file blob, one new tree


def test_materialize_puts_a_folder_back_exactly_and_verify_notices_changes(tmp_path: Path) -> None:
    root = tmp_path / "box"
    root.mkdir()
    _make(root)
    with Store.open(tmp_path / "store") as store:
        _, tree = _tree(store, trees.Snapshotter(), root)
        before = trees.current_files(root)
        # every kind of change at once
        (root / "pkg" / "deep" / "x.py").unlink()
        (root / "pkg" / "deep").rmdir()
        (root / "pkg" / "deep").write_text("a file where a folder was\n")
        (root / "run.sh").chmod(0o644)
        (root / "link").unlink()
        (root / "link").mkdir()
        (root / "link" / "inside").write_text("a folder where a link was\n")
        (root / "new" / "empty").mkdir(parents=True)
        (root / "new" / "added.txt").write_text("added\n")
        with pytest.raises(trees.SandboxMismatchError, match=r"new/added\.txt: not in the snapshot"):
            trees.verify(root, tree, "p1")

        def blob(digest: str) -> bytes:
            data = store.read(lambda t: t.get_blob(digest))
            assert data is not None
            return data

        changed = trees.materialize(root, tree, blob)
        assert trees.current_files(root) == before
        trees.verify(root, tree, "p1")
        assert os.readlink(root / "link") == "pkg/deep/x.py" and os.access(root / "run.sh", os.X_OK)
        assert not (root / "new").exists() and (root / ".keel" / "state").read_text() == "keel's own\n"
        assert (root / ".git").read_text() == "gitdir: elsewhere\n"
        assert set(changed) >= {"new/added.txt", "run.sh", "link", "pkg/deep/x.py"}
        (root / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
        with pytest.raises(trees.SandboxMismatchError, match=r"blob\.bin: content differs"):
            trees.verify(root, tree, "p1")


def test_snapshot_holds_the_persons_keel_config_but_no_keel_state_or_temporary_file(tmp_path: Path) -> None:
    root = tmp_path / "box"
    (root / ".keel" / "store").mkdir(parents=True)
    (root / ".keel" / "config.toml").write_text("# the team's providers\n")
    (root / ".keel" / "store" / "data.mdb").write_bytes(b"keel's own")
    (root / "sub" / ".git").mkdir(parents=True)
    (root / "sub" / ".git" / "config").write_text("[core]\n")
    (root / "sub" / ".big.txt.k3x9_q0z.keel-tmp").write_text("half a write")
    (root / "sub" / "notes.keel-tmp").write_text("the person's\n")
    with Store.open(tmp_path / "store") as store:
        _, tree = _tree(store, trees.Snapshotter(), root)
        assert [e.path for e in tree.entries] == [".keel/config.toml", "sub/notes.keel-tmp"]
        assert trees.tree_digest(root) == trees.Snapshotter().digest(root)

        def blob(digest: str) -> bytes:
            data = store.read(lambda t: t.get_blob(digest))
            assert data is not None
            return data

        (root / ".keel" / "config.toml").write_text("# changed since\n")
        assert trees.materialize(root, tree, blob) == [".keel/config.toml"]
        assert (root / ".keel" / "config.toml").read_text() == "# the team's providers\n"
        assert (root / ".keel" / "store" / "data.mdb").read_bytes() == b"keel's own"
        assert trees.remove_temps(root) == ["sub/.big.txt.k3x9_q0z.keel-tmp"]
        assert sorted(p.name for p in (root / "sub").iterdir()) == [".git", "notes.keel-tmp"]

        unsafe = SandboxTree(entries=[*tree.entries, msgspec.structs.replace(tree.entries[0], path=".keel/store/x")])
        with pytest.raises(trees.UnsafePathError, match=r"restore point p3 holds the path '\.keel/store/x'"):
            trees.materialize(tmp_path / "elsewhere", unsafe, blob, "restore point p3")
        assert not (tmp_path / "elsewhere").exists()


def test_materialize_on_a_full_disk_is_a_full_disk(tmp_path: Path) -> None:
    """A sandbox made again from its snapshot (a move, a worker, a restore) on a full tmpfs: DiskFullError
    naming the mount and the file, never an OSError that ends the host."""
    source = tmp_path / "box"
    source.mkdir()
    (source / "big.bin").write_bytes(bytes(range(256)) * 2400)
    with Store.open(tmp_path / "store") as store, mounted(tmp_path / "mnt", "1m") as mnt:
        _, tree = _tree(store, trees.Snapshotter(), source)
        fill(mnt, leave=300 * 1024)
        with pytest.raises(DiskFullError) as info:
            trees.materialize(mnt / "box", tree, lambda d: store.read(lambda t: t.get_blob(d)) or b"")
        assert info.value.mount == str(mnt)
        assert f"the sandbox file {mnt / 'box' / 'big.bin'}: " in info.value.message
        assert "No space left on device" in info.value.message
