"""Snapshots that follow what changed: the stat cache sees a same-tick, same-size rewrite and a command's
change; a git sandbox's snapshots hold only what differs from a commit of its repository, and restore,
fork and bundles read that commit back; a commit that is gone is a clear error, never another tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from keel.server.engine.files import trees
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.record import content_digest
from keel.storage.snapshots import load_tree, snapshot_base
from tests.bundles.kit import git, git_workspace, keel, ok, read, record
from tests.rewind.kit import AFTER_U1, AFTER_U2, imported_into_a_clone, mission, point_after, sandbox_files

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _stat(path: Path) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _store(store: Store, snap: trees.Snapshotter, root: Path, paths: list[str] | None = None) -> str:
    scan = snap.scan(root, paths=paths)
    return store.write(lambda t: snap.store_txn(t, root, scan))  # type: ignore[no-any-return]


def _files(store: Store, digest: str, repo: Path | None = None) -> dict[str, str]:
    from keel.server.engine.files.gitbase import GitBase

    tree = store.read(lambda t: load_tree(t.get_blob, digest, GitBase(repo) if repo else None))
    assert tree is not None
    return {e.path: e.blob for e in tree.entries}


@contextmanager
def coarse_clock(where: Path) -> Iterator[Path]:
    """A real file system whose timestamps count whole seconds (ext2 with 128-byte inodes), mounted for
    the test, so that a file rewritten within the second keeps its size, mtime, ctime and inode; skips
    where mounting is not permitted."""
    image, mnt = where / "fs.img", where / "mnt"
    mnt.mkdir(parents=True)
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    made = subprocess.run(["mke2fs", "-q", "-F", "-t", "ext2", "-I", "128", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(mnt)]).returncode == 0
    if not mounted:
        pytest.skip("cannot make and mount a loop ext2 file system here (needs mke2fs and root with loop devices)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_same_size_rewrite_within_the_tick_of_the_scan_is_seen(tmp_path: Path) -> None:
    with coarse_clock(tmp_path) as mnt:
        root = mnt / "box"
        root.mkdir()
        target = root / "a.txt"
        for _ in range(20):  # until the write, the scan and the rewrite fall in one tick of the clock
            snap = trees.Snapshotter()
            target.write_text("one\n")
            first = snap.scan(root)
            before = _stat(target)
            with open(target, "r+") as f:  # the same inode, the same size
                f.write("two\n")
            if _stat(target) == before:
                break
        else:
            raise AssertionError("no rewrite landed within one tick of the file system's clock")
        assert [e.blob for e in first.entries] == [content_digest(b"one\n")]
        assert [e.blob for e in snap.scan(root).entries] == [content_digest(b"two\n")]  # stat alone says "same"


def test_a_change_made_by_a_command_outside_keels_tools_is_seen(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    git_workspace(ws)
    with Store.open(tmp_path / "store") as store:
        snap = trees.Snapshotter()
        _store(store, snap, ws)
        (ws / "tool.txt").write_text("written by write_file\n")
        digest = _store(store, snap, ws, paths=["tool.txt"])  # a tool says what it wrote
        assert set(_files(store, digest, ws)) == {"README.md", "data.bin", "old.txt", "tool.txt"}
        command = "sed -i 's/hello/HELLO/' README.md && rm old.txt && echo x > new.txt"
        subprocess.run(["sh", "-c", command], cwd=ws, check=True)
        digest = _store(store, snap, ws)  # after a command: the whole sandbox, by its stat data
        files = _files(store, digest, ws)
        assert set(files) == {"README.md", "data.bin", "tool.txt", "new.txt"}
        assert files["README.md"] == content_digest(b"HELLO\n")
        assert store.read(lambda t: snapshot_base(t.get_blob, digest)) == git(ws, "rev-parse", "HEAD")


def _based(store: Path, mid: str) -> list[str]:
    """The commits the snapshots of the mission's restore points are relative to."""

    def bases(t: Txn) -> list[str]:
        trees_of = [m.get_checkpoint(t, p.checkpoint).sandbox_tree for p in m.restore_points(t, mid)]
        return [snapshot_base(t.get_blob, tree) for tree in trees_of]

    return read(store, bases)  # type: ignore[no-any-return]


def test_restore_fork_and_bundle_of_snapshots_relative_to_a_commit(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    base = git(ws, "rev-parse", "HEAD")
    assert set(b for b in _based(store, mid) if b) == {base}  # the person's commit: no copy of its files
    sandbox = Path(record(store, mid).sandbox)
    p_u1 = point_after(store, mid, "unit succeeded: u1")

    ok(keel("restore", mid, p_u1, "--files", store=store))
    assert sandbox_files(sandbox) == AFTER_U1
    forked = json.loads(ok(keel("fork", mid, p_u1, "--json", store=store)).stdout)
    assert sandbox_files(Path(forked["sandbox"])) == AFTER_U1

    other = imported_into_a_clone(tmp_path, ws, store, mid)
    bundle = tmp_path / "m.keel"
    p_done = point_after(other, mid, "completed")
    ok(keel("restore", mid, p_done, "--files", store=other))
    assert sandbox_files(Path(record(other, mid).sandbox)) == AFTER_U2

    # a repository without that commit: the import says which commit it needs and imports nothing
    stranger = tmp_path / "stranger" / "ws"
    git_workspace(stranger)
    (stranger / "README.md").write_text("another history\n")
    git(stranger, "commit", "-q", "-am", "other")
    out = keel("import", str(bundle), "--workspace", str(stranger), "--allow-unsigned", store=tmp_path / "s3")
    assert out.returncode != 0 and not (tmp_path / "s3").exists()
    assert git(stranger, "rev-parse", "HEAD")[:12] not in out.stderr
    assert base[:12] in out.stderr and "fetch or clone it first" in out.stderr


def test_a_base_commit_gone_from_the_repository_is_a_clear_error_not_another_tree(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    base = git(ws, "rev-parse", "HEAD")
    sandbox = Path(record(store, mid).sandbox)
    p_u1 = point_after(store, mid, "unit succeeded: u1")
    # the person rewrites history and drops keel's branches; git collects the old commit
    for line in git(ws, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree ") and Path(line[9:]) != ws.resolve():
            git(ws, "worktree", "remove", "--force", "--force", line[9:])
    for branch in git(ws, "for-each-ref", "--format=%(refname:short)", "refs/heads/keel").split():
        git(ws, "branch", "-D", branch)
    (ws / "README.md").write_text("rewritten\n")
    git(ws, "commit", "-q", "--amend", "-am", "rewritten")
    git(ws, "reflog", "expire", "--expire=now", "--all")
    git(ws, "gc", "-q", "--prune=now")
    assert ok(keel("verify", store=store)).returncode == 0  # the store itself is whole
    before = sorted(p.name for p in ws.iterdir())

    out = ok(keel("restore", mid, p_u1, "--files", store=store), 6)  # not found
    assert base[:12] in out.stderr and "does not have" in out.stderr
    assert sorted(p.name for p in ws.iterdir()) == before
    assert not sandbox.exists() or sandbox_files(sandbox) != AFTER_U1
    out = ok(keel("fork", mid, p_u1, store=store), 6)
    assert base[:12] in out.stderr and "does not have" in out.stderr


def test_a_git_sandbox_snapshot_stores_only_what_differs(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    git_workspace(ws)
    for i in range(300):
        (ws / f"f{i}.txt").write_text(f"file {i}\n" * 40)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "many")
    sandbox = tmp_path / "sandbox"
    git(ws, "worktree", "add", "-q", "--detach", str(sandbox), "HEAD")
    with Store.open(tmp_path / "store") as store:
        snap = trees.Snapshotter()
        first = _store(store, snap, sandbox)
        blob = store.read(lambda t: t.get_blob(first))
        assert blob is not None and b"keel-based" in blob
        empty = sum(len(r) for _, r in store.read(lambda t: list(t.scan_raw(DB.BLOBS, b""))))
        assert empty < 2000  # no copy of the 303 files of the commit
        (sandbox / "f7.txt").write_text("changed\n")
        second = _store(store, snap, sandbox, paths=["f7.txt"])
        files = _files(store, second, ws)
        assert len(files) == 303 and files["f7.txt"] == content_digest(b"changed\n")
    shutil.rmtree(sandbox)
