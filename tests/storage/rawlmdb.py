"""Raw LMDB access for tests: read and damage stored records behind keel's back (the store must be closed)."""

from __future__ import annotations

from pathlib import Path

import lmdb

from keel.storage.keys import DB


def raw_env(path: Path) -> lmdb.Environment:
    """The store's LMDB environment opened directly, bypassing keel (the store must be closed)."""
    return lmdb.open(str(path), max_dbs=len(DB) + 4, subdir=True)


def raw_get(path: Path, db: DB, key: bytes) -> bytes:
    env = raw_env(path)
    try:
        with env.begin(db=env.open_db(db.value.encode())) as txn:
            value = txn.get(key)
            assert value is not None, f"{db}/{key!r} is not stored"
            return bytes(value)
    finally:
        env.close()


def raw_put(path: Path, db: DB, key: bytes, value: bytes) -> None:
    env = raw_env(path)
    try:
        with env.begin(write=True, db=env.open_db(db.value.encode())) as txn:
            txn.put(key, value)
    finally:
        env.close()
