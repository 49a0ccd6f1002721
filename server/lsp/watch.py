"""Noticing store changes: a thread polls the store's transaction id and hands new views to the hub.

The watcher never holds a read transaction between polls: `Store.txn_id()` reads LMDB's environment info,
and a changed id (or the once-a-second liveness sweep, since a host can die without writing) triggers
one short `read_views`. The hub lives on the event loop: it keeps the current view of every mission,
diffs, and calls each subscriber with `(old, new)` for the missions that changed. Features subscribe;
none of them polls. Depends on storage and snapshot only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from keel.server.lsp.snapshot import MissionView, read_views
from keel.storage import Store

log = logging.getLogger(__name__)

Listener = Callable[[MissionView | None, MissionView], None]
SWEEP_S = 1.0


class MissionHub:
    """The server's current picture of every mission; runs on the event loop thread only."""

    def __init__(self) -> None:
        self.views: dict[str, MissionView] = {}
        self.stranded: set[str] = set()
        self._listeners: list[Listener] = []
        self.on_look: list[Callable[[dict[str, MissionView]], None]] = []  # after every look at the store

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, views: dict[str, MissionView]) -> None:
        for mid, view in views.items():
            self._publish(msgspec.structs.replace(view, stranded=mid in self.stranded))
        for look in self.on_look:
            try:
                look(views)
            except Exception:
                log.exception("store listener %s failed", getattr(look, "__qualname__", look))

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

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2)

    def poke(self) -> None:
        """Look now (after a command changed the store) instead of at the next poll."""
        self._wake.set()

    def _run(self) -> None:
        last_txn = -1
        last_sweep = 0.0
        failures = 0
        while not self._stop.is_set():
            try:
                store = self._open()
                if store is not None:
                    txn = store.txn_id()
                    now = time.monotonic()
                    if txn != last_txn or now - last_sweep >= SWEEP_S:
                        views = read_views(store)
                        last_txn, last_sweep = txn, now
                        self._loop.call_soon_threadsafe(self._hub.apply, views)
                failures = 0
            except RuntimeError:  # the loop closed: the server is shutting down
                return
            except Exception:
                failures += 1
                if failures in (1, 10) or failures % 600 == 0:
                    log.exception("watching the store at %s failed (%d times in a row)", self.path, failures)
            self._wake.wait(self._poll_s)
            self._wake.clear()
