"""Checks of data.mdb's LMDB structure, with plain reads: the quick one every open does, and the full walk.

`check_data_file` runs before lmdb maps the file: both meta pages, the page size, and that every page
the newest snapshot may use lies inside the file (a truncated file is what turns LMDB reads into SIGBUS).
`walk` is `keel verify`'s structural half: from the newest meta page it visits every page LMDB can
reach — the free-page tree, the main tree, every named database's tree and every overflow run — and
checks each page's header, bounds, node offsets and key order, that no page is reached twice, and that
the counts agree with each tree's MDB_db record and with the file's last page.

Depends on `lmdbfile` and the standard library only: never on lmdb, so damage cannot crash the checker.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from keel.storage.lmdbfile import (
    DB_RECORD_BYTES,
    F_BIGDATA,
    F_DUPDATA,
    F_SUBDATA,
    MDB_DUPSORT,
    MDB_INTEGERKEY,
    MDB_REVERSEKEY,
    NODE_HEADER,
    NUM_METAS,
    P_BRANCH,
    P_INVALID,
    P_LEAF,
    P_OVERFLOW,
    PAGE_HEADER,
    DataFile,
    DbRecord,
    FileDamage,
    Meta,
    Node,
    PageHeader,
    newest,
    overflow_page_count,
    read_node,
)

FREE_DB = "(free pages)"
MAIN_DB = "(main)"
_MAX_DEPTH = 32
_LEAF_FLAGS = {0, F_BIGDATA, F_SUBDATA, F_DUPDATA, F_DUPDATA | F_SUBDATA}


class PageProblem(NamedTuple):
    db: str
    pgno: int  # -1: the file as a whole
    message: str


def check_data_file(path: Path) -> Meta:
    """The newest meta page of an existing data.mdb, or FileDamage saying what is wrong with the file.

    The newest meta's last used page must lie inside the file, unless every page past the end is free
    (LMDB never writes a page that was freed in the transaction that allocated it)."""
    with DataFile(path) as f:
        meta = newest(f.metas())
        # measured after the meta page was read: LMDB writes a commit's pages before its meta page and never
        # shrinks the file, so a meta read now never names pages past the end unless the file was cut
        f.measure()
        size = meta.page_size
        pages = f.size // size
        for name, root in (("free-page", meta.free.root), ("main", meta.main.root)):
            header = PageHeader.parse(f.read(root * size, PAGE_HEADER)) if root < pages else None
            if header is not None and (header.pgno != root or header.flags not in (P_BRANCH, P_LEAF)):
                raise FileDamage(
                    f"has a damaged {name} tree root: page {root}'s header says page {header.pgno}, "
                    f"flags {header.flags:#x}"
                )
        if meta.last_pg >= pages:
            free = _Walk(f, meta).free_pages()
            if free is None or not set(range(pages, meta.last_pg + 1)) <= free:
                raise FileDamage(
                    f"is {f.size} bytes but its newest meta page says it uses {meta.last_pg + 1} "
                    f"pages of {size} bytes: the file was truncated"
                )
        return meta


def walk(path: Path, databases: frozenset[str] = frozenset()) -> list[PageProblem]:
    """Every structural problem of data.mdb's newest snapshot (an empty list: the structure is sound);
    `databases` names the named databases the main tree must hold."""
    with DataFile(path) as f:
        try:
            meta = newest(f.metas())
        except FileDamage as exc:
            return [PageProblem("*", -1, f"the LMDB file is damaged: {path.name} {exc}")]
        f.measure()  # after the meta page: every page a commit names was written before its meta page
        walker = _Walk(f, meta)
        problems = walker.run()
        missing = sorted(databases - {name for name, _ in walker.named})
        if missing and not problems:
            problems.append(
                PageProblem(MAIN_DB, meta.main.root, f"the main tree lacks the databases {', '.join(missing)}")
            )
        return problems


class _Counts:
    def __init__(self) -> None:
        self.branch = self.leaf = self.overflow = self.entries = self.depth = 0


class _Walk:
    def __init__(self, f: DataFile, meta: Meta) -> None:
        self.f = f
        self.meta = meta
        self.problems: list[PageProblem] = []
        self.owner: dict[int, str] = {}  # page -> the database that reached it
        self.free: dict[int, int] = {}  # free page -> the txnid whose record lists it
        self.named: list[tuple[str, DbRecord]] = []

    @property
    def psize(self) -> int:
        return self.meta.page_size

    def problem(self, db: str, pgno: int, message: str) -> None:
        self.problems.append(PageProblem(db, pgno, message))

    def run(self) -> list[PageProblem]:
        if self.f.size % self.psize:
            self.problem(
                "*",
                -1,
                f"data.mdb is {self.f.size} bytes, not a whole number of {self.psize}-byte "
                "pages: the file was truncated",
            )
        self.tree(FREE_DB, self.meta.free, self.free_leaf)
        self.tree(MAIN_DB, self.meta.main, self.main_leaf)
        for name, record in self.named:
            self.tree(name, record, None)
        self.account()
        return self.problems

    def free_pages(self) -> set[int] | None:
        """The pages the free-page tree lists, or None if that tree is damaged."""
        self.tree(FREE_DB, self.meta.free, self.free_leaf)
        return None if self.problems else set(self.free)

    # -- trees ----------------------------------------------------------------------------------
    def tree(self, db: str, record: DbRecord, on_leaf: Callable[[str, int, Node, bytes], None] | None) -> None:
        if record.root == P_INVALID:
            if (record.depth, record.entries, record.branch_pages, record.leaf_pages) != (0, 0, 0, 0):
                self.problem(db, -1, f"empty tree with depth {record.depth} and {record.entries} entries")
            return
        if record.flags & MDB_DUPSORT:
            self.problem(db, record.root, "a DUPSORT database: keel never makes one")
            return
        if not 1 <= record.depth <= _MAX_DEPTH:
            self.problem(db, record.root, f"tree depth {record.depth} is impossible")
            return
        counts = _Counts()
        self.page(db, record, record.root, 1, (None, None), counts, on_leaf)
        seen = (counts.branch, counts.leaf, counts.overflow, counts.entries)
        claimed = (record.branch_pages, record.leaf_pages, record.overflow_pages, record.entries)
        if seen != claimed and not self.problems_in(db):
            self.problem(
                db,
                record.root,
                f"tree holds {seen[0]} branch, {seen[1]} leaf, {seen[2]} overflow pages "
                f"and {seen[3]} entries; its record says {claimed[0]}, {claimed[1]}, "
                f"{claimed[2]} and {claimed[3]}",
            )

    def problems_in(self, db: str) -> bool:
        return any(p.db == db for p in self.problems)

    def claim(self, db: str, pgno: int, what: str) -> bool:
        if not NUM_METAS <= pgno <= self.meta.last_pg:
            self.problem(db, pgno, f"{what} page {pgno} is outside pages 2..{self.meta.last_pg}")
            return False
        if pgno in self.owner:
            self.problem(db, pgno, f"page {pgno} is reached twice (already used by {self.owner[pgno]})")
            return False
        self.owner[pgno] = db
        if (pgno + 1) * self.psize > self.f.size:
            self.problem(
                db,
                pgno,
                f"{what} page {pgno} lies past the end of the file ({self.f.size} bytes): the file was truncated",
            )
            return False
        return True

    def page(
        self,
        db: str,
        record: DbRecord,
        pgno: int,
        level: int,
        bounds: tuple[bytes | None, bytes | None],
        counts: _Counts,
        on_leaf: Callable[[str, int, Node, bytes], None] | None,
    ) -> None:
        leaf = level == record.depth
        if not self.claim(db, pgno, "leaf" if leaf else "branch"):
            return
        raw = self.f.read(pgno * self.psize, self.psize)
        header = PageHeader.parse(raw)
        want = P_LEAF if leaf else P_BRANCH
        if header.pgno != pgno:
            self.problem(db, pgno, f"page {pgno}'s header says it is page {header.pgno}")
            return
        if header.flags != want:
            kind = "leaf" if leaf else "branch"
            self.problem(
                db,
                pgno,
                f"page {pgno} at depth {level} of {record.depth} should be a {kind} page "
                f"(flags {want:#x}) but has flags {header.flags:#x}",
            )
            return
        nodes = self.nodes(db, pgno, raw, header, leaf)
        if nodes is None:
            return
        self.key_order(db, record, pgno, nodes, bounds, leaf)
        if leaf:
            counts.leaf += 1
            counts.entries += len(nodes)
            for node in nodes:
                self.leaf_node(db, pgno, node, raw, counts, on_leaf)
            return
        counts.branch += 1
        for i, node in enumerate(nodes):
            low = bounds[0] if i == 0 else node.key
            high = nodes[i + 1].key if i + 1 < len(nodes) else bounds[1]
            self.page(db, record, node.child, level + 1, (low, high), counts, on_leaf)

    def nodes(self, db: str, pgno: int, raw: bytes, header: PageHeader, leaf: bool) -> list[Node] | None:
        """The page's nodes, each checked to lie in the node area [upper, page end) without overlap."""
        lower, upper, psize = header.lower, header.upper, self.psize
        if not PAGE_HEADER <= lower <= upper <= psize or (lower - PAGE_HEADER) % 2:
            self.problem(
                db,
                pgno,
                f"page {pgno} has free-space bounds lower {lower}, upper {upper}, outside {PAGE_HEADER}..{psize}",
            )
            return None
        count = (lower - PAGE_HEADER) // 2
        if count == 0:
            self.problem(db, pgno, f"page {pgno} has no nodes")
            return None
        ptrs = [int.from_bytes(raw[PAGE_HEADER + 2 * i : PAGE_HEADER + 2 * i + 2], "little") for i in range(count)]
        nodes: list[Node] = []
        ends: list[tuple[int, int, int]] = []
        for i, ptr in enumerate(ptrs):
            if ptr < upper or ptr % 2 or ptr + NODE_HEADER > psize:
                self.problem(db, pgno, f"page {pgno} node {i} has offset {ptr}, outside the node area {upper}..{psize}")
                return None
            node = read_node(raw, ptr)
            body = len(node.key) + (self.leaf_data_size(node) if leaf else 0)
            end = ptr + NODE_HEADER + body
            if end > psize:
                self.problem(db, pgno, f"page {pgno} node {i} at offset {ptr} runs past the page end ({end} > {psize})")
                return None
            nodes.append(node)
            ends.append((ptr, end, i))
        ends.sort()
        for (_, end, i), (start, _, j) in pairwise(ends):
            if end > start:
                self.problem(db, pgno, f"page {pgno} nodes {i} and {j} overlap")
                return None
        used = sum(_even(end - start) for start, end, _ in ends)
        if ends[0][0] != upper or used != psize - upper:  # LMDB packs nodes from `upper` to the page end
            self.problem(
                db,
                pgno,
                f"page {pgno}'s nodes take {used} bytes from offset {ends[0][0]}, but its "
                f"node area is {upper}..{psize}",
            )
            return None
        return nodes

    @staticmethod
    def leaf_data_size(node: Node) -> int:
        return 8 if node.flags & F_BIGDATA else node.data_size

    def key_order(
        self,
        db: str,
        record: DbRecord,
        pgno: int,
        nodes: list[Node],
        bounds: tuple[bytes | None, bytes | None],
        leaf: bool,
    ) -> None:
        """Keys strictly increase within the page and lie in [low, high) set by the parent's separators
        (a branch page's first key is unused by LMDB and skipped)."""
        sort_key = _sort_key(record.flags)
        low = None if bounds[0] is None else sort_key(bounds[0])
        high = None if bounds[1] is None else sort_key(bounds[1])
        previous: bytes | int | None = None
        for i, node in enumerate(nodes):
            if i == 0 and not leaf:
                continue
            if record.flags & MDB_INTEGERKEY and len(node.key) not in (4, 8):
                self.problem(db, pgno, f"page {pgno} node {i} has an integer key of {len(node.key)} bytes")
                return
            key = sort_key(node.key)
            wrong = (
                "is not above the key before it"
                if previous is not None and key <= previous  # type: ignore[operator]
                else "is below its parent's separator"
                if low is not None and key < low  # type: ignore[operator]
                else "is not below its parent's next separator"
                if high is not None and key >= high  # type: ignore[operator]
                else ""
            )
            if wrong:
                self.problem(db, pgno, f"page {pgno} node {i}: key {node.key[:32]!r} {wrong}")
                return
            previous = key

    def leaf_node(
        self,
        db: str,
        pgno: int,
        node: Node,
        raw: bytes,
        counts: _Counts,
        on_leaf: Callable[[str, int, Node, bytes], None] | None,
    ) -> None:
        if node.flags not in _LEAF_FLAGS or node.flags & F_DUPDATA:
            self.problem(db, pgno, f"page {pgno}: node {node.key[:32]!r} has flags {node.flags:#x}")
            return
        start = node.ptr + NODE_HEADER + len(node.key)
        if node.flags & F_BIGDATA:
            data = self.overflow(
                db, int.from_bytes(raw[start : start + 8], "little"), node.data_size, counts, on_leaf is not None
            )
            if data is None:
                return
        else:
            data = bytes(raw[start : start + node.data_size])
        if on_leaf is not None:
            on_leaf(db, pgno, node, data)
        elif node.flags & F_SUBDATA:
            self.problem(db, pgno, f"page {pgno}: node {node.key[:32]!r} claims to be a database")

    def overflow(self, db: str, first: int, size: int, counts: _Counts, want_data: bool) -> bytes | None:
        """Claim an F_BIGDATA value's overflow run; its data when `want_data` (free lists), else b''."""
        if not self.claim(db, first, "overflow"):
            return None
        header = PageHeader.parse(self.f.read(first * self.psize, PAGE_HEADER))
        need = overflow_page_count(size, self.psize)
        if header.pgno != first or header.flags != P_OVERFLOW or header.overflow_pages != need:
            self.problem(
                db,
                first,
                f"overflow page {first} has header pgno {header.pgno}, flags {header.flags:#x}, "
                f"{header.overflow_pages} pages; expected a run of {need} for {size} bytes",
            )
            return None
        for pgno in range(first + 1, first + need):
            if not self.claim(db, pgno, "overflow"):
                return None
        counts.overflow += need
        return self.f.read(first * self.psize + PAGE_HEADER, size) if want_data else b""

    # -- leaf contents --------------------------------------------------------------------------
    def main_leaf(self, db: str, pgno: int, node: Node, data: bytes) -> None:
        if not node.flags & F_SUBDATA:
            return  # a plain value in the main database
        if len(data) != DB_RECORD_BYTES:
            self.problem(db, pgno, f"page {pgno}: database record {node.key!r} is {len(data)} bytes")
            return
        self.named.append((node.key.decode(errors="replace"), DbRecord.parse(data)))

    def free_leaf(self, db: str, pgno: int, node: Node, data: bytes) -> None:
        """A free-list record: txnid key, data = count then that many page numbers (an MDB_IDL)."""
        txnid = int.from_bytes(node.key, "little")
        count = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
        if count < 0 or 8 + 8 * count > len(data):
            self.problem(db, pgno, f"page {pgno}: free list of txn {txnid} claims {count} pages in {len(data)} bytes")
            return
        for i in range(count):
            page = int.from_bytes(data[8 + 8 * i : 16 + 8 * i], "little")
            if not NUM_METAS <= page <= self.meta.last_pg:
                self.problem(db, pgno, f"free list of txn {txnid} names page {page}, outside 2..{self.meta.last_pg}")
            elif page in self.free:
                self.problem(db, pgno, f"page {page} is listed free twice (txns {self.free[page]} and {txnid})")
            else:
                self.free[page] = txnid

    def account(self) -> None:
        """Every page up to last_pg is a meta page, used once, or free (LMDB's own audit)."""
        both = sorted(set(self.free) & set(self.owner))
        for page in both[:10]:
            self.problem(FREE_DB, page, f"page {page} is listed free but used by {self.owner[page]}")
        total = NUM_METAS + len(self.owner) + len(self.free)
        if not self.problems and total != self.meta.last_pg + 1:
            self.problem(
                "*",
                -1,
                f"{total} pages are accounted for (2 meta, {len(self.owner)} used, "
                f"{len(self.free)} free) but the file's last page is {self.meta.last_pg}",
            )


def _even(n: int) -> int:
    return n + (n & 1)


def _sort_key(flags: int) -> Callable[[bytes], bytes | int]:
    if flags & MDB_INTEGERKEY:
        return lambda key: int.from_bytes(key, "little")
    if flags & MDB_REVERSEKEY:
        return lambda key: key[::-1]
    return lambda key: key
