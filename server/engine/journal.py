"""Write-ahead journal: request fingerprints, journal lanes, and the group-committing writer thread.

Every store write of a running host goes through one `JournalWriter` thread, so the asyncio loop never
blocks on an fsync. A caller hands it a transaction function and awaits the commit: nothing reaches an
agent before its entry is durable. Urgent work (expensive or effectful steps, checkpoints) is committed
at once — together with whatever else is queued; cheap steps may wait up to the group window so that
several share one commit. Depends on storage only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from keel.protocol.errors import DiskFullError, ErrorCode, KeelError
from keel.storage import Store, Txn
from keel.storage.errors import StoreBusyError


class NondeterminismError(KeelError):
    """An agent's request does not match the journal entry at its position."""

    code = ErrorCode.NONDETERMINISM


def fingerprint(method: str, params: Any) -> str:
    """BLAKE2b of the method and the canonical JSON of its params (sorted keys, no spaces)."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    h = hashlib.blake2b(digest_size=16, person=b"keel-journal")
    h.update(method.encode())
    h.update(b"\x00")
    h.update(canonical.encode())
    return h.hexdigest()


def lane(unit_id: str, epoch: int) -> str:
    """The journal a unit writes to: its id, or `id#epoch` after a restore started it afresh."""
    return unit_id if epoch == 0 else f"{unit_id}#{epoch}"


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
    """One thread that commits transaction functions, batching cheap ones within a bounded window."""

    def __init__(self, store: Store, window_s: float) -> None:
        self.store = store
        self.window_s = window_s
        self.commits = 0
        self.items = 0
        self.parallel = 1  # how many units may add entries right now; alone, nobody waits for a batch
        self.on_disk_full: Callable[[str], object] | None = None  # called from this thread; must not block
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="keel-journal", daemon=True)
        self._thread.start()

    async def commit(self, fn: Callable[[Txn], Any], *, urgent: bool = True) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Item(fn, future, loop, urgent))
        return await future

    def submit(self, fn: Callable[[Txn], Any]) -> None:
        """Queue a write nobody waits for (progress events); it rides along with the next commit."""
        self._queue.put(_Item(fn, None, None, False))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            alone = self.parallel <= 1
            deadline = time.monotonic() + (0.0 if first.urgent or alone else self.window_s)
            stop = False
            while True:
                try:
                    item = (
                        self._queue.get_nowait()
                        if time.monotonic() >= deadline
                        else self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    )
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                if item.urgent:
                    deadline = 0.0
            try:
                self._commit(batch)
            except BaseException as exc:  # never leave a step waiting on a future nobody settles
                for item in batch:
                    self._settle(item, None, exc)
            if stop:
                return

    def _write(self, batch: list[_Item]) -> list[Any]:
        """Commit the batch; while another process holds the store's write lock (a frozen process), wait
        for it, saying so on stderr (the host's log) each time the lock's time limit passes: a host has
        nothing better to do, and giving up would fail steps that did nothing wrong."""
        while True:
            try:
                return self.store.write(lambda txn: [item.fn(txn) for item in batch])
            except StoreBusyError as exc:
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
        self.commits += 1
        self.items += len(batch)
        with contextlib.suppress(Exception):  # committed, perhaps only in the reserve: stop before waking anyone
            self._alarm(self.store.full_disk())
        for item, result in zip(batch, results, strict=True):
            self._settle(item, result, None)

    def _alarm(self, message: str) -> None:
        if message and self.on_disk_full is not None:
            with contextlib.suppress(Exception):  # it only schedules; a closed loop means nobody listens
                self.on_disk_full(message)

    @staticmethod
    def _settle(item: _Item, result: Any, error: BaseException | None) -> None:
        if item.future is None or item.loop is None:
            return

        def settle() -> None:
            assert item.future is not None
            if item.future.done():
                return
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            item.loop.call_soon_threadsafe(settle)
