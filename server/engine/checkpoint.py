"""Checkpoint manifests: what a checkpoint records, content-addressed.

A manifest names blobs by digest (graph, configuration, agent states, the sandbox's file snapshot), so
a checkpoint stores only what changed: an unchanged graph or configuration is shared with the parent.
`commit` builds the manifest inside the caller's transaction (storage/missions.commit_checkpoint moves
HEAD and adds the restore point in the same one). When a checkpoint is due is policy.py's business.
Depends on storage and protocol only; nothing of the host.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from keel.protocol.records import CheckpointManifest, RestorePoint, UnitLease, UnitMark, sandbox_kept
from keel.protocol.spec import MissionSpec, UnitSpec
from keel.protocol.states import MissionState, UnitState
from keel.server.engine import faultpoints
from keel.server.engine.journal import lane
from keel.storage import DB, Txn
from keel.storage import missions as m
from keel.storage.keys import mission_prefix


def config_of(spec: MissionSpec, active_model: str = "") -> dict[str, Any]:
    """What a checkpoint keeps as configuration: permissions, policies, model selection, and the model
    ("provider/model") serving the mission now — the only part that a failover changes."""
    return {
        "permissions": msgspec.to_builtins(spec.permissions),
        "models": msgspec.to_builtins(spec.models),
        "checkpoint": msgspec.to_builtins(spec.checkpoint),
        "max_parallel": spec.max_parallel,
        "active_model": active_model,
    }


def commit(
    txn: Txn,
    mission_id: str,
    *,
    reason: str,
    units: list[UnitSpec],
    marks: dict[str, UnitMark],
    config: dict[str, Any],
    state: MissionState,
    sandbox_tree: str = "",
    label: str = "",
    files_restored: bool = False,
) -> RestorePoint:
    """Write a checkpoint manifest (sharing unchanged blobs), move HEAD, add a restore point."""
    faultpoints.pause_here("CHECKPOINT")  # inside the write transaction, for crash tests
    marks = {uid: _with_agent_state(txn, mission_id, uid, mark) for uid, mark in marks.items()}
    parent = m.head(txn, mission_id) or ""
    previous = m.get_checkpoint(txn, parent) if parent else None
    manifest = CheckpointManifest(
        mission_id=mission_id,
        number=(previous.number + 1) if previous else 1,
        reason=reason,
        created_at=time.time(),
        graph=txn.put_object(list(units)),
        units=dict(marks),
        config=txn.put_object(config),
        parent=parent,
        sandbox_tree=sandbox_tree,
        evidence_hwm=txn.last_seq(DB.EVIDENCE, mission_prefix(mission_id)),
        events_hwm=txn.last_seq(DB.EVENTS, mission_prefix(mission_id)),
        state=state,
        files_restored=files_restored,
    )
    return m.commit_checkpoint(txn, manifest, label=label)


def _with_agent_state(txn: Txn, mission_id: str, unit_id: str, mark: UnitMark) -> UnitMark:
    """The mark, its agent state's blob present. A `state/save` step stores the state as a blob that only the
    next checkpoint names; a `keel gc` that fell in between removed it as unreachable. The unit's journal
    holds the state itself: it is stored again (under the digest it encodes to now)."""
    if not mark.agent_state or txn.get_raw(DB.BLOBS, mark.agent_state.encode()) is not None:
        return mark
    saved = m.journal_last_done(txn, mission_id, lane(unit_id, mark.epoch), "state/save")
    if saved is None or not isinstance(saved.result, dict) or "state" not in saved.result:
        return mark  # nothing to store it from: `keel verify` names the missing blob
    return msgspec.structs.replace(mark, agent_state=txn.put_object(saved.result["state"]))


class QuietMark(msgspec.Struct, frozen=True):
    """A running unit at its last quiet moment (none of its changes in flight): its journal lane, the last
    entry it had committed, and the snapshots of its own sandbox then (its lease's `tree`, written with the
    entry that last changed the files, and `base_tree`). The files and the journal agree at that moment."""

    lane: str
    journal_hwm: int
    tree: str
    base_tree: str


def with_unit_trees(
    marks: dict[str, UnitMark], held: list[UnitLease], quiet: dict[str, QuietMark] | None = None
) -> dict[str, UnitMark]:
    """The marks of units that had not finished, with the snapshots of their own sandboxes, so that a
    restore to the checkpoint makes those sandboxes again.

    A unit this host runs is taken at its own last quiet moment (`quiet`): no change of it is half-made
    there, whatever the other units are doing, so no unit waits for another's command. Any other unit
    (run by a `keel worker`, or not running) is taken from its lease as the checkpoint's transaction reads
    it. A lease's tree is written in the transaction of the journal entry that changed the files, with that
    entry's seq as `last_checkpoint`, so the mark takes the lease's journal mark when it is higher (steps
    recorded since the host noted them, e.g. by a `keel worker`): the snapshot and the journal copied up to
    the mark then agree. An effect a worker has in flight at that moment is an intent past the tree: a
    restore settles it as after a crash (reconciled with the files, or asked about)."""
    leases = {x.unit: x for x in held}
    out = dict(marks)
    for uid, mark in marks.items():
        if mark.state == UnitState.SUCCEEDED:
            continue
        calm = (quiet or {}).get(uid)
        if mark.state == UnitState.RUNNING and calm is not None and calm.lane == lane(uid, mark.epoch):
            hwm, tree, base_tree = calm.journal_hwm, calm.tree, calm.base_tree
        elif (found := leases.get(uid)) is not None and found.lane == lane(uid, mark.epoch):
            place = found.place
            hwm, tree, base_tree = max(mark.journal_hwm, place.last_checkpoint), place.tree, place.base_tree
        else:
            continue
        if sandbox_kept(tree, base_tree):
            out[uid] = msgspec.structs.replace(mark, journal_hwm=hwm, tree=tree, base_tree=base_tree)
    return out


def load_graph(txn: Txn, digest: str) -> list[UnitSpec]:
    units = txn.get_object(digest, list[UnitSpec])
    return list(units or [])
