"""Where a unit's files are, and making them here: the one answer every part of the engine asks.

A unit works in its own sandbox. On its mission's machine that is a git worktree on the unit's own branch,
made from the mission branch (`branch_off`, then `fill`), or a copy of the mission sandbox where there is no
git; a worker started again on the same lane goes on in the sandbox its lane already has (`reuse`). A unit's
lease names the sandbox (`Placement`), with the two snapshots the store keeps of it: the files it started
from (`base_tree`) and the files at its last journal entry that changed any (`tree`). From those two the
sandbox can be made anywhere (`make_here`): on the machine a mission moved to, on a `keel worker`, for a unit
a restore left without one, for an export of unfinished work. `problem` says whether the sandbox a lease
names is here and holds what was recorded; unit recovery acts on that answer (unitrecovery.py).

Depends on storage and the engine's files modules (merge, places, trees) and restore's blob reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from keel.protocol.records import Placement, UnitLease, is_tree_ref
from keel.server.engine.files import merge, places, trees
from keel.server.engine.files.gitbase import for_workspace
from keel.server.engine.files.sandbox import SandboxError
from keel.server.engine.restore import blob_reader
from keel.storage import Store
from keel.storage import missions as m
from keel.storage.snapshots import load_tree, snapshot_base


class PreparedSandbox(msgspec.Struct, frozen=True):
    """The sandbox a worker of the unit starts in, before its lease names it."""

    sandbox: str
    branch: str
    base: str
    tree: str
    # a fresh sandbox: its snapshot, stored with its first lease (the unit's base_tree);
    # a worker started again in it keeps the lease's trees
    scan: trees.Scan | None = None
    files: trees.Snapshotter | None = None  # the scanner that made `scan`: the unit's steps go on with it
    copied: bool = False  # a plain folder, not a git worktree (Placement.copied)


def home(store_path: Path, mission_id: str, lane: str) -> tuple[Path, str]:
    """The sandbox folder and git branch of a unit's journal lane on its mission's machine."""
    return places.unit_sandbox_path(store_path, mission_id, lane), merge.unit_branch(mission_id, lane)


def reuse(store_path: Path, mission_id: str, lane: str, lease: UnitLease | None) -> PreparedSandbox | None:
    """The sandbox the lane already has, when the folder is here; else None. A lane whose run completed
    keeps its sandbox too: it holds that run's files (and, in git, their commit), which a replay of its
    journal answers without making them again."""
    path, branch = home(store_path, mission_id, lane)
    was = lease.place if lease else Placement()
    if not (lease and lease.lane == lane and path.exists() and was.made()):
        return None
    # no recorded tree (a person vouched for an effect): the sandbox as it is is the reference
    base = "" if was.is_copy() else was.base
    return PreparedSandbox(str(path), branch, base, was.tree or trees.tree_digest(path), copied=was.is_copy())


def has_steps(lane: str, lease: UnitLease) -> bool:
    """The lane's journal already holds steps: their file changes are in its own sandbox, and a replay
    answers them without making them again, so a sandbox made afresh from the mission branch would
    silently lack them."""
    return lease.lane == lane and lease.place.last_checkpoint > 0


def remade(store: Store, store_path: Path, mission_id: str, lease: UnitLease) -> PreparedSandbox:
    """The sandbox of a lane that has steps but whose folder is not here, made again from the snapshots its
    lease names (`make_here`); SandboxError when they are not kept: the unit cannot go on as it was."""
    here = make_here(store, store_path, mission_id, lease)
    if not here.place.is_copy():
        raise SandboxError(
            f"its journal lane {lease.lane} holds {lease.place.last_checkpoint} step(s), but their sandbox "
            f"{lease.place.sandbox or '(none)'} is not here and no snapshot of its files is kept"
        )
    return PreparedSandbox(here.place.sandbox, "", "", here.place.tree, copied=True)


def branch_off(mission_sandbox: Path, store_path: Path, mission_id: str, lane: str) -> str:
    """A fresh sandbox for the lane, made from the mission branch (an old one is removed); returns its base.
    Changes the mission sandbox's git state: the caller holds the lock on it. A git sandbox has no files
    yet: `fill` writes them, outside that lock, so that units starting together write theirs at once."""
    path, branch = home(store_path, mission_id, lane)
    return merge.create(mission_sandbox, path, branch)


def fill(store_path: Path, mission_id: str, lane: str, base: str) -> PreparedSandbox:
    """The files of a sandbox `branch_off` made, written and snapshotted: the snapshot is stored with the
    unit's first lease (its base_tree), so its work can be made again elsewhere."""
    path, branch = home(store_path, mission_id, lane)
    merge.check_out(path)
    files = trees.Snapshotter()
    scan = files.scan(path, keep_bytes=False, checked_out=True)  # the bytes are read when it is stored
    return PreparedSandbox(str(path), branch, base, "", scan, files, copied=not merge.is_git(path))


def make_here(
    store: Store, store_path: Path, mission_id: str, held: UnitLease, target: Path | None = None
) -> UnitLease:
    """The lease as it is here: its sandbox made again (at `target`, by default the unit's sandbox path of this
    store) from the stored snapshots when both are there (a plain folder merged file by file), else pointing
    at a folder that does not exist here (lost)."""
    target = target or places.unit_sandbox_path(store_path, mission_id, held.lane)
    merge.remove_sandbox(target)
    place = msgspec.structs.replace(held.place, sandbox=str(target), branch="", base="", commit="", copied=False)
    moved_here = msgspec.structs.replace(held, place=place, pid=0, hostname="")
    get = store.read
    # the repository holding the commit a git sandbox's snapshots are relative to: the mission's workspace
    # (its own machine), else the one the store belongs to (a `keel worker` elsewhere)
    own = places.workspace_of(store_path)
    workspace = Path(get(lambda t: m.get_mission(t, mission_id)).workspace or own)
    repo = for_workspace(workspace) or for_workspace(own)
    tree = get(lambda t: load_tree(t.get_blob, place.tree, repo)) if is_tree_ref(place.tree) else None
    base = get(lambda t: load_tree(t.get_blob, place.base_tree, repo)) if is_tree_ref(place.base_tree) else None
    if tree is None or base is None:
        return moved_here
    blob = blob_reader(store, repo)
    target.mkdir(parents=True)
    trees.materialize(target, tree, blob)
    digests = {e.path: trees.file_digest(blob(e.blob)) for e in base.entries if merge.counts(e.path)}
    merge.base_file(target).write_text(json.dumps(digests, sort_keys=True))
    return msgspec.structs.replace(moved_here, place=msgspec.structs.replace(place, copied=True))


def problem(store: Store, mission_id: str, held: UnitLease, mission_sandbox: Path) -> str:
    """Why the unit cannot go on in the sandbox its lease names ("" when it can): it names none, the folder
    is not here, or its files no longer match the snapshot recorded with the lane's last journal entry (unless
    an effect of the lane is in doubt: its command may have changed them). The lane is read for an effect in
    doubt only when the files do not match: a sandbox as recorded costs what the sandbox costs, not the history."""
    place = held.place
    path = Path(place.sandbox)
    if not place.sandbox:
        return held.why or "it has no sandbox"
    if not path.exists():
        return f"its sandbox {place.sandbox} is missing"
    if not place.tree:
        return ""
    try:
        base = store.read(lambda t: snapshot_base(t.get_blob, place.tree))
        found = trees.digest_as_recorded(path, place.tree, base, mission_sandbox)
    except trees.SandboxUnreadableError as exc:
        why = exc.message
    else:
        if found == place.tree:
            return ""
        why = (
            f"its sandbox {path} no longer matches the tree digest recorded with its last journal "
            f"entry (recorded {place.tree[:12]}, found {found[:12]})"
        )
    in_doubt = store.read(lambda t: any(e.phase == "intent" for e in m.journal_scan(t, mission_id, held.lane)))
    return "" if in_doubt else why
