"""Waiting out a network loss: probe the mission's providers with backoff until one answers again.

A host started with `--wait-online` (detached hosts always are) stays alive when its mission goes
offline: it has checkpointed and stopped its agents, and now loops `router.probe()` (full-jitter
backoff between rounds, docs/providers.md) while watching the store. It resumes the mission by itself
when a candidate answers, unless in the meantime a person paused the mission (a pause control, or the
record is no longer `offline`) — a mission a person paused is never resumed by the prober — and only
when the mission's `models.auto_resume` is true. Depends on storage and the providers package only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from keel.protocol.states import MissionState, PauseReason
from keel.storage import Store, Txn
from keel.storage import missions as m

log = logging.getLogger("keel.offline")
WATCH_S = 0.05


async def wait_online(
    store: Store,
    mission_id: str,
    probe: Callable[[], Coroutine[Any, Any, bool]],
    commit: Callable[[Callable[[Txn], object]], Awaitable[object]],
) -> bool:
    """True when a probe round succeeded while the mission was still offline; False when a person paused
    it first (then it is recorded paused, reason operator) or it left `offline` some other way."""
    watch = asyncio.create_task(_person_stepped_in(store, mission_id))
    rounds = 0
    try:
        while True:
            rounds += 1
            attempt: asyncio.Task[bool] = asyncio.create_task(probe())
            done, _ = await asyncio.wait([attempt, watch], return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await attempt
                await commit(lambda txn: honour_pause(txn, mission_id))
                log.info("mission %s: a person paused it while offline; not resuming", mission_id)
                return False
            if attempt.result():
                log.info("mission %s: a provider answers again after %d probe round(s)", mission_id, rounds)
                return True
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def _person_stepped_in(store: Store, mission_id: str) -> None:
    """Returns once the mission has a pause control it has not seen, or is no longer offline."""
    seen = -1
    while True:
        if store.txn_id() != seen:
            seen, stepped_in = await asyncio.to_thread(store.read, lambda txn: _stepped_in(txn, mission_id))
            if stepped_in:
                return
        await asyncio.sleep(WATCH_S)


def _stepped_in(txn: Txn, mission_id: str) -> tuple[int, bool]:
    record = m.get_mission(txn, mission_id)
    pause = any(c.action == "pause" for _, c in m.controls_after(txn, mission_id, record.control_seen))
    return txn.snapshot_id(), pause or record.state != MissionState.OFFLINE


def honour_pause(txn: Txn, mission_id: str) -> MissionState:
    """An offline mission with a pause it has not acted on becomes paused (reason operator); returns the
    mission's state. Run by a host before it leaves an offline mission, and when its probing stops."""
    record = m.get_mission(txn, mission_id)
    controls = m.controls_after(txn, mission_id, record.control_seen)
    if record.state == MissionState.OFFLINE and any(c.action == "pause" for _, c in controls):
        record = m.set_mission_state(
            txn, mission_id, MissionState.PAUSED, pause_reason=PauseReason.OPERATOR, control_seen=controls[-1][0]
        )
    return record.state
