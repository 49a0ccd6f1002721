"""Waiting for one mission's changes: woken by the store when it says the mission changed (PostgreSQL's
NOTIFY names the missions and databases a commit changed), or after a timeout, whichever comes first.

A store without wake-ups (LMDB) only times out: the caller polls at its own pace (`live` says which). A
wake-up is a hint, never the news itself: the caller reads what changed. Depends on storage only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection

from keel.storage import Store


class MissionChanges:
    def __init__(self, store: Store, mission_id: str, dbs: Collection[str] = ()) -> None:
        loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._unsubscribe = store.subscribe(
            lambda: loop.call_soon_threadsafe(self._event.set), mission=mission_id, dbs=dbs
        )

    @property
    def live(self) -> bool:
        """Whether the store wakes this waiter (else `wait` is a plain sleep)."""
        return self._unsubscribe is not None

    async def wait(self, seconds: float) -> None:
        """Until the mission changed (since the last wait returned) or `seconds` passed."""
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that arrives as the
        # event is set, and the waiter would then never stop
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()
        self._event.clear()

    def poke(self) -> None:
        """Wake the waiter now (from the event loop's thread): something besides the store changed."""
        self._event.set()

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
