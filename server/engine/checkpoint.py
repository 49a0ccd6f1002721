"""Checkpoints and the checkpoint policy: content-addressed manifests, and when a step must be durable.

A manifest names blobs by digest (graph, configuration, agent states), so a checkpoint stores only what
changed: an unchanged graph or configuration is shared with the parent. `commit` builds the manifest
inside the caller's transaction (storage/missions.commit_checkpoint moves HEAD and adds the restore
point in the same one). docs/checkpointing.md explains the policy's cost model. Depends on storage only.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.records import CheckpointManifest, RestorePoint, UnitMark
from keel.protocol.spec import CheckpointPolicy, MissionSpec, UnitSpec
from keel.protocol.states import MissionState
from keel.storage import DB, Txn
from keel.storage import missions as m
from keel.storage.keys import mission_prefix

#: Steps that are cheap to redo: they may wait for a group commit (never for longer than the window).
CHEAP_METHODS = frozenset({"now", "random", "evidence/add"})


class Policy:
    """Decides, per step, whether its commit is urgent, and when a full checkpoint (snapshot) is due."""

    def __init__(self, spec: CheckpointPolicy) -> None:
        self.spec = spec
        self.at_risk_ms = 0.0  # work done since the last checkpoint that a crash would make us replay
        self.last_snapshot = time.monotonic()

    @property
    def window_s(self) -> float:
        return 0.0 if self.spec.policy == "every-step" else self.spec.group_window_ms / 1000

    def urgent(self, method: str, tool_class: str | None, wall_ms: float, tokens: int) -> bool:
        if self.spec.policy == "every-step":
            return True
        if method == "tool/run":
            return tool_class != "read_only" or wall_ms >= self.spec.expensive_step_ms
        if method in CHEAP_METHODS:
            return wall_ms >= self.spec.expensive_step_ms
        return True  # model calls, questions, plan changes, saved state: always before use

    def record(self, wall_ms: float) -> bool:
        """Account one step; True when a snapshot checkpoint is due now."""
        self.at_risk_ms += wall_ms
        if self.spec.policy == "every-step":
            return True
        if self.spec.policy == "interval":
            return (time.monotonic() - self.last_snapshot) * 1000 >= self.spec.interval_ms
        return self.at_risk_ms >= self.spec.snapshot_budget_ms

    def snapshotted(self) -> None:
        self.at_risk_ms = 0.0
        self.last_snapshot = time.monotonic()


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
    fault_point("CHECKPOINT")
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
        state=state,
        files_restored=files_restored,
    )
    return m.commit_checkpoint(txn, manifest, label=label)


def fault_point(name: str) -> None:
    """Fault injection for crash tests: with KEEL_FAULT_<NAME>="FILE:SECONDS" set, touch FILE and sleep
    here (inside the transaction), so a test can SIGKILL the host at exactly this point."""
    spec = os.environ.get(f"KEEL_FAULT_{name}")
    if not spec:
        return
    marker, _, seconds = spec.rpartition(":")
    Path(marker).write_text(str(os.getpid()))
    time.sleep(float(seconds))


def load_graph(txn: Txn, digest: str) -> list[UnitSpec]:
    units = txn.get_object(digest, list[UnitSpec])
    return list(units or [])


class TreeDigest:
    """Digest of a sandbox's files (not .git), re-hashing only files whose size or mtime changed."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, int, int, str]] = {}

    def __call__(self, root: Path) -> str:
        total = hashlib.blake2b(digest_size=16, person=b"keel-tree")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in (".git", ".keel"))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                cached = self._cache.get(path)
                # the inode too: a file replaced by a rename within one clock tick keeps size and mtime
                if cached and cached[:3] == (st.st_ino, st.st_size, st.st_mtime_ns):
                    digest = cached[3]
                else:
                    digest = _file_digest(path)
                    self._cache[path] = (st.st_ino, st.st_size, st.st_mtime_ns, digest)
                total.update(os.path.relpath(path, root).encode() + b"\x00" + digest.encode() + b"\n")
        return total.hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    try:
        if os.path.islink(path):
            h.update(os.readlink(path).encode())
        else:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 16), b""):
                    h.update(chunk)
    except OSError:
        pass
    return h.hexdigest()
