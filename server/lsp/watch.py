"""Noticing store changes: a thread polls the store's transaction id and hands new views to the hub.

The watcher never holds a read transaction between polls: `Store.txn_id()` reads LMDB's environment info,
and a changed id (or the once-a-second liveness sweep, since a host can die without writing) triggers
one short `read_views_at`. The hub lives on the event loop: it keeps the current view of every mission,
diffs, and calls each subscriber with `(old, new)` for the missions that changed. Features subscribe;
none of them polls. The hub's views are also what requests answer from (`keel/missions`): current within
one poll, and a command waits for the watcher to catch up with its own write (`StoreWatcher.current`).
Depends on storage and snapshot only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from keel.server.lsp.snapshot import MissionView, read_views_at
from keel.storage import Store

log = logging.getLogger(__name__)

Listener = Callable[[MissionView | None, MissionView], None]
Condition = Callable[[MissionView], bool]
SWEEP_S = 1.0
WOKEN_POLL_S = 1.0  # how often a watcher the store wakes still looks by itself (a wake-up can be lost)


class MissionHub:
    """The server's current picture of every mission; runs on the event loop thread only."""

    def __init__(self) -> None:
        self.views: dict[str, MissionView] = {}
        self.stranded: set[str] = set()
        self.loaded = False  # the first picture of the store (or of its absence) is in
        self.read_at = 0.0  # when (time.monotonic) the read that made the current picture began
        self._listeners: list[Listener] = []
        self._waiting: list[tuple[str, Condition, asyncio.Future[None]]] = []
        self.on_look: list[Callable[[dict[str, MissionView]], None]] = []  # after every look at the store
        self.on_remove: list[Callable[[str], None]] = []  # a mission deleted from the store

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, views: dict[str, MissionView], read_at: float = 0.0) -> None:
        """The store's whole picture: every mission's view (a mission missing from it was deleted), as a read
        that began at `read_at` (time.monotonic) saw it."""
        self.read_at = max(self.read_at, read_at)
        for mid in [mid for mid in self.views if mid not in views]:
            del self.views[mid]
            for forget in self.on_remove:
                forget(mid)
        for mid, view in views.items():
            self._publish(msgspec.structs.replace(view, stranded=mid in self.stranded))
        for look in self.on_look:
            try:
                look(views)
            except Exception:
                log.exception("store listener %s failed", getattr(look, "__qualname__", look))
        self.loaded = True

    async def until(self, mission_id: str, condition: Condition, within: float) -> bool:
        """Wait (at most `within` seconds) until the mission's view meets `condition`; whether it did."""
        view = self.views.get(mission_id)
        if view is not None and condition(view):
            return True
        entry = (mission_id, condition, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(entry[2], within)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiting.remove(entry)

    def set_stranded(self, mission_id: str, stranded: bool) -> None:
        if (mission_id in self.stranded) == stranded:
            return
        (self.stranded.add if stranded else self.stranded.discard)(mission_id)
        view = self.views.get(mission_id)
        if view is not None:
            self._publish(msgspec.structs.replace(view, stranded=stranded))

    def _publish(self, view: MissionView) -> None:
        old = self.views.get(view.record.id)
        if old == view:
            return
        self.views[view.record.id] = view
        for listener in self._listeners:
            try:
                listener(old, view)
            except Exception:  # one failing feature must not stop the others
                log.exception(
                    "mission listener %s failed on %s", getattr(listener, "__qualname__", listener), view.record.id
                )
        for mission_id, condition, done in self._waiting:
            if mission_id == view.record.id and not done.done() and condition(view):
                done.set_result(None)


class StoreWatcher:
    """Polls `txn_id()` every `poll_s` in its own thread; opens the store once it exists."""

    def __init__(
        self,
        path: Path,
        loop: asyncio.AbstractEventLoop,
        hub: MissionHub,
        *,
        poll_s: float = 0.05,
        opener: Callable[[], Store | None],
    ) -> None:
        self.path = path
        self._loop = loop
        self._hub = hub
        self._poll_s = poll_s
        self._open = opener
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keel-store-watcher", daemon=True)
        self._applied_txn = -1  # the transaction the hub's views are as new as (event loop only)
        self._woken = False  # the store wakes this watcher on others' commits (PostgreSQL): poll slowly
        self._again = False  # read the views at the next look even if the store did not change
        self._catching_up: list[asyncio.Future[None]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2)

    def poke(self) -> None:
        """Look now (after a command changed the store) instead of at the next poll."""
        self._wake.set()

    def read_again(self) -> None:
        """Read every mission's view now, whether or not the store changed (supervision found a host gone and
        wants a picture read after that, not one from before it)."""
        self._again = True
        self._wake.set()

    async def current(self, within: float = 30.0) -> None:
        """Wait (at most `within` seconds) until the hub's views include the store's newest transaction: a
        command's answer then agrees with `keel/missions`. The bound is for a watcher that cannot read the
        store at all; on a loaded machine a look can take seconds, and answering early would show stale views."""
        store = self._open()
        if store is None:
            return
        target = store.txn_id()
        deadline = self._loop.time() + within
        while self._applied_txn < target and self._loop.time() < deadline:
            waiter = self._loop.create_future()
            self._catching_up.append(waiter)
            self.poke()
            try:
                await asyncio.wait_for(waiter, deadline - self._loop.time())
            except TimeoutError:
                return

    def _deliver(self, txn: int, views: dict[str, MissionView], read_at: float = 0.0) -> None:
        self._hub.apply(views, read_at)
        self._applied_txn = max(self._applied_txn, txn)
        waiters, self._catching_up = self._catching_up, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _run(self) -> None:
        last_txn = -1
        last_sweep = 0.0
        failures = 0
        while not self._stop.is_set():
            try:
                store = self._open()
                if store is None and last_txn == -1:
                    last_txn = -2  # no store yet: that is the first picture, an empty one
                    self._loop.call_soon_threadsafe(self._deliver, -1, {})
                elif store is not None:
                    if not self._woken:
                        self._woken = store.subscribe(self._wake.set) is not None
                    now = time.monotonic()
                    if store.txn_id() != last_txn or now - last_sweep >= SWEEP_S or self._again:
                        self._again = False
                        txn, views = read_views_at(store)  # as new as its own snapshot, which may trail txn_id
                        last_txn, last_sweep = txn, now
                        self._loop.call_soon_threadsafe(self._deliver, txn, views, now)
                failures = 0
            except RuntimeError:  # the loop closed: the server is shutting down
                return
            except Exception:
                failures += 1
                if failures in (1, 10) or failures % 600 == 0:
                    log.exception("watching the store at %s failed (%d times in a row)", self.path, failures)
            looked = time.monotonic()
            self._wake.wait(WOKEN_POLL_S if self._woken else self._poll_s)
            self._wake.clear()
            if self._woken:  # woken by every commit: look at most once per poll_s, as a polling watcher does
                self._stop.wait(max(0.0, self._poll_s - (time.monotonic() - looked)))
