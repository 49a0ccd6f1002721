"""A mission that moves to another machine: its sandboxes made again from the store.

On a shared store (PostgreSQL) a mission's host may start on a machine other than the one whose workspace
holds its sandboxes (its machine died, and a supervisor elsewhere took the host lease over). The mission
record names that machine (`MissionRecord.machine`); a host that finds another name there makes the
mission's files again in this machine's workspace from what the store holds:

- the mission sandbox from the newest checkpoint with a file snapshot (every merge is followed by one),
  committed on a fresh mission branch `keel/<id>` made from this workspace's HEAD;
- each unfinished unit's sandbox from the snapshot its lease names (`Placement.tree`: stored with every
  journal entry that changed files, and with the completion), as a plain folder whose base file holds the
  digests of the snapshot it started from (`base_tree`), so its work merges file by file like a copy
  sandbox's (placement.make_here, called for each unit by the host's registry). A unit without both
  snapshots stored (an appending agent's, or a lease written by a keel that kept only digests) gets no
  sandbox here: recovery then re-executes it when its journal holds no effect, and otherwise asks the
  person, as for any lost sandbox.

Every step is idempotent, and the record names the new machine only after all of them, so a host killed
midway simply moves the mission again. Depends on storage and the engine's merge, places, restore, sandbox
and trees modules.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.protocol.records import CheckpointManifest, MissionRecord, SandboxTree, is_tree_ref
from keel.server.engine.files import merge, trees
from keel.server.engine.files.gitbase import GitBase, for_workspace
from keel.server.engine.files.sandbox import SandboxError, ensure_sandbox, git_toplevel
from keel.server.engine.restore import blob_reader
from keel.storage import Store, Txn
from keel.storage import missions as m
from keel.storage.snapshots import load_tree


def here() -> str:
    """This machine's name, as leases and mission records name machines."""
    return os.uname().nodename


def moved(record: MissionRecord, store: Store) -> bool:
    """The mission's sandboxes are on another machine. Only a shared store's missions move: an LMDB store
    is on this machine's disk with its sandboxes, whatever this machine is called now (a container gets a
    new name each time it starts). A record that names no machine is taken as this one's."""
    return store.shared and bool(record.machine) and record.machine != here()


def _latest_tree(
    store: Store, manifest: CheckpointManifest, base: GitBase | None
) -> tuple[CheckpointManifest, SandboxTree] | None:
    """The newest checkpoint at or before `manifest` with a file snapshot, and that snapshot."""

    def find(txn: Txn) -> tuple[CheckpointManifest, SandboxTree] | None:
        current: CheckpointManifest | None = manifest
        while current is not None:
            ref = current.sandbox_tree
            tree = load_tree(txn.get_blob, ref, base) if is_tree_ref(ref) else None
            if tree is not None:
                return current, tree
            current = m.parent_checkpoint(txn, current)
        return None

    return store.read(find)


def rebuild_mission_sandbox(
    store: Store, workspace: Path, sandbox: Path, mission_id: str, manifest: CheckpointManifest | None, origin: str
) -> Path:
    """Make the mission sandbox here hold the files of its newest snapshot, committed on its branch."""
    repo = for_workspace(workspace)
    found = _latest_tree(store, manifest, repo) if manifest is not None else None
    if found is None and manifest is not None and manifest.units:
        raise SandboxError(
            f"mission {mission_id} ran on {origin}, and the store holds no snapshot of its files to carry on "
            f"from here; resume it on {origin}, or bring it here with `keel export` / `keel import`"
        )
    # a branch or worktree left from an earlier stay on this machine is out of date
    merge.remove_sandbox(sandbox, git_toplevel(workspace), f"keel/{mission_id}")
    ensure_sandbox(workspace, sandbox, mission_id)
    if found is not None:
        point, tree = found
        trees.materialize(sandbox, tree, blob_reader(store, repo))
        trees.verify(sandbox, tree, f"the files of checkpoint {point.number} of mission {mission_id}")
        if merge.is_git(sandbox):
            message = f"keel: mission files of checkpoint {point.number}, carried over from {origin}"
            merge.commit_all(sandbox, message)
    return sandbox
