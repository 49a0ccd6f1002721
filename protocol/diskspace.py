"""Telling a full filesystem: free space, the mount point, and the DiskFullError that names both.

Every layer that writes (the store, the file tools, commands, git in the sandboxes) asks here whether a
failed write means "disk full". ENOSPC and EDQUOT always do. An EIO does when the filesystem has almost
no space left: LMDB turns a short write into EIO, so a full disk can reach keel as "Input/output error".

A failure that reaches keel only as words and an exit status (a command, a git checkout) is judged by one
pure decision, `failed_for_space`, over what was seen of the filesystem it wrote to: what the failure
said, the least free space seen while it ran and after, the space it needed, and whether a write of
keel's own met a full disk there meanwhile (the store spends its reserve then, so the free space seen
afterwards says nothing). Standard library only: storage, tools and the engine all use it.
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


def free_or_none(path: str | os.PathLike[str]) -> int | None:
    """`free_bytes`, or None when the filesystem cannot be asked."""
    try:
        return free_bytes(path)
    except OSError:
        return None


def same_filesystem(one: str | os.PathLike[str], other: str | os.PathLike[str]) -> bool:
    """Whether the two paths (or their nearest existing ancestors) are on one filesystem."""
    try:
        return os.stat(_existing(Path(one))).st_dev == os.stat(_existing(Path(other))).st_dev
    except OSError:
        return False


def failed_for_space(words: str, least_free: int | None, needed: int = 0, known_full: str = "") -> str:
    """Why a failure that wrote to one filesystem counts as that filesystem being full, or "" when it is the
    failure's own. `words`: what the failure itself said (a command's stderr, git's message; never words
    passed on by an agent, which a replay would say again); `least_free`: the least free space seen there
    while it ran and after (None: unknown); `needed`: bytes it had to write, when known; `known_full`: why
    keel counts that filesystem full from a write of its own meanwhile ("" when none met a full disk)."""
    if says_no_space(words):
        return "it said there is no space left"
    if least_free is not None and least_free < max(NEARLY_FULL_BYTES, needed):
        room = f"{least_free // 1024} KiB were free"
        return f"{room} and it needed {needed // 1024} KiB" if needed > NEARLY_FULL_BYTES else room
    if known_full:
        return f"a write of keel's there met a full disk meanwhile ({known_full[:200]})"
    return ""


def command_failed_for_space(
    exit_code: int | None, timed_out: bool, stderr: str, least_free: int | None, known_full: str = ""
) -> str:
    """Why a finished command's failure counts as its filesystem being full ("" when it is the command's own
    result): only a non-zero exit that was not keel's time limit, judged by `failed_for_space`."""
    if exit_code == 0 or timed_out:
        return ""
    return failed_for_space(stderr, least_free, 0, known_full)


def says_io_error(error: BaseException | str) -> bool:
    if isinstance(error, BaseException) and getattr(error, "errno", None) == errno.EIO:
        return True
    return "Input/output error" in str(error)


def is_disk_full(error: BaseException | str, path: str | os.PathLike[str]) -> bool:
    """Whether a failed write to `path` means its filesystem is full: "no space" always; an I/O error
    only when almost no space is left there."""
    return says_no_space(error) or (says_io_error(error) and nearly_full(path))


def disk_full(path: str | os.PathLike[str], cause: str, what: str = "") -> DiskFullError:
    """The error naming the filesystem (mount point, free space) and the path whose write failed, on one
    line (a cause of several lines, such as git's, is joined)."""
    mount = mount_point(path)
    try:
        free = f"{free_bytes(path) // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    subject = f"{what} {path}" if what else str(path)
    return DiskFullError(
        f"disk full: the filesystem mounted at {mount} ({free}) cannot take a write to "
        f"{subject}: {' '.join(cause.split())[:300]}; free some space there, then resume",
        mount=str(mount),
        path=str(path),
    )
