"""`keel gc`: unreachable blobs and dead missions' records go; every kept restore point stays whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import CheckpointManifest, Event, JournalEntry, RestorePoint
from keel.protocol.spec import UnitSpec
from keel.storage import DB, Store, Txn
from keel.storage import missions as m
from keel.storage.keys import log_key, mission_prefix
from keel.storage.verify import verify_all
from tests.bundles.kit import git_workspace, keel, ok, write_mission
from tests.storage.test_verify import make_mission

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def point_loads(txn: Txn, mission_id: str, point: RestorePoint) -> None:
    """What a restore to `point` reads: the manifest chain (down to where retention cut it), its blobs and
    journals up to each mark."""
    manifest: CheckpointManifest | None = m.get_checkpoint(txn, point.checkpoint)
    while manifest is not None:
        assert txn.get_object(manifest.graph, list[UnitSpec]) is not None
        assert txn.get_blob(manifest.config) is not None
        for unit, mark in manifest.units.items():
            assert not mark.agent_state or txn.get_blob(mark.agent_state) is not None
            assert len(m.journal_entries(txn, mission_id, unit, upto=mark.journal_hwm)) == mark.journal_hwm
        manifest = m.parent_checkpoint(txn, manifest)


def _branch_and_more(txn: Txn, first: str) -> str:
    """A restore point on a side branch (parent p1, a blob of its own), then one more checkpoint on HEAD."""
    base = m.get_checkpoint(txn, first)
    side = msgspec.structs.replace(base, number=99, parent=first, config=txn.put_blob(b"side config only"))
    side_digest = txn.put_object(side)
    prefix = mission_prefix("m1")
    number = txn.last_seq(DB.POINTS, prefix) + 1
    txn.put(
        DB.POINTS,
        log_key(prefix, number),
        RestorePoint(id=f"p{number}", mission_id="m1", checkpoint=side_digest, reason="side", created_at=1.0),
    )
    m.journal_put(txn, "m1", "u1", JournalEntry(seq=4, kind="now", fingerprint="f4", result=4))
    current = m.head_checkpoint(txn, "m1")
    assert current is not None
    m.commit_checkpoint(
        txn,
        CheckpointManifest(
            mission_id="m1",
            number=current.number + 1,
            reason="unit",
            created_at=time.time(),
            parent=m.head(txn, "m1") or "",
            graph=current.graph,
            config=current.config,
            units=current.units,
        ),
    )
    return side_digest


def test_gc_policy_keeps_chains_and_drops_the_rest(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    with Store.open(store_path) as store:
        digests = make_mission(store, "m1", checkpoints=3)
        side = store.write(lambda t: _branch_and_more(t, digests[0]))
        make_mission(store, "gone", checkpoints=2)
        store.write(lambda t: t.delete(DB.MISSIONS, b"gone"))  # a deleted mission leaves its records behind
        orphan = store.write(lambda t: t.put_blob(b"nobody refers to me"))
        store.write(lambda t: m.add_event(t, "m1", Event(kind="note", at=1.0)))
    dry = json.loads(ok(keel("gc", "--keep-last", "1", "--keep", "p1", "--dry-run", "--json", store=store_path)).stdout)
    assert dry["dry_run"] and dry["blobs_removed"] > 0
    report = json.loads(ok(keel("gc", "--keep-last", "1", "--keep", "p1", "--json", store=store_path)).stdout)
    assert sorted(report["points_dropped"]) == ["m1:p2", "m1:p3", "m1:p4"]
    assert report["orphan_records"] > 0
    with Store.open(store_path, create=False) as store:
        assert verify_all(store).ok, verify_all(store).problems
        points = store.read(lambda t: m.restore_points(t, "m1"))
        assert [p.id for p in points] == ["p1", "p5"]
        for point in points:
            store.read(lambda t, p=point: point_loads(t, "m1", p))  # type: ignore[misc]
        for digest in digests:  # p2, p3 were dropped, but their manifests are HEAD's ancestors: kept
            assert store.read(lambda t, d=digest: t.get_blob(d)) is not None  # type: ignore[misc]
        assert store.read(lambda t: t.get_blob(side)) is None
        assert store.read(lambda t: t.get_blob(orphan)) is None
        assert store.read(lambda t: t.get_blob(m.get_checkpoint(t, digests[0]).config)) is not None
        for db in (DB.HEADS, DB.POINTS, DB.JOURNAL, DB.EVENTS):
            assert not store.read(lambda t, d=db: list(t.scan_raw(d, b"gone\x00")) + list(t.scan_raw(d, b"gone")))
        assert store.read(lambda t: m.events_after(t, "m1"))  # the live mission's records stay
    again = json.loads(ok(keel("gc", "--json", store=store_path)).stdout)
    assert again["blobs_removed"] == 0 and again["points_dropped"] == [] and again["orphan_records"] == 0
    assert keel("gc", "--keep-last", "-1", store=store_path).returncode == 2


def test_gc_after_a_real_mission_then_resume_from_the_store(tmp_path: Path) -> None:
    git_workspace(tmp_path / "ws")
    units = [
        {
            "id": f"u{i}",
            "params": {"steps": [{"tool": "write_file", "args": {"path": f"f{i}.txt", "content": f"{i}\n"}}]},
        }
        for i in range(3)
    ]
    store_path = tmp_path / "store"
    ok(keel("run", str(write_mission(tmp_path, units)), "--plain", store=store_path))
    with Store.open(store_path, create=False) as store:
        mission_id = store.read(m.list_missions)[0].id
        stray = store.write(lambda t: t.put_blob(b"stray"))
    report = json.loads(ok(keel("gc", "--keep-last", "2", "--json", store=store_path)).stdout)
    assert report["blobs_removed"] > 1  # the stray, and what only the dropped points needed
    with Store.open(store_path, create=False) as store:
        assert verify_all(store).ok
        assert store.read(lambda t: t.get_blob(stray)) is None
        points = store.read(lambda t: m.restore_points(t, mission_id))
        assert len(points) == 2
        for point in points:
            store.read(lambda t, p=point: point_loads(t, mission_id, p))  # type: ignore[misc]
    for point in points:
        ok(keel("restore", mission_id, point.id, store=store_path))
        with Store.open(store_path, create=False) as store:
            assert verify_all(store).ok


def _stray_blobs(store_path: Path, count: int) -> None:
    """Blobs nothing reaches (incompressible, so the file really holds them)."""
    with Store.open(store_path, create=False) as store:
        for _ in range(count):
            store.write(lambda t: t.put_blob(os.urandom(64 * 1024)))


@pytest.mark.lmdb_only("compaction rewrites the LMDB file; a database server gives space back itself")
def test_gc_compact_gives_the_freed_space_back_and_every_point_still_restores(tmp_path: Path) -> None:
    git_workspace(tmp_path / "ws")
    units = [{"id": "u", "params": {"steps": [{"tool": "write_file", "args": {"path": "f.txt", "content": "f\n"}}]}}]
    store_path = tmp_path / "store"
    ok(keel("run", str(write_mission(tmp_path, units)), "--plain", store=store_path))
    _stray_blobs(store_path, 80)
    grown = (store_path / "data.mdb").stat().st_size
    plain = json.loads(ok(keel("gc", "--json", store=store_path)).stdout)
    assert plain["blobs_removed"] == 80 and "compacted" not in plain
    assert (store_path / "data.mdb").stat().st_size >= grown  # LMDB reuses freed pages; it never gives them back

    _stray_blobs(store_path, 80)
    report = json.loads(ok(keel("gc", "--compact", "--json", store=store_path)).stdout)
    sizes = report["compacted"]
    assert sizes["bytes_before"] >= grown and sizes["bytes_after"] < grown - 4 * 1024 * 1024, sizes
    assert (store_path / "data.mdb").stat().st_size == sizes["bytes_after"]
    with Store.open(store_path, create=False) as store:
        assert verify_all(store).ok
        mission_id = store.read(m.list_missions)[0].id
        points = store.read(lambda t: m.restore_points(t, mission_id))
    for point in points:
        ok(keel("restore", mission_id, point.id, "--files", store=store_path))
    ok(keel("resume", mission_id, "--plain", store=store_path))


@pytest.mark.lmdb_only("compaction rewrites the LMDB file; a database server gives space back itself")
def test_gc_compact_refuses_while_another_process_has_the_store_open(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    with Store.open(store_path) as store:
        make_mission(store, "m1")
    _stray_blobs(store_path, 20)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store_path)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        before = (store_path / "data.mdb").stat()
        busy = keel("gc", "--compact", store=store_path)
        assert busy.returncode == 7, busy.stdout + busy.stderr
        assert f"pid {holder.pid}" in busy.stderr and "gc removed 20 blobs" in busy.stdout
        after = (store_path / "data.mdb").stat()  # gc's own removals are written; the file is not replaced
        assert (after.st_ino, after.st_size >= before.st_size) == (before.st_ino, True)
    finally:
        holder.kill()
        holder.wait()
    ok(keel("gc", "--compact", store=store_path))  # the other process is gone: its reader slot is cleared
    with Store.open(store_path, create=False) as store:
        assert verify_all(store).ok


HOLD = """
import sys
from keel.storage import Store
from keel.storage import missions as m
store = Store.open(sys.argv[1], create=False)
store.read(m.list_missions)
print("open", flush=True)
sys.stdin.read()
"""
