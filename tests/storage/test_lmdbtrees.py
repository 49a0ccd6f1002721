"""The B-tree check every open makes (`storage/lmdbtrees.py`): a zeroed or mislabelled branch or leaf page of any
tree is refused with StoreDamagedError naming its page and database, before an LMDB cursor could step onto it
(liblmdb aborts the process on such a page); a healthy store, also one another process is committing to,
always opens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keel.storage import Store, StoreDamagedError
from keel.storage.lmdbfile import P_BRANCH, P_LEAF, DataFile, PageHeader, newest
from keel.storage.lmdbtrees import tree_damage
from keel.storage.lmdbwalk import FREE_DB, MAIN_DB, _Walk
from tests.storage.test_lmdbfile import PAGE, _copy, _fill


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lmdbtrees") / "store"
    _fill(path)
    return path


def _tree_pages(data: Path) -> dict[int, tuple[str, int]]:
    """Every branch and leaf page the newest snapshot reaches: page -> (database, flags)."""
    with DataFile(data) as f:
        probe = _Walk(f, newest(f.metas()))
        assert probe.run() == []
    raw = data.read_bytes()
    pages = {}
    for pgno, db in probe.owner.items():
        flags = PageHeader.parse(raw[pgno * PAGE : pgno * PAGE + 16]).flags
        if flags in (P_BRANCH, P_LEAF):
            pages[pgno] = (db, flags)
    return pages


def _damage(data: Path, pgno: int, raw: bytes) -> None:
    with open(data, "r+b") as f:
        f.seek(pgno * PAGE)
        f.write(raw)


def test_a_healthy_store_passes(pristine: Path) -> None:
    data = pristine / "data.mdb"
    with DataFile(data) as f:
        assert tree_damage(f, newest(f.metas())) is None
    Store.open(pristine, readonly=True).close()


def test_every_zeroed_tree_page_is_refused_by_name(pristine: Path, tmp_path: Path) -> None:
    data = _copy(pristine, tmp_path / "s")
    original = data.read_bytes()
    pages = _tree_pages(data)
    kinds = {(db, flags) for db, flags in pages.values()}
    assert {("journal", P_BRANCH), ("journal", P_LEAF), ("events", P_LEAF), ("blobs", P_LEAF)} <= kinds, kinds
    for pgno, (db, flags) in sorted(pages.items()):
        _damage(data, pgno, bytes(PAGE))
        with DataFile(data) as f:
            found = tree_damage(f, newest(f.metas()))
        with pytest.raises(StoreDamagedError, match=f"the LMDB file is damaged: {data}") as refused:
            Store.open(data.parent)
        assert found is not None and (found.db, found.pgno) == (db, pgno), (pgno, db, found)
        if db not in (MAIN_DB, FREE_DB):  # those trees' roots are refused by the meta check, before LMDB opens
            kind = "leaf" if flags == P_LEAF else "branch"
            assert f"page {pgno} of the {db} database should be a {kind} page" in str(refused.value)
        _damage(data, pgno, original[pgno * PAGE : (pgno + 1) * PAGE])
    Store.open(data.parent).close()  # every page put back: healthy again


def test_a_leaf_where_a_branch_belongs_is_refused(pristine: Path, tmp_path: Path) -> None:
    data = _copy(pristine, tmp_path / "s")
    branch = next(p for p, (db, flags) in sorted(_tree_pages(data).items()) if flags == P_BRANCH and db == "journal")
    raw = bytearray(data.read_bytes()[branch * PAGE : (branch + 1) * PAGE])
    raw[10:12] = P_LEAF.to_bytes(2, "little")  # mp_flags
    _damage(data, branch, bytes(raw))
    with pytest.raises(StoreDamagedError, match=f"page {branch} of the journal database should be a branch page"):
        Store.open(data.parent)


WRITER = """
import sys
from pathlib import Path
from keel.protocol.records import JournalEntry
from keel.storage import DB, Store
from keel.storage.keys import log_key, unit_prefix
stop = Path(sys.argv[2])
with Store.open(sys.argv[1]) as store:
    n = 0
    while not stop.exists() or n < 200:
        def churn(txn, n=n):
            for i in range(n % 7, 300, 7):  # rewrite and delete: pages are freed and reused
                key = log_key(unit_prefix("m1", "u1"), i)
                if n % 3 == 2:
                    txn.delete(DB.JOURNAL, key)
                else:
                    entry = JournalEntry(seq=i, kind="k", fingerprint="f", result={"o": "c" * (n % 900)})
                    txn.put(DB.JOURNAL, key, entry)
        store.write(churn)
        n += 1
        print(n, flush=True)
"""


def test_a_store_being_written_is_never_called_damaged(pristine: Path, tmp_path: Path) -> None:
    """The check reads pages inside a read transaction: the writer reuses none of the pages it looks at."""
    path = tmp_path / "s"
    _copy(pristine, path)
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline()  # it commits
        opens = 0
        while writer.poll() is None and opens < 300:
            Store.open(path, readonly=True).close()
            opens += 1
            if opens == 100:
                stop.touch()
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    commits = int(out.split()[-1])
    assert commits >= 200 and opens >= 100, (commits, opens)
