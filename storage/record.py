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
import struct
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from keel.protocol.hashes import blake2b
from keel.storage.errors import CorruptRecordError

T = TypeVar("T")

MAGIC = b"KEEL"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">4sBBHI")
HEADER_SIZE = _HEAD.size + 32
_PERSON = b"keel-record-v1"


class Codec(enum.IntEnum):
    MSGPACK = 1
    RAW = 2


_CODECS = {int(c): c for c in Codec}
_GOOD_HEADS = {MAGIC + bytes([FORMAT_VERSION, c, 0, 0]): c for c in Codec}  # the first 8 bytes of a valid header


_DB_STATES: dict[str, Any] = {}  # db name -> a BLAKE2b state that has hashed the name, copied per record
_KEY_LENGTHS = tuple(n.to_bytes(4, "big") for n in range(512))  # LMDB keys are at most 511 bytes
_MSGPACK_HEAD = MAGIC + bytes([FORMAT_VERSION, Codec.MSGPACK, 0, 0])


def _db_state(db: str) -> Any:
    start = _DB_STATES.get(db)
    if start is None:
        start = _DB_STATES[db] = blake2b(db.encode() + b"\x00", digest_size=32, person=_PERSON)
    return start


def _key_length(n: int) -> bytes:
    return _KEY_LENGTHS[n] if n < 512 else n.to_bytes(4, "big")


def _digest(db: str, key: bytes, head: bytes, payload: bytes | memoryview) -> bytes:
    """BLAKE2b-256 over the database name, the key's length and bytes, the first 12 header bytes and
    the payload, in that order: a copy of the per-database state, then two updates."""
    h = _db_state(db).copy()
    h.update(_key_length(len(key)) + key + head)
    h.update(payload)
    return h.digest()  # type: ignore[no-any-return]


def seal(db: str, key: bytes, payload: bytes, codec: Codec) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, codec, 0, len(payload))
    return head + _digest(db, key, head, payload) + payload


def open_record(db: str, key: bytes, data: bytes) -> tuple[Codec, bytes]:
    """Verify a sealed record and return its codec and payload."""
    codec, payload = open_view(db, key, data)
    return codec, bytes(payload)


_VIEW_FROM = 4096  # payloads this long are returned as a view; shorter ones cost less to copy


def open_view(db: str, key: bytes, data: bytes) -> tuple[Codec, bytes | memoryview]:
    """`open_record` without copying a long payload (a view into `data`), for a decoder to read at once.

    The common case costs one dict lookup for the first eight header bytes, one length check and one
    digest; any record that fails them goes through `_diagnose`, which names what is wrong."""
    codec = _GOOD_HEADS.get(data[:8])
    length = len(data) - HEADER_SIZE
    if codec is None or length < 0 or data[8:12] != length.to_bytes(4, "big"):
        raise _diagnose(db, key, data)
    payload = data[HEADER_SIZE:] if length < _VIEW_FROM else memoryview(data)[HEADER_SIZE:]
    if _digest(db, key, data[:12], payload) != data[12:HEADER_SIZE]:
        raise CorruptRecordError(db, key, "digest mismatch (BLAKE2b-256)")
    return codec, payload


def log_opener(db: str, prefix: bytes) -> Callable[[bytes, bytes], tuple[Codec, bytes | memoryview]]:
    """`open_view` for the records of one log, whose keys are `prefix` and an 8-byte sequence number:
    the same checks and the same digest, at less cost per record (a resume reads whole journal lanes).

    The database name, the key's length and the prefix are hashed once into a state that each record
    copies, so a record's own update is its sequence number and header, then its payload. Only a
    msgpack record under a key of this log takes that path; any other goes through `open_view`."""
    size, lane = len(prefix) + 8, _db_state(db).copy()
    lane.update(_key_length(size) + prefix)
    cut, good, msgpack = len(prefix), _MSGPACK_HEAD, Codec.MSGPACK

    def open_log_record(key: bytes, data: bytes) -> tuple[Codec, bytes | memoryview]:
        length, head = len(data) - HEADER_SIZE, data[:12]
        if len(key) != size or length < 0 or head != good + length.to_bytes(4, "big") or key[:cut] != prefix:
            return open_view(db, key, data)
        h = lane.copy()
        h.update(key[cut:] + head)
        payload = data[HEADER_SIZE:]
        h.update(payload)
        if h.digest() != data[12:HEADER_SIZE]:
            raise CorruptRecordError(db, key, "digest mismatch (BLAKE2b-256)")
        return msgpack, payload

    return open_log_record


def open_log(
    db: str,
    prefix: bytes,
    records: Iterable[tuple[bytes, bytes]],
    stop: bytes,
    decode: Callable[[bytes | memoryview], T],
) -> list[T]:
    """Verify and decode a log's records: `records` are (key, sealed bytes) in key order from the first
    wanted key, read until a key at or after `stop`. Every record is verified as
    `open_view` verifies it, in one loop with no call per record but the digest's and `decode` (a resume
    reads whole journal lanes through here). `stop` must be at most `prefix`'s end (`txn.prefix_end`), so
    every key read starts with `prefix`; the log's entries are the keys of `prefix` and an 8-byte sequence
    number, and a key of another shape is passed over. An error of `decode` is raised as it is.

    Each record is hashed from a state that has hashed the database name and the key's length once; a
    record whose header is not that of a msgpack record of its length goes through `open_view`, which
    names what is wrong with it (or its codec: a log holds msgpack records only)."""
    size = len(prefix) + 8
    state = _db_state(db).copy()
    state.update(_key_length(size))
    copy = state.copy
    heads: dict[int, bytes | None] = {}  # a record's length -> its header's first 12 bytes
    out: list[T] = []
    append = out.append
    for key, data in records:
        if key >= stop:
            break
        head = data[:12]
        if len(key) != size or head != heads.get(len(data)):
            if len(key) != size:
                continue  # not an entry of this log
            expected = _log_head(len(data))
            if head != expected:
                codec, _ = open_view(db, key, data)  # names what is wrong, or the codec: only RAW is left
                raise CorruptRecordError(db, key, f"expected a msgpack record, found codec {codec.name}")
            heads[len(data)] = expected
        h = copy()
        h.update(key + head)
        payload = data[HEADER_SIZE:] if len(data) < _VIEW_FROM else memoryview(data)[HEADER_SIZE:]
        h.update(payload)
        if h.digest() != data[12:HEADER_SIZE]:
            raise CorruptRecordError(db, key, "digest mismatch (BLAKE2b-256)")
        append(decode(payload))
    return out


def _log_head(length: int) -> bytes | None:
    """The first 12 header bytes of a msgpack record of `length` bytes (None: too short to be one)."""
    return None if length < HEADER_SIZE else _MSGPACK_HEAD + (length - HEADER_SIZE).to_bytes(4, "big")


def _diagnose(db: str, key: bytes, data: bytes) -> CorruptRecordError:
    """Why a record's header is not one keel wrote."""
    if len(data) < HEADER_SIZE:
        return CorruptRecordError(db, key, f"truncated: {len(data)} bytes is shorter than the header")
    magic, version, codec, reserved, length = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return CorruptRecordError(db, key, f"bad magic {magic!r}")
    if version > FORMAT_VERSION:
        return CorruptRecordError(
            db, key, f"record format {version} is newer than this keel reads ({FORMAT_VERSION}); upgrade keel"
        )
    if version != FORMAT_VERSION:
        return CorruptRecordError(db, key, f"unknown record format {version}")
    if codec not in _CODECS or reserved:
        return CorruptRecordError(db, key, f"bad header (codec {codec}, reserved {reserved})")
    return CorruptRecordError(
        db, key, f"length mismatch: header says {length} payload bytes, record has {len(data) - HEADER_SIZE}"
    )


def content_digest(data: bytes) -> str:
    """The name of a content-addressed blob: BLAKE2b-256 hex of its bytes."""
    return blake2b(data, digest_size=32).hexdigest()
