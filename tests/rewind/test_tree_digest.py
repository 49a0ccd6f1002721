"""One walker, one set of rules: the tree digest of a sandbox (subagent leases) and its snapshot.

Rules (server/engine/files/trees.py): mode bits count; a file that cannot be read is an error naming it, never
hashed as empty or left out; the digest is the name the snapshot's root folder has. A digest recorded by
the keel before folder trees (32 hex digits, in leases written before an upgrade) is compared in its own
form, so an intact sandbox is not mistaken for a tampered one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.server.engine.files import trees
from keel.storage import Store

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def digest_recorded_by_the_previous_keel(root: Path) -> str:
    """checkpoint.TreeDigest as the keel before folder trees had it (copied unchanged, cache left out)."""
    total = hashlib.blake2b(digest_size=16, person=b"keel-tree")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", ".keel"))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                os.lstat(path)
            except OSError:
                continue
            h = hashlib.blake2b(digest_size=16)
            try:
                if os.path.islink(path):
                    h.update(os.readlink(path).encode())
                else:
                    with open(path, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 16), b""):
                            h.update(chunk)
            except OSError:
                pass
            total.update(os.path.relpath(path, root).encode() + b"\x00" + h.hexdigest().encode() + b"\n")
    return total.hexdigest()


def _sandbox(root: Path) -> None:
    """A unit sandbox as a worktree looks: a `.git` file, nested folders, a script, links."""
    for path, text in {
        "z.txt": "z\n",
        "a/b.txt": "b\n",
        "a/b/c.txt": "c\n",
        "a.txt": "a\n",
        "m/n/o/p.txt": "p\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / ".git").write_text("gitdir: /somewhere/.git/worktrees/u1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("a/b.txt", root / "link-to-file")
    os.symlink("m/n", root / "link-to-folder")
    (root / ".keel").mkdir()
    (root / ".keel" / "x").write_text("keel's own\n")


def test_the_digest_is_the_snapshots_name_and_mode_bits_count(tmp_path: Path) -> None:
    root = tmp_path / "box"
    _sandbox(root)
    digest = trees.tree_digest(root)
    with Store.open(tmp_path / "store") as store:
        snap = trees.Snapshotter()
        scan = snap.scan(root)
        assert store.write(lambda t: snap.store_txn(t, root, scan)) == digest
    (root / "z.txt").chmod(0o755)
    assert trees.tree_digest(root) != digest  # the previous digest ignored modes: an executable bit is a change
    (root / "z.txt").chmod(0o644)
    assert trees.tree_digest(root) == digest
    (root / "m" / "n" / "o" / "p.txt").write_text("P\n")
    assert trees.tree_digest(root) != digest


def test_a_digest_recorded_before_the_upgrade_still_matches_an_intact_sandbox(tmp_path: Path) -> None:
    root = tmp_path / "box"
    _sandbox(root)
    recorded = digest_recorded_by_the_previous_keel(root)
    assert len(recorded) == 32
    assert trees.digest_as_recorded(root, recorded) == recorded
    assert trees.digest_as_recorded(root, trees.tree_digest(root)) == trees.tree_digest(root)
    (root / "a" / "b" / "c.txt").write_text("tampered\n")
    assert trees.digest_as_recorded(root, recorded) != recorded
    (root / "a" / "b" / "c.txt").write_text("c\n")
    (root / "a" / "new.txt").write_text("added\n")
    assert trees.digest_as_recorded(root, recorded) != recorded


_CHECK = """
import sys
from pathlib import Path
from keel.server.engine.files import trees
root = Path(sys.argv[1])
for what in ("digest", "snapshot", "files"):
    try:
        if what == "digest":
            trees.tree_digest(root)
        elif what == "snapshot":
            trees.Snapshotter().scan(root)
        else:
            trees.current_files(root)
        print(what, "ok")
    except trees.SandboxUnreadableError as exc:
        print(what, exc.message)
"""


def _without_file_capabilities() -> None:
    """In the child before exec: drop root's power to read what it may not (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from the bounding set, so the checked process meets permissions as anyone would."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root and drops root's file capabilities")
@pytest.mark.parametrize("what", ["file", "folder"])
def test_an_unreadable_file_or_folder_is_an_error_naming_it(tmp_path: Path, what: str) -> None:
    root = tmp_path / "box"
    root.mkdir()
    (root / "fine.txt").write_text("readable\n")
    secret = root / "secret"
    if what == "folder":
        secret.mkdir()
        (secret / "inside.txt").write_text("hidden\n")
    else:
        secret.write_text("hidden\n")
    secret.chmod(0)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHECK, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_without_file_capabilities,
        )
    finally:
        secret.chmod(0o700)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout
    for line in lines:
        assert f"cannot read {secret} in the sandbox: Permission denied" in line, line
