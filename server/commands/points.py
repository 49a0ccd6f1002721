"""`keel points ID` lists a mission's restore points; `keel restore ID POINT` rewinds to one."""

from __future__ import annotations

import argparse
import time
from typing import Any

from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import places
from keel.server.engine.hostlock import HostBusyError, HostLock
from keel.server.engine.restore import restore_txn
from keel.server.exits import Exit
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("points", parents=[common], help="list a mission's restore points")
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.set_defaults(run=run_points)
    p = sub.add_parser("restore", parents=[common], help="rewind a mission to a restore point (a new checkpoint)")
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("point", help="restore point id, e.g. p3")
    p.set_defaults(run=run_restore)


def run_points(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        points = store.read(lambda t: m.restore_points(t, m.resolve_mission_id(t, args.id)))
    if args.json:
        print_json([{"id": p.id, "time": p.created_at, "reason": p.reason, "checkpoint": p.checkpoint,
                     "label": p.label} for p in points])
        return Exit.OK
    for p in points:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.created_at))
        print(f"{p.id:<6} {stamp}  {p.reason}" + (f"  ({p.label})" if p.label else ""))
    return Exit.OK


def run_restore(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        lock = HostLock(places.lock_path(store_path(args), mission_id), mission_id)
        if lock.held_elsewhere():
            raise HostBusyError(f"mission {mission_id} is running; pause it before a restore")
        point = store.write(lambda t: restore_txn(t, mission_id, args.point))
    if args.json:
        print_json({"mission": mission_id, "point": point.id, "restored_to": args.point})
    else:
        print(f"mission {mission_id}: restored to {args.point} as new point {point.id}; "
              f"continue with `keel resume {mission_id}`")
    return Exit.OK
