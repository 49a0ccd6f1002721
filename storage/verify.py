"""Whole-store verification: the LMDB file's structure, every record's seal and every reference between records.

`verify_structure` walks every page of data.mdb that LMDB can reach with plain reads (`lmdbwalk.py`),
so damage that would crash LMDB is reported instead; `verify_all` then reads every record through LMDB.

References checked: HEAD -> checkpoint manifest -> graph/config/context/agent-state blobs, the sandbox
tree and every file blob it names, and the parent manifest; restore point -> manifest; journal, event
and evidence logs decode as their types. Each
problem is reported; verification never stops at the first one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from keel.protocol.records import (
    CheckpointManifest,
    Control,
    Event,
    Evidence,
    JournalEntry,
    MissionRecord,
    RestorePoint,
)
from keel.storage.base import Store
from keel.storage.errors import CorruptRecordError, StoreError, render_key
from keel.storage.keys import DB
from keel.storage.lmdbfile import FileDamage
from keel.storage.lmdbwalk import PageProblem, check_data_file, walk
from keel.storage.migrations import SchemaInfo
from keel.storage.record import Codec, content_digest, open_record
from keel.storage.snapshots import manifest_trees, tree_refs
from keel.storage.txn import Txn, decode_value


class Problem(msgspec.Struct, frozen=True):
    db: str
    key: str
    message: str


class Report(msgspec.Struct):
    records: int = 0
    problems: list[Problem] = []

    @property
    def ok(self) -> bool:
        return not self.problems


_TYPES: dict[DB, Any] = {
    DB.MISSIONS: MissionRecord,
    DB.HEADS: str,
    DB.JOURNAL: JournalEntry,
    DB.EVENTS: Event,
    DB.EVIDENCE: Evidence,
    DB.CONTROL: Control,
    DB.POINTS: RestorePoint,
    DB.META: Any,
}


def verify_structure(data_file: Path) -> list[Problem]:
    """Every structural problem of an LMDB data file, each naming its database and page.

    A host may be committing meanwhile. LMDB reuses a freed page only once no reader's snapshot is older
    than the transaction that freed it, and plain reads are no reader: so the walk runs inside a read
    transaction, begun before the newest meta page is read, and no page it can reach is rewritten under it.
    Only a file whose meta pages and size pass the plain check is opened (beginning a read transaction
    reads nothing else); any other is walked, and reported, with plain reads alone."""
    databases = frozenset(db.value for db in DB)
    try:
        check_data_file(data_file)
    except (FileDamage, OSError):
        return _problems(walk(data_file, databases))
    try:
        env = open_reader(data_file.parent)
    except lmdb.Error as exc:
        return [Problem(db="*", key="", message=f"LMDB cannot open the file: {exc}")]
    try:
        return walk_in_snapshot(env, data_file)
    finally:
        env.close()


_RESIZE_RETRIES = 10


def open_reader(folder: Path) -> lmdb.Environment:
    """The store's environment, read-only; opened again when another process grew the map while LMDB
    opened it (MDB_MAP_RESIZED: nothing is wrong, the store is being written)."""
    for _ in range(_RESIZE_RETRIES):
        try:
            return lmdb.open(str(folder), readonly=True, max_dbs=len(DB) + 4, max_readers=512, subdir=True)
        except lmdb.MapResizedError:
            continue
    raise lmdb.MapResizedError("the map keeps being resized by another process")


def walk_in_snapshot(env: lmdb.Environment, data_file: Path) -> list[Problem]:
    """`walk` inside a read transaction of `env`. A writer may have grown the map since `env` was opened:
    LMDB then refuses the transaction (MDB_MAP_RESIZED) until the environment adopts the new size."""
    databases = frozenset(db.value for db in DB)
    for _ in range(_RESIZE_RETRIES):
        try:
            txn = env.begin()
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # adopt the size another process grew the map to
            continue
        with txn:
            return _problems(walk(data_file, databases))
    return [Problem(db="*", key="", message="the map keeps being resized by another process; verify again")]


def _problems(found: list[PageProblem]) -> list[Problem]:
    return [Problem(db=p.db, key=f"page {p.pgno}" if p.pgno >= 0 else "", message=p.message) for p in found]


def verify_all(store: Store) -> Report:
    try:
        return store.read(_verify)
    except lmdb.Error as exc:  # a damaged B-tree surfaces while walking it
        return Report(problems=[Problem(db="*", key="", message=f"LMDB structure is damaged: {exc}")])
    except StoreError as exc:
        return Report(problems=[Problem(db="*", key="", message=exc.message)])


def _verify(txn: Txn) -> Report:
    report = Report()

    def check(db: DB, key: bytes, fn: Callable[[], object]) -> object | None:
        try:
            return fn()
        except CorruptRecordError as exc:
            report.problems.append(Problem(db=exc.db, key=render_key(exc.key), message=exc.reason))
        except (lmdb.Error, ValueError) as exc:
            report.problems.append(Problem(db=db.value, key=render_key(key), message=str(exc)))
        return None

    for db in DB:
        for key, raw in txn.scan_raw(db, b""):
            report.records += 1
            if db is DB.BLOBS:
                check(db, key, partial(_check_blob, key, raw))
            elif db is DB.META and key == b"schema":
                check(db, key, partial(decode_value, db.value, key, raw, SchemaInfo))
            elif db in _TYPES and _TYPES[db] is not Any:
                check(db, key, partial(decode_value, db.value, key, raw, _TYPES[db]))
            else:
                check(db, key, partial(open_record, db.value, key, raw))

    def missing(db: DB, key: bytes, what: str) -> None:
        report.problems.append(Problem(db=db.value, key=render_key(key), message=what))

    for key, raw in txn.scan_raw(DB.HEADS, b""):
        digest = check(DB.HEADS, key, partial(decode_value, DB.HEADS.value, key, raw, str))
        if isinstance(digest, str):
            _check_chain(txn, digest, key, missing, check)
    for key, raw in txn.scan_raw(DB.POINTS, b""):
        point = check(DB.POINTS, key, partial(decode_value, DB.POINTS.value, key, raw, RestorePoint))
        if isinstance(point, RestorePoint) and not txn.exists(DB.BLOBS, point.checkpoint.encode()):
            missing(DB.POINTS, key, f"restore point {point.id} refers to missing checkpoint {point.checkpoint[:16]}")
    report.problems = list(dict.fromkeys(report.problems))  # a record reached twice is reported once
    return report


def _check_blob(key: bytes, raw: bytes) -> None:
    codec, payload = open_record(DB.BLOBS.value, key, raw)
    if codec is not Codec.RAW or content_digest(payload) != key.decode(errors="replace"):
        raise CorruptRecordError(DB.BLOBS.value, key, "blob content does not match its name")


def _check_chain(
    txn: Txn,
    digest: str,
    head_key: bytes,
    missing: Callable[[DB, bytes, str], None],
    check: Callable[[DB, bytes, Callable[[], object]], object | None],
) -> None:
    """Walk HEAD's manifest chain through its parents; each manifest's blobs must exist. The chain ends at a
    parent retention removed (the mission's `retired`)."""
    seen: set[str] = set()
    record = check(DB.MISSIONS, head_key, partial(txn.get, DB.MISSIONS, head_key, MissionRecord))
    retired = frozenset(record.retired) if isinstance(record, MissionRecord) else frozenset()
    while digest and digest not in seen:
        seen.add(digest)
        if not txn.exists(DB.BLOBS, digest.encode()):
            if digest not in retired:
                missing(DB.HEADS, head_key, f"checkpoint {digest[:16]} is missing")
            return
        manifest = check(DB.BLOBS, digest.encode(), partial(txn.get_object, digest, CheckpointManifest))
        if not isinstance(manifest, CheckpointManifest):
            return
        refs = [
            manifest.graph,
            manifest.config,
            manifest.context,
            *(mark.agent_state for mark in manifest.units.values()),
        ]
        for tree in manifest_trees(manifest):
            if tree in seen:
                continue
            seen.add(tree)
            files = check(DB.BLOBS, tree.encode(), partial(tree_refs, txn.get_blob, tree, seen))
            refs += files if isinstance(files, list) and files else [tree]
            seen.update(refs)
        for ref in refs:
            if ref and not txn.exists(DB.BLOBS, ref.encode()):
                missing(DB.BLOBS, digest.encode(), f"checkpoint {manifest.number} refers to missing blob {ref[:16]}")
        digest = manifest.parent
