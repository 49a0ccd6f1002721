"""BLAKE2b and SHA-1 from CPython's own modules, without hashlib: importing hashlib loads OpenSSL, a few ms of
the start of every keel process (a unit's worker, a command, a host) that only needs these two."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hashlib import blake2b, sha1
else:
    try:
        from _blake2 import blake2b
        from _sha1 import sha1
    except ImportError:  # pragma: no cover - an interpreter without CPython's own hash modules
        from hashlib import blake2b, sha1

__all__ = ["blake2b", "sha1"]
