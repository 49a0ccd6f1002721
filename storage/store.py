"""The LMDB environment: opening, schema, transactions, map growth and full disks.

Every access goes through `read(fn)` or `write(fn)`: the transaction lives exactly as long as `fn`.
`write` retries `fn` on a grown map when LMDB reports MapFullError (up to `max_map_size`), and turns a
real ENOSPC or the ceiling into StoreFullError after aborting, so what was committed before is intact.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from keel.protocol import __version__
from keel.storage.errors import StoreDamagedError, StoreError, StoreFullError, StoreTooNewError
from keel.storage.keys import DB
from keel.storage.location import prepare_keel_dir
from keel.storage.migrations import MIGRATIONS, SCHEMA_VERSION, SchemaInfo
from keel.storage.txn import Txn

T = TypeVar("T")

DEFAULT_MAP_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_MAP_SIZE = 64 * 1024 * 1024 * 1024
_SCHEMA_KEY = b"schema"
_RESIZE_RETRIES = 10


class _Shared:
    """One LMDB environment per path per process (LMDB forbids opening it twice), shared by refcount."""

    lock = threading.Lock()
    envs: dict[Path, tuple[lmdb.Environment, int]] = {}


class Store:
    """One open LMDB store. Safe to share between threads; several processes may open the same path.

    Opening the same path again in one process shares the environment; it closes with its last user."""

    def __init__(self, env: lmdb.Environment, path: Path, max_map_size: int) -> None:
        self._env = env
        self.path = path
        self.max_map_size = max_map_size
        self._dbs = _open_dbs(env)
        self._resize = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE,
             max_map_size: int = DEFAULT_MAX_MAP_SIZE, create: bool = True) -> Store:
        path = Path(path)
        creating = not (path / "data.mdb").exists()
        if creating and not create:
            raise StoreError(f"no keel store at {path}")
        key = path.resolve()
        with _Shared.lock:
            shared = _Shared.envs.get(key)
            if shared is not None:
                _Shared.envs[key] = (shared[0], shared[1] + 1)
                return cls(shared[0], path, max(max_map_size, map_size))
        try:
            path.mkdir(parents=True, exist_ok=True)
            env = lmdb.open(str(path), map_size=map_size, max_dbs=len(DB) + 4, max_readers=512,
                            sync=True, metasync=True, subdir=True, readahead=False, writemap=False)
        except lmdb.Error as exc:
            raise _translate(exc, f"cannot open store at {path}") from None
        except OSError as exc:
            raise _translate(exc, f"cannot open store at {path}") from None
        try:
            env.reader_check()  # clear reader slots left by killed processes
            store = cls(env, path, max(max_map_size, map_size))
            store._ensure_schema()
        except lmdb.Error as exc:
            env.close()
            raise _translate(exc, f"cannot open store at {path}") from None
        except BaseException:
            env.close()
            raise
        with _Shared.lock:
            _Shared.envs[key] = (env, 1)
        if creating:
            prepare_keel_dir(path)
        return store

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        key = self.path.resolve()
        with _Shared.lock:
            env, users = _Shared.envs.get(key, (self._env, 1))
            if users > 1:
                _Shared.envs[key] = (env, users - 1)
                return
            _Shared.envs.pop(key, None)
        self._env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------------
    def read(self, fn: Callable[[Txn], T]) -> T:
        txn = self._begin(write=False)
        try:
            return fn(Txn(txn, self._dbs, write=False))
        except lmdb.Error as exc:
            raise _translate(exc, "read failed") from None
        finally:
            txn.abort()

    def write(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn` in a write transaction and commit it durably; `fn` may run more than once."""
        while True:
            txn = self._begin(write=True)
            try:
                result = fn(Txn(txn, self._dbs, write=True))
                txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                self._grow()
            except lmdb.Error as exc:
                txn.abort()
                raise _translate(exc, "write failed") from None
            except BaseException:
                txn.abort()
                raise

    def _begin(self, write: bool) -> lmdb.Transaction:
        for _ in range(_RESIZE_RETRIES):
            try:
                return self._env.begin(write=write, buffers=False)
            except lmdb.MapResizedError:
                with self._resize:
                    self._env.set_mapsize(0)  # adopt the size another process grew the map to
            except lmdb.Error as exc:
                raise _translate(exc, "cannot begin a transaction") from None
        raise StoreError("store map keeps being resized by another process")

    def _grow(self) -> None:
        with self._resize:
            current = self._env.info()["map_size"]
            if current >= self.max_map_size:
                raise StoreFullError(f"store at {self.path} reached its size ceiling of "
                                     f"{self.max_map_size} bytes; nothing committed was lost")
            self._env.set_mapsize(min(current * 2, self.max_map_size))

    # -- facts ----------------------------------------------------------------------------------
    def txn_id(self) -> int:
        """The id of the newest committed write transaction (any process): the change signal."""
        return int(self._env.info()["last_txnid"])

    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    def reader_pids(self) -> set[int]:
        """Processes holding LMDB reader slots (diagnostics; slots of dead processes are cleared on open)."""
        rows = str(self._env.readers()).splitlines()[1:]  # "pid thread txnid" rows after a header
        return {int(row.split()[0]) for row in rows if row.strip()}

    def stat(self) -> dict[str, Any]:
        return {"path": str(self.path), **self._env.info(), **self._env.stat()}

    def schema(self) -> SchemaInfo:
        info = self.read(lambda t: t.get(DB.META, _SCHEMA_KEY, SchemaInfo))
        assert info is not None
        return info

    def _ensure_schema(self) -> None:
        def run(txn: Txn) -> None:
            info = txn.get(DB.META, _SCHEMA_KEY, SchemaInfo)
            if info is None:
                txn.put(DB.META, _SCHEMA_KEY, SchemaInfo(version=SCHEMA_VERSION, written_by=__version__))
                return
            if info.version > SCHEMA_VERSION:
                raise StoreTooNewError(
                    f"store at {self.path} has schema {info.version}, written by keel {info.written_by}; "
                    f"this keel ({__version__}) reads schema {SCHEMA_VERSION} at most; upgrade keel")
            for version in range(info.version, SCHEMA_VERSION):
                MIGRATIONS[version](txn)
            if info.version < SCHEMA_VERSION:
                txn.put(DB.META, _SCHEMA_KEY, SchemaInfo(version=SCHEMA_VERSION, written_by=__version__))

        current = self.read(lambda t: t.get(DB.META, _SCHEMA_KEY, SchemaInfo))
        if current is None or current.version != SCHEMA_VERSION:
            self.write(run)


def _open_dbs(env: lmdb.Environment) -> dict[DB, Any]:
    """Open the named databases; adopt a map another process grew meanwhile (MDB_MAP_RESIZED)."""
    for _ in range(_RESIZE_RETRIES):
        try:
            return {db: env.open_db(db.value.encode()) for db in DB}
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    raise StoreError("store map keeps being resized by another process")


# LMDB errors that mean the file's structure is damaged (LMDB has no checksums of its own).
_DAMAGE = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError, lmdb.BadValsizeError,
           lmdb.BadTxnError, lmdb.PanicError, lmdb.IncompatibleError, lmdb.VersionMismatchError)


def _translate(exc: BaseException, context: str) -> StoreError:
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "Disk quota" in text:
        return StoreFullError(f"{context}: disk full ({text}); nothing committed was lost")
    if isinstance(exc, _DAMAGE):
        return StoreDamagedError(f"{context}: the LMDB file is damaged ({text}); run `keel verify`")
    return StoreError(f"{context}: {text}")
