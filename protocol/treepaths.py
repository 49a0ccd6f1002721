"""Which paths of a workspace's files are the person's, and which are git's or keel's own.

One rule for every picture keel takes of a sandbox (snapshots, tree digests, commits on keel's branches,
merges, apply, export) and for every path it writes back (restore, fork, import):

- `.git` (at any depth) is git's; a path that is absolute, malformed or climbs out with `..` is nobody's.
- `.keel/` (at any depth) is keel's state (its store, sandboxes, logs, locks, homes), except the one file
  of it that is the person's: `.keel/config.toml`, the provider settings a team may commit with its code.
  It is part of the sandbox's files like any other and round-trips through restore points.
- `.NAME.XXXXXXXX.keel-tmp` (X: eight of a-z, 0-9 and `_`) is a temporary file keel writes next to NAME
  and renames into place (`write_file`, `apply_diff`, restored and merged files). A process killed in
  between leaves it behind: it is never part of any picture, and the next host removes it. A person's
  own file that merely ends in `.keel-tmp` has not this exact form and counts as any other.

Depends on the standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

KEEL_DIR = ".keel"
GIT_DIR = ".git"
CONFIG = "config.toml"  # `.keel/config.toml`: the person's file inside keel's folder
TEMP_SUFFIX = ".keel-tmp"
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX), re.DOTALL)
# the same names as a git pathspec: left out of every `git add` keel makes in its own worktrees
GIT_EXCLUDE_TEMPS = ":(exclude,glob)**/.?*." + "[a-z0-9_]" * 8 + TEMP_SUFFIX


def is_temp(name: str) -> bool:
    """A file name (not a path) of keel's temporary form `.NAME.XXXXXXXX.keel-tmp`."""
    return _TEMP.fullmatch(name) is not None


def temp_name(path: Path) -> Path:
    """A fresh temporary name next to `path` (not created)."""
    import secrets  # here: importing it (hmac, OpenSSL) would cost every process that loads this module

    token = "".join(secrets.choice(_TEMP_CHARS) for _ in range(8))
    return path.with_name(f".{path.name}.{token}{TEMP_SUFFIX}")


def create_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file next to `path`, opened for writing (mode 0600, never an existing file)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        name = temp_name(path)
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue


def is_keel_state(rel: str) -> bool:
    """A relative path inside a `.keel` folder that is not that folder's `config.toml`."""
    parts = rel.split("/")
    return any(part == KEEL_DIR and parts[i + 1 :] != [CONFIG] for i, part in enumerate(parts))


def is_persons(rel: str) -> bool:
    """A relative path (already well formed) that belongs to the person's files: not git's, not keel's."""
    return GIT_DIR not in rel.split("/") and not is_keel_state(rel) and not is_temp(rel.rpartition("/")[2])


def path_problem(rel: str) -> str:
    """Why a workspace path from a record may not be written ("" when it may): it must be relative, stay
    inside the workspace and be neither git's nor keel's state. (A temporary file's name is harmless to
    write; a picture that holds one, recorded by a keel before this rule, simply leaves it out.)"""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel or (len(rel) > 1 and rel[1] == ":"):
        return "is absolute or malformed"
    if any(p in ("", ".", "..") for p in parts):
        return "leaves the workspace"
    if GIT_DIR in parts:
        return "is inside .git, which is git's"
    if is_keel_state(rel):
        return f"is keel's own state (of {KEEL_DIR}/, only {KEEL_DIR}/{CONFIG} is the workspace's)"
    return ""
