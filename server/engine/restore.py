"""Rewind a mission to a restore point, or fork a new mission from one; history is never rewritten.

A restore writes a NEW checkpoint holding the point's task graph and unit marks. A unit that had not
finished at the point gets a fresh journal lane (a new epoch) that begins as its old lane up to the point's
mark (`missions.share_lane`: the entries are shared, not copied), so entries recorded after the point are
never used on replay; the old lane stays as it was. The mission becomes paused: `keel resume` continues from there.

With files (`restore_files`), the sandbox is first made equal to the point's file snapshot
(server/engine/files/trees.py), then re-hashed and checked against it: a mismatch is an error and nothing is
recorded. The new checkpoint says `files_restored`, so the host that resumes it checks the sandbox
again before anything runs. A fork copies the records the point needs (journal lanes up to their marks,
evidence up to the point) to a new mission id with its own sandbox (its own `keel/<id>` branch in a git
workspace); its first checkpoint's parent is the point's checkpoint, so the original is only read.
Depends on storage and the engine's checkpoint, journal, places, sandbox and trees modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from keel.protocol.errors import InvalidTransitionError
from keel.protocol.records import (
    CheckpointManifest,
    Event,
    LaneBase,
    MissionRecord,
    RestorePoint,
    SandboxTree,
    UnitMark,
    sandbox_kept,
)
from keel.protocol.states import LeaseState, MissionState, PauseReason, UnitState, can
from keel.server import gitrun
from keel.server.engine import checkpoint, faultpoints
from keel.server.engine.files import gitbase, merge, places, trees
from keel.server.engine.files.sandbox import SandboxError, ensure_sandbox, git_toplevel
from keel.server.engine.journal import fresh_epoch, lane
from keel.storage import DB, Store, Txn, leases
from keel.storage import missions as m
from keel.storage.keys import mission_prefix, unit_prefix


def _check_restorable(record: MissionRecord) -> None:
    if not can(record.state).restore:
        then = "pause it before a restore" if can(record.state).pause else "it cannot be restored"
        raise InvalidTransitionError(f"mission {record.id} is {record.state.value}; {then}")


def restore_txn(txn: Txn, mission_id: str, point_id: str, *, files: bool = False) -> RestorePoint:
    record = m.get_mission(txn, mission_id)
    _check_restorable(record)
    point = m.get_point(txn, mission_id, point_id)
    target = m.get_checkpoint(txn, point.checkpoint)
    current = m.head_checkpoint(txn, mission_id)
    marks: dict[str, UnitMark] = {}
    for unit_id, mark in target.units.items():
        if mark.state == UnitState.SUCCEEDED:
            marks[unit_id] = mark
            continue
        latest = current.units.get(unit_id) if current else None
        if latest is not None and _unchanged_since(txn, mission_id, unit_id, mark, latest):
            marks[unit_id] = _reopened(mark, mark.epoch)  # it carries on in its own sandbox, on its own lane
            continue
        epoch = fresh_epoch(txn, mission_id, unit_id, mark.epoch, latest.epoch if latest else 0)
        old_lane, new_lane = lane(unit_id, mark.epoch), lane(unit_id, epoch)
        m.share_lane(txn, mission_id, new_lane, LaneBase(lane=old_lane, upto=mark.journal_hwm))
        marks[unit_id] = _reopened(mark, epoch)
        _place_reopened(txn, mission_id, unit_id, new_lane, mark, point.id)
    m.set_mission_state(
        txn, mission_id, MissionState.PAUSED, pause_reason=PauseReason.OPERATOR, question=None, error=""
    )
    units = checkpoint.load_graph(txn, target.graph)
    config = txn.get_object(target.config, dict) or checkpoint.config_of(record.spec)
    return checkpoint.commit(
        txn,
        mission_id,
        reason=f"restored to {point.id}",
        units=units,
        marks=marks,
        config=config,
        state=MissionState.PAUSED,
        sandbox_tree=target.sandbox_tree,
        label=f"restore of {point.id}" + (" with files" if files else ""),
        files_restored=files,
    )


def _unchanged_since(txn: Txn, mission_id: str, unit_id: str, mark: UnitMark, latest: UnitMark) -> bool:
    """Nothing of the unit happened after the point: the same lane, no journal entry past the point's mark,
    not finished since, and still based on the files it was based on at the point (an export since carried
    its work into the mission sandbox and made that its base: leases.carried). Its sandbox then still holds
    its files at the point (a unit's sandbox is not in the point's snapshot, and a replay does not redo its
    writes), and its work merges onto the point's mission files, so it resumes there."""
    unit_lane = lane(unit_id, mark.epoch)
    held = leases.get(txn, mission_id, unit_id)
    return (
        latest.epoch == mark.epoch
        and mark.journal_hwm > 0
        and txn.last_seq(DB.JOURNAL, unit_prefix(mission_id, unit_lane)) == mark.journal_hwm
        and held is not None
        and held.lane == unit_lane
        and held.state != LeaseState.DONE
        and (not mark.base_tree or held.place.base_tree == mark.base_tree)
    )


def _place_reopened(txn: Txn, mission_id: str, unit_id: str, unit_lane: str, mark: UnitMark, point: str) -> None:
    """A reopened unit whose journal up to the point changed files needs its sandbox as it was at the point:
    a lease on its lane names the point's snapshots of that sandbox (the resuming host makes it from them,
    registry.recover), or, from a point that holds none, no sandbox at all (then a lost sandbox: run again
    when its journal holds no effect, else a question). It never goes on in a fresh sandbox without the
    files its replayed steps made."""
    entries = m.journal_kinds(txn, mission_id, unit_lane, mark.journal_hwm)
    if not any(e.tool_class in ("effectful", "idempotent") or e.kind == "effect/ask" for e in entries):
        return  # nothing it did is in its files: a fresh sandbox from the mission branch is the same
    kept = sandbox_kept(mark.tree, mark.base_tree)
    leases.reopen(
        txn,
        mission_id,
        unit_id,
        lane=unit_lane,
        tree=mark.tree if kept else "",
        base_tree=mark.base_tree if kept else "",
        checkpoint=mark.journal_hwm,
        why="" if kept else f"restore point {point} holds no snapshot of its sandbox",
    )


def _reopened(mark: UnitMark, epoch: int) -> UnitMark:
    state = UnitState.RESUMABLE if mark.journal_hwm else UnitState.PENDING
    return msgspec.structs.replace(mark, state=state, epoch=epoch, error="")


# -- files ------------------------------------------------------------------------------------------------
def load_point(
    store: Store, mission_id: str, point_id: str
) -> tuple[MissionRecord, RestorePoint, SandboxTree, Callable[[str], bytes]]:
    """A restore point, its file snapshot and the reader of its files' bytes (the store's blobs, and the
    workspace repository's for a snapshot relative to a git commit)."""
    record = store.read(lambda t: m.get_mission(t, mission_id))
    base = gitbase.for_workspace(Path(record.workspace))

    def read(txn: Txn) -> tuple[RestorePoint, SandboxTree]:
        point = m.get_point(txn, mission_id, point_id)
        manifest = m.get_checkpoint(txn, point.checkpoint)
        return point, trees.point_tree(txn, manifest, f"restore point {point.id} of mission {mission_id}", base)

    point, tree = store.read(read)
    return record, point, tree, blob_reader(store, base)


def blob_reader(store: Store, base: gitbase.GitBase | None = None) -> Callable[[str], bytes]:
    """Read one blob per short read transaction (a restore never holds a long one); a file of a
    snapshot's base commit from the repository (`base`, after it listed that commit's files)."""

    def blob(digest: str) -> bytes:
        data = store.read(lambda t: t.get_blob(digest))
        if data is None and base is not None:
            data = base.blob(digest)
        if data is None:
            raise trees.NoSnapshotError(f"file blob {digest[:16]} of the snapshot is missing from the store")
        return data

    return blob


SANDBOX = "sandbox"  # the point name of a mission's sandbox as it is now


def point_files(
    store: Store, store_path: Path, mission_id: str, point: str
) -> tuple[trees.Files, Callable[[str], bytes], str]:
    """(files, reader of their bytes by digest, name) of a restore point, or of the sandbox as it is now
    when `point` is empty or "sandbox" (freshly hashed: what no checkpoint has seen yet counts)."""
    if point and point != SANDBOX:
        _, p, tree, reader = load_point(store, mission_id, point)
        return trees.tree_files(tree), reader, p.id
    record = store.read(lambda t: m.get_mission(t, mission_id))
    root = Path(record.sandbox or places.sandbox_path(store_path, mission_id))
    files = trees.current_files(root) if root.is_dir() else {}
    paths = {digest: path for path, (_, digest) in files.items()}
    return files, lambda digest: trees.read_bytes(str(root / paths[digest]), files[paths[digest]][0]), SANDBOX


def restore_files(store: Store, store_path: Path, mission_id: str, point_id: str) -> RestorePoint:
    """Put the point's files into the sandbox, verify them, then record the restore (one transaction)."""
    record, point, tree, reader = load_point(store, mission_id, point_id)
    _check_restorable(record)
    sandbox = Path(record.sandbox or places.sandbox_path(store_path, mission_id))
    ensure_sandbox(Path(record.workspace), sandbox, mission_id)
    trees.materialize(sandbox, tree, reader, f"restore point {point.id} of mission {mission_id}")
    faultpoints.pause_here("RESTORE_VERIFY")
    trees.verify(sandbox, tree, f"restore point {point.id}")
    return store.write(lambda t: restore_txn(t, mission_id, point_id, files=True))


def check_restored_files(store: Store, manifest: CheckpointManifest, sandbox: Path) -> None:
    """A host resuming right after a restore with files: the sandbox must still be the restored one."""
    base = gitbase.for_workspace(sandbox)
    tree = store.read(lambda t: trees.point_tree(t, manifest, f"checkpoint {manifest.number}", base))
    try:
        trees.verify(
            sandbox,
            tree,
            f"the files restored by checkpoint {manifest.number} ({manifest.reason}); "
            f"restore them again with `keel restore {manifest.mission_id} POINT --files`",
        )
    except trees.SandboxMismatchError as exc:  # the mission says why it did not start (editor, `keel status`)
        message = exc.message

        def note(txn: Txn) -> None:
            state = m.get_mission(txn, manifest.mission_id).state
            m.set_mission_state(txn, manifest.mission_id, state, error=message[:2000])
            m.add_event(txn, manifest.mission_id, Event(kind="error", at=time.time(), message=message[:500]))

        store.write(note)
        raise


# -- fork -------------------------------------------------------------------------------------------------
def fork(store: Store, store_path: Path, mission_id: str, point_id: str, name: str = "") -> MissionRecord:
    """A new mission from a restore point: own id, own sandbox holding the point's files, paused; named
    `name` (default: the original's name)."""
    record, point, tree, reader = load_point(store, mission_id, point_id)
    new_id = places.new_mission_id()
    sandbox = places.sandbox_path(store_path, new_id)
    workspace = Path(record.workspace)
    git = _fork_sandbox(workspace, Path(record.sandbox or places.sandbox_path(store_path, mission_id)), sandbox, new_id)
    try:
        trees.materialize(sandbox, tree, reader, f"restore point {point.id} of mission {mission_id}")
        trees.verify(sandbox, tree, f"restore point {point.id} of mission {mission_id}")
        spec = msgspec.structs.replace(record.spec, name=name) if name else record.spec
        named = msgspec.structs.replace(record, spec=spec)
        return store.write(lambda t: _fork_txn(t, named, point, new_id, sandbox))
    except BaseException:
        merge.remove_sandbox(sandbox, git_toplevel(workspace) if git else None, f"keel/{new_id}")
        raise


def _fork_sandbox(workspace: Path, original: Path, target: Path, new_id: str) -> bool:
    """Branch keel/<new> where the original sandbox is (or the workspace HEAD), then its worktree."""
    top = git_toplevel(workspace)
    if top is None:
        target.mkdir(parents=True, exist_ok=False)
        return False
    start = gitrun.run(original, "rev-parse", "HEAD") if original.exists() else None
    base = start.stdout.strip() if start is not None and start.returncode == 0 else "HEAD"
    made = gitrun.run(top, "branch", f"keel/{new_id}", base)
    if made.returncode != 0:
        raise SandboxError(f"cannot create branch keel/{new_id}: {made.stderr.strip()}")
    ensure_sandbox(workspace, target, new_id)
    return True


def _fork_txn(txn: Txn, record: MissionRecord, point: RestorePoint, new_id: str, sandbox: Path) -> MissionRecord:
    target = m.get_checkpoint(txn, point.checkpoint)
    now = time.time()
    fork_record = msgspec.structs.replace(
        record,
        id=new_id,
        state=MissionState.PAUSED,
        pause_reason=PauseReason.OPERATOR,
        question=None,
        error="",
        host=None,
        sandbox=str(sandbox),
        forked_from=f"{record.id}:{point.id}",
        created_at=now,
        updated_at=now,
        control_seen=0,
    )
    m.put_mission(txn, fork_record)
    for name, hwm in _lanes_of_chain(txn, target).items():
        for entry in m.journal_entries(txn, record.id, name, upto=hwm):
            m.journal_put(txn, new_id, name, entry)
    for _, item in m.evidence_after(txn, record.id, upto=target.evidence_hwm):
        m.add_evidence(txn, new_id, item)
    m.add_event(
        txn,
        new_id,
        Event(kind="state", at=now, state=MissionState.PAUSED.value, message=f"forked from {record.id} at {point.id}"),
    )
    marks = {
        uid: mk if mk.state == UnitState.SUCCEEDED else _reopened(mk, mk.epoch) for uid, mk in target.units.items()
    }
    for uid, mk in target.units.items():
        if mk.state != UnitState.SUCCEEDED:
            _place_reopened(txn, new_id, uid, lane(uid, mk.epoch), mk, f"{record.id}:{point.id}")
    manifest = CheckpointManifest(
        mission_id=new_id,
        number=target.number + 1,
        reason=f"forked from {record.id} {point.id}",
        created_at=now,
        graph=target.graph,
        units=marks,
        config=target.config,
        parent=point.checkpoint,
        sandbox_tree=target.sandbox_tree,
        context=target.context,
        evidence_hwm=txn.last_seq(DB.EVIDENCE, mission_prefix(new_id)),
        state=MissionState.PAUSED,
        files_restored=True,
    )
    m.commit_checkpoint(txn, manifest, label=f"fork of {record.id} {point.id}")
    return fork_record


def _lanes_of_chain(txn: Txn, manifest: CheckpointManifest) -> dict[str, int]:
    """Every journal lane a checkpoint chain refers to, with the highest entry it needs."""
    lanes: dict[str, int] = {}
    current: CheckpointManifest | None = manifest
    while current is not None:
        for uid, mark in current.units.items():
            name = lane(uid, mark.epoch)
            lanes[name] = max(lanes.get(name, 0), mark.journal_hwm)
        current = m.parent_checkpoint(txn, current)
    return lanes
