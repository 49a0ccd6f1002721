"""The PostgreSQL backend: the same sealed records in one table, for stores shared by several machines.

Layout (in the schema the URL's search_path names, `public` by default):

    keel_records (db text, key bytea, value bytea, PRIMARY KEY (db, key))   every record, sealed

`bytea` sorts bytewise, as LMDB's keys do, so prefix scans and logs read in the same order. A row's
bytes are the sealed record LMDB would hold, verified on every read: a row changed behind keel's back
is a CorruptRecordError naming its database and key, as on LMDB.

First contact: opening a database that has no keel table makes it, and one with no schema record writes
it, also for a read-only verb (`keel missions` on a new database lists none); a role that may not create
the tables gets a StoreError that names them.

Change wake-ups: every write NOTIFYs the store's channel at commit (in the COMMIT's round trip), its payload
naming what it changed as `db/mission` tokens (`missions.change_token`); `subscribe` LISTENs on one connection per
process and wakes the watchers the change concerns: a mission host its own mission's controls and leases
only, never every other mission's writes (a wake-up may be lost; they still poll now and then, and catch up
after a reconnect).

Transactions: a read is one REPEATABLE READ READ ONLY transaction (a consistent snapshot, never waiting
on a writer). A write is READ COMMITTED and fences what it touches (`pgtxn`: a mission's records under
the mission's transaction-scoped advisory lock), so a mission's writes follow one another as LMDB's do, on
every machine at once, while different missions' writes never wait on each other; it holds the store's lock
shared, and a `whole` write (gc, migrations) exclusively. It notes its transaction id. `txn_id()` is a
number of the server's current snapshot, which grows with every commit (no row every writer updates).
Waiting for a lock is bounded by `write_timeout` (`lock_timeout`); then StoreBusyError names the holder (its
application name says which keel process on which machine); a deadlock between two writes that span
missions runs the one the server failed again. A connection lost before COMMIT was sent is retried; a
connection lost during COMMIT leaves the outcome unknown, and keel reads it back (`pg_xact_status` of the
noted transaction id) on a new connection: committed is success, anything else runs `fn` again. Never a guess.

A server that refuses keel's credentials or role (a wrong or missing password, a role or database that does
not exist, no pg_hba.conf rule) is StoreRefusedError at once, with the server's words: waiting would not
help. An unreachable server (a restart, a failover, a network cut) is waited out with backoff for
`reconnect_s` ($KEEL_STORE_RECONNECT_S, default 30 s), then StoreUnavailableError says for how long and
why. A mission host and a unit worker wait for ever (`reconnect_s = inf`): for them a store that is away
is a pause, never a failure; `on_wait` reports the wait in their logs. The URL comes from
`<folder>/store.url`; a password never does (libpq's ~/.pgpass or $PGPASSWORD). A machine that vanishes
in the middle of a transaction holds the store's lock until the server gives up on it (`_SESSION`: 10 s).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors

from keel.storage.base import Store
from keel.storage.errors import (
    StoreBusyError,
    StoreError,
    StoreFullError,
    StoreRefusedError,
    StoreUnavailableError,
)
from keel.storage.location import URL_FILE
from keel.storage.pgtxn import ANY_CHANGE, PgTxn, snapshot_number
from keel.storage.pgwords import first_line, refused_for_good, server_words, unreachable_why
from keel.storage.txn import Txn
from keel.storage.writelock import default_timeout, seconds_from_env

T = TypeVar("T")

# A machine that dies or is cut off leaves its connections open on the server until TCP says otherwise.
# The server then aborts a transaction left open for 10 s (releasing the store's lock: keel's transactions
# take milliseconds) and drops an idle connection in about 11 s; on keel's side a lost server is noticed
# by the same keepalives, and a send nobody acknowledges fails after 15 s.
_LINK: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,
}
_SESSION = (
    "SET idle_in_transaction_session_timeout = '10s'; SET tcp_keepalives_idle = 5; "
    "SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3"
)

LINGER_S = 5.0  # an idle connection beyond the pool's first is closed once it has not been used for this long
POOL_ENV = "KEEL_STORE_POOL"
DEFAULT_POOL = 4  # connections a process uses at once, at most: 1,000 missions hosted and 8 workers hold < 50
RECONNECT_ENV = "KEEL_STORE_RECONNECT_S"
DEFAULT_RECONNECT_S = 30.0
_LOCK_CLASS = 0x6B65656C  # 'keel': the advisory lock's first key; the second is the schema's hash
_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)
WAIT_REPORT_S = 5.0  # how often a long wait for the server is reported (`on_wait`)

_TABLES = """
CREATE TABLE IF NOT EXISTS keel_records (
    db text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (db, key)
);
"""


def read_url(folder: Path) -> str:
    try:
        url = (folder / URL_FILE).read_text().strip()
    except OSError as exc:
        raise StoreError(f"cannot read {folder / URL_FILE}: {exc.strerror}") from None
    if not url.startswith(("postgresql://", "postgres://")):
        raise StoreError(f"{folder / URL_FILE} does not hold a postgresql:// URL")
    return url


def held() -> bool:
    """A PgStore of this process is not closed yet (`base.held_in_process`)."""
    with PgStore.counting:
        return PgStore.unclosed > 0


class PgStore(Store):
    backend = "postgresql"
    shared = True
    counting = threading.Lock()
    unclosed = 0  # this process's stores not closed yet

    def __init__(self, path: Path, url: str, readonly: bool, write_timeout: float | None) -> None:
        self.path = path
        self.url = url
        self.readonly = readonly
        self.write_timeout = default_timeout() if write_timeout is None else write_timeout
        self.reconnect_s = seconds_from_env(RECONNECT_ENV, DEFAULT_RECONNECT_S)
        self.disk_full = ""
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []  # with when each was given back
        self.linger_s = LINGER_S
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a connection given back (for a take at the cap)
        self.most = pool_size()  # connections in use at once, at most (the listener's aside)
        self._in_use = 0
        self._holding = threading.local()  # connections this thread has taken and not given back
        self._closed = False
        self._lock_key = 0
        self._channel = "keel_changes"
        self._listeners: list[_Listener] = []
        self.application = f"keel pid {os.getpid()} on {socket.gethostname()}"
        with PgStore.counting:
            PgStore.unclosed += 1

    @classmethod
    def open_folder(
        cls,
        path: Path,
        *,
        readonly: bool = False,
        write_timeout: float | None = None,
        wait: Callable[[str], object] | None = None,
    ) -> PgStore:
        store = cls(path, read_url(path), readonly, write_timeout)
        if wait is not None:  # a long-running process: the server may be away at its first contact too
            store.wait_out_outages(wait)
        try:
            store._prepare()
            store._first_contact()
        except BaseException:
            store.close()
            raise
        return store

    def describe(self) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.url)
        where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
        return f"postgresql://{where} ({self.path})"

    def close(self) -> None:
        with self._lock:
            was_open, self._closed = not self._closed, True
            idle, self._idle = self._idle, []
        if was_open:
            with PgStore.counting:
                PgStore.unclosed -= 1
        for conn, _ in idle:
            conn.close()

    def stat(self) -> dict[str, Any]:
        return {"path": str(self.path), "backend": self.backend, "url": self.describe(), "last_txnid": self.txn_id()}

    # -- connections ----------------------------------------------------------------------------
    def _connect(self, patience: float | None = None) -> psycopg.Connection[Any]:
        """A new connection, retried with backoff while the server cannot be reached, for `patience`
        seconds (default `reconnect_s`); the wait is reported through `on_wait` every WAIT_REPORT_S."""
        started = time.monotonic()
        limit = self.reconnect_s if patience is None else patience
        reported = 0.0
        for attempt in itertools.count():
            try:
                return self._open()
            except psycopg.OperationalError as exc:
                if refused_for_good(str(exc)):
                    raise StoreRefusedError(
                        f"the PostgreSQL server of {self.describe()} refused keel: {server_words(str(exc))}"
                    ) from None
                waited = time.monotonic() - started
                if waited >= limit:
                    raise StoreUnavailableError(
                        f"the PostgreSQL store {self.describe()} could not be reached for {waited:.0f} s: "
                        f"{unreachable_why(str(exc))}"
                    ) from None
                if self.on_wait is not None and waited - reported >= WAIT_REPORT_S:
                    reported = waited
                    self.on_wait(
                        f"the PostgreSQL store {self.describe()} is unreachable ({waited:.0f} s so far; waiting for "
                        f"it): {unreachable_why(str(exc))}"
                    )
                _back_off(attempt)
        raise AssertionError("unreachable")

    def _open(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True, application_name=self.application, **_LINK)
        conn.execute(_SESSION)
        return conn

    def _take(self, patience: float | None = None, *, wait: bool = True) -> psycopg.Connection[Any]:
        """A connection of the pool. At most `most` are in use at once: a thread that takes one more then
        waits until one is given back (however many threads a process runs, hosting many missions), unless
        it holds one already (a read inside a write: waiting could then wait for itself); `wait=False`:
        StoreBusyError instead of waiting."""
        held = getattr(self._holding, "count", 0)
        with self._returned:
            while True:
                if self._closed:
                    raise StoreError(f"store {self.describe()} is closed")
                if self._idle or self._in_use < self.most or held:
                    break
                if not wait:
                    raise StoreBusyError(f"store {self.describe()}: every connection of this process is in use")
                self._returned.wait()
            self._in_use += 1
            while self._idle:
                conn, _ = self._idle.pop()  # the one given back last: the others may age out
                if not conn.closed:
                    self._holding.count = held + 1
                    return conn
        try:
            conn = self._connect(patience)
        except BaseException:
            with self._returned:
                self._in_use -= 1
                self._returned.notify()
            raise
        self._holding.count = held + 1
        return conn

    def _give(self, conn: psycopg.Connection[Any]) -> None:
        """Back to the pool. The pool keeps the connection given back last for good; the others while they
        were used within `linger_s` (a burst of threads reading at once), so a process at rest holds one
        connection (and its listener's) however busy it once was. `_take` pops the last one given back, so
        the pool is ordered by when each came back and the stale ones lead it."""
        healthy = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        now = time.monotonic()
        closing = []
        self._holding.count = max(0, getattr(self._holding, "count", 1) - 1)
        with self._returned:
            self._in_use -= 1
            self._returned.notify()
            if healthy and not self._closed:
                self._idle.append((conn, now))
            else:
                closing.append(conn)
            while len(self._idle) > 1 and now - self._idle[0][1] > self.linger_s:
                closing.append(self._idle.pop(0)[0])
        for old in closing:
            old.close()

    def _prepare(self) -> None:
        """Make the tables where they do not exist yet (under the store's lock: other machines may be
        doing the same) and learn the lock's key."""

        def run(conn: psycopg.Connection[Any]) -> None:
            row = conn.execute(
                "SELECT hashtext(current_schema()), to_regclass('keel_records') IS NOT NULL,"
                " current_setting('search_path')"
            ).fetchone()
            assert row is not None
            if row[0] is None:  # no schema of the search path exists, or none is this role's to use
                raise StoreRefusedError(
                    f"the PostgreSQL store {self.describe()} names schema {row[2]} (its search_path), which does "
                    f"not exist or which role {conn.info.user!r} may not use: create it, or grant the role USAGE "
                    "and CREATE on it"
                )
            self._lock_key = int(row[0])
            self._channel = f"keel_changes_{self._lock_key & 0xFFFFFFFF:08x}"  # one per store (schema)
            if not row[1]:
                try:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, self._lock_key))
                        conn.execute(_TABLES)
                except pgerrors.InsufficientPrivilege as exc:
                    raise StoreError(
                        f"the PostgreSQL store {self.describe()} has no keel table yet (keel_records) "
                        f"and this role may not make them: {first_line(exc)}; grant it CREATE on the schema, or "
                        "let a role that has it run any keel command once"
                    ) from None

        self._with_connection(run)

    def _first_contact(self) -> None:
        """Write the schema record when the store has none yet (a new or half-made database): also for a
        read-only open, as LMDB's migrates a store read-write when it must. A read-only verb's first
        contact then answers like any other's (no missions) instead of failing on a missing record."""
        if self.readonly and not self._schema_current():
            self.readonly = False
            try:
                self._ensure_schema()
            finally:
                self.readonly = True
        else:
            self._ensure_schema()

    def _with_connection(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run `fn` on a pooled connection; when the connection breaks, again on a new one (`fn` must be
        safe to repeat: it is a read, or a transaction that did not commit)."""
        deadline = time.monotonic() + self.reconnect_s
        attempt = 0
        while True:
            conn = self._take()
            try:
                return fn(conn)
            except psycopg.OperationalError as exc:
                if not conn.broken or time.monotonic() >= deadline:
                    raise _translate(exc, self) from None
                attempt += 1
                _back_off(attempt)
            except psycopg.Error as exc:
                raise _translate(exc, self) from None
            finally:
                self._give(conn)

    # -- transactions ---------------------------------------------------------------------------
    def read(self, fn: Callable[[Txn], T]) -> T:
        def run(conn: psycopg.Connection[Any]) -> T:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                return fn(PgTxn(conn, write=False))
            finally:
                if not conn.broken:
                    conn.execute("ROLLBACK")

        return self._with_connection(run)

    def write(self, fn: Callable[[Txn], T], *, timeout: float | None = None, whole: bool = False) -> T:
        if self.readonly:
            raise StoreError(f"store {self.describe()} was opened read-only")
        limit = self.write_timeout if timeout is None else timeout
        # timeout 0 (a caller with somewhere else to send the write) does not wait for the server either
        patience = 0.0 if timeout == 0 else self.reconnect_s
        deadline = time.monotonic() + patience
        attempt = 0
        while True:
            conn = self._take(patience, wait=timeout != 0)
            xid = ""
            committing = False
            try:
                txn = PgTxn(conn, write=True, store_key=self._lock_key)
                txn.waiting = (_LOCK_CLASS, self._lock_key)
                cur = conn.execute(  # one round trip: no parameters, so the simple query protocol
                    f"BEGIN; SET LOCAL lock_timeout = {max(1, int(limit * 1000))};"
                    f" SELECT pg_advisory_xact_lock{'' if whole else '_shared'}({_LOCK_CLASS}, {self._lock_key});"
                    " SELECT pg_current_xact_id()::text"
                )
                while cur.nextset():
                    pass  # to the last statement's result
                row = cur.fetchone()
                assert row is not None
                xid, txn.waiting = str(row[0]), None
                result = fn(txn)
                committing = True
                conn.execute(f"NOTIFY {self._channel}, '{txn.payload()}'; COMMIT")  # one round trip
                return result
            except pgerrors.LockNotAvailable:  # an OperationalError too: the server answered, the lock is held
                _rollback(conn)
                what = "store" if txn.waiting in (None, (_LOCK_CLASS, self._lock_key)) else "part of store"
                holder = "another write" if timeout == 0 else self._holder(txn.waiting)  # 0: asked not to wait
                raise StoreBusyError(
                    f"{what} {self.describe()} is being written by {holder} for more than {limit:g} s; "
                    "nothing was written"
                ) from None
            except pgerrors.DeadlockDetected:  # two writes that span missions each waited for the other's
                _rollback(conn)
                attempt += 1
                _back_off(attempt)
            except psycopg.OperationalError as exc:
                if not conn.broken:
                    _rollback(conn)
                    raise _translate(exc, self) from None
                if committing and self._committed(xid):
                    return result
                if time.monotonic() >= deadline:
                    raise _translate(exc, self) from None
                attempt += 1
                _back_off(attempt)
            except psycopg.Error as exc:
                _rollback(conn)
                raise _translate(exc, self) from None
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self._give(conn)

    def _committed(self, xid: str) -> bool:
        """Whether the transaction whose COMMIT got no answer committed: read back on a new connection
        (waiting while the server still has it in progress), never guessed."""
        while True:
            conn = self._connect()
            try:
                row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
            except pgerrors.InvalidParameterValue:
                return False  # a transaction id the restarted server never reached: nothing of it is durable
            except psycopg.OperationalError:
                _back_off(0)
                continue
            finally:
                conn.close()
            status = None if row is None else row[0]
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status is None:
                raise StoreError(f"the outcome of transaction {xid} on {self.describe()} can no longer be read back")
            time.sleep(0.05)  # in progress: its backend has not finished yet

    def _holder(self, lock: tuple[int, int] | None) -> str:
        """Who holds the advisory lock a write waited for (the store's, or a mission's fence), for StoreBusyError."""
        key1, key2 = lock or (_LOCK_CLASS, self._lock_key)

        def run(conn: psycopg.Connection[Any]) -> str:
            row = conn.execute(
                "SELECT a.application_name, a.client_addr::text, a.state FROM pg_locks l"
                " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
                " AND l.classid = %s::oid AND l.objid = %s::oid AND l.granted LIMIT 1",
                (key1 & 0xFFFFFFFF, key2 & 0xFFFFFFFF),
            ).fetchone()
            if row is None:
                return "another process"
            name, addr, state = row
            return f"{name or 'a client'} from {addr or 'a local socket'} ({state})"

        try:
            return self._with_connection(run)
        except StoreError:
            return "another process"

    # -- change wake-ups ------------------------------------------------------------------------
    def subscribe(
        self, callback: Callable[[], object], *, mission: str | None = None, dbs: Collection[str] = ()
    ) -> Callable[[], None] | None:
        """Every write NOTIFYs the store's channel at commit, its payload naming what it changed (`PgTxn.payload`:
        `missions.change_token`); one thread per store LISTENs and calls each subscriber that the change concerns:
        every one without a `mission`, else those whose mission (and one of `dbs`, when given) it names. NOTIFY
        is only a wake-up (a listener that was disconnected misses some): after a reconnect every subscriber is
        called once, to catch up by reading."""
        listener = _Listener(callback, mission, frozenset(dbs))
        with self._lock:
            self._listeners.append(listener)
            first = len(self._listeners) == 1
        if first:
            threading.Thread(target=self._listen, name="keel-store-listen", daemon=True).start()

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _listen(self) -> None:
        while not self._closed:
            try:
                conn = self._open()
            except psycopg.Error:
                time.sleep(1.0)
                continue
            try:
                conn.execute(f"LISTEN {self._channel}")
                self._wake(ANY_CHANGE)  # whatever happened while nobody listened
                while not self._closed:
                    for notice in conn.notifies(timeout=1.0, stop_after=1):
                        self._wake(notice.payload)
            except psycopg.Error:
                time.sleep(0.2)
            finally:
                conn.close()

    def _wake(self, payload: str) -> None:
        tokens = None if payload == ANY_CHANGE else frozenset(payload.split(",") if payload else ())
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            if tokens is None or listener.concerned(tokens):
                with contextlib.suppress(Exception):  # a subscriber that is gone (its event loop closed)
                    listener.callback()

    # -- facts ----------------------------------------------------------------------------------
    def txn_id(self) -> int:
        """A number of the database's current snapshot (`pgtxn.snapshot_number`): it grows with every commit."""
        row = self._with_connection(lambda conn: conn.execute("SELECT pg_current_snapshot()::text").fetchone())
        assert row is not None
        return snapshot_number(str(row[0]))


class _Listener:
    __slots__ = ("callback", "dbs", "mission")

    def __init__(self, callback: Callable[[], object], mission: str | None, dbs: frozenset[str]) -> None:
        self.callback = callback
        self.mission = mission
        self.dbs = dbs

    def concerned(self, tokens: frozenset[str]) -> bool:
        """Whether a change naming `tokens` is this subscriber's: it names no mission in particular, or it names
        this subscriber's mission (in one of its databases, when it named some)."""
        if self.mission is None:
            return True
        if self.dbs:
            return any(f"{db}/{self.mission}" in tokens for db in self.dbs)
        return any(token.endswith(f"/{self.mission}") for token in tokens)


def pool_size() -> int:
    """Connections a process uses at once at most: $KEEL_STORE_POOL, else DEFAULT_POOL (a pooler in front of
    the server, PgBouncer in transaction mode, can share them further: docs/postgres.md)."""
    text = os.environ.get(POOL_ENV, "")
    try:
        return max(1, int(text)) if text else DEFAULT_POOL
    except ValueError:
        raise StoreError(f"${POOL_ENV} must be a whole number of connections (got {text!r})") from None


def _back_off(attempt: int) -> None:
    time.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if conn.broken or conn.closed:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        conn.close()


def _translate(exc: psycopg.Error, store: PgStore) -> StoreError:
    """A typed error for a database error: a full disk on the server is StoreFullError (the engine pauses
    `disk_full`), a lost server StoreUnavailableError, anything else StoreError with the server's words."""
    if isinstance(exc, pgerrors.DiskFull):
        return StoreFullError(
            f"the PostgreSQL server of {store.describe()} has no space left: {first_line(exc)}; "
            "nothing committed was lost"
        )
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailableError(
            f"the PostgreSQL store {store.describe()} is unreachable: {unreachable_why(str(exc))}"
        )
    return StoreError(f"PostgreSQL store {store.describe()}: {first_line(exc)}")
