"""Garbage collection: drop what no mission can reach any more, in one write transaction.

Roots are each mission's HEAD and the restore points the retention policy keeps (all of them when no
policy is given). Everything a root reaches stays: its manifest, the manifest's parent chain, and every
blob a manifest in that chain names (so a kept point is never orphaned). Without a policy the whole chain
stays; with one (`--keep-last`, `--keep`) only the chain down to the oldest kept checkpoint: what only
dropped points needed is freed, the parents cut off are recorded in the mission's `retired` (a chain ends
there: missions.parent_checkpoint, verify, bundles) and the mission's first file snapshot in its
`start_tree` (`keel apply` compares with it). Removed: blobs nothing
reaches, restore points the policy drops (never the one at HEAD), and the records (journal, events,
evidence, control, points, leases, HEAD) of missions that no longer exist. A damaged record aborts the
collection (CorruptRecordError) before anything is deleted.

Depends on keel.storage only. Sandbox file snapshots are reached through each manifest's `sandbox_tree`
and its unfinished units' `tree` and `base_tree` (`snapshots.manifest_trees`: their folder blobs, or an
older keel's flat tree blob, and every file blob they name: `snapshots.tree_refs`). If a new kind of blob is ever
referenced from outside checkpoint manifests, `bundle.manifest_refs` must learn it, or gc would remove it.
"""

from __future__ import annotations

import msgspec

from keel.protocol.records import CheckpointManifest, RestorePoint, is_tree_ref
from keel.storage import leases
from keel.storage.bundle import reachable_blobs
from keel.storage.keys import DB, mission_prefix
from keel.storage.snapshots import tree_refs
from keel.storage.txn import Txn

_MISSION_DBS = (DB.HEADS, DB.POINTS, DB.JOURNAL, DB.EVENTS, DB.EVIDENCE, DB.CONTROL, DB.LEASES)


class GcReport(msgspec.Struct):
    blobs_removed: int = 0
    bytes_freed: int = 0
    points_dropped: list[str] = []  # "mission:point"
    orphan_records: int = 0  # records of missions that no longer exist
    blobs_kept: int = 0
    dry_run: bool = False


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


def gc_txn(txn: Txn, *, keep_last: int | None = None, keep: tuple[str, ...] = (), dry_run: bool = False) -> GcReport:
    from keel.storage import missions as m

    report = GcReport(dry_run=dry_run)
    missions = {key for key, _ in txn.scan_raw(DB.MISSIONS, b"")}
    doomed: list[tuple[DB, bytes]] = []
    for db in _MISSION_DBS:
        for key, _ in txn.scan_raw(db, b""):
            if key.split(b"\x00", 1)[0] not in missions:
                doomed.append((db, key))
    report.orphan_records = len(doomed)
    roots: dict[str, list[str]] = {}  # mission -> its HEAD and kept points' checkpoints
    for mission_key in sorted(missions):
        mission_id = mission_key.decode()
        head = m.head(txn, mission_id)
        points = [(k, p) for k, p in txn.scan(DB.POINTS, mission_prefix(mission_id), RestorePoint)]
        kept = kept_points([p for _, p in points], head, keep_last, keep)
        roots[mission_id] = ([head] if head else []) + [p.checkpoint for p in kept]
        for key, point in points:
            if point not in kept:
                doomed.append((DB.POINTS, key))
                report.points_dropped.append(f"{mission_id}:{point.id}")
    policy = keep_last is not None or bool(keep)
    chains = {mission_id: _kept_chain(txn, found, floor=policy) for mission_id, found in roots.items()}
    manifests = {digest: manifest for chain in chains.values() for digest, manifest in chain.items()}
    records = {mission_id: m.get_mission(txn, mission_id) for mission_id in roots}
    retiring = set()  # missions whose record this collection changes
    for mission_id, chain in chains.items():
        cut = {x.parent for x in chain.values() if x.parent and x.parent not in manifests}
        record = records[mission_id]
        if cut - set(record.retired):  # what this collection retires: the chain's start moves up
            start = record.start_tree or _start_tree(txn, roots[mission_id][:1])
            records[mission_id] = msgspec.structs.replace(
                record, retired=tuple(sorted({*record.retired, *cut})), start_tree=start
            )
            retiring.add(mission_id)
    stop = {parent for record in records.values() for parent in record.retired}
    live = reachable_blobs(txn.get_blob, [d for found in roots.values() for d in found], stop=stop)
    for mission_id in roots:  # units' sandbox snapshots (a shared store keeps them, server/engine/units/moving.py)
        for held in leases.list_leases(txn, mission_id):
            for tree in (held.place.tree, held.place.base_tree):
                if is_tree_ref(tree) and tree not in live:
                    live.update(tree_refs(txn.get_blob, tree, skip=live))
    for record in records.values():  # what `keel apply` compares with
        if is_tree_ref(record.start_tree) and record.start_tree not in live:
            live.update(tree_refs(txn.get_blob, record.start_tree, skip=live))
    report.blobs_kept = len(live)
    for key, raw in txn.scan_raw(DB.BLOBS, b""):
        if key.decode(errors="replace") not in live:
            doomed.append((DB.BLOBS, key))
            report.blobs_removed += 1
            report.bytes_freed += len(raw)
    if not dry_run:
        for db, key in doomed:
            txn.delete(db, key)
        for mission_id in retiring:
            m.put_mission(txn, records[mission_id])
    return report


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
