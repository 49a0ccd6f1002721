"""`keel worker [--store URL] [--units N] [--interval S] [--take-over]`: run units that missions offer, on this machine.

A mission whose file says `workers = true` has its host offer its units in the store instead of running them
(server/engine/units/remote.py). A worker on any machine sharing the store (PostgreSQL; or an LMDB store on this
machine) claims offered units of any mission, up to `--units` at once, each under a new lease epoch; makes
each unit's sandbox here from the snapshots the store holds; and runs it (server/engine/units/workerhost.py): its
agent here, its journal and completion into the store, fenced by the lease. A unit that needs its mission
host (a question, `plan/add`, a provider stop, a full disk, a failure) is handed back to it. SIGTERM or
Ctrl-C stops the running units at a consistent point (their leases read `orphaned`, and their hosts offer
them again); a worker that dies or loses the network is fenced when its lease's ttl passes. With
`--take-over` it also does what `keel supervise` does: a running mission whose host went silent gets a host
on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, store_path

QUICK_LOOK_S = 0.02  # how often to look for offers for QUICK_FOR_S after a unit was claimed or ended
QUICK_FOR_S = 2.0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("worker", parents=[common], help=help_of("worker"))
    p.add_argument("--units", type=int, default=2, metavar="N", help="units run at once (default 2)")
    p.add_argument(
        "--interval", type=float, default=0.2, metavar="S", help="seconds between looks for offers (default 0.2)"
    )
    p.add_argument(
        "--workspace", default=".", metavar="DIR", help="where this machine's provider settings are (default .)"
    )
    p.add_argument(
        "--take-over",
        action="store_true",
        help="also start a host here for running missions whose host went silent (as `keel supervise`)",
    )
    p.set_defaults(run=run)


def _say(text: str) -> None:
    print(f"keel worker: {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.units < 1:
        raise SystemExit("keel worker: --units must be at least 1")
    with open_store(args, wait=_say) as store:  # a database away is a pause for its units, never a failure
        return asyncio.run(_work(store, store_path(args), Path(args.workspace).resolve(), args))


async def _work(store: Any, path: Path, workspace: Path, args: argparse.Namespace) -> int:
    from keel.server.commands.supervise import Supervisor
    from keel.server.engine.units import moving
    from keel.server.engine.units.registry import lease_ttl
    from keel.server.engine.units.workerhost import UnitHost, claim_here, forget_sandbox, offered_units
    from keel.storage.leases import StaleLeaseError

    worker, hostname, ttl = f"w-{uuid.uuid4().hex[:10]}", moving.here(), lease_ttl()
    running: dict[asyncio.Task[Any], UnitHost] = {}
    refused: set[tuple[str, str, int]] = set()  # offers this worker could not take: not tried again
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    _say(f"{worker} on {hostname} takes units offered in {store.describe()}")
    supervisor = Supervisor(path, _say, args.interval) if args.take_over else None
    quick_until = 0.0  # until then, look for offers every QUICK_LOOK_S
    while not stopping.is_set():
        if supervisor is not None:
            await asyncio.to_thread(supervisor.look, store)
        offers = await asyncio.to_thread(store.read, offered_units) if len(running) < args.units else []
        random.shuffle(offers)  # workers that look at once each try a different offer first
        for mission_id, offered in offers:
            if len(running) >= args.units or (mission_id, offered.unit, offered.epoch) in refused:
                continue
            try:
                claimed = await asyncio.to_thread(claim_here, store, path, mission_id, offered, worker, hostname, ttl)
            except StaleLeaseError:
                continue  # another worker took it first, or its host withdrew it
            except Exception as exc:  # when claimed, claim_here handed it back to its host
                _say(f"{mission_id}/{offered.unit}: cannot run it here: {exc}")
                refused.add((mission_id, offered.unit, offered.epoch))
                continue
            unit_host = UnitHost(store, path, mission_id, claimed, workspace, ttl)
            _say(f"{mission_id}/{offered.unit}: claimed (epoch {claimed.epoch}), sandbox {claimed.place.sandbox}")
            running[asyncio.create_task(unit_host.run())] = unit_host
            quick_until = time.monotonic() + QUICK_FOR_S
        # A mission host offers its next unit a moment after one ends or is claimed: look again soon then,
        # and every --interval when nothing has happened for a while.
        quick = time.monotonic() < quick_until and len(running) < args.units  # (a full worker waits for an end)
        pause = QUICK_LOOK_S if quick else args.interval
        if running:
            done, _ = await asyncio.wait([*running], timeout=pause)
        else:
            done = set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), pause)
        if done:
            quick_until = time.monotonic() + QUICK_FOR_S
        for task in done:
            unit_host = running.pop(task)
            await asyncio.to_thread(forget_sandbox, unit_host.sandbox)  # what it did is in the store
            if (error := task.exception()) is not None:  # the lease tells its host; this worker goes on
                _say(f"{unit_host.mission_id}/{unit_host.unit.id}: stopped by an error: {error!r}")
                continue
            outcome = task.result()
            said = f": {unit_host.returned}" if unit_host.returned else (f": {outcome.error}" if outcome.error else "")
            _say(f"{unit_host.mission_id}/{unit_host.unit.id}: {outcome.kind.value}{said[:300]}")
    for unit_host in running.values():
        unit_host.stop_unit()
    await asyncio.gather(*running, return_exceptions=True)
    _say("stopped")
    sys.stdout.flush()
    return 0
