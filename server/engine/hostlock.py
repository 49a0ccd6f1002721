"""One host per mission: an exclusive flock on `.keel/locks/<id>.lock`, released by the kernel on death.

A killed host leaves the lock file but not the lock, so a stale lock never blocks a restart. Depends on
the standard library only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from keel.protocol.errors import ErrorCode, KeelError


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
