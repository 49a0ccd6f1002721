"""Many missions hosted in one process (`keel supervise --in-process`).

A machine that hosts many missions at once (a fleet sharing a PostgreSQL store, most of its missions waiting
for `keel worker`s) runs them in one process instead of one process each: every mission's host is a task on
one event loop over one store (one pool of connections, one listener for wake-ups), and their host leases are
renewed together, in one write for every mission hosted here each quarter of the lease's ttl. A waiting
mission then costs no process, no connection and no heartbeat of its own; what it still reads are its
wake-ups (NOTIFY naming its controls and leases) and a rare safety poll.

Each host keeps its own fence: a mission whose lease another machine took stops alone (its task is
cancelled before it writes anything more), and the others go on. A host here that ends (completed, paused,
waiting for an answer) lets go of its lease as a host process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from keel.protocol.errors import KeelError
from keel.protocol.records import HostLease
from keel.protocol.states import MissionState
from keel.server.engine.files import places
from keel.server.engine.host import MissionHost, answered
from keel.server.engine.hostlock import HostLock, host_ttl, lease_holder_dead
from keel.server.engine.step.progress import Progress
from keel.storage import Store, Txn, hostlease
from keel.storage.hostlease import FencedHostError


class Hosting:
    """The missions this process hosts, and their shared heartbeat."""

    def __init__(self, store: Store, store_path: Path, say: Callable[[str], None]) -> None:
        self.store = store
        self.store_path = store_path
        self.say = say
        self.ttl_s = host_ttl()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.hosts: dict[str, MissionHost] = {}

    def hosted(self) -> frozenset[str]:
        return frozenset(self.tasks)

    def start(self, mission_id: str) -> None:
        """Host `mission_id` here (on this process's event loop), unless it already is."""
        if mission_id not in self.tasks:
            self.tasks[mission_id] = asyncio.create_task(self._host(mission_id), name=f"keel-host-{mission_id}")

    async def _host(self, mission_id: str) -> None:
        lock = HostLock(places.lock_path(self.store_path, mission_id), mission_id)
        again = False
        try:
            lock.acquire()
            try:
                state = await self._run(mission_id)
            finally:
                lock.release()
            # an answer that came while the host was stopping found the lock held and was left to it
            again = state == MissionState.WAITING_INPUT and await asyncio.to_thread(answered, self.store, mission_id)
        except asyncio.CancelledError:
            self.say(f"mission {mission_id}: its host here stopped (its lease was taken over, or this process stops)")
        except (KeelError, FencedHostError) as exc:
            self.say(f"mission {mission_id}: not hosted here: {exc}")
        except Exception as exc:  # one mission's host failing leaves the others running
            self.say(f"mission {mission_id}: its host here stopped on an error: {exc!r}")
        finally:
            self.tasks.pop(mission_id, None)
            self.hosts.pop(mission_id, None)
        if again:
            self.start(mission_id)

    async def _run(self, mission_id: str) -> MissionState:
        def claim(txn: Txn) -> HostLease:
            return hostlease.claim(
                txn,
                mission_id,
                host_id=uuid.uuid4().hex[:12],
                pid=os.getpid(),
                hostname=os.uname().nodename,
                ttl_s=self.ttl_s,
                dead=lease_holder_dead,
            )

        lease = await asyncio.to_thread(self.store.write, claim)
        progress = Progress("plain", prefix=f"mission {mission_id}: ")
        host = await asyncio.to_thread(MissionHost, self.store, self.store_path, mission_id, progress, True, lease)
        host.beats_itself = False
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        host.on_fenced = lambda: loop.call_soon_threadsafe(task.cancel)
        self.hosts[mission_id] = host
        self.say(f"mission {mission_id}: hosted here (epoch {host.lease.epoch})")
        state = await host.run()
        self.say(f"mission {mission_id}: {state.value}")
        return state

    async def beat(self) -> None:
        """Renew every hosted mission's lease, in one write each quarter of the ttl; a host whose lease was
        taken over is stopped."""
        while True:
            await asyncio.sleep(self.ttl_s / 4)
            hosts = dict(self.hosts)
            if not hosts:
                continue
            try:
                fenced = await asyncio.to_thread(self.store.write, partial(_beat_all, hosts=hosts))
            except Exception as exc:  # a store that is away now: the next beat tries again
                self.say(f"the hosts' heartbeat could not be written: {exc}")
                continue
            for mission_id in fenced:
                if (task := self.tasks.get(mission_id)) is not None:
                    task.cancel()

    async def stop(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def _beat_all(txn: Txn, *, hosts: dict[str, MissionHost]) -> list[str]:
    """Beat each host's lease at its epoch; the missions whose lease another host holds now."""
    fenced = []
    for mission_id, host in hosts.items():
        try:
            hostlease.beat(txn, mission_id, host.lease.epoch)
        except FencedHostError:
            fenced.append(mission_id)
    return fenced
