"""The storage layer's typed errors; each names the database and key it concerns."""

from __future__ import annotations

from keel.protocol.errors import ErrorCode, KeelError


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


class StoreFullError(StoreError):
    """The disk is full or the map reached its ceiling; everything committed before is intact."""

    code = ErrorCode.STORE_FULL


class StoreTooNewError(StoreError):
    code = ErrorCode.STORE_TOO_NEW


def render_key(key: bytes) -> str:
    """A key as a person reads it: text parts joined by '/', a trailing 8-byte sequence as a number."""
    parts = key.split(b"\x00")
    out: list[str] = []
    for part in parts:
        try:
            text = part.decode("ascii")
            if text.isprintable():
                out.append(text)
                continue
        except UnicodeDecodeError:
            pass
        out.append(str(int.from_bytes(part, "big")) if len(part) == 8 else part.hex())
    return "/".join(out)
