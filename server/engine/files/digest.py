"""The digest of a sandbox's files as an effect starts from or leaves them, build caches left out.

An effect's identity (step/effects.py) is recorded with this digest of the files it started from, and its
outcome with the digest of the files it left; `keel apply` leaves the same caches out. Depends on
files/trees.py only.
"""

from __future__ import annotations

from pathlib import Path

from keel.protocol.hashes import blake2b
from keel.server.engine.files.trees import Snapshotter

# what a command leaves behind that is not what it does: build caches (docs/rewind.md)
CACHE_FOLDERS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
CACHE_SUFFIXES = (".pyc", ".pyo")


def is_cache(path: str) -> bool:
    """A build cache a command leaves behind (`__pycache__/x.pyc`, `.pytest_cache/…`), not what it does."""
    parts = path.split("/")
    return any(p in CACHE_FOLDERS for p in parts[:-1]) or path.endswith(CACHE_SUFFIXES)


def files_digest(root: Path, seen: Snapshotter | None = None) -> str:
    """The digest of the sandbox's files (paths, modes and content digests), build caches left out. With
    `seen` (one per sandbox), a file whose size, times and inode did not change is not read again."""
    h = blake2b(digest_size=16, person=b"keel-files")
    for entry in (seen or Snapshotter()).scan(root, keep_bytes=False).entries:
        if not is_cache(entry.path):
            h.update(f"{entry.path}\0{entry.mode}\0{entry.blob}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
