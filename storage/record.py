"""Sealed records: the header-plus-payload format of every value keel stores.

    offset  size  field
    0       4     magic  b"KEEL"
    4       1     format version (1)
    5       1     codec  (1 msgpack, 2 raw bytes)
    6       2     reserved, zero
    8       4     payload length (big-endian)
    12      32    BLAKE2b-256 digest
    44      n     payload

The digest covers the database name, the key, the first 12 header bytes and the payload, so a record
copied to another key or database does not verify either. `open_record` verifies everything and
raises CorruptRecordError; it never returns unverified bytes.
"""

from __future__ import annotations

import enum
import hashlib
import struct

from keel.storage.errors import CorruptRecordError

MAGIC = b"KEEL"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">4sBBHI")
HEADER_SIZE = _HEAD.size + 32
_PERSON = b"keel-record-v1"


class Codec(enum.IntEnum):
    MSGPACK = 1
    RAW = 2


def _digest(db: str, key: bytes, head: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32, person=_PERSON)
    h.update(db.encode())
    h.update(b"\x00")
    h.update(len(key).to_bytes(4, "big"))
    h.update(key)
    h.update(head)
    h.update(payload)
    return h.digest()


def seal(db: str, key: bytes, payload: bytes, codec: Codec) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, codec, 0, len(payload))
    return head + _digest(db, key, head, payload) + payload


def open_record(db: str, key: bytes, data: bytes) -> tuple[Codec, bytes]:
    """Verify a sealed record and return its codec and payload."""
    if len(data) < HEADER_SIZE:
        raise CorruptRecordError(db, key, f"truncated: {len(data)} bytes is shorter than the header")
    magic, version, codec, reserved, length = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptRecordError(db, key, f"bad magic {magic!r}")
    if version > FORMAT_VERSION:
        raise CorruptRecordError(
            db, key, f"record format {version} is newer than this keel reads ({FORMAT_VERSION}); upgrade keel"
        )
    if version != FORMAT_VERSION:
        raise CorruptRecordError(db, key, f"unknown record format {version}")
    if codec not in (Codec.MSGPACK, Codec.RAW) or reserved:
        raise CorruptRecordError(db, key, f"bad header (codec {codec}, reserved {reserved})")
    if len(data) != HEADER_SIZE + length:
        raise CorruptRecordError(
            db, key, f"length mismatch: header says {length} payload bytes, record has {len(data) - HEADER_SIZE}"
        )
    payload = data[HEADER_SIZE:]
    if _digest(db, key, data[: _HEAD.size], payload) != data[_HEAD.size : HEADER_SIZE]:
        raise CorruptRecordError(db, key, "digest mismatch (BLAKE2b-256)")
    return Codec(codec), payload


def content_digest(data: bytes) -> str:
    """The name of a content-addressed blob: BLAKE2b-256 hex of its bytes."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()
