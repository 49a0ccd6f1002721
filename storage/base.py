"""What every store backend is: `Store`, opened by its local folder, with transactions as functions.

A store's *folder* is local to each machine: for LMDB it holds data.mdb; for PostgreSQL it holds only
`store.url`, the database's address (`location.py` makes it for `--store postgresql://…`). Logs, host locks
and sandboxes live beside the folder either way, so everything above the storage layer addresses a store
by one local path. `Store.open` picks the backend by what the folder holds; the backends' modules are
imported only when used (psycopg is not loaded for an LMDB store).

Every access goes through `read(fn)` or `write(fn)`; the transaction lives exactly as long as `fn`, and
`write` may run `fn` more than once (map growth, a commit whose outcome had to be read back), so `fn`
must not have effects outside the transaction. Both backends keep the same sealed records
(`record.py`), verified on every read, and the same schema record (`migrations.py`).
"""

from __future__ import annotations

import abc
import math
import os
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from keel.protocol import __version__
from keel.storage.errors import StoreError, StoreTooNewError
from keel.storage.keys import DB
from keel.storage.location import URL_FILE
from keel.storage.migrations import MIGRATIONS, SCHEMA_VERSION, SchemaInfo
from keel.storage.txn import Txn

T = TypeVar("T")

SCHEMA_KEY = b"schema"


def held_in_process() -> bool:
    """Whether this process holds a store open, of either backend: an LMDB environment and its locks, or a
    database's connections, belong to the process that opened them, and a fork of this process must not
    inherit one (a detached host forked by the command line: server/hoststart.py). A backend whose
    module was never imported holds nothing."""
    lmdb_side, pg_side = sys.modules.get("keel.storage.store"), sys.modules.get("keel.storage.pg")
    return bool(lmdb_side is not None and lmdb_side.held()) or bool(pg_side is not None and pg_side.held())


class Store(abc.ABC):
    """One open store. Safe to share between threads; several processes (and, for PostgreSQL, machines)
    may open the same store."""

    backend = ""
    # machines other than this one may open it (PostgreSQL): a mission may move to another machine, so its
    # hosts keep what a sandbox needs to be made again there (file snapshots of units' sandboxes) in it
    shared = False
    path: Path
    readonly: bool
    write_timeout: float
    reserve_bytes: int = 0
    disk_full = ""  # set when a write of this Store met a full disk: the message naming it
    reserve_owner = False  # may spend the reserve on a full disk (the mission host sets it)
    # a database store: how long to wait for its server (then StoreUnavailableError), and who hears of
    # a long wait; a mission host and a unit worker wait for ever (`wait_out_outages`)
    reconnect_s = 30.0
    on_wait: Callable[[str], object] | None = None

    def wait_out_outages(self, say: Callable[[str], object]) -> None:
        """For a long-running process with nothing to do without its store: wait for the server however
        long it is away (a pause, never a failure), saying so through `say` now and then."""
        self.reconnect_s = math.inf
        self.on_wait = say

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        write_timeout: float | None = None,
        wait: Callable[[str], object] | None = None,
        **options: Any,
    ) -> Store:
        """Open the store in `path`: PostgreSQL where the folder names one, else LMDB (made there when
        `create` and nothing is there yet). `readonly` opens never wait on a writer; `write_timeout`
        bounds how long a write waits for another writer (default $KEEL_WRITE_LOCK_TIMEOUT_S or 10 s).
        `wait`: a long-running process's; its store waits out outages from the first contact on, saying so
        through `wait` (`wait_out_outages`)."""
        folder = Path(path)
        if (folder / URL_FILE).exists():
            from keel.storage.pg import PgStore

            return PgStore.open_folder(folder, readonly=readonly, write_timeout=write_timeout, wait=wait)
        from keel.storage.store import LmdbStore

        store = LmdbStore.open_folder(folder, create=create, readonly=readonly, write_timeout=write_timeout, **options)
        if wait is not None:
            store.wait_out_outages(wait)
        return store

    # -- transactions ---------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, fn: Callable[[Txn], T]) -> T: ...

    @abc.abstractmethod
    def write(self, fn: Callable[[Txn], T], *, timeout: float | None = None, whole: bool = False) -> T:
        """Run `fn` in a write transaction and commit it durably; `fn` may run more than once. Waits at
        most `timeout` (default `write_timeout`) for another writer, then StoreBusyError.

        LMDB has one writer at a time. On PostgreSQL a write fences only the missions it touches, so
        missions' writes never wait on each other; `whole` (garbage collection, migrations: writes that
        judge the whole store) waits for every other writer, and every other writer for it."""
        ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(
        self, callback: Callable[[], object], *, mission: str | None = None, dbs: Collection[str] = ()
    ) -> Callable[[], None] | None:
        """Call `callback` (from another thread) after commits, as a wake-up only: the caller still reads
        to learn what changed, and polls now and then in case a wake-up was lost. With `mission`, only after
        commits that changed that mission's records (in one of `dbs`, `DB` values, when given; a mission's
        host lease is "hostlease"). Returns the function that unsubscribes; None: this backend has no
        wake-ups (LMDB), poll `txn_id()` instead."""
        return None

    # -- facts ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def txn_id(self) -> int:
        """A number that grows with every committed write (any process): the change signal."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages: its folder, or its database's address without secrets."""
        return str(self.path)

    def stat(self) -> dict[str, Any]:
        return {"path": str(self.path), "backend": self.backend}

    # -- a full disk (LMDB keeps a reserve file; a database server manages its own disk) ---------
    def keep_reserve(self) -> bool:
        return False

    def full_disk(self) -> str:
        """Why the store's disk counts as full now, or "": the caller should stop."""
        return self.disk_full

    # -- giving space back ----------------------------------------------------------------------
    def compact(self) -> tuple[int, int]:
        """Rewrite the store's file without its free space: (bytes before, bytes after). A database server
        gives space back itself (PostgreSQL's autovacuum reuses it; `VACUUM FULL` returns it)."""
        raise StoreError(
            f"{self.describe()} is a database server's: it reuses freed space itself "
            "(VACUUM FULL keel_records gives it back to the filesystem)"
        )

    # -- schema ---------------------------------------------------------------------------------
    def schema(self) -> SchemaInfo:
        info = self.read(lambda t: t.get(DB.META, SCHEMA_KEY, SchemaInfo))
        assert info is not None
        return info

    def _ensure_schema(self) -> None:
        """Write this keel's schema record into a new store, or migrate an older one forward in one write."""

        def run(txn: Txn) -> None:
            info = txn.get(DB.META, SCHEMA_KEY, SchemaInfo)
            if info is None:
                txn.put(DB.META, SCHEMA_KEY, SchemaInfo(version=SCHEMA_VERSION, written_by=__version__))
                return
            self._refuse_newer(info)
            for version in range(info.version, SCHEMA_VERSION):
                MIGRATIONS[version](txn)
            if info.version < SCHEMA_VERSION:
                txn.put(DB.META, SCHEMA_KEY, SchemaInfo(version=SCHEMA_VERSION, written_by=__version__))

        if not self._schema_current():
            self.write(run, whole=True)

    def _schema_current(self) -> bool:
        """Whether the schema is this keel's; a newer one is StoreTooNewError."""
        current = self.read(lambda t: t.get(DB.META, SCHEMA_KEY, SchemaInfo))
        if current is not None:
            self._refuse_newer(current)
        return current is not None and current.version == SCHEMA_VERSION

    def _refuse_newer(self, info: SchemaInfo) -> None:
        if info.version > SCHEMA_VERSION:
            raise StoreTooNewError(
                f"store at {self.describe()} has schema {info.version}, written by keel {info.written_by}; "
                f"this keel ({__version__}) reads schema {SCHEMA_VERSION} at most; upgrade keel"
            )
