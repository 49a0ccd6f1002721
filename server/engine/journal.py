"""Write-ahead journal: request fingerprints, journal lanes, and the group-committing journal writer.

Every store write of a running host goes through one `JournalWriter`, and a caller awaits the commit:
nothing reaches an agent before its entry is durable. How a write is committed depends on whether a
group can form:
- alone (one unit adds entries, `parallel` ≤ 1) and nothing else is being committed, the caller commits
  at once on its own thread (the event loop's), together with whatever was queued before it: no thread
  handoff, no wake-up. It never waits on the store's write lock there: when another process holds it
  (a worker's heartbeat), the write goes to the writer thread, which waits;
- otherwise the writer thread commits. Urgent work (expensive or effectful steps, checkpoints) is
  committed at once, together with whatever else is queued; a cheap step may wait up to the group
  window so that several share one commit, and the window closes as soon as every unit that may add
  entries (`parallel`) has one waiting in it.
Writes are committed in the order they were handed in, whichever thread commits them. Depends on
storage only.
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keel.protocol.errors import DiskFullError, ErrorCode, KeelError
from keel.protocol.hashes import blake2b
from keel.protocol.modelwire import normalise
from keel.storage import DB, Store, Txn, leases
from keel.storage.errors import StoreBusyError, StoreUnavailableError
from keel.storage.keys import unit_prefix

if TYPE_CHECKING:  # imported where it is used: a worker takes `request_fingerprint` from here, not asyncio
    import asyncio


class NondeterminismError(KeelError):
    """An agent's request does not match the journal entry at its position."""

    code = ErrorCode.NONDETERMINISM


def fingerprint(method: str, params: Any) -> str:
    """BLAKE2b of the method and the canonical JSON of its params (sorted keys, no spaces)."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    h = blake2b(digest_size=16, person=b"keel-journal")
    h.update(method.encode())
    h.update(b"\x00")
    h.update(canonical.encode())
    return h.hexdigest()


def fingerprint_basis(method: str, params: Any) -> Any:
    """What a request's fingerprint is taken over: the params, or for a proxied model request its body
    without the fields that differ between identical runs (modelwire.normalise)."""
    if method == "effect/ask" and isinstance(params, dict):  # the agent mints a new call id for the same effect
        return {k: v for k, v in params.items() if k != "call_id"}
    if method != "model/forward" or not isinstance(params, dict):
        return params
    return {"api": params.get("api"), "path": params.get("path"), "body": normalise(params.get("body"))}


def request_fingerprint(method: str, params: Any) -> str:
    """The fingerprint of an agent's request as its journal entry records it (host and worker alike)."""
    return fingerprint(method, fingerprint_basis(method, params))


def lane(unit_id: str, epoch: int) -> str:
    """The journal a unit writes to: its id, or `id#epoch` after a restore started it afresh."""
    return unit_id if epoch == 0 else f"{unit_id}#{epoch}"


def lane_epoch(unit_lane: str) -> int:
    """The unit epoch a journal lane is named by (`lane`: `id`, or `id#epoch`)."""
    _, sep, epoch = unit_lane.rpartition("#")
    return int(epoch) if sep and epoch.isdigit() else 0


def fresh_epoch(txn: Txn, mission_id: str, unit_id: str, *named: int) -> int:
    """An epoch whose lane no record of the unit has used: past every lane of the unit the journal holds
    (on any branch of the mission's history: a restore's lanes outlive the points that superseded them),
    its lease's and the `named` ones. A reused lane would hand a replay entries recorded after its point."""
    held = leases.get(txn, mission_id, unit_id)
    used = max((*named, lane_epoch(held.lane) if held else 0, *_journal_epochs(txn, mission_id, unit_id)), default=0)
    return used + 1


def _journal_epochs(txn: Txn, mission_id: str, unit_id: str) -> list[int]:
    """The epochs of the unit's `id#epoch` lanes in the journal: one seek per lane, not a walk of its entries."""
    head = unit_prefix(mission_id, unit_id)[:-1] + b"#"
    found: list[int] = []
    start = head
    while True:
        first = next(iter(txn.scan_raw(DB.JOURNAL, head, start=start)), None)
        if first is None:
            return found
        end = first[0].index(b"\x00", len(head))
        name = first[0][len(head) : end]
        if name.isdigit():
            found.append(int(name))
        start = first[0][:end] + b"\x01"  # past every entry of this lane: the next lane's name sorts after


class _Item:
    __slots__ = ("fn", "future", "loop", "urgent")

    def __init__(
        self,
        fn: Callable[[Txn], Any],
        future: asyncio.Future[Any] | None,
        loop: asyncio.AbstractEventLoop | None,
        urgent: bool,
    ) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop
        self.urgent = urgent


class JournalWriter:
    """Commits transaction functions in order: on the caller's thread when alone and idle, else on one
    writer thread that batches cheap ones within a window."""

    def __init__(self, store: Store, window_s: float) -> None:
        self.store = store
        self.window_s = window_s
        self.commits = 0
        self.items = 0
        self.direct = 0  # commits made on the caller's thread, without the writer thread
        self.parallel = 1  # how many units may add entries right now; alone, nobody waits for a batch
        self.on_disk_full: Callable[[str], object] | None = None  # called from a committing thread; must not block
        self.fence: Callable[[Txn], object] | None = None  # runs first in every batch's transaction (the host lease)
        self._pending: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._busy = False  # a batch is being committed (by the writer thread or a caller): the rest queue
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="keel-journal", daemon=True)
        self._thread.start()

    async def commit(self, fn: Callable[[Txn], Any], *, urgent: bool = True) -> Any:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        batch = self._enter(_Item(fn, future, loop, urgent))
        if batch is not None:
            self._commit_here(batch)
        return await future

    def submit(self, fn: Callable[[Txn], Any]) -> None:
        """Queue a write nobody waits for (progress events); it rides along with the next commit, or is
        committed by itself once the group window has passed."""
        self._enter(_Item(fn, None, None, False), alone=False)

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _enter(self, item: _Item, alone: bool = True) -> list[_Item] | None:
        """Queue `item`; or, when it may be committed at once on this thread, the batch to commit: what
        was queued before it, then it."""
        with self._cond:
            if alone and self.parallel <= 1 and not self._busy and not self._closed:
                self._busy = True
                batch = [*self._pending, item]
                self._pending.clear()
                return batch
            self._pending.append(item)
            if len(self._pending) == 1 or self._full():  # else the thread is still waiting out a window
                self._cond.notify()
            return None

    def _commit_here(self, batch: list[_Item]) -> None:
        """Commit on the caller's thread without waiting on the store's write lock. Anything but success
        (another process writing, a full disk, a failing function; nothing was committed) hands the
        batch to the writer thread, which waits for the lock and deals with failures item by item."""
        results: list[Any] | None = None
        try:
            results = self.store.write(self._batch_fn(batch), timeout=0)
        except Exception:
            pass
        finally:
            with self._cond:
                if results is None:
                    self._pending.extendleft(reversed(batch))
                self._busy = False
                if self._pending or self._closed:
                    self._cond.notify()
        if results is not None:
            self.direct += 1
            self._committed(batch, results)

    def _run(self) -> None:
        while (batch := self._gather()) is not None:
            try:
                self._commit(batch)
            except BaseException as exc:  # never leave a step waiting on a future nobody settles
                for item in batch:
                    self._settle(item, None, exc)
            finally:
                with self._cond:
                    self._busy = False

    def _gather(self) -> list[_Item] | None:
        """The next batch, once its window allows; None when closed with nothing queued. The window
        opened by a cheap first item closes early on an urgent item, on close, or once as many items
        wait for their commit as units may add entries (nobody else is going to join)."""
        with self._cond:
            deadline: float | None = None
            while True:
                if self._busy or not self._pending:
                    if self._closed and not self._pending:
                        return None
                    deadline = None
                    self._cond.wait()
                    continue
                if deadline is None:
                    deadline = time.monotonic() + (0.0 if self._pending[0].urgent else self.window_s)
                left = deadline - time.monotonic()
                if left <= 0 or self._closed or self._full():
                    break
                self._cond.wait(left)
            self._busy = True
            batch = list(self._pending)
            self._pending.clear()
            return batch

    def _full(self) -> bool:
        waiting = 0
        for item in self._pending:
            if item.urgent:
                return True
            waiting += item.future is not None
        return waiting >= max(1, self.parallel)

    def _batch_fn(self, batch: list[_Item]) -> Callable[[Txn], list[Any]]:
        fence = self.fence

        def run(txn: Txn) -> list[Any]:
            if fence is not None:
                fence(txn)
            return [item.fn(txn) for item in batch]

        return run

    def _write(self, batch: list[_Item]) -> list[Any]:
        """Commit the batch; while another process holds the store's write lock (a frozen process), wait
        for it, saying so on stderr (the host's log) each time the lock's time limit passes: a host has
        nothing better to do, and giving up would fail steps that did nothing wrong."""
        while True:
            try:
                return self.store.write(self._batch_fn(batch))
            except (StoreBusyError, StoreUnavailableError) as exc:
                sys.stderr.write(f"keel host: still waiting to write: {exc.message}\n")
                sys.stderr.flush()

    def _commit(self, batch: list[_Item]) -> None:
        try:
            results = self._write(batch)
        except BaseException as exc:
            if isinstance(exc, DiskFullError):
                self._alarm(exc.message)
            if len(batch) > 1:  # one bad (or too big) function must not fail its neighbours: one by one
                for item in batch:
                    self._commit([item])
                return
            self._settle(batch[0], None, exc)
            return
        self._committed(batch, results)

    def _committed(self, batch: list[_Item], results: list[Any]) -> None:
        self.commits += 1
        self.items += len(batch)
        with contextlib.suppress(Exception):  # committed, perhaps only in the reserve: stop before waking anyone
            self._alarm(self.store.full_disk())
        self._settle_all([(item, result, None) for item, result in zip(batch, results, strict=True)])

    def _alarm(self, message: str) -> None:
        if message and self.on_disk_full is not None:
            with contextlib.suppress(Exception):  # it only schedules; a closed loop means nobody listens
                self.on_disk_full(message)

    @staticmethod
    def _settle(item: _Item, result: Any, error: BaseException | None) -> None:
        JournalWriter._settle_all([(item, result, error)])

    @staticmethod
    def _settle_all(outcomes: list[tuple[_Item, Any, BaseException | None]]) -> None:
        """Settle the items' futures: directly on their loop's own thread, else with one call per loop
        (a batch wakes its loop once, not once per item)."""
        import asyncio

        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for item, result, error in outcomes:
            if item.future is not None and item.loop is not None:
                by_loop.setdefault(item.loop, []).append((item.future, result, error))
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, settled in by_loop.items():
            if loop is running:
                _settle_futures(settled)
                continue
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle_futures, settled)


def _settle_futures(settled: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in settled:
        if future.done():  # cancelled: its step was given up
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
