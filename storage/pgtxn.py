"""A transaction of the PostgreSQL backend, and the fences that keep missions' writes independent.

A write transaction runs at READ COMMITTED (every statement sees what has committed before it) and fences
what it touches with transaction-scoped advisory locks, taken before the first statement that reads or
writes it: a mission's records (every key of a mission's databases starts with its id) under the mission's
lock, a provider's health under its own, the schema record under the store's meta lock. So a write sees
each mission as its last writer left it, as if it were the only writer, while writes of different missions
never wait on each other. Blobs need no fence: they are content-addressed and written once; the one writer
that removes them (garbage collection) writes `whole`.

Every write also holds the store's lock, shared; a `whole` write holds it exclusively and so has the store to
itself. A scan that spans missions (an empty prefix) fences each mission as its rows come, and reads a row
again once it holds the row's fence, so what it yields is fenced too. Locks are taken in the order keys are
met, so two writes that each span missions can deadlock; the server breaks it by failing one, and `PgStore`
runs that one again.

Lock keys are two 32-bit integers: the store's (its schema's hash) and the fence's (a hash of its name).
Two names of one hash share a fence, which only makes them wait on each other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg

from keel.storage import missions
from keel.storage.keys import DB, SEQ_BYTES
from keel.storage.record import Codec, content_digest, seal
from keel.storage.txn import Txn, prefix_end

ANY_CHANGE = "*"  # a payload that concerns every subscriber: a reconnect, or a change too large to name
_PAYLOAD_MAX = 4000  # bytes of tokens a NOTIFY names before it says ANY_CHANGE (PostgreSQL allows < 8000)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_.:/-]+")
_PAGE = 512  # rows per round trip of a long scan
_FIRST_PAGE = 8
_SEND_ANYWAY = 16 * 1024  # a blob up to this size is sent with an INSERT that keeps the one there, without asking
_SNAPSHOT_SCALE = 1 << 20  # more than the transactions a server can have in progress at once


def fence(db: DB, key: bytes) -> bytes | None:
    """The name of the fence a write takes before touching `key` in `db`: its mission's id, a provider
    endpoint's key, or the store's meta records; None for a blob (content-addressed, written once)."""
    if db is DB.BLOBS:
        return None
    if db is DB.META:
        return b"\x00meta"
    if db is DB.PROVIDERS:
        return b"\x00providers\x00" + key
    return key.partition(b"\x00")[0]


def prefix_fence(db: DB, prefix: bytes) -> bytes | None:
    """The one fence every key under `prefix` shares, when it names one (a mission's log, a unit's lane);
    else None: the scan spans fences, and is fenced row by row."""
    if db in (DB.BLOBS, DB.META, DB.PROVIDERS) or b"\x00" not in prefix:
        return None
    return prefix.partition(b"\x00")[0]


def lock_key(name: bytes) -> int:
    """A fence's half of its advisory lock key: a signed 32-bit hash of its name."""
    return int.from_bytes(hashlib.blake2b(name, digest_size=4).digest(), "big", signed=True)


def snapshot_number(text: str) -> int:
    """A number of a PostgreSQL snapshot (`xmin:xmax:xip,…`) that grows with every commit or abort in the
    database: one that ends a transaction in progress takes it out of `xip` (or raises `xmax`), and every
    transaction that started since raises `xmax` by more than it adds to `xip`."""
    _, xmax, xip = text.split(":")
    return int(xmax) * _SNAPSHOT_SCALE - (len(xip.split(",")) if xip else 0)


class PgTxn(Txn):
    """A transaction of the PostgreSQL backend: each operation is one statement on its connection; a write
    fences what it touches first (see the module's text)."""

    def __init__(self, conn: psycopg.Connection[Any], write: bool, store_key: int = 0) -> None:
        self._conn = conn
        self.write = write
        self._store_key = store_key
        self._held: set[bytes] = set()  # the fences this write holds
        self.waiting: tuple[int, int] | None = None  # the lock it is waiting for (its holder is named on a timeout)
        self._changed: set[str] = set()  # what this write transaction changed (change_token)
        self._read_at: float | None = None  # a read's clock, once asked
        self._known: dict[tuple[DB, bytes], bytes | None] = {}  # fenced records as this write read or left them

    # -- fences ---------------------------------------------------------------------------------
    def _fence(self, name: bytes | None) -> bool:
        """Hold the fence `name` (a write only); True when it was taken just now."""
        if not self.write or name is None or name in self._held:
            return False
        self.waiting = (self._store_key, lock_key(name))
        self._conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", self.waiting)
        self.waiting = None
        self._held.add(name)
        return True

    def try_mission(self, mission_id: str) -> bool:
        name = mission_id.encode()
        if not self.write or name in self._held:
            return True
        row = self._conn.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s)", (self._store_key, lock_key(name))
        ).fetchone()
        if row is None or not row[0]:
            return False
        self._held.add(name)
        return True

    # -- the change wake-up ---------------------------------------------------------------------
    def payload(self) -> str:
        """The NOTIFY payload of this write transaction: its change tokens, or ANY_CHANGE when they are too many
        to name or not plain."""
        text = ",".join(sorted(self._changed))
        if len(text) > _PAYLOAD_MAX or (text and not all(_TOKEN_CHARS.fullmatch(t) for t in self._changed)):
            return ANY_CHANGE
        return text

    def _note(self, db: DB, key: bytes) -> None:
        if (token := missions.change_token(db, key)) is not None:
            self._changed.add(token)

    # -- facts ----------------------------------------------------------------------------------
    def snapshot_id(self) -> int:
        row = self._conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        return snapshot_number(str(row[0]))

    def clock(self) -> float:
        """The database server's clock (`clock_timestamp()`), the same for every machine; a read asks once
        (its snapshot is of one moment: a supervisor judging a thousand leases asks the server once)."""
        if self._read_at is not None:
            return self._read_at
        row = self._conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        if not self.write:
            self._read_at = float(row[0])
        return float(row[0])

    # -- records --------------------------------------------------------------------------------
    def get_raw(self, db: DB, key: bytes) -> bytes | None:
        """A record; a write reads each fenced record once (no other writer can change it under the fence)."""
        name = fence(db, key)
        if not self.write or name is None:
            return self._get(db, key)
        self._fence(name)
        if (db, key) not in self._known:
            self._known[db, key] = self._get(db, key)
        return self._known[db, key]

    def exists(self, db: DB, key: bytes) -> bool:
        if self.write and (db, key) in self._known:
            return self._known[db, key] is not None
        self._fence(fence(db, key))
        return (
            self._conn.execute("SELECT 1 FROM keel_records WHERE db = %s AND key = %s", (db.value, key)).fetchone()
            is not None
        )

    def which_exist(self, db: DB, keys: Iterable[bytes]) -> set[bytes]:
        """One round trip per thousand keys (no values read); for blobs, which need no fence."""
        wanted = list(dict.fromkeys(keys))
        if db is not DB.BLOBS:
            return super().which_exist(db, wanted)
        found: set[bytes] = set()
        for at in range(0, len(wanted), 1000):
            rows = self._conn.execute(
                "SELECT key FROM keel_records WHERE db = %s AND key = ANY(%s)",
                (db.value, wanted[at : at + 1000]),
                binary=True,
            ).fetchall()
            found.update(bytes(row[0]) for row in rows)
        return found

    def put_blob(self, data: bytes) -> str:
        """Stored once: a small blob in one round trip (an INSERT that leaves an existing one), a large one
        only after asking whether it is there (its bytes are not sent again)."""
        digest = content_digest(data)
        key = digest.encode()
        if len(data) <= _SEND_ANYWAY or not self.exists(DB.BLOBS, key):
            self.put_raw(DB.BLOBS, key, seal(DB.BLOBS.value, key, data, Codec.RAW), overwrite=False)
        return digest

    def _get(self, db: DB, key: bytes) -> bytes | None:
        row = self._conn.execute(
            "SELECT value FROM keel_records WHERE db = %s AND key = %s", (db.value, key), binary=True
        ).fetchone()
        return None if row is None else bytes(row[0])

    def put_raw(self, db: DB, key: bytes, sealed: bytes, *, overwrite: bool = True) -> bool:
        name = fence(db, key)
        self._fence(name)
        self._note(db, key)
        if overwrite:
            self._conn.execute(
                "INSERT INTO keel_records (db, key, value) VALUES (%s, %s, %s)"
                " ON CONFLICT (db, key) DO UPDATE SET value = EXCLUDED.value",
                (db.value, key, sealed),
            )
            written = True
        else:
            row = self._conn.execute(
                "INSERT INTO keel_records (db, key, value) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                (db.value, key, sealed),
            ).fetchone()
            written = row is not None
        if name is not None and self.write:
            if written:
                self._known[db, key] = sealed
            else:
                self._known.pop((db, key), None)  # one was there: read it if asked
        return written

    def delete(self, db: DB, key: bytes) -> bool:
        self._fence(fence(db, key))
        self._note(db, key)
        self._known.pop((db, key), None)
        row = self._conn.execute(
            "DELETE FROM keel_records WHERE db = %s AND key = %s RETURNING 1", (db.value, key)
        ).fetchone()
        return row is not None

    def scan_raw(
        self, db: DB, prefix: bytes, *, reverse: bool = False, start: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Rows under `prefix` in key order. A write fences the prefix's mission first; a write's scan that
        spans missions fences each row's as it comes and yields the row as it is under the fence."""
        if not self.write or (name := prefix_fence(db, prefix)) is not None:
            if self.write:
                self._fence(name)
            yield from self._rows(db, prefix, reverse, start)
            return
        for key, value in self._rows(db, prefix, reverse, start):
            if self._fence(fence(db, key)):  # fenced just now: the row may have changed since the page was read
                fresh = self._get(db, key)
                if fresh is None:
                    continue
                value = fresh
            yield key, value

    def _rows(self, db: DB, prefix: bytes, reverse: bool, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Pages of rows, the first small (most scans stop early: a newest entry, an existence check),
        each next one twice as large, up to _PAGE."""
        upper = prefix_end(prefix)
        lower = start if start is not None and start > prefix and not reverse else prefix
        bound = "" if upper is None else " AND key < %(upper)s"
        order, step = ("DESC", "key < %(after)s") if reverse else ("", "key > %(after)s")
        first = f"SELECT key, value FROM keel_records WHERE db = %(db)s AND key >= %(lower)s{bound}"
        rest = f"SELECT key, value FROM keel_records WHERE db = %(db)s AND key >= %(lower)s{bound} AND {step}"
        params: dict[str, Any] = {"db": db.value, "lower": lower, "upper": upper}
        query, page = first, _FIRST_PAGE
        while True:
            rows = self._conn.execute(f"{query} ORDER BY key {order} LIMIT {page}", params, binary=True).fetchall()
            for key, value in rows:
                yield bytes(key), bytes(value)
            if len(rows) < page:
                return
            params["after"] = bytes(rows[-1][0])
            query, page = rest, min(page * 2, _PAGE)

    def last_seq(self, db: DB, prefix: bytes) -> int:
        """The newest sequence number of the log under `prefix` (0: empty), read from the index alone."""
        self._fence(prefix_fence(db, prefix))
        upper = prefix_end(prefix)
        bound = "" if upper is None else " AND key < %(upper)s"
        row = self._conn.execute(
            f"SELECT key FROM keel_records WHERE db = %(db)s AND key >= %(prefix)s{bound} AND length(key) = %(size)s"
            " ORDER BY key DESC LIMIT 1",
            {"db": db.value, "prefix": prefix, "upper": upper, "size": len(prefix) + SEQ_BYTES},
            binary=True,
        ).fetchone()
        return 0 if row is None else int.from_bytes(bytes(row[0])[len(prefix) :], "big")
