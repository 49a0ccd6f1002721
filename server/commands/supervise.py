"""`keel supervise [--store URL] [--interval S]`: keep the store's running missions hosted.

For a machine that shares a PostgreSQL store with others (docs/postgres.md). Every `--interval` it reads the
missions and their host leases (`control.needs_host`); a running mission whose host went silent past its
lease's ttl (its machine died, froze or lost the network), or stopped without finishing it, gets a host on
this machine (`keel resume` detached, which takes the lease over and makes the mission's sandboxes here from
the store: server/engine/moving.py). When several supervisors see the same silent lease, the store lets one
new host claim it; the others' hosts stop at once ("already running"). A mission whose host does not take
over after three starts here is reported and left alone until its lease changes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, store_path
from keel.server.engine import control
from keel.storage import Txn, hostlease
from keel.storage import missions as m

ATTEMPTS = 3
SETTLE_S = 10.0  # how long a host started here has to claim the lease before another start


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("supervise", parents=[common], help=help_of("supervise"))
    p.add_argument(
        "--interval", type=float, default=0.5, metavar="S", help="seconds between looks at the store (default 0.5)"
    )
    p.set_defaults(run=run)


def _say(text: str) -> None:
    print(f"keel supervise: {text}", flush=True)


def _due(txn: Txn) -> list[tuple[str, int, str]]:
    """(mission, lease epoch, why) of every mission that needs a host."""
    out = []
    for record in m.list_missions(txn):
        why = control.needs_host(txn, record)
        if why:
            lease = hostlease.get(txn, record.id)
            out.append((record.id, lease.epoch if lease else 0, why))
    return out


def run(args: argparse.Namespace) -> int:
    path = store_path(args)
    with open_store(args) as store:
        store.wait_out_outages(_say)
        tried: dict[tuple[str, int], tuple[int, float]] = {}  # (mission, epoch) -> (starts here, last start)
        _say(f"watching {store.describe()}")
        while True:
            for mission_id, epoch, why in store.read(_due):
                count, last = tried.get((mission_id, epoch), (0, 0.0))
                if time.monotonic() - last < SETTLE_S:
                    continue  # the host started last time is still taking over
                if count >= ATTEMPTS:
                    if count == ATTEMPTS:
                        _say(f"mission {mission_id}: {why}; {ATTEMPTS} hosts started here did not take it over")
                        tried[(mission_id, epoch)] = (count + 1, last)
                    continue
                pid = control.spawn_host(path, mission_id)
                tried[(mission_id, epoch)] = (count + 1, time.monotonic())
                _say(f"mission {mission_id}: {why}; host started here (pid {pid})")
            sys.stdout.flush()
            time.sleep(args.interval)
