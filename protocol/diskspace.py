"""Telling a full filesystem: free space, the mount point, and the DiskFullError that names both.

Every layer that writes (the store, the file tools, commands, git in the sandboxes) asks here whether a
failed write means "disk full". ENOSPC and EDQUOT always do. An EIO does when the filesystem has almost
no space left: LMDB turns a short write into EIO, so a full disk can reach keel as "Input/output error".
Standard library only: storage, tools and the engine all use it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from keel.protocol.errors import DiskFullError

#: Free space below which a failed write (EIO, or a command's non-zero exit) counts as a full disk. A
#: write that fails for want of space leaves next to nothing: a short write fills the disk to the block.
NEARLY_FULL_BYTES = 256 * 1024

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded", "Out of diskspace")  # the last: git's


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: str | os.PathLike[str]) -> Path:
    """The mount point of the filesystem holding `path` (or its nearest existing ancestor), symbolic
    links followed (a workspace's .git may be a link to another disk)."""
    path = Path(os.path.realpath(_existing(Path(path))))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(_existing(Path(path)))
    return st.f_bavail * st.f_frsize


def nearly_full(path: str | os.PathLike[str], below: int = NEARLY_FULL_BYTES) -> bool:
    try:
        return free_bytes(path) < below
    except OSError:
        return False


def says_no_space(error: BaseException | str) -> bool:
    """True for an ENOSPC/EDQUOT error, or a message (git's stderr, LMDB's text) that says so."""
    if isinstance(error, BaseException) and getattr(error, "errno", None) in _NO_SPACE_ERRNOS:
        return True
    text = str(error)
    return any(phrase in text for phrase in _NO_SPACE_TEXTS)


def says_io_error(error: BaseException | str) -> bool:
    if isinstance(error, BaseException) and getattr(error, "errno", None) == errno.EIO:
        return True
    return "Input/output error" in str(error)


def is_disk_full(error: BaseException | str, path: str | os.PathLike[str]) -> bool:
    """Whether a failed write to `path` means its filesystem is full: "no space" always; an I/O error
    only when almost no space is left there."""
    return says_no_space(error) or (says_io_error(error) and nearly_full(path))


def disk_full(path: str | os.PathLike[str], cause: str, what: str = "") -> DiskFullError:
    """The error naming the filesystem (mount point, free space) and the path whose write failed."""
    mount = mount_point(path)
    try:
        free = f"{free_bytes(path) // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    subject = f"{what} {path}" if what else str(path)
    return DiskFullError(
        f"disk full: the filesystem mounted at {mount} ({free}) cannot take a write to "
        f"{subject}: {cause.strip()[:300]}; free some space there, then resume",
        mount=str(mount),
        path=str(path),
    )
