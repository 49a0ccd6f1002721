"""Garbage collection's mark: what no mission can reach any more, as seen in one read transaction.

Roots are each mission's HEAD and the restore points the retention policy keeps (all of them when no
policy is given). Everything a root reaches stays: its manifest, the manifest's parent chain, and every
blob a manifest in that chain names (so a kept point is never orphaned). Without a policy the whole chain
stays; with one (`--keep-last`, `--keep`) only the chain down to the oldest kept checkpoint: what only
dropped points needed is freed, the parents cut off are recorded in the mission's `retired` (a chain ends
there: missions.parent_checkpoint, verify, bundles) and the mission's first file snapshot in its
`start_tree` (`keel apply` compares with it). To be removed: blobs nothing reaches, restore points the
policy drops (never the one at HEAD), and the records (journal, events, evidence, control, points,
leases, HEAD) of missions that no longer exist. A damaged record aborts the collection
(CorruptRecordError) before anything is deleted.

`plan_txn` only reads: it is the whole of `keel gc --dry-run`, and the plan that `gcsweep.collect` carries
out in short write transactions. The plan keeps the root records as they were (`roots_seen`, `tails`) so
that each of those transactions can find the roots written since (`catch_up`) and spare what they reach.
Unreachable blobs are listed with the blobs each names, so that the sweep removes a blob before every blob
it names (`deletion_order`): at every commit a blob still in the store names only blobs still in the store,
which writers rely on (a snapshot reuses a folder blob that exists without writing its files again:
server/engine/files/trees.store_txn).

Depends on keel.storage only. Sandbox file snapshots are reached through each manifest's `sandbox_tree`
and its unfinished units' `tree` and `base_tree` (`snapshots.manifest_trees`: their folder blobs, or an
older keel's flat tree blob, and every file blob they name: `snapshots.tree_refs`). If a new kind of blob is ever
referenced from outside checkpoint manifests, `bundle.manifest_refs` must learn it, or gc would remove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from keel.protocol.records import (
    CheckpointManifest,
    MissionRecord,
    RestorePoint,
    SandboxBased,
    SandboxTree,
    UnitLease,
    is_tree_ref,
)
from keel.storage import leases
from keel.storage.bundle import manifest_refs, reachable_blobs
from keel.storage.keys import DB, SEQ_BYTES, log_key, mission_prefix
from keel.storage.record import HEADER_SIZE
from keel.storage.snapshots import Snapshot, manifest_trees, tree_refs
from keel.storage.txn import Txn, decode_value

_MISSION_DBS = (DB.HEADS, DB.POINTS, DB.JOURNAL, DB.EVENTS, DB.EVIDENCE, DB.CONTROL, DB.LEASES)
_ROOT_DBS = (DB.HEADS, DB.LEASES, DB.MISSIONS)  # records naming roots (besides restore points, read by tail)
_MAPS = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})  # msgpack map headers: a manifest's or a snapshot's first byte
_snapshot: msgspec.msgpack.Decoder[Snapshot] = msgspec.msgpack.Decoder(Snapshot)
_manifest = msgspec.msgpack.Decoder(CheckpointManifest)


class GcReport(msgspec.Struct):
    blobs_removed: int = 0
    bytes_freed: int = 0
    points_dropped: list[str] = []  # "mission:point"
    orphan_records: int = 0  # records of missions that no longer exist
    blobs_kept: int = 0
    dry_run: bool = False
    blobs_spared: int = 0  # unreachable at the mark, then named again by a write made during the collection
    transactions: int = 0  # write transactions the collection took
    longest_txn_ms: float = 0.0  # the longest time it held the store's write lock


class Retire(msgspec.Struct, frozen=True):
    """A mission record's change: the checkpoints cut off its chain, and its first file snapshot."""

    cut: tuple[str, ...]
    start_tree: str


@dataclass
class GcPlan:
    report: GcReport
    points: list[tuple[str, bytes, str]]  # the dropped points: ("mission:point", key, checkpoint)
    retire: dict[str, Retire]
    orphans: list[tuple[DB, bytes]]
    blobs: dict[str, list[str]]  # unreachable ones, each with the blobs it names (`deletion_order`)
    sizes: dict[str, int]
    live: set[str]  # reachable, with everything each reaches; the sweep adds what writes name meanwhile
    stop: frozenset[str]  # checkpoints retired before this collection: their chains end there
    roots_seen: dict[tuple[DB, bytes], bytes] = field(default_factory=dict)
    tails: dict[str, int] = field(default_factory=dict)  # each mission's last restore point number seen


def kept_points(
    points: list[RestorePoint], head: str | None, keep_last: int | None, keep: tuple[str, ...]
) -> list[RestorePoint]:
    """The points a policy retains: all (no policy), else the last N, the named ones and HEAD's point.
    A name is a point id (`p3`), a label, or `MISSION:POINT`."""
    if keep_last is None and not keep:
        return list(points)
    tail = points[-keep_last:] if keep_last else []
    names = set(keep)

    def named(p: RestorePoint) -> bool:
        return bool({p.id, p.label, f"{p.mission_id}:{p.id}", f"{p.mission_id}:{p.label}"} & names - {""})

    return [p for p in points if p in tail or named(p) or p.checkpoint == head]


def plan_txn(txn: Txn, *, keep_last: int | None = None, keep: tuple[str, ...] = ()) -> GcPlan:
    """What one collection at this transaction's snapshot removes and changes; nothing is written."""
    from keel.storage import missions as m

    report = GcReport()
    missions = {key for key, _ in txn.scan_raw(DB.MISSIONS, b"")}
    orphans = [
        (db, key) for db in _MISSION_DBS for key, _ in txn.scan_raw(db, b"") if key.split(b"\x00", 1)[0] not in missions
    ]
    report.orphan_records = len(orphans)
    roots: dict[str, list[str]] = {}  # mission -> its HEAD and kept points' checkpoints
    dropped: list[tuple[str, bytes, str]] = []
    tails: dict[str, int] = {}
    for mission_key in sorted(missions):
        mission_id = mission_key.decode()
        head = m.head(txn, mission_id)
        points = list(txn.scan(DB.POINTS, mission_prefix(mission_id), RestorePoint))
        tails[mission_id] = int.from_bytes(points[-1][0][-SEQ_BYTES:], "big") if points else 0
        kept = kept_points([p for _, p in points], head, keep_last, keep)
        roots[mission_id] = ([head] if head else []) + [p.checkpoint for p in kept]
        dropped += [(f"{mission_id}:{p.id}", key, p.checkpoint) for key, p in points if p not in kept]
    report.points_dropped = [name for name, _, _ in dropped]
    policy = keep_last is not None or bool(keep)
    chains = {mission_id: _kept_chain(txn, found, floor=policy) for mission_id, found in roots.items()}
    manifests = {digest: manifest for chain in chains.values() for digest, manifest in chain.items()}
    records = {mission_id: m.get_mission(txn, mission_id) for mission_id in roots}
    before = frozenset(parent for record in records.values() for parent in record.retired)
    retire: dict[str, Retire] = {}
    for mission_id, chain in chains.items():
        record = records[mission_id]
        cut = {x.parent for x in chain.values() if x.parent and x.parent not in manifests} - set(record.retired)
        if cut:  # what this collection retires: the chain's start moves up
            start = record.start_tree or _start_tree(txn, roots[mission_id][:1])
            retire[mission_id] = Retire(cut=tuple(sorted(cut)), start_tree=start)
            records[mission_id] = retired_record(record, retire[mission_id])
    stop = {parent for record in records.values() for parent in record.retired}
    live = reachable_blobs(txn.get_blob, [d for found in roots.values() for d in found], stop=stop)
    trees = [t for mission_id in roots for held in leases.list_leases(txn, mission_id) for t in _lease_trees(held)]
    _reach_trees(txn, trees + [record.start_tree for record in records.values()], live)
    report.blobs_kept = len(live)
    sizes: dict[str, int] = {}
    named: dict[str, list[str]] = {}
    for key, raw in txn.scan_raw(DB.BLOBS, b""):
        digest = key.decode(errors="replace")
        if digest not in live:
            sizes[digest] = len(raw)
            named[digest] = blob_refs(raw)
    report.blobs_removed, report.bytes_freed = len(sizes), sum(sizes.values())
    plan = GcPlan(report, dropped, retire, orphans, named, sizes, live, before, tails=tails)
    plan.roots_seen = {(db, key): raw for db in _ROOT_DBS for key, raw in txn.scan_raw(db, b"")}
    return plan


def retired_record(record: MissionRecord, change: Retire) -> MissionRecord:
    """`record` with `change` made: the cut checkpoints retired, its first snapshot kept (if it had none)."""
    return msgspec.structs.replace(
        record,
        retired=tuple(sorted({*record.retired, *change.cut})),
        start_tree=record.start_tree or change.start_tree,
    )


def catch_up(txn: Txn, plan: GcPlan) -> None:
    """Add to the plan's live set what the root records written since it last looked reach (HEADs, restore
    points, units' leases, mission records' first snapshots), walking only what is not known live yet."""
    manifests: list[str] = []
    trees: list[str] = []
    seen: dict[tuple[DB, bytes], bytes] = {}
    for db in _ROOT_DBS:
        for key, raw in txn.scan_raw(db, b""):
            seen[(db, key)] = raw
            if plan.roots_seen.get((db, key)) == raw:
                continue
            if db is DB.HEADS:
                manifests.append(decode_value(db.value, key, raw, str))
            elif db is DB.MISSIONS:
                trees.append(decode_value(db.value, key, raw, MissionRecord).start_tree)
            elif b"\x00" in key:  # a unit's lease (a key without one is the mission's host lease)
                trees += _lease_trees(decode_value(db.value, key, raw, UnitLease))
    tails = {}
    for db, key in seen:
        if db is DB.MISSIONS:
            mission_id, prefix = key.decode(), mission_prefix(key.decode())
            tails[mission_id] = plan.tails.get(mission_id, 0)
            start = log_key(prefix, tails[mission_id] + 1)
            for point_key, point in txn.scan(DB.POINTS, prefix, RestorePoint, start=start):
                manifests.append(point.checkpoint)
                tails[mission_id] = int.from_bytes(point_key[-SEQ_BYTES:], "big")
    spare(txn, plan, manifests, trees)
    plan.roots_seen, plan.tails = seen, tails  # only once all they name is live (a write may run again)


def spare(txn: Txn, plan: GcPlan, manifests: list[str], trees: list[str]) -> None:
    """Add to the plan's live set everything these checkpoints and snapshots reach (as the store is now)."""
    reachable_blobs(txn.get_blob, manifests, stop=plan.stop, seen=plan.live)
    _reach_trees(txn, trees, plan.live)


def blob_refs(raw: bytes) -> list[str]:
    """The blobs a sealed blob names, when it is a checkpoint manifest or a file snapshot (else none)."""
    payload = raw[HEADER_SIZE:]
    if not payload or payload[0] not in _MAPS:
        return []
    try:
        found = _snapshot.decode(payload)
    except msgspec.DecodeError:
        try:
            manifest = _manifest.decode(payload)
        except msgspec.DecodeError:
            return []
        return [manifest.parent, *manifest_refs(manifest), *manifest_trees(manifest)]
    if isinstance(found, SandboxTree):
        return [entry.blob for entry in found.entries]
    if isinstance(found, SandboxBased):
        return [found.files]
    return [entry.blob.hex() for entry in found.entries]


def deletion_order(named: dict[str, list[str]]) -> list[str]:
    """The blobs of `named` (each with the blobs it names), each before every one of them it names. Those
    that name none (files: nearly all of them) simply go last."""
    inner = {digest: [r for r in refs if named.get(r)] for digest, refs in named.items() if refs}
    order: list[str] = []  # each after every one it names: reversed below
    done: set[str] = set()
    for first in inner:
        if first in done:
            continue
        done.add(first)
        stack = [(first, iter(inner[first]))]
        while stack:
            digest, refs = stack[-1]
            ref = next((r for r in refs if r not in done), None)
            if ref is None:
                order.append(digest)
                stack.pop()
            else:
                done.add(ref)
                stack.append((ref, iter(inner[ref])))
    order.reverse()
    return order + [digest for digest, refs in named.items() if not refs]


def _lease_trees(held: UnitLease) -> list[str]:
    return [held.place.tree, held.place.base_tree]


def _reach_trees(txn: Txn, trees: list[str], live: set[str]) -> None:
    for tree in trees:
        if is_tree_ref(tree) and tree not in live:
            live.update(tree_refs(txn.get_blob, tree, skip=live))


def _kept_chain(txn: Txn, roots: list[str], *, floor: bool) -> dict[str, CheckpointManifest]:
    """The checkpoints a mission keeps: its roots and their parent chains — with a retention policy
    (`floor`), only down to the oldest root (by number: a parent is numbered below its child), so that
    dropping points frees what only they needed."""
    found = {digest: manifest for digest in roots if (manifest := txn.get_object(digest, CheckpointManifest))}
    lowest = min((x.number for x in found.values()), default=0) if floor else 0
    stack = list(found.values())
    while stack:
        parent = stack.pop().parent
        if not parent or parent in found:
            continue
        manifest = txn.get_object(parent, CheckpointManifest)
        if manifest is not None and manifest.number >= lowest:
            found[parent] = manifest
            stack.append(manifest)
    return found


def _start_tree(txn: Txn, head: list[str]) -> str:
    """The oldest file snapshot on HEAD's whole chain (what the mission started from)."""
    found = ""
    manifest = txn.get_object(head[0], CheckpointManifest) if head else None
    while manifest is not None:
        found = manifest.sandbox_tree if is_tree_ref(manifest.sandbox_tree) else found
        manifest = txn.get_object(manifest.parent, CheckpointManifest) if manifest.parent else None
    return found
