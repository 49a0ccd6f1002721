"""The LMDB backend: opening, transactions, map growth and full disks.

Every access goes through `read(fn)` or `write(fn)` (`base.py`): the transaction lives exactly as long as
`fn`. `write` retries `fn` on a grown map when LMDB reports MapFullError (up to `max_map_size`), and turns a
full disk (ENOSPC, or the EIO LMDB makes of a short write when almost no space is left) or the ceiling
into StoreFullError after aborting, so what was committed before is intact.

A full disk would leave a host unable to record even that it stopped. So the store keeps a *reserve*:
a 1 MiB file `<store>/reserve` (made on a writable open when absent and there is room; not data: verify,
bundles and gc never see it). In the process that owns it (`reserve_owner`: a mission host; never a
subagent's heartbeat or a CLI verb) a write that meets a full disk deletes the reserve and runs once more
in the space it freed, and `full_disk()` tells the caller to stop: the journal entries in flight and the
pause still commit. After a failed meta-page write LMDB refuses every transaction (MDB_PANIC) until the
environment is opened again: `reopen()` does that, and a transaction that meets the panic reopens once.
py-lmdb invalidates every open transaction and cursor when the map is resized or the environment
reopened, so each transaction holds the environment's gate (`envgate.py`) and such a change waits until
no transaction of this process is open: a read in one thread is never broken by another's resize.

Opening checks data.mdb with plain reads before LMDB maps it (`lmdbopen.check_file`): a truncated
or empty file is StoreDamagedError, never a SIGBUS or a silently re-initialised store; a new store is
made only where data.mdb does not exist. Then, before any tree is walked, every branch and leaf page of
every tree (`lmdbopen.check_trees`): a damaged one is StoreDamagedError, never liblmdb's abort.
Opening an existing store writes nothing (the named databases are opened in a read transaction) unless a
migration is due, so readers never wait on a writer. Every write first takes `writer.lock` with a time
limit (`writelock.py`), so a frozen writer is named in a StoreBusyError rather than hanging everyone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from keel.protocol.diskspace import NEARLY_FULL_BYTES, disk_full, free_bytes, is_disk_full
from keel.storage.base import Store
from keel.storage.envgate import EnvGate, NestedChange
from keel.storage.errors import StoreBusyError, StoreDamagedError, StoreError, StoreFullError
from keel.storage.keys import DB
from keel.storage.lmdbopen import check_file, check_trees
from keel.storage.location import DATA_FILE, prepare_keel_dir
from keel.storage.txn import LmdbTxn, Txn
from keel.storage.writelock import WriterLock, default_timeout

T = TypeVar("T")

DEFAULT_MAP_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_MAP_SIZE = 64 * 1024 * 1024 * 1024
_RESIZE_RETRIES = 10
RESERVE_NAME = "reserve"
DEFAULT_RESERVE_BYTES = 1024 * 1024


class _Env:
    """An open LMDB environment and its databases, shared by every Store of one path in this process
    (LMDB forbids opening a file twice in a process); `reopen` swaps it for all of them."""

    def __init__(self, env: lmdb.Environment, readonly: bool) -> None:
        self.env = env
        self.readonly = readonly
        self.dbs: dict[DB, Any] = {}
        self.users = 1
        self.gate = EnvGate()  # every transaction holds it open; a map resize or a reopen waits for none


class _Shared:
    lock = threading.Lock()
    envs: dict[Path, _Env] = {}
    writers: dict[Path, WriterLock] = {}  # closed with the environment's last user


def held() -> bool:
    """An LMDB environment or writer lock of this process is open (`base.held_in_process`)."""
    with _Shared.lock:
        return bool(_Shared.envs or _Shared.writers)


def _writer_lock(path: Path) -> WriterLock:
    key = path.resolve()
    with _Shared.lock:
        return _Shared.writers.setdefault(key, WriterLock(path))


class LmdbStore(Store):
    """One open LMDB store. Safe to share between threads; several processes may open the same path.

    Opening the same path again in one process shares the environment; it closes with its last user."""

    def __init__(
        self,
        shared: _Env,
        path: Path,
        max_map_size: int,
        write_timeout: float | None = None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        self._shared = shared
        self.path = path
        self.max_map_size = max_map_size
        self.write_timeout = default_timeout() if write_timeout is None else write_timeout
        self.readonly = shared.readonly
        self.reserve_bytes = reserve_bytes
        self.disk_full = ""  # set when a write of this Store met a full disk: the message naming it
        self.reserve_owner = False  # may spend the reserve on a full disk (the mission host sets it)
        self._reserve_held = False
        self._writer = _writer_lock(path)
        self._closed = False

    backend = "lmdb"

    @property
    def _env(self) -> lmdb.Environment:
        return self._shared.env

    @property
    def _dbs(self) -> dict[DB, Any]:
        return self._shared.dbs

    @classmethod
    def open_folder(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
        create: bool = True,
        write_timeout: float | None = None,
        readonly: bool = False,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> LmdbStore:
        """Open (or, with `create` and no data.mdb, make) the store.

        `readonly`: an existing store for reading only; opening it never waits on a writer (it is
        opened read-write after all when its schema must be migrated). `write_timeout` bounds how long
        a write waits for another writer (default $KEEL_WRITE_LOCK_TIMEOUT_S or 10 s)."""
        path = Path(path)
        creating = not (path / DATA_FILE).exists()
        if creating and not create:
            raise StoreError(f"no keel store at {path}")
        size = max(max_map_size, map_size)
        shared = _share(path, readonly)
        if shared is not None:
            store = cls(shared, path, size, write_timeout, reserve_bytes)
            if not store.readonly:
                store.keep_reserve()
            return store
        path.mkdir(parents=True, exist_ok=True)
        writer = _writer_lock(path)
        timeout = default_timeout() if write_timeout is None else write_timeout
        if creating:
            with writer.held(timeout):  # another process may be creating it right now: let it finish
                if not (path / DATA_FILE).exists():
                    store = cls._adopt(
                        _lmdb_open(path, map_size, False), path, size, write_timeout, False, reserve_bytes
                    )
                    prepare_keel_dir(path)
                    store.keep_reserve()
                    return store
        check_file(path, writer, timeout)
        if readonly:
            try:
                store = cls._adopt(_lmdb_open(path, map_size, True), path, size, write_timeout, True, reserve_bytes)
            except _NeedsWrite:
                store = cls._adopt(_lmdb_open(path, map_size, False), path, size, write_timeout, False, reserve_bytes)
                store.keep_reserve()
                return store
            try:
                if store._schema_current():
                    return store
            except BaseException:
                store.close()
                raise
            store.close()  # an older schema: migrate it, which needs a writable environment
        store = cls._adopt(_lmdb_open(path, map_size, False), path, size, write_timeout, False, reserve_bytes)
        store.keep_reserve()
        return store

    @classmethod
    def _adopt(
        cls,
        env: lmdb.Environment,
        path: Path,
        max_map_size: int,
        write_timeout: float | None,
        readonly: bool,
        reserve_bytes: int,
    ) -> LmdbStore:
        try:
            env.reader_check()  # clear reader slots left by killed processes
            shared = _Env(env, readonly)
            store = cls(shared, path, max_map_size, write_timeout, reserve_bytes)
            store._check_trees()  # before anything walks a tree: opening the named databases does
            shared.dbs = store._open_dbs(env)
            if not readonly:
                store._ensure_schema()
        except lmdb.Error as exc:
            env.close()
            raise _translate(exc, f"cannot open store at {path}", path) from None
        except BaseException:
            env.close()
            raise
        with _Shared.lock:
            _Shared.envs[path.resolve()] = shared
        return store

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        key = self.path.resolve()
        with _Shared.lock:
            self._shared.users -= 1
            if self._shared.users > 0:
                return
            if _Shared.envs.get(key) is self._shared:
                _Shared.envs.pop(key)
            writer = _Shared.writers.pop(key, None)
        with self._changing():  # a thread of this process may still be reading: it finishes first
            self._env.close()
        if writer is not None:
            writer.close()  # no write is under way: this was the store's last user here

    def reopen(self) -> None:
        """Open the LMDB environment again, for every Store of this path in this process: after a failed
        meta-page write LMDB marks it fatal (MDB_PANIC) and refuses every transaction until then.
        Committed data is untouched; waits until no transaction of this process is open."""
        with self._changing():
            old = self._shared.env
            map_size = int(old.info()["map_size"])
            old.close()
            env = _lmdb_open(self.path, map_size, self._shared.readonly)
            self._shared.env, self._shared.dbs = env, self._open_dbs(env)

    # -- the reserve ----------------------------------------------------------------------------
    def keep_reserve(self) -> bool:
        """Make the reserve file when it is missing and the filesystem has room for it and is not nearly
        full after it (random bytes: a compressing filesystem must really allocate them). True if the
        store has one."""
        if self.reserve_bytes <= 0:
            return False
        reserve = self.path / RESERVE_NAME
        tmp = self.path / f".{RESERVE_NAME}.tmp"
        try:
            if reserve.exists():
                self._reserve_held = True
                return True
            if free_bytes(self.path) < self.reserve_bytes + NEARLY_FULL_BYTES:
                return False
            with open(tmp, "wb") as out:
                out.write(os.urandom(self.reserve_bytes))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, reserve)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        self._reserve_held = True
        return True

    def full_disk(self) -> str:
        """Why the store's disk counts as full now, or "": a write of this Store met a full disk, or
        another process (a subagent) spent the reserve this Store saw. The caller should stop."""
        if self.disk_full:
            return self.disk_full
        if self._reserve_held and not (self.path / RESERVE_NAME).exists():
            error = disk_full(self.path, "its reserve was spent by another keel process", "the store at")
            return error.message
        return ""

    def _spend_reserve(self, error: StoreError) -> bool:
        """A write met a full disk: delete the reserve so that it can run once more in the space freed."""
        self.disk_full = error.message
        if not self.reserve_owner:
            return False
        try:
            (self.path / RESERVE_NAME).unlink()
        except OSError:
            return False
        return True

    # -- transactions ---------------------------------------------------------------------------
    def read(self, fn: Callable[[Txn], T]) -> T:
        txn = self._begin(write=False)
        try:
            return fn(LmdbTxn(txn, self._dbs, write=False))
        except lmdb.Error as exc:
            raise _translate(exc, "read failed", self.path) from None
        finally:
            self._end(txn)

    def write(self, fn: Callable[[Txn], T], *, timeout: float | None = None, whole: bool = False) -> T:
        """Run `fn` in a write transaction and commit it durably; `fn` may run more than once (every write
        is `whole`: one writer at a time).

        Waits at most `timeout` (default `write_timeout`) for another writer (StoreBusyError names it;
        0 tries once, for a caller that has somewhere else to send the write). On a full disk the
        reserve is spent and `fn` runs once more; `full_disk()` then says to stop."""
        if self.readonly:
            raise StoreError(f"store at {self.path} was opened read-only")
        with self._writer.held(self.write_timeout if timeout is None else timeout):
            return self._write_locked(fn)

    def _write_locked(self, fn: Callable[[Txn], T]) -> T:
        spent = False
        while True:
            txn = self._begin(write=True)
            try:
                result = fn(LmdbTxn(txn, self._dbs, write=True))
                txn.commit()
                return result
            except lmdb.MapFullError:
                failure: StoreError | None = None
            except lmdb.Error as exc:
                failure = _translate(exc, "write failed", self.path)
            finally:
                self._end(txn)
            if failure is None:
                self._grow()  # after the transaction ended: a resize waits for every open one
                continue
            if isinstance(failure, StoreFullError) and not spent:
                spent = self._spend_reserve(failure)
                if spent:
                    continue
            raise failure from None

    def _begin(self, write: bool) -> lmdb.Transaction[bytes]:
        """A new transaction, holding the environment's gate open until `_end`."""
        gate = self._shared.gate
        reopened = False
        for _ in range(_RESIZE_RETRIES):
            gate.enter()
            try:
                return self._env.begin(write=write, buffers=False)
            except lmdb.MapResizedError:
                gate.leave()
                self._change_map(0)  # adopt the size another process grew the map to
            except lmdb.PanicError:
                gate.leave()
                if reopened:
                    raise StoreDamagedError(
                        f"store at {self.path} stays unusable after reopening (MDB_PANIC); run `keel verify`"
                    ) from None
                self.reopen()  # a failed commit (full disk) left the environment fatal: committed data is intact
                reopened = True
            except lmdb.Error as exc:
                gate.leave()
                raise _translate(exc, "cannot begin a transaction", self.path) from None
            except BaseException:
                gate.leave()
                raise
        raise StoreError("store map keeps being resized by another process")

    def _end(self, txn: lmdb.Transaction[bytes]) -> None:
        """Abort `txn` (nothing, once committed) and let go of the gate `_begin` held open for it."""
        try:
            txn.abort()
        finally:
            self._shared.gate.leave()

    def _change_map(self, size: int) -> None:
        """Resize the map (0: to the size another process grew it to), once no transaction of this process
        is open: py-lmdb invalidates every open one when the map changes."""
        with self._changing():
            self._env.set_mapsize(size)

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Held while the map or the environment changes: no transaction of this process is open meanwhile."""
        try:
            with self._shared.gate.changing():
                yield
        except NestedChange as exc:
            raise StoreError(f"store at {self.path}: {exc}") from None

    def _grow(self) -> None:
        current = self.map_size()
        if current >= self.max_map_size:
            raise StoreFullError(
                f"store at {self.path} reached its size ceiling of "
                f"{self.max_map_size} bytes; nothing committed was lost"
            )
        self._change_map(min(current * 2, self.max_map_size))

    # -- giving space back ----------------------------------------------------------------------
    def compact(self) -> tuple[int, int]:
        """Rewrite data.mdb packed and put the copy in its place: (bytes before, bytes after). A file never
        shrinks otherwise: LMDB reuses freed pages, it does not give them back. Under the writer lock, and
        only while no other process has the store open (a process holding the old file would go on writing
        into it): one that has is named, nothing changes."""
        import shutil  # here, not at the top: `keel missions` and the other quick verbs never load it

        data = self.path / "data.mdb"
        with self._writer.held(self.write_timeout):
            self._refuse_other_users()
            copy = self.path / "compact.tmp"
            shutil.rmtree(copy, ignore_errors=True)
            copy.mkdir()
            try:
                self._packed_copy(copy)
                _fsync(copy / "data.mdb")
                before, after = data.stat().st_size, (copy / "data.mdb").stat().st_size
                with self._changing():
                    self._refuse_other_users()
                    map_size = int(self._env.info()["map_size"])
                    self._env.close()
                    os.replace(copy / "data.mdb", data)
                    _fsync(self.path)
                    env = _lmdb_open(self.path, map_size, self._shared.readonly)
                    self._shared.env, self._shared.dbs = env, self._open_dbs(env)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        return before, after

    def _packed_copy(self, target: Path) -> None:
        """Every record written again into a new environment at `target`, database by database in key order
        and appended, so that LMDB fills each page. (LMDB's own compacting copy only leaves out free pages:
        a journal whose lanes grew side by side keeps its pages half full, as their splits left them.)
        Records are copied as stored, seal and digest included."""
        env = lmdb.open(str(target), map_size=self.map_size(), max_dbs=len(DB) + 4, subdir=True, sync=False)
        try:
            dbs = {db: env.open_db(db.value.encode()) for db in DB}
            with self._shared.gate.open(), self._env.begin() as source:
                for db, handle in self._shared.dbs.items():
                    out = env.begin(write=True)
                    for count, (key, value) in enumerate(source.cursor(handle), 1):
                        out.put(key, value, db=dbs[db], append=True)
                        if count % 10_000 == 0:  # a bounded write transaction
                            out.commit()
                            out = env.begin(write=True)
                    out.commit()
            env.sync(True)
        finally:
            env.close()

    def _refuse_other_users(self) -> None:
        others = sorted(_lock_holders(self.path / "lock.mdb") - {os.getpid()})
        if others:
            raise StoreBusyError(
                f"store at {self.path} is open in other processes (pid {', '.join(map(str, others))}): "
                "stop their mission hosts and `keel serve`, then compact"
            )

    # -- facts ----------------------------------------------------------------------------------
    def txn_id(self) -> int:
        """The id of the newest committed write transaction (any process): the change signal."""
        return int(self._info()["last_txnid"])

    def map_size(self) -> int:
        return int(self._info()["map_size"])

    def _info(self) -> dict[str, Any]:
        with self._shared.gate.open():  # not while the environment is being replaced
            return dict(self._env.info())

    def reader_pids(self) -> set[int]:
        """Processes holding LMDB reader slots (diagnostics; slots of dead processes are cleared on open)."""
        with self._shared.gate.open():
            rows = str(self._env.readers()).splitlines()[1:]  # "pid thread txnid" rows after a header
        return {int(row.split()[0]) for row in rows if row.strip()}

    def stat(self) -> dict[str, Any]:
        with self._shared.gate.open():
            return {"path": str(self.path), "backend": self.backend, **self._env.info(), **self._env.stat()}

    def _check_trees(self) -> None:
        """Refuse a file whose B-trees an LMDB cursor could not walk without aborting the process. Inside a
        read transaction: a host committing meanwhile reuses no page of that snapshot or a newer one."""
        txn = self._begin(write=False)
        try:
            check_trees(self.path / DATA_FILE)
        finally:
            self._end(txn)

    def _open_dbs(self, env: lmdb.Environment) -> dict[DB, Any]:
        """Open the named databases. py-lmdb opens one in a write transaction unless the environment is
        read-only (a DBI opened in a read transaction is dropped when py-lmdb resets it), and a write
        transaction waits on LMDB's writer mutex, which a frozen writer holds forever; so a read-write
        open takes the writer lock (with its time limit) first, and read-only commands open the
        environment read-only, which never touches either lock."""
        for _ in range(_RESIZE_RETRIES):
            try:
                if self.readonly:
                    return {db: env.open_db(db.value.encode(), create=False) for db in DB}
                with self._writer.held(self.write_timeout):
                    return {db: env.open_db(db.value.encode()) for db in DB}
            except lmdb.MapResizedError:
                env.set_mapsize(0)  # adopt a map another process grew meanwhile
            except lmdb.NotFoundError:
                raise _NeedsWrite from None  # a store from before a database was added: create it
        raise StoreError("store map keeps being resized by another process")


class _NeedsWrite(Exception):
    """A read-only open found work only a writable environment can do (a missing database)."""


def _share(path: Path, readonly: bool) -> _Env | None:
    """This process's open environment of `path`, with one more user (LMDB forbids opening it twice)."""
    key = path.resolve()
    with _Shared.lock:
        shared = _Shared.envs.get(key)
        if shared is None:
            return None
        if shared.readonly and not readonly:
            raise StoreError(f"store at {path} is open read-only in this process; it cannot also be opened for writing")
        shared.users += 1
        return shared


def _lmdb_open(path: Path, map_size: int, readonly: bool) -> lmdb.Environment:
    """The environment; opened again when another process grew the map between LMDB's reading the file's
    size and its first transaction (MDB_MAP_RESIZED: nothing is wrong, the store is being written)."""
    for _ in range(_RESIZE_RETRIES):
        try:
            return lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=len(DB) + 4,
                max_readers=512,
                readonly=readonly,
                sync=True,
                metasync=True,
                subdir=True,
                readahead=False,
                writemap=False,
            )
        except lmdb.MapResizedError:
            continue
        except (lmdb.Error, OSError) as exc:
            raise _translate(exc, f"cannot open store at {path}", path) from None
    raise StoreError(f"cannot open store at {path}: its map keeps being resized by another process")


def _lock_holders(lock_file: Path) -> set[int]:
    """Processes holding a POSIX lock on LMDB's lock file: every process that has the store open does (LMDB
    takes one at open and keeps it). Read from /proc/locks, so that no descriptor of the file is opened and
    closed here (closing one would drop this process's own LMDB lock)."""
    st = lock_file.stat()
    node = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders: set[int] = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "POSIX" in fields and node in fields:
            holders.add(int(fields[fields.index(node) - 1]))
    return holders


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# LMDB errors that mean the file's structure is damaged (LMDB has no checksums of its own).
_DAMAGE = (
    lmdb.CorruptedError,
    lmdb.InvalidError,
    lmdb.PageNotFoundError,
    lmdb.BadValsizeError,
    lmdb.BadTxnError,
    lmdb.PanicError,
    lmdb.IncompatibleError,
    lmdb.VersionMismatchError,
)


def _translate(exc: BaseException, context: str, path: Path) -> StoreError:
    """A typed error for an LMDB or OS error. ENOSPC, EDQUOT, or EIO with (almost) no space left on the
    store's filesystem (LMDB reports a short write as EIO) are a full disk, named by its mount point."""
    text = str(exc)
    if is_disk_full(exc, path):
        full = disk_full(path, f"{context}: {text}", "the store at")
        return StoreFullError(f"{full.message}; nothing committed was lost", mount=full.mount, path=full.path)
    if isinstance(exc, _DAMAGE):
        return StoreDamagedError(f"{context}: the LMDB file is damaged ({text}); run `keel verify`")
    return StoreError(f"{context}: {text}")
