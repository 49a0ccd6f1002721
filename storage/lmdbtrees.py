"""The quick check of data.mdb's B-trees that every open makes, with plain reads, before LMDB walks them.

LMDB trusts its pages: a cursor that steps onto a page whose header is not what the tree needs there (a
zeroed page, a branch where a leaf belongs) fails an assertion inside liblmdb, which aborts the process
(SIGABRT), and no Python code can catch that. So the store refuses such a file when it opens it: from a
snapshot's meta page this visits every branch and leaf page of the free-page tree, the main tree and
every named database's tree, and checks what LMDB's cursors rely on — each page lies inside the file and
says it is the page it was reached as, with a branch's or a leaf's flags as its depth requires, sane
free-space bounds, and (branch pages) at least two children that lie inside the file.

Branch pages are read whole (their children are needed); of a leaf only its 16-byte header, except the
main tree's leaves, which hold the named databases' records. Overflow runs and the contents of leaf nodes
are left to `keel verify`'s full walk (`lmdbwalk.walk`): a damaged record there is caught when read, by its
seal. The cost is about 2 µs of CPU per page: 42 ms for a 90 MB store of 50k journal entries, as many
events and evidence records (`benchmarks/open_check.py`); well under a millisecond for a small store.

Depends on `lmdbfile`, `lmdbwalk`'s names of the trees and the standard library only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from keel.storage.lmdbfile import (
    DB_RECORD_BYTES,
    F_SUBDATA,
    NODE_HEADER,
    NUM_METAS,
    P_BRANCH,
    P_INVALID,
    P_LEAF,
    PAGE_HEADER,
    DataFile,
    DbRecord,
    Meta,
    PageHeader,
    read_node,
)
from keel.storage.lmdbwalk import FREE_DB, MAIN_DB

_MAX_DEPTH = 32
_HEADER = struct.Struct("<QHHHH")  # the page header, as lmdbfile.PageHeader reads it
_RUN_PAGES = 32  # leaf headers are read this many pages at a time


class TreeDamage(NamedTuple):
    db: str  # the named database, MAIN_DB or FREE_DB
    pgno: int
    message: str

    def __str__(self) -> str:
        return f"page {self.pgno} of the {self.db} database {self.message}"


def tree_damage(f: DataFile, meta: Meta) -> TreeDamage | None:
    """The first page of `meta`'s snapshot that LMDB could not walk safely, or None. `f` must have been
    measured after `meta` was read, and the snapshot must be pinned (a read transaction held on it) so
    that no writer reuses its pages meanwhile."""
    check = _Check(f, meta)
    try:
        check.tree(FREE_DB, meta.free, main=False)
        for name, record in check.tree(MAIN_DB, meta.main, main=True):
            check.tree(name, record, main=False)
    except _Damaged as exc:
        return exc.damage
    return None


class _Damaged(Exception):
    def __init__(self, damage: TreeDamage) -> None:
        self.damage = damage


class _Check:
    def __init__(self, f: DataFile, meta: Meta) -> None:
        self.f = f
        self.psize = meta.page_size
        self.last = min(meta.last_pg, f.size // self.psize - 1)  # the last page both in use and in the file

    def tree(self, db: str, record: DbRecord, main: bool) -> list[tuple[str, DbRecord]]:
        """Check one tree; the main tree's named databases (name, record)."""
        if record.root == P_INVALID:
            return []
        if not 1 <= record.depth <= _MAX_DEPTH:
            raise _Damaged(TreeDamage(db, record.root, f"is the root of a tree of impossible depth {record.depth}"))
        level = [record.root]
        for depth in range(1, record.depth):
            level = [child for pgno in level for child in self.branch(db, pgno, depth, record.depth)]
        if main:
            return [named for pgno in level for named in self.main_leaf(pgno, record.depth)]
        self.leaves(db, level, record.depth)
        return []

    def header(self, db: str, pgno: int, raw: bytes, want: int, depth: int, depth_of_tree: int) -> PageHeader:
        """The header at the start of `raw` (page `pgno`), checked."""
        header = PageHeader.parse(raw)
        kind = "leaf" if want == P_LEAF else "branch"
        if header.pgno != pgno or header.flags != want:
            raise _Damaged(
                TreeDamage(
                    db,
                    pgno,
                    f"should be a {kind} page at depth {depth} of {depth_of_tree}, but its header says page "
                    f"{header.pgno} with flags {header.flags:#x}",
                )
            )
        fewest = 2 if want == P_BRANCH and db != FREE_DB else 1  # LMDB asserts that
        if not PAGE_HEADER + 2 * fewest <= header.lower <= header.upper <= self.psize or header.lower % 2:
            raise _Damaged(
                TreeDamage(
                    db, pgno, f"has free-space bounds lower {header.lower}, upper {header.upper} for a {kind} page"
                )
            )
        return header

    def page(self, db: str, pgno: int, count: int = 1) -> bytes:
        """`count` pages from page `pgno` on, which must lie in the file's pages in use."""
        if not NUM_METAS <= pgno <= self.last:
            raise _Damaged(TreeDamage(db, pgno, f"lies outside the file's pages in use (2..{self.last})"))
        return self.f.read(pgno * self.psize, min(count, self.last + 1 - pgno) * self.psize)

    def nodes(self, db: str, pgno: int, raw: bytes, header: PageHeader) -> Iterator[int]:
        """The offsets of the page's nodes, each inside its node area."""
        for i in range((header.lower - PAGE_HEADER) // 2):
            ptr = int.from_bytes(raw[PAGE_HEADER + 2 * i : PAGE_HEADER + 2 * i + 2], "little")
            if not header.upper <= ptr <= self.psize - NODE_HEADER:
                raise _Damaged(TreeDamage(db, pgno, f"has node {i} at offset {ptr}, outside its node area"))
            yield ptr

    def branch(self, db: str, pgno: int, depth: int, depth_of_tree: int) -> list[int]:
        raw = self.page(db, pgno)
        header = self.header(db, pgno, raw, P_BRANCH, depth, depth_of_tree)
        return [int.from_bytes(raw[ptr : ptr + 6], "little") for ptr in self.nodes(db, pgno, raw, header)]

    def leaves(self, db: str, pgnos: list[int], depth: int) -> None:
        """Leaf headers, read a run of pages at a time (a tree's leaves mostly lie close together)."""
        pgnos = sorted(pgnos)
        unpack, lowest = _HEADER.unpack_from, PAGE_HEADER + 2
        i = 0
        while i < len(pgnos):
            first = pgnos[i]
            run = self.page(db, first, _RUN_PAGES)
            while i < len(pgnos) and pgnos[i] - first < _RUN_PAGES:
                pgno = pgnos[i]
                offset = (pgno - first) * self.psize
                if offset + PAGE_HEADER > len(run):
                    self.page(db, pgno)  # says where it lies
                at, _pad, flags, lower, upper = unpack(run, offset)
                if at != pgno or flags != P_LEAF or not lowest <= lower <= upper <= self.psize or lower % 2:
                    self.header(db, pgno, run[offset : offset + PAGE_HEADER], P_LEAF, depth, depth)  # says what
                i += 1

    def main_leaf(self, pgno: int, depth: int) -> list[tuple[str, DbRecord]]:
        raw = self.page(MAIN_DB, pgno)
        header = self.header(MAIN_DB, pgno, raw, P_LEAF, depth, depth)
        named = []
        for ptr in self.nodes(MAIN_DB, pgno, raw, header):
            node = read_node(raw, ptr)
            if not node.flags & F_SUBDATA:
                continue
            start = ptr + NODE_HEADER + len(node.key)
            if node.data_size != DB_RECORD_BYTES or start + DB_RECORD_BYTES > self.psize:
                raise _Damaged(TreeDamage(MAIN_DB, pgno, f"holds a damaged record of database {node.key[:32]!r}"))
            named.append((node.key.decode(errors="replace"), DbRecord.parse(raw[start : start + DB_RECORD_BYTES])))
        return named
