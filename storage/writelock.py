"""The store's writer lock: `<store>/writer.lock`, taken around every write transaction, with a time limit.

LMDB's own write lock is a mutex in lock.mdb that a waiter cannot time out on: a process frozen
(SIGSTOP, a closed laptop lid) inside a write transaction would make every other writer wait forever.
So every `Store.write` first takes this advisory POSIX record lock, trying without blocking until its
time limit, and only then begins LMDB's transaction; on timeout F_GETLK names the holder's pid and
/proc says whether it is stopped. The kernel drops the lock of a process that dies, so a killed writer
never leaves it behind. Fairness: the lock is byte 0 of the file; a process first takes byte 1 (the
turnstile) and holds it while it waits for byte 0, so a writer that commits in a tight loop cannot take
the lock again ahead of a waiting process (non-blocking tries would otherwise starve the waiter).
POSIX record locks belong to a process, not a thread, so a threading.Lock lets
one thread of a process hold it at a time (re-entrant: opening a new store holds it around its first
writes). Readers never touch it.

Depends on the standard library and storage.errors only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keel.storage.errors import StoreBusyError

DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "KEEL_WRITE_LOCK_TIMEOUT_S"
LOCK_NAME = "writer.lock"
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux: type, whence, start, len, pid
_WRITER = 0  # byte held while writing
_TURNSTILE = 1  # byte held while waiting for _WRITER


def default_timeout() -> float:
    """The time limit of a write: $KEEL_WRITE_LOCK_TIMEOUT_S, else 10 s."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)


def seconds_from_env(name: str, default: float) -> float:
    """A duration in seconds from the environment variable `name`; `default` when unset or not a number."""
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class WriterLock:
    """One store's writer lock in this process (shared by every Store object on that path)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_NAME
        self._thread = threading.RLock()
        self._depth = 0  # how many times the holding thread has entered; only it changes this
        self._fd: int | None = None

    def close(self) -> None:
        with self._thread:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        if not self._thread.acquire(timeout=max(timeout, 0.0)):
            raise StoreBusyError(
                f"the store's write lock is held by another thread of this process "
                f"(pid {os.getpid()}); gave up after {timeout:g} s"
            )
        try:
            fd = self._open()
            if self._depth == 0:
                self._lock(fd, deadline, timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, _WRITER)
        finally:
            self._thread.release()

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        return self._fd

    def _lock(self, fd: int, deadline: float, timeout: float) -> None:
        self._take(fd, _TURNSTILE, deadline, timeout)
        try:
            self._take(fd, _WRITER, deadline, timeout)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, _TURNSTILE)

    def _take(self, fd: int, byte: int, deadline: float, timeout: float) -> None:
        pause = 0.0005
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
                return
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreBusyError(self._busy_message(fd, timeout))
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.01)

    def _busy_message(self, fd: int, timeout: float) -> str:
        pid = holder_pid(fd, _WRITER) or holder_pid(fd, _TURNSTILE)
        who = f"pid {pid} ({process_state(pid)})" if pid else "another process"
        return (
            f"the store's write lock is held by {who}; gave up after {timeout:g} s "
            f"({self.path}). Continue or end that process and try again "
            f"(set {TIMEOUT_ENV} to wait longer)"
        )


def holder_pid(fd: int, byte: int) -> int:
    """The pid of another process holding `byte` of `fd`'s file, 0 if none (F_GETLK)."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0)
    kind, _whence, _start, _len, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
    return pid if kind != fcntl.F_UNLCK else 0


def process_state(pid: int) -> str:
    """How a person reads /proc/<pid>/stat's state letter: 'stopped: SIGSTOP/frozen', 'running', …"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "state unknown"
    state = stat.rpartition(")")[2].split()[:1]
    letter = state[0] if state else "?"
    return {
        "T": "stopped: SIGSTOP/frozen",
        "t": "stopped by a debugger",
        "D": "running: waiting on disk",
        "Z": "exiting",
    }.get(letter, "running")
