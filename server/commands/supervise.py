"""`keel supervise [--store URL] [--interval S]`: keep the store's running missions hosted.

For a machine that shares a PostgreSQL store with others (docs/postgres.md). Every `--interval` it reads the
missions and their host leases (`control.needs_host`); a running mission whose host went silent past its lease's ttl
while this process could reach the store (its machine died, froze or lost the network; a store outage silences every
host and is no evidence: storage/reach.py), or stopped without finishing it, gets a host on this machine: `keel
resume` detached, forked by this process's host starter (server/hoststarter.py), or with `--in-process` a task of
this very process (hosting.py), which takes the lease over and makes the mission's sandboxes here from the store
(server/engine/units/moving.py). When several supervisors see the
same silent lease, the store lets one new host claim it; the others' hosts stop at once ("already running"). Starts
for one mission are 10 s apart at least; a mission that three hosts started here in a row did not take over (each
one crashed, say) is reported and left alone until it is seen with a live host again."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, store_path
from keel.server.engine import control
from keel.server.engine.hostlock import host_ttl
from keel.server.hoststarter import HostStarter
from keel.storage import Store, Txn
from keel.storage import missions as m
from keel.storage.reach import Reach, gap_for

ATTEMPTS = 3
SETTLE_S = 10.0  # how long a host started here has to claim the lease before another start


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("supervise", parents=[common], help=help_of("supervise"))
    p.add_argument(
        "--interval", type=float, default=0.5, metavar="S", help="seconds between looks at the store (default 0.5)"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="host the missions in this process (one process for every mission it hosts) instead of starting a "
        "host process for each",
    )
    p.set_defaults(run=run)


def _say(text: str) -> None:
    print(f"keel supervise: {text}", flush=True)


def _due(txn: Txn, reach: Reach, started: float) -> list[tuple[str, str]]:
    """(mission, why) of every mission that needs a host, silence counted only while this process reached
    the store (`reach`, noted with this read, which started at `started`)."""
    since = reach.note(started, txn.clock())
    return [(record.id, why) for record in m.list_missions(txn) if (why := control.needs_host(txn, record, since))]


class Supervisor:
    """Starts a host here for each mission of the store that needs one, at most ATTEMPTS in a row."""

    def __init__(
        self,
        path: Path,
        say: Callable[[str], None],
        interval: float = 0.5,
        host: Callable[[str], object] | None = None,
        hosted: Callable[[], Collection[str]] = frozenset,
        start: control.Starter = control.spawn_host,
    ) -> None:
        self.path = path
        self.start = start  # how a host process is started: a fork of this process's host starter, or a new one
        self.say = say
        self.host = host  # None: a host process is started for each mission
        self.hosted = hosted  # the missions this process hosts itself (their leases name this very process)
        self.reach = Reach(gap_for(host_ttl()) + interval)
        self.tried: dict[str, tuple[int, float]] = {}  # mission -> (hosts started here in a row, when the last one)

    def look(self, store: Store) -> None:
        started = time.monotonic()
        due = store.read(lambda txn: _due(txn, self.reach, started))
        hosted = self.hosted()
        due = [(mission_id, why) for mission_id, why in due if mission_id not in hosted]
        tried = self.tried
        for mission_id in set(tried) - {mission_id for mission_id, _ in due}:
            tried[mission_id] = (0, tried[mission_id][1])  # a live host (or none needed): counted afresh
        for mission_id, why in due:
            count, last = tried.get(mission_id, (0, 0.0))
            if time.monotonic() - last < SETTLE_S:
                continue  # the host started last time is still taking over (or crashed at once)
            if count >= ATTEMPTS:
                if count == ATTEMPTS:
                    self.say(f"mission {mission_id}: {why}; {ATTEMPTS} hosts started here did not take it over")
                    tried[mission_id] = (count + 1, last)
                continue
            tried[mission_id] = (count + 1, time.monotonic())
            if self.host is not None:
                self.host(mission_id)
                self.say(f"mission {mission_id}: {why}; hosted in this process")
                continue
            pid = self.start(self.path, mission_id)
            self.say(f"mission {mission_id}: {why}; host started here (pid {pid})")


def run(args: argparse.Namespace) -> int:
    starter = None if args.in_process else HostStarter.launch()  # before the store opens: hosts are its forks
    with open_store(args, wait=_say) as store:  # a database away is a pause, never a failure
        if args.in_process:
            return asyncio.run(_host_here(store, store_path(args), args.interval))
        supervisor = Supervisor(
            store_path(args), _say, args.interval, start=starter.start if starter else control.spawn_host
        )
        _say(f"watching {store.describe()}")
        while True:
            supervisor.look(store)
            sys.stdout.flush()
            time.sleep(args.interval)


async def _host_here(store: Store, path: Path, interval: float) -> int:
    """`--in-process`: the missions that need a host are hosted as tasks of this process (hosting.py)."""
    from keel.server.engine.hosting import Hosting

    hosting = Hosting(store, path, _say)
    loop = asyncio.get_running_loop()
    supervisor = Supervisor(
        path, _say, interval, host=lambda mid: loop.call_soon_threadsafe(hosting.start, mid), hosted=hosting.hosted
    )
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    beating = asyncio.create_task(hosting.beat())
    _say(f"hosting the missions of {store.describe()} in this process (pid {os.getpid()})")
    try:
        while not stopping.is_set():
            await asyncio.to_thread(supervisor.look, store)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), interval)
    finally:
        beating.cancel()
        await hosting.stop()
    _say("stopped")
    return 0
