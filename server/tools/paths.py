"""Sandbox path resolution: every path a tool touches is relative to the sandbox and stays inside it.

Rejects absolute paths, `..` that climbs out, and symlinks (anywhere along the path) that point
outside. Writes are also refused inside `.git` and `.keel`, which belong to git and to keel.
Depends on the stdlib and server/tools/base.py only.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path, PurePosixPath

from keel.server.tools.base import ToolError

#: Folders no tool lists, searches or writes.
HIDDEN_DIRS = frozenset({".git", ".keel"})


def normalize(rel: str) -> str:
    """The path in canonical relative POSIX form ('.' for the sandbox root); ToolError if it escapes."""
    if not isinstance(rel, str):
        raise ToolError(f"path must be a string, got {type(rel).__name__}")
    if "\0" in rel:
        raise ToolError(f"path {rel!r} contains a NUL byte")
    if PurePosixPath(rel).is_absolute():
        raise ToolError(f"path {rel!r} is absolute; give a path relative to the sandbox")
    norm = posixpath.normpath(rel or ".")
    if norm == ".." or norm.startswith("../"):
        raise ToolError(f"path {rel!r} escapes the sandbox through '..'")
    return norm


def resolve(root: Path, rel: str, *, for_write: bool = False) -> Path:
    """The real location of `rel` inside the sandbox whose real path is `root` (ToolContext.root);
    ToolError naming `rel` if it is not allowed."""
    norm = normalize(rel)
    if for_write:
        if norm == ".":
            raise ToolError("path '.' is the sandbox folder itself, not a file")
        if norm.split("/")[0] in HIDDEN_DIRS:
            raise ToolError(f"path {rel!r} is inside {norm.split('/')[0]}/, which tools may not change")
    target = root / norm
    if _no_link_below(root, norm):  # nothing to follow: the path is where it says (the root is real)
        return target
    target = target.resolve(strict=False)
    if target != root and not target.is_relative_to(root):
        raise ToolError(f"path {rel!r} resolves to {target}, outside the sandbox, through a symlink")
    return target


def _no_link_below(root: Path, norm: str) -> bool:
    """Whether no folder or file along `norm` below `root` is a symlink (as far as the path exists)."""
    path = str(root)
    for part in norm.split("/"):
        if part == ".":
            continue
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return False
        except FileNotFoundError:
            return True  # the rest does not exist: nothing below it to follow
        except OSError:
            return False
    return True


def relative(root: Path, path: Path) -> str:
    """`path` (inside the sandbox whose real path is `root`) as the relative POSIX path tools report."""
    return path.relative_to(root).as_posix()
