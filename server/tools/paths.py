"""Sandbox path resolution: every path a tool touches is relative to the sandbox and stays inside it.

Rejects absolute paths, `..` that climbs out, and symlinks (anywhere along the path) that point
outside. Writes are also refused inside `.git` and `.keel`, which belong to git and to keel.
Depends on the stdlib and server/tools/base.py only.
"""

from __future__ import annotations

import posixpath
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


def resolve(sandbox: Path, rel: str, *, for_write: bool = False) -> Path:
    """The real location of `rel` inside `sandbox`; ToolError naming `rel` if it is not allowed."""
    norm = normalize(rel)
    root = sandbox.resolve()
    if for_write:
        if norm == ".":
            raise ToolError("path '.' is the sandbox folder itself, not a file")
        if norm.split("/")[0] in HIDDEN_DIRS:
            raise ToolError(f"path {rel!r} is inside {norm.split('/')[0]}/, which tools may not change")
    target = (root / norm).resolve(strict=False)
    if target != root and not target.is_relative_to(root):
        raise ToolError(f"path {rel!r} resolves to {target}, outside the sandbox, through a symlink")
    return target


def relative(sandbox: Path, path: Path) -> str:
    """`path` (inside the resolved sandbox) as the relative POSIX path tools report."""
    return path.relative_to(sandbox.resolve()).as_posix()
