"""Stores for gc tests and benchmarks, made with the storage API and the real snapshotter: missions whose
checkpoints each hold a folder-tree snapshot of a sandbox in which some files changed, so that dropping
old points frees file and folder blobs; and checks that what a store's roots reach is all there."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from keel.protocol.records import CheckpointManifest, Event, MissionRecord, RestorePoint, is_tree_ref
from keel.protocol.spec import MissionSpec, UnitSpec
from keel.protocol.states import MissionState
from keel.server.engine.files.trees import Snapshotter
from keel.storage import DB, Store, Txn, leases
from keel.storage import missions as m
from keel.storage.errors import StoreBusyError
from keel.storage.record import Codec, content_digest, seal
from keel.storage.snapshots import load_tree, manifest_trees


def content(mission_id: str, path: str, version: int) -> bytes:
    """A sandbox file's bytes at a version: each version of each file of each mission is a blob of its own."""
    return f"{mission_id}: {path} at version {version}\n".encode() * 8


def files_at(count: int, version: int, changes: int, mission_id: str = "m1") -> dict[str, bytes]:
    """A mission's sandbox after `version` checkpoints, each of which changed the next `changes` files (round
    robin)."""
    out = {}
    for i in range(count):
        path = f"d{i % 8}/s{i % 3}/f{i}.txt"
        last = max((v for v in range(1, version + 1) if i in _changed(v, count, changes)), default=0)
        out[path] = content(mission_id, path, last)
    return out


def _changed(version: int, count: int, changes: int) -> set[int]:
    return {(version * changes + k) % count for k in range(changes)}


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)


def new_mission(store: Store, mission_id: str, workspace: Path) -> None:
    spec = MissionSpec(name=mission_id, agent=("agent",), units=(UnitSpec(id="u1"),))
    now = time.time()
    record = MissionRecord(
        id=mission_id, spec=spec, state=MissionState.PAUSED, created_at=now, updated_at=now, workspace=str(workspace)
    )
    store.write(lambda t: m.put_mission(t, record))


def checkpoint(
    store: Store,
    mission_id: str,
    sandbox: Path,
    snapshots: Snapshotter,
    reason: str = "unit",
    waits: list[float] | None = None,
) -> str:
    """Snapshot the sandbox and commit a checkpoint holding it, as a host does (one write transaction);
    `waits` gets how long the write took, waiting for the lock included."""
    scan = snapshots.scan(sandbox)
    began = time.monotonic()

    def write(txn: Txn) -> str:
        head = m.head_checkpoint(txn, mission_id)
        manifest = CheckpointManifest(
            mission_id=mission_id,
            number=head.number + 1 if head else 1,
            reason=reason,
            created_at=time.time(),
            parent=m.head(txn, mission_id) or "",
            graph=txn.put_object([UnitSpec(id="u1")]),
            config=txn.put_object({"permissions": "kit"}),
            units={},
            sandbox_tree=snapshots.store_txn(txn, sandbox, scan),
            state=MissionState.PAUSED,
        )
        return m.commit_checkpoint(txn, manifest).checkpoint

    digest = store.write(write)
    if waits is not None:
        waits.append(time.monotonic() - began)
    return digest


def grow(store: Store, mission_id: str, folder: Path, *, checkpoints: int, files: int, changes: int) -> Path:
    """A paused mission of `checkpoints` checkpoints over a sandbox of `files` files in `folder`; returns
    the sandbox (its files as of the last checkpoint)."""
    sandbox = folder / "sandbox"
    new_mission(store, mission_id, folder)
    snapshots = Snapshotter()
    for version in range(1, checkpoints + 1):
        write_files(sandbox, files_at(files, version, changes, mission_id))
        checkpoint(store, mission_id, sandbox, snapshots)
    return sandbox


def long_history(store: Store, mission_id: str, count: int, config_bytes: int) -> None:
    """`count` more checkpoints on the mission's chain, all naming one large config blob (one transaction)."""

    def write(txn: Txn) -> None:
        config = txn.put_object({"notes": "n" * config_bytes})
        for _ in range(count):
            head = m.head_checkpoint(txn, mission_id)
            manifest = CheckpointManifest(
                mission_id=mission_id,
                number=head.number + 1 if head else 1,
                reason="unit",
                created_at=time.time(),
                parent=m.head(txn, mission_id) or "",
                graph=head.graph if head else txn.put_object([UnitSpec(id="u1")]),
                config=config,
                units={},
                sandbox_tree=head.sandbox_tree if head else "",
                state=MissionState.PAUSED,
            )
            m.commit_checkpoint(txn, manifest)

    store.write(write)


def strays(store: Store, count: int, size: int = 64, per_txn: int = 10_000) -> None:
    """Blobs nothing refers to (written as `Txn.put_blob` writes them, without looking for each first)."""
    for start in range(0, count, per_txn):
        blobs = [os.urandom(size) for _ in range(min(per_txn, count - start))]

        def write(txn: Txn, blobs: list[bytes] = blobs) -> None:
            for data in blobs:
                key = content_digest(data).encode()
                txn.put_raw(DB.BLOBS, key, seal(DB.BLOBS.value, key, data, Codec.RAW))

        store.write(write)


def missing_blobs(txn: Txn) -> list[str]:
    """Blobs that a root names (every HEAD's and point's chain down to where retention cut it, every lease's
    snapshots, every mission's first snapshot) and the store lacks, each with who names it."""
    out: list[str] = []
    roots = [(f"HEAD of {k.decode()}", txn.get(DB.HEADS, k, str) or "") for k, _ in txn.scan_raw(DB.HEADS, b"")]
    roots += [(f"point {p.mission_id}:{p.id}", p.checkpoint) for _, p in txn.scan(DB.POINTS, b"", RestorePoint)]
    seen: set[str] = set()
    trees: list[tuple[str, str]] = []
    for who, digest in roots:
        manifest = m.get_checkpoint(txn, digest) if digest else None
        while manifest is not None and digest not in seen:
            seen.add(digest)
            refs = [manifest.graph, manifest.config, *(u.agent_state for u in manifest.units.values() if u.agent_state)]
            out += [f"{who}: checkpoint {manifest.number} names {r[:12]}" for r in refs if txn.get_blob(r) is None]
            trees += [(f"{who}: checkpoint {manifest.number}", t) for t in manifest_trees(manifest)]
            digest, manifest = manifest.parent, m.parent_checkpoint(txn, manifest)
    for record in m.list_missions(txn):
        trees.append((f"start of {record.id}", record.start_tree))
        for held in leases.list_leases(txn, record.id):
            trees += [(f"lease {record.id}/{held.unit}", t) for t in (held.place.tree, held.place.base_tree)]
    for who, tree in trees:
        if not is_tree_ref(tree):
            continue
        loaded = load_tree(txn.get_blob, tree)  # a missing folder below the root raises
        if loaded is None:
            out.append(f"{who}: snapshot {tree[:12]} is missing")
            continue
        out += [f"{who}: file {e.path} {e.blob[:12]}" for e in loaded.entries if txn.get_blob(e.blob) is None]
    return out


def keep_writing(
    store_path: Path, sandbox: Path, stop: Path, out: Path, *, files: int, changes: int, versions: int
) -> None:
    """Another process's writes while gc runs, until `stop` exists: checkpoints of mission m1 whose sandbox
    is put back to the files of each old version in turn (`versions` > 0: their blobs are ones the policy
    may be dropping), or else small writes (an event) as often as it can. Writes `out`: how many, how many
    gave up waiting for the write lock (StoreBusyError), and the longest a write took."""
    waits: list[float] = []
    busy = 0
    snapshots = Snapshotter()
    with Store.open(store_path, create=False) as store:
        while not stop.exists():
            try:
                if versions:
                    write_files(sandbox, files_at(files, 1 + len(waits) % versions, changes))
                    checkpoint(store, "m1", sandbox, snapshots, reason="put back meanwhile", waits=waits)
                else:
                    began = time.monotonic()
                    store.write(
                        lambda t: m.add_event(t, "m1", Event(kind="note", at=time.time(), message="still here"))
                    )
                    waits.append(time.monotonic() - began)
            except StoreBusyError:
                busy += 1
                waits.append(store.write_timeout)
    out.write_text(json.dumps({"writes": len(waits), "busy": busy, "longest_s": max(waits, default=0.0)}))


if __name__ == "__main__":  # python -m tests.storage.gckit STORE SANDBOX STOP OUT FILES CHANGES VERSIONS
    a = sys.argv[1:]
    keep_writing(Path(a[0]), Path(a[1]), Path(a[2]), Path(a[3]), files=int(a[4]), changes=int(a[5]), versions=int(a[6]))
