"""Transactions of one process's LMDB environment, and changes to its map that need none to be open.

py-lmdb invalidates every transaction and cursor of an environment when its map is resized
(`Environment.set_mapsize`: after another process grew the file, or when a write needs room) or the
environment is closed and opened again; a thread reading meanwhile fails with "Attempt to operate on
closed/deleted/dropped object". So each transaction holds the gate open (`enter`/`leave`) for as long as it
lives, and a change of the map waits in `changing()` until no transaction is open, keeping new ones out
until it is done (it goes first: a stream of short reads cannot hold it off). A thread that already holds a
transaction may begin another (a nested read) while a change waits; it cannot change the map itself, which
would invalidate its own transaction: `NestedChange` says so.

Depends only on the standard library.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NestedChange(RuntimeError):
    """The thread asking to change the map holds a transaction of the same environment."""


class EnvGate:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open = 0  # transactions open in this process
        self._changing = False  # a change holds the gate or waits for it
        self._mine = threading.local()  # transactions the current thread holds

    def _held(self) -> int:
        return int(getattr(self._mine, "count", 0))

    def enter(self) -> None:
        """Before a transaction begins (or the environment is asked anything): waits out a change."""
        held = self._held()
        with self._cond:
            if not held:
                self._cond.wait_for(lambda: not self._changing)
            self._open += 1
        self._mine.count = held + 1

    def leave(self) -> None:
        """After the transaction ended."""
        self._mine.count = self._held() - 1
        with self._cond:
            self._open -= 1
            if self._open == 0:
                self._cond.notify_all()

    @contextmanager
    def open(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def change_waiting(self) -> bool:
        """A change holds the gate or waits for the open transactions to end."""
        with self._cond:
            return self._changing

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Held while the map is resized or the environment replaced: no transaction is open meanwhile."""
        if self._held():
            raise NestedChange("the store's map cannot change while this thread holds one of its transactions")
        with self._cond:
            self._cond.wait_for(lambda: not self._changing)
            self._changing = True
            self._cond.wait_for(lambda: self._open == 0)
        try:
            yield
        finally:
            with self._cond:
                self._changing = False
                self._cond.notify_all()
