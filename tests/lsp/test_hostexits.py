"""Supervision's wait for host exits (server/lsp/features/hostexits.py) ends when its task is cancelled, even when
a host's exit wakes it in the same moment: the server's shutdown cancels supervision's loop, and a loop that
missed it would keep `keel serve` alive after its client went away."""

from __future__ import annotations

import asyncio

from keel.server.lsp.features.hostexits import HostExits


async def test_a_cancel_that_comes_with_an_exit_stops_the_waiting_loop() -> None:
    exits = HostExits()

    async def supervise() -> None:
        while True:
            await exits.wait(10)

    for _ in range(20):
        task = asyncio.create_task(supervise())
        for _ in range(3):
            await asyncio.sleep(0)  # the loop waits
        exits._woken.set()  # a watched host exits (what its pidfd's reader does) ...
        task.cancel()  # ... as the server shuts down
        done, _ = await asyncio.wait({task}, timeout=2)
        assert task in done and task.cancelled()
