"""One host per mission: an exclusive flock on `.keel/locks/<id>.lock`, released by the kernel on death;
across machines, the mission's host lease in the store (storage/hostlease.py), which this module judges.

A killed host leaves the lock file but not the lock, so a stale lock never blocks a restart. `host_alive`
tells whether the host a mission records still runs (its pid and start time). Depends on the standard
library, protocol and storage.writelock only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.records import HostInfo, HostLease, MissionRecord
from keel.storage.writelock import seconds_from_env

HOST_TTL_ENV = "KEEL_HOST_LEASE_TTL_S"
DEFAULT_HOST_TTL_S = 10.0


class HostBusyError(KeelError):
    """Another host runs this mission right now."""

    code = ErrorCode.USAGE


class HostLock:
    def __init__(self, path: Path, mission_id: str) -> None:
        self.path = path
        self.mission_id = mission_id
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise HostBusyError(
                f"mission {self.mission_id} is already running (host pid {holder}); "
                f"pause it with `keel pause {self.mission_id}`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def held_elsewhere(self) -> bool:
        """True when some live process holds the lock (probe without keeping it)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def host_alive(record: MissionRecord) -> bool:
    """Whether the host recorded in the mission still runs (same machine: the pid exists, not a zombie,
    and it started no later than the record says)."""
    return record.host is not None and host_runs(record.host)


def host_runs(host: HostInfo) -> bool:
    """`host_alive` for a recorded host."""
    if host.hostname and host.hostname != os.uname().nodename:
        return True  # another machine's host: assume alive (its lock is not ours to probe)
    try:
        stat = Path(f"/proc/{host.pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    start_ticks = int(fields[19])
    boot = _boot_time()
    started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    return started <= host.started_at + 2.0


def host_ttl() -> float:
    """How long a host's lease outlives its last heartbeat: $KEEL_HOST_LEASE_TTL_S, else 10 s. A host on
    another machine that goes silent (dead, frozen, cut off) is taken over after this long."""
    return seconds_from_env(HOST_TTL_ENV, DEFAULT_HOST_TTL_S)


def lease_holder_dead(lease: HostLease) -> bool:
    """Whether a host lease's holder is known to be gone without waiting out its ttl: it ran on this
    machine and its process no longer runs (or is a zombie), or it is this very process."""
    if lease.hostname != os.uname().nodename:
        return False  # another machine's host: only its silence (the ttl) tells
    if lease.pid == os.getpid():
        return True
    try:
        state = Path(f"/proc/{lease.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0
