"""Raw access to stored records on either backend, for tests: read and damage them behind keel's back.

LMDB through `rawlmdb.py` (the store must be closed); PostgreSQL by SQL on the store's own table.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from keel.storage.keys import DB
from keel.storage.location import URL_FILE
from tests.storage import rawlmdb


def _url(path: Path) -> str | None:
    marker = path / URL_FILE
    return marker.read_text().strip() if marker.exists() else None


def raw_get(path: Path, db: DB, key: bytes) -> bytes:
    url = _url(path)
    if url is None:
        return rawlmdb.raw_get(path, db, key)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM keel_records WHERE db = %s AND key = %s", (db.value, key)).fetchone()
    assert row is not None, f"{db}/{key!r} is not stored"
    return bytes(row[0])


def raw_put(path: Path, db: DB, key: bytes, value: bytes) -> None:
    url = _url(path)
    if url is None:
        rawlmdb.raw_put(path, db, key, value)
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO keel_records (db, key, value) VALUES (%s, %s, %s)"
            " ON CONFLICT (db, key) DO UPDATE SET value = EXCLUDED.value",
            (db.value, key, value),
        )


def raw_keys(path: Path, db: DB) -> list[bytes]:
    """Every key of one database, in order."""
    url = _url(path)
    if url is None:
        env = rawlmdb.raw_env(path)
        try:
            with env.begin(db=env.open_db(db.value.encode())) as txn:
                return [bytes(k) for k, _ in txn.cursor()]
        finally:
            env.close()
    with psycopg.connect(url, autocommit=True) as conn:
        return [
            bytes(r[0]) for r in conn.execute("SELECT key FROM keel_records WHERE db = %s ORDER BY key", (db.value,))
        ]


def flip_byte(path: Path, db: DB, key: bytes, position: int, mask: int = 0x01) -> None:
    """Flip bits of one byte of a stored record, in place, as a bad disk (or a stray UPDATE) would."""
    data = bytearray(raw_get(path, db, key))
    data[position % len(data)] ^= mask
    raw_put(path, db, key, bytes(data))
