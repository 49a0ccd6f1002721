"""`keel gc` removes in short write transactions, and another client's writes land between them: at every
point of the collection, a write that names an old blob again (a sandbox reverted to a dropped point's
files, a restore or a fork from a point being dropped, a lease on a dropped point's snapshot) keeps it,
a mission record changed meanwhile keeps its change, and the store stays whole."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from keel.protocol.errors import NotFoundError
from keel.protocol.records import Placement
from keel.protocol.states import MissionState
from keel.server.engine import restore
from keel.server.engine.files.trees import Snapshotter
from keel.storage import DB, Store, Txn, leases
from keel.storage import missions as m
from keel.storage.gc import deletion_order
from keel.storage.gcsweep import collect
from keel.storage.verify import verify_all
from tests.storage.gckit import checkpoint, files_at, grow, missing_blobs, strays, write_files

FILES, CHANGES, CHECKPOINTS = 12, 3, 6


class Between:
    """The store, with another client's writes made just before gc's write transaction number `at`."""

    def __init__(self, store: Store, at: int, writes: Callable[[], None]) -> None:
        self.store, self.at, self.writes, self.count = store, at, writes, 0

    def read(self, fn: Callable[[Txn], Any]) -> Any:
        return self.store.read(fn)

    def write(self, fn: Callable[[Txn], Any], **options: Any) -> Any:
        if self.count == self.at:
            self.writes()
        self.count += 1
        return self.store.write(fn, **options)


def _store(folder: Path) -> tuple[Store, Path]:
    store = Store.open(folder / "store")
    sandbox = grow(store, "m1", folder / "m1", checkpoints=CHECKPOINTS, files=FILES, changes=CHANGES)
    grow(store, "gone", folder / "gone", checkpoints=2, files=4, changes=1)
    store.write(lambda t: t.delete(DB.MISSIONS, b"gone"))  # a deleted mission leaves its records behind
    strays(store, 3)
    return store, sandbox


def _another_client(store: Store, folder: Path, sandbox: Path) -> None:
    """Writes a host, an operator and a restore make while gc runs, each in its own transaction."""

    write_files(sandbox, files_at(FILES, 2, CHANGES))  # the files as at p2, which the policy drops
    checkpoint(store, "m1", sandbox, Snapshotter(), reason="reverted")  # reuses p2's folder blobs
    with contextlib.suppress(NotFoundError):  # unless gc dropped the point already
        store.write(lambda t: restore.restore_txn(t, "m1", "p3"))
    with contextlib.suppress(NotFoundError):  # its first checkpoint's parent is p5's, where gc cuts HEAD's chain
        restore.fork(store, folder / "store", "m1", "p5")

    def lease_on_p4(txn: Txn) -> None:
        tree = m.get_checkpoint(txn, m.get_point(txn, "m1", "p4").checkpoint).sandbox_tree
        leases.grant(txn, "m1", "u9", lane="u9", host_id="h", ttl_s=60.0, place=Placement(tree=tree, base_tree=tree))

    with contextlib.suppress(NotFoundError):
        store.write(lease_on_p4)

    def note(txn: Txn) -> None:  # after the restore, which clears the error
        m.set_mission_state(txn, "m1", MissionState.PAUSED, error="noted while gc ran")

    store.write(note)


@pytest.mark.slow
def test_writes_between_gc_transactions_keep_what_they_name(tmp_path: Path, backend: str, store_folder: Any) -> None:
    """The other client's writes land before each of gc's write transactions in turn (on PostgreSQL, before
    the first, a middle and the last one: the same code, with a store made anew each time)."""
    _store(tmp_path / "template")[0].close()
    shutil.copytree(tmp_path / "template", tmp_path / "pristine")
    with Store.open(tmp_path / "template" / "store") as store:  # how many write transactions gc takes, alone
        alone = collect(store, keep_last=1, most=4)
    assert alone.transactions > 5 and alone.points_dropped == [f"m1:p{n}" for n in range(1, CHECKPOINTS)]
    every = range(alone.transactions)
    for at in every if backend == "lmdb" else sorted({0, len(every) // 2, len(every) - 1}):
        folder = tmp_path / f"at{at}"
        if backend == "lmdb":
            shutil.copytree(tmp_path / "pristine", folder)
            store, sandbox = Store.open(folder / "store"), folder / "m1" / "sandbox"
        else:
            store, sandbox = _store(Path(store_folder(folder)))
        with store:
            proxy = Between(store, at, lambda s=store, f=folder, b=sandbox: _another_client(s, f, b))
            report = collect(cast(Store, proxy), keep_last=1, most=4)
            assert proxy.count > at, "the other client's writes landed"
            assert report.blobs_removed > 0 and report.orphan_records > 0
            if at == 0:  # p2's snapshot was unreachable when gc looked, then named again
                assert report.blobs_spared > 0
            assert store.read(missing_blobs) == [], at
            assert verify_all(store).ok, (at, verify_all(store).problems)
            assert store.read(lambda t: m.get_mission(t, "m1")).error == "noted while gc ran"
            collect(store)  # a second collection (no policy: whole chains) finds the store consistent
            assert store.read(missing_blobs) == [], at
            assert verify_all(store).ok, (at, verify_all(store).problems)


@pytest.mark.parametrize(
    ("named", "order"),
    [
        ({}, []),
        ({"a": []}, ["a"]),
        ({"file": [], "folder": ["file"], "root": ["folder", "file"]}, ["root", "folder", "file"]),
        ({"c2": ["c1", "t2"], "c1": ["t1"], "t1": ["f"], "t2": ["f"], "f": []}, ["c2", "t2", "c1", "t1", "f"]),
        ({"x": ["live", "y"], "y": []}, ["x", "y"]),  # a blob not to be removed is no constraint
    ],
)
def test_deletion_order_table(named: dict[str, list[str]], order: list[str]) -> None:
    got = deletion_order(named)
    assert sorted(got) == sorted(named)
    position = {digest: n for n, digest in enumerate(got)}
    for digest, refs in named.items():
        assert all(position[digest] < position[r] for r in refs if r in named), got
    assert got == order
