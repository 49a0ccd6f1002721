"""The storage layer's typed errors; each names the database and key it concerns."""

from __future__ import annotations

from keel.protocol.errors import DiskFullError, ErrorCode, KeelError


class StoreError(KeelError):
    code = ErrorCode.STORE


class CorruptRecordError(StoreError):
    """A record that fails its checks; never returned as bytes."""

    code = ErrorCode.CORRUPT_RECORD

    def __init__(self, db: str, key: bytes, reason: str) -> None:
        super().__init__(f"corrupt record {db}/{render_key(key)}: {reason}")
        self.db = db
        self.key = key
        self.reason = reason


class StoreDamagedError(StoreError):
    """The LMDB file's own structure is damaged (LMDB keeps no checksums; keel's records do)."""

    code = ErrorCode.CORRUPT_RECORD


class StoreFullError(StoreError, DiskFullError):
    """The store's disk is full or its map reached its ceiling; everything committed before is intact.
    A DiskFullError too: the engine pauses the mission with reason `disk_full` for either."""

    code = ErrorCode.STORE_FULL


class StoreBusyError(StoreError):
    """Another process (or thread) held the store's write lock past the time limit; nothing was written."""

    code = ErrorCode.STORE_BUSY


class StoreUnavailableError(StoreError):
    """A database store's server could not be reached within the store's `reconnect_s`; nothing was written
    by the failed call."""


class StoreRefusedError(StoreError):
    """A database store's server refused keel's credentials or role (a wrong or missing password, a role or
    database that does not exist, no pg_hba.conf rule): permanent, so never retried; the message is the
    server's."""

    code = ErrorCode.STORE_REFUSED


class StoreTooNewError(StoreError):
    code = ErrorCode.STORE_TOO_NEW


def render_key(key: bytes) -> str:
    """A key as a person reads it: text parts joined by '/', a trailing 8-byte sequence as a number.

    A log key is `part NUL part NUL seq8`; a sequence number's top byte is always zero (no log reaches
    2**56 entries) while ids never start with NUL, which tells the two apart.
    """
    seq: int | None = None
    if len(key) > 8 and key[-9] == 0 and key[-8] == 0:
        key, seq = key[:-9], int.from_bytes(key[-8:], "big")
    out = [_render_part(part) for part in key.split(b"\x00")] if key or seq is None else []
    if seq is not None:
        out.append(str(seq))
    return "/".join(out)


def _render_part(part: bytes) -> str:
    try:
        text = part.decode("ascii")
    except UnicodeDecodeError:
        return part.hex()
    return text if text.isprintable() else part.hex()
