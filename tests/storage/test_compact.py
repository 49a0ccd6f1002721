"""`Store.compact` packs: a journal whose lanes grew side by side (pages split in the middle of the key
range, left half full) is rewritten full, every record byte for byte the same, and the store verifies.
LMDB only: a database server gives space back itself."""

from __future__ import annotations

from pathlib import Path

from keel.protocol.records import JournalEntry
from keel.storage import DB, Store
from keel.storage import missions as m
from keel.storage.verify import verify_all
from tests.storage.rawlmdb import raw_env


def _records(store: Store) -> list[tuple[DB, bytes, bytes]]:
    return store.read(lambda t: [(db, key, raw) for db in DB for key, raw in t.scan_raw(db, b"")])


def _journal_leaves(path: Path) -> int:
    env = raw_env(path)
    try:
        with env.begin() as txn:
            return int(txn.stat(env.open_db(DB.JOURNAL.value.encode(), txn=txn, create=False))["leaf_pages"])
    finally:
        env.close()


def test_compaction_fills_the_pages_two_lanes_left_half_full(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        for seq in range(1, 1501):  # two lanes, an entry each in turn: every append lands mid-range for "a"
            entries = [
                (lane, JournalEntry(seq=seq, kind="tool/run", fingerprint="f", result="x" * 1150)) for lane in "ab"
            ]
            store.write(lambda t, e=entries: [m.journal_put(t, "m1", lane, entry) for lane, entry in e])
        before = _records(store)
    leaves = _journal_leaves(path)
    with Store.open(path, create=False) as store:
        sizes = store.compact()
        assert _records(store) == before
        assert verify_all(store).ok
    assert sizes[1] < sizes[0] * 0.75, sizes
    assert _journal_leaves(path) < leaves * 0.75, leaves
