"""Where a mission's files live next to its store: logs, host locks and sandboxes.

For the default store `<workspace>/.keel/store` these are `.keel/logs`, `.keel/locks`, `.keel/sandboxes`.
Pure path arithmetic plus mission ids; depends on nothing else in keel.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase: sorts like the numbers


def new_mission_id(now: float | None = None) -> str:
    """'m' + 9 base32 digits of milliseconds since the epoch + 3 random digits: short and sortable."""
    millis = int((time.time() if now is None else now) * 1000)
    stamp = "".join(_ALPHABET[(millis >> (5 * i)) & 31] for i in reversed(range(9)))
    rand = int.from_bytes(os.urandom(2), "big")
    return "m" + stamp + "".join(_ALPHABET[(rand >> (5 * i)) & 31] for i in reversed(range(3)))


def keel_dir(store_path: Path) -> Path:
    return store_path.parent


def workspace_of(store_path: Path) -> Path:
    """The workspace a store folder belongs to (`<workspace>/.keel/<store>`)."""
    return keel_dir(store_path).parent


def log_path(store_path: Path, mission_id: str) -> Path:
    return keel_dir(store_path) / "logs" / f"{mission_id}.log"


def agent_log_path(store_path: Path, mission_id: str, unit_id: str) -> Path:
    return keel_dir(store_path) / "logs" / mission_id / f"{unit_id}.log"


def lock_path(store_path: Path, mission_id: str) -> Path:
    return keel_dir(store_path) / "locks" / f"{mission_id}.lock"


def sandbox_path(store_path: Path, mission_id: str) -> Path:
    return keel_dir(store_path) / "sandboxes" / mission_id


def unit_sandbox_path(store_path: Path, mission_id: str, lane: str) -> Path:
    """A unit's own sandbox (one per journal lane): `.keel/sandboxes/<mission>-units/<lane>`."""
    return keel_dir(store_path) / "sandboxes" / f"{mission_id}-units" / lane.replace("#", "-e")


def worker_sandbox_path(store_path: Path, worker: str, mission_id: str, lane: str, epoch: int) -> Path:
    """A unit's sandbox on a `keel worker`, one per claim (the lease epoch it was claimed under), so that a
    worker taking a unit again never shares a folder with its earlier claim, which it removes when that run
    ends: `.keel/workers/<worker>/<mission>/<lane>.<epoch>`."""
    return keel_dir(store_path) / "workers" / worker / mission_id / f"{lane.replace('#', '-e')}.{epoch}"


def unit_home_path(store_path: Path, mission_id: str, lane: str) -> Path:
    """A unit's own folder outside its sandbox, kept across its runs (an outside agent's HOME and session
    files live there): `.keel/homes/<mission>/<lane>`."""
    return keel_dir(store_path) / "homes" / mission_id / lane.replace("#", "-e")
