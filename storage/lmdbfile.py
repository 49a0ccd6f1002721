"""LMDB's on-disk format (64-bit, LMDB 0.9), read with plain file reads and never mapped.

LMDB maps data.mdb and trusts it: a page that lies past the end of a truncated file is a SIGBUS, a
damaged page header can make it read anywhere. So everything that judges the file's health reads it
here with `os.pread`, where damage can only ever be a short read or odd bytes. The layout follows
`libraries/liblmdb/mdb.c` (MDB_page, MDB_node, MDB_meta, MDB_db) with PAGEBASE 0 and 8-byte pgno_t.

Depends only on the standard library (no lmdb, no keel records).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_INVALID = 2**64 - 1
NUM_METAS = 2
PAGE_HEADER = 16  # PAGEHDRSZ: pgno u64, pad u16, flags u16, lower u16 / upper u16 (or pages u32)
NODE_HEADER = 8  # NODESIZE: lo u16, hi u16, flags u16, ksize u16
MIN_PAGE_SIZE = 512
MAX_PAGE_SIZE = 65536

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_DIRTY, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MDB_REVERSEKEY, MDB_DUPSORT, MDB_INTEGERKEY = 0x02, 0x04, 0x08

_HEADER = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_DB = struct.Struct("<IHHQQQQQ")
_META = struct.Struct(f"<IIQQ{_DB.size}s{_DB.size}sQQ")
META_BYTES = PAGE_HEADER + _META.size
DB_RECORD_BYTES = _DB.size  # an MDB_db record


class FileDamage(Exception):
    """What is wrong with data.mdb, as one sentence (the caller adds the file's name)."""


# The parsed structures are NamedTuples, not dataclasses: every store open reads the meta pages, and
# making a dataclass costs a compile at import, which `keel missions` and a resume would pay.


class DbRecord(NamedTuple):
    """MDB_db: one B-tree's root and counts (in a meta page, or a named database's main-DB node)."""

    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def parse(cls, raw: bytes) -> DbRecord:
        return cls(*_DB.unpack(raw))


class Meta(NamedTuple):
    """MDB_meta of meta page 0 or 1; the one with the higher txnid is the current snapshot."""

    pgno: int
    flags: int
    magic: int
    version: int
    mapsize: int
    free: DbRecord
    main: DbRecord
    last_pg: int
    txnid: int

    @property
    def page_size(self) -> int:
        return self.free.pad  # mm_psize lives in the free DB's md_pad

    @classmethod
    def parse(cls, page: bytes) -> Meta:
        pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(page)
        magic, version, _address, mapsize, free, main, last_pg, txnid = _META.unpack_from(page, PAGE_HEADER)
        return cls(pgno, flags, magic, version, mapsize, DbRecord.parse(free), DbRecord.parse(main), last_pg, txnid)

    def fault(self, expected_pgno: int) -> str | None:
        """Why this meta page cannot be used (a predicate of "data.mdb …"), or None."""
        where = f"in meta page {expected_pgno}"
        if self.pgno != expected_pgno or not self.flags & P_META:
            return f"has no meta page header {where} (pgno {self.pgno}, flags {self.flags:#x})"
        if self.magic != MDB_MAGIC:
            return f"has magic {self.magic:#x} {where}, not LMDB's {MDB_MAGIC:#x}"
        if self.version != MDB_DATA_VERSION:
            return f"has format version {self.version} {where}, not {MDB_DATA_VERSION}"
        size = self.page_size
        if not MIN_PAGE_SIZE <= size <= MAX_PAGE_SIZE or size & (size - 1):
            return f"names an impossible page size of {size} bytes {where}"
        if self.last_pg < NUM_METAS - 1:
            return f"says {where} that its last used page is {self.last_pg}"
        for name, db in (("free-page", self.free), ("main", self.main)):
            if db.root != P_INVALID and not NUM_METAS <= db.root <= self.last_pg:
                return f"puts the {name} tree's root at page {db.root} {where}, outside pages 2..{self.last_pg}"
        return None


class PageHeader(NamedTuple):
    pgno: int
    pad: int
    flags: int
    lower: int
    upper: int

    @classmethod
    def parse(cls, page: bytes) -> PageHeader:
        return cls(*_HEADER.unpack_from(page))

    @property
    def overflow_pages(self) -> int:
        return self.lower | self.upper << 16  # mp_pages: u32 over lower/upper


class Node(NamedTuple):
    """MDB_node at offset `ptr` of its page: a branch node's child, or a leaf's key and data."""

    ptr: int
    lo: int
    hi: int
    flags: int
    key: bytes

    @property
    def child(self) -> int:  # branch nodes: pgno spread over lo, hi and flags
        return self.lo | self.hi << 16 | self.flags << 32

    @property
    def data_size(self) -> int:  # leaf nodes
        return self.lo | self.hi << 16


def read_node(page: bytes, ptr: int) -> Node:
    lo, hi, flags, ksize = _NODE.unpack_from(page, ptr)
    start = ptr + NODE_HEADER
    return Node(ptr, lo, hi, flags, bytes(page[start : start + ksize]))


def overflow_page_count(data_size: int, page_size: int) -> int:
    """OVPAGES: pages an F_BIGDATA value of `data_size` bytes takes, the first with a page header."""
    return (PAGE_HEADER - 1 + data_size) // page_size + 1


class DataFile:
    """data.mdb opened for plain reads; a read past its end comes back short, never as a signal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self._fd).st_size

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> DataFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def measure(self) -> int:
        """The file's size now (a writer may have grown it since it was opened)."""
        self.size = os.fstat(self._fd).st_size
        return self.size

    def read(self, offset: int, length: int) -> bytes:
        if offset >= self.size:
            return b""
        return os.pread(self._fd, min(length, self.size - offset), offset)

    def metas(self) -> tuple[Meta, Meta]:
        """Both meta pages, as LMDB reads them (page 1 sits one page size after page 0); raises FileDamage."""
        if self.size == 0:
            raise FileDamage("is 0 bytes: an existing store file is never empty; it was truncated")
        first = self.read(0, META_BYTES)
        if len(first) < META_BYTES:
            raise FileDamage(f"is {self.size} bytes, too short to hold LMDB's first meta page")
        meta0 = Meta.parse(first)
        fault = meta0.fault(0)
        if fault:
            raise FileDamage(fault)
        size = meta0.page_size
        if self.size < NUM_METAS * size:
            raise FileDamage(
                f"is {self.size} bytes, shorter than its two meta pages of {size} bytes: the file was truncated"
            )
        meta1 = Meta.parse(self.read(size, META_BYTES))
        fault = meta1.fault(1)
        if fault:
            raise FileDamage(fault)
        if meta1.page_size != size:
            raise FileDamage(f"has meta pages that disagree on the page size ({size} and {meta1.page_size} bytes)")
        return meta0, meta1


def newest(metas: tuple[Meta, Meta]) -> Meta:
    """The meta LMDB uses: the higher txnid (mdb_env_pick_meta)."""
    return metas[1] if metas[0].txnid < metas[1].txnid else metas[0]
