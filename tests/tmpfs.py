"""Real full filesystems for the disk-full tests: a tmpfs mounted for a test, and a ballast file that
takes its free space. Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped, saying so."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def mount(where: Path, size: str) -> Path:
    """Mount a real tmpfs of `size` (e.g. "2m") at `where`; skips the test where that is not permitted."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()}); needs root with CAP_SYS_ADMIN")
    return where


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False)


@contextmanager
def mounted(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs at `where` for the duration of the block."""
    mount(where, size)
    try:
        yield where
    finally:
        unmount(where)


def fill(mnt: Path, leave: int = 0) -> Path:
    """A ballast file taking every free byte of the filesystem at `mnt` but about `leave`."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 16, 4096, 1):
            try:
                while not leave or os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize > leave + chunk:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler
