"""Typed operations inside one store transaction, on either backend.

A `Txn` never outlives the function that `Store.read`/`Store.write` hands it to. Values are msgspec
objects encoded as msgpack inside sealed records; blobs are raw bytes named by their digest. `Txn` holds
every typed operation over five raw ones (`get_raw`, `put_raw`, `delete`, `scan_raw`, `snapshot_id`);
`LmdbTxn` here and `storage/pg.py`'s `PgTxn` implement them, so both backends store the same bytes.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import lmdb
import msgspec

from keel.storage.errors import CorruptRecordError, StoreError
from keel.storage.keys import DB, SEQ_BYTES, log_key
from keel.storage.record import Codec, content_digest, log_opener, open_log, open_record, open_view, seal

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_MSGPACK = Codec.MSGPACK  # a module constant: an enum member's lookup costs more than the check
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(type_: type[T]) -> msgspec.msgpack.Decoder[T]:
    dec = _decoders.get(type_)
    if dec is None:
        dec = _decoders[type_] = msgspec.msgpack.Decoder(type_)
    return dec


def decode_value(db: str, key: bytes, data: bytes, type_: type[T]) -> T:
    codec, payload = open_view(db, key, data)
    if codec is not _MSGPACK:
        raise CorruptRecordError(db, key, f"expected a msgpack record, found codec {codec.name}")
    try:
        return _decoder(type_).decode(payload)
    except msgspec.DecodeError as exc:
        raise _undecodable(db, key, type_, exc) from None


def _undecodable(db: str, key: bytes, type_: Any, exc: Exception) -> CorruptRecordError:
    return CorruptRecordError(db, key, f"does not decode as {getattr(type_, '__name__', type_)}: {exc}")


class Txn(abc.ABC):
    """Typed operations over a backend's raw ones. `write` says whether this transaction may write."""

    write: bool

    # -- what a backend implements ----------------------------------------------------------------
    @abc.abstractmethod
    def snapshot_id(self) -> int:
        """The id of the committed transaction this one sees (a read may briefly trail Store.txn_id())."""
        ...

    @abc.abstractmethod
    def get_raw(self, db: DB, key: bytes) -> bytes | None:
        """A record's sealed bytes, unverified: callers open them with `storage/record.py`."""
        ...

    def try_mission(self, mission_id: str) -> bool:
        """Fence `mission_id` for this write without waiting: False when another write holds its fence now
        (a worker then looks at the next offer instead of queueing behind the one others are taking). With
        one writer at a time (LMDB) nothing else can hold it."""
        return True

    def clock(self) -> float:
        """Seconds since the epoch by the store's clock: lease heartbeats and expiry are judged by it, so
        on a shared database no machine's clock decides whether another machine's worker is alive."""
        return time.time()

    @abc.abstractmethod
    def put_raw(self, db: DB, key: bytes, sealed: bytes, *, overwrite: bool = True) -> bool:
        """Store sealed bytes; with overwrite=False an existing key is left alone and False returned."""
        ...

    @abc.abstractmethod
    def delete(self, db: DB, key: bytes) -> bool: ...

    @abc.abstractmethod
    def scan_raw(
        self, db: DB, prefix: bytes, *, reverse: bool = False, start: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys starting with `prefix` and their sealed bytes, in key order (or reversed), from `start` on."""
        ...

    # -- single records -------------------------------------------------------------------------
    def get(self, db: DB, key: bytes, type_: type[T]) -> T | None:
        data = self.get_raw(db, key)
        return None if data is None else decode_value(db.value, key, data, type_)

    def put(self, db: DB, key: bytes, value: Any, *, overwrite: bool = True) -> bool:
        """Store `value`; with overwrite=False an existing key is left alone and False returned."""
        sealed = seal(db.value, key, _encoder.encode(value), Codec.MSGPACK)
        return self.put_raw(db, key, sealed, overwrite=overwrite)

    def exists(self, db: DB, key: bytes) -> bool:
        return self.get_raw(db, key) is not None

    def which_exist(self, db: DB, keys: Iterable[bytes]) -> set[bytes]:
        """Which of `keys` are in `db` (a backend with round trips asks for them all at once)."""
        return {key for key in keys if self.exists(db, key)}

    def scan(
        self, db: DB, prefix: bytes, type_: type[T], *, reverse: bool = False, start: bytes | None = None
    ) -> Iterator[tuple[bytes, T]]:
        """Records whose key starts with `prefix`, in key order (or reversed), from `start` on."""
        for key, raw in self.scan_raw(db, prefix, reverse=reverse, start=start):
            yield key, decode_value(db.value, key, raw, type_)

    # -- append-only logs -----------------------------------------------------------------------
    def last_seq(self, db: DB, prefix: bytes) -> int:
        for key, _ in self.scan_raw(db, prefix, reverse=True):
            tail = key[len(prefix) :]
            if len(tail) == SEQ_BYTES:
                return int.from_bytes(tail, "big")
        return 0

    def append(self, db: DB, prefix: bytes, value: Any) -> int:
        """Append to the log under `prefix`; returns the new sequence number (1-based)."""
        seq = self.last_seq(db, prefix) + 1
        if not self.put(db, log_key(prefix, seq), value, overwrite=False):
            raise StoreError(f"log {db.value}/{prefix!r} already has entry {seq}")
        return seq

    def read_log(
        self, db: DB, prefix: bytes, type_: type[T], after: int = 0, upto: int | None = None
    ) -> Iterator[tuple[int, T]]:
        """A log's entries after `after` (up to `upto`), each verified and decoded."""
        cut, name, decoder = len(prefix), db.value, _decoder(type_)
        for key, raw in self.scan_raw(db, prefix, start=log_key(prefix, after + 1)):
            seq = int.from_bytes(key[cut:], "big")
            if upto is not None and seq > upto:
                return
            yield seq, _decode_log_value(name, key, raw, decoder, type_)

    def log_values(self, db: DB, prefix: bytes, type_: type[T], after: int = 0, upto: int | None = None) -> list[T]:
        """`read_log`'s values as a list, read in one loop (`record.open_log`): how a resume reads a lane."""
        start = log_key(prefix, after + 1)
        return self._log_values(db, prefix, type_, after, upto, self.scan_raw(db, prefix, start=start))

    def _log_values(
        self,
        db: DB,
        prefix: bytes,
        type_: type[T],
        after: int,
        upto: int | None,
        records: Iterable[tuple[bytes, bytes]],
    ) -> list[T]:
        """`records` (from the log's first wanted key on) verified and decoded. A record that does not
        decode is named by reading the log again through `read_log`, which raises the error naming it."""
        stop = _log_stop(prefix, upto)
        try:
            return open_log(db.value, prefix, records, stop, _decoder(type_).decode)
        except msgspec.DecodeError:
            return [value for _, value in self.read_log(db, prefix, type_, after, upto)]

    # -- content-addressed blobs ------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        """Store bytes once under their digest; an existing blob is shared, not rewritten."""
        digest = content_digest(data)
        key = digest.encode()
        if self.get_raw(DB.BLOBS, key) is None:
            self.put_raw(DB.BLOBS, key, seal(DB.BLOBS.value, key, data, Codec.RAW))
        return digest

    def get_blob(self, digest: str) -> bytes | None:
        key = digest.encode()
        data = self.get_raw(DB.BLOBS, key)
        if data is None:
            return None
        _, payload = open_record(DB.BLOBS.value, key, data)
        if content_digest(payload) != digest:
            raise CorruptRecordError(DB.BLOBS.value, key, "blob content does not match its name")
        return payload

    def put_object(self, value: Any) -> str:
        return self.put_blob(_encoder.encode(value))

    def get_object(self, digest: str, type_: type[T]) -> T | None:
        data = self.get_blob(digest)
        if data is None:
            return None
        try:
            return _decoder(type_).decode(data)
        except msgspec.DecodeError as exc:
            raise CorruptRecordError(DB.BLOBS.value, digest.encode(), f"does not decode: {exc}") from None


class LmdbTxn(Txn):
    """A transaction of the LMDB backend (`storage/store.py`)."""

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: dict[DB, Any], write: bool) -> None:
        self._txn = txn
        self._dbs = dbs
        self.write = write

    def snapshot_id(self) -> int:
        return int(self._txn.id())

    def get_raw(self, db: DB, key: bytes) -> bytes | None:
        data = self._txn.get(key, db=self._dbs[db])
        return None if data is None else bytes(data)

    def put_raw(self, db: DB, key: bytes, sealed: bytes, *, overwrite: bool = True) -> bool:
        return bool(self._txn.put(key, sealed, db=self._dbs[db], overwrite=overwrite))

    def delete(self, db: DB, key: bytes) -> bool:
        return bool(self._txn.delete(key, db=self._dbs[db]))

    def scan_raw(
        self, db: DB, prefix: bytes, *, reverse: bool = False, start: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        with self._txn.cursor(db=self._dbs[db]) as cur:
            if reverse:
                upper = prefix_end(prefix)
                if upper is not None and cur.set_range(upper):
                    positioned = cur.prev()
                else:
                    positioned = cur.last()
                while positioned:
                    key = bytes(cur.key())
                    if not key.startswith(prefix):
                        break
                    yield key, bytes(cur.value())
                    positioned = cur.prev()
                return
            if not cur.set_range(start if start is not None and start > prefix else prefix):
                return
            for key, value in cur.iternext():  # bytes: transactions are begun with buffers=False
                if not key.startswith(prefix):
                    break
                yield key, value

    def log_values(self, db: DB, prefix: bytes, type_: type[T], after: int = 0, upto: int | None = None) -> list[T]:
        with self._txn.cursor(db=self._dbs[db]) as cur:
            if not cur.set_range(log_key(prefix, after + 1)):
                return []
            return self._log_values(db, prefix, type_, after, upto, cur.iternext())

    def read_log(
        self, db: DB, prefix: bytes, type_: type[T], after: int = 0, upto: int | None = None
    ) -> Iterator[tuple[int, T]]:
        """A log's entries after `after` (up to `upto`), each verified and decoded. One loop over the cursor,
        with no layer per record: a resume reads whole journal lanes through here."""
        cut, name, decode = len(prefix), db.value, _decoder(type_).decode
        last = (1 << 64) - 1 if upto is None else upto
        open_log_record = log_opener(name, prefix)
        with self._txn.cursor(db=self._dbs[db]) as cur:
            if not cur.set_range(log_key(prefix, after + 1)):
                return
            for key, raw in cur.iternext():
                if not key.startswith(prefix):
                    return
                seq = int.from_bytes(key[cut:], "big")
                if seq > last:
                    return
                codec, payload = open_log_record(key, raw)
                if codec is not _MSGPACK:
                    raise CorruptRecordError(name, key, f"expected a msgpack record, found codec {codec.name}")
                try:
                    value = decode(payload)
                except msgspec.DecodeError as exc:
                    raise _undecodable(name, key, type_, exc) from None
                yield seq, value


def _decode_log_value(name: str, key: bytes, raw: bytes, decoder: msgspec.msgpack.Decoder[T], type_: Any) -> T:
    codec, payload = open_view(name, key, raw)
    if codec is not _MSGPACK:
        raise CorruptRecordError(name, key, f"expected a msgpack record, found codec {codec.name}")
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise _undecodable(name, key, type_, exc) from None


def _log_stop(prefix: bytes, upto: int | None) -> bytes:
    """The first key past a log's entries up to `upto` (None: all of them)."""
    if upto is not None and upto < (1 << 64) - 1:
        return log_key(prefix, max(upto, 0) + 1)
    end = prefix_end(prefix)
    return b"\xff" * 512 if end is None else end  # LMDB keys are at most 511 bytes


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key with this prefix (None: no such key)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
