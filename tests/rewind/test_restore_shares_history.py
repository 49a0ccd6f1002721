"""A restore of a unit 20,000 entries into its run adds what it changes to the store, not a copy of those
entries: the restored lane shares them with the lane it restores, and reads as that lane up to the point."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from keel.server.engine.restore import restore_txn
from keel.storage import Store
from keel.storage import missions as m
from tests.historykit import UNIT, make_mission

ENTRIES = 20_000


def used_bytes(store: Path) -> int:
    """The pages data.mdb has in use (a restore that copied history would take thousands more)."""
    env = lmdb.open(str(store), readonly=True, lock=False, max_dbs=32)
    try:
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()


@pytest.mark.lmdb_only("measures the pages of data.mdb")
def test_a_restore_shares_the_history_it_restores(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    mid = make_mission(store_path, tmp_path, ENTRIES)
    before = used_bytes(store_path)
    with Store.open(store_path) as store:
        point = store.write(lambda t: restore_txn(t, mid, "p1"))
        head = store.read(lambda t: m.head_checkpoint(t, mid))
        assert head is not None and point.id == "p2"
        lane = f"{UNIT}#{head.units[UNIT].epoch}"
        restored = store.read(lambda t: m.journal_entries(t, mid, lane))
        assert restored == store.read(lambda t: m.journal_entries(t, mid, UNIT, upto=ENTRIES))
    assert used_bytes(store_path) - before <= 1 << 20
