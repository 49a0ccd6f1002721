"""`keel points ID` lists a mission's restore points; `keel restore ID POINT [--files]` rewinds to one."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keel.protocol.states import can
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import control
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostBusyError, HostLock
from keel.server.engine.restore import restore_files, restore_txn
from keel.server.exits import Exit
from keel.storage import Store
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("points", parents=[common], help=help_of("points"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.set_defaults(run=run_points)
    p = sub.add_parser("restore", parents=[common], help=help_of("restore"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("point", help="restore point id, e.g. p3")
    p.add_argument(
        "--files",
        action="store_true",
        help="also put the sandbox's files back as they were at the point (verified afterwards)",
    )
    p.set_defaults(run=run_restore)


def run_points(args: argparse.Namespace) -> int:
    with open_store(args, readonly=True) as store:
        points = store.read(lambda t: m.restore_points(t, m.resolve_mission_id(t, args.id)))
    if args.json:
        print_json(
            [
                {"id": p.id, "time": p.created_at, "reason": p.reason, "checkpoint": p.checkpoint, "label": p.label}
                for p in points
            ]
        )
        return Exit.OK
    for p in points:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.created_at))
        print(f"{p.id:<6} {stamp}  {p.reason}" + (f"  ({p.label})" if p.label else ""))
    return Exit.OK


@contextlib.contextmanager
def mission_lock(store: Store, path: Path, mission_id: str, what: str) -> Iterator[None]:
    """Hold the mission's host lock for the operation: no host can start while files are rewritten. A host that
    has stopped its mission (paused it, finished it) still holds the lock while it writes its last checkpoint
    and exits: it is waited for (control.wait_for_stopping_host); a host at work is an error that says so."""
    control.wait_for_stopping_host(store, path, mission_id)
    lock = HostLock(places.lock_path(path, mission_id), mission_id)
    try:
        lock.acquire()
    except HostBusyError:
        state = store.read(lambda t: m.get_mission(t, mission_id)).state
        then = f"pause it before {what}" if can(state).pause else f"its host has not exited; try {what} again"
        raise HostBusyError(f"mission {mission_id} is {state.value}; {then}") from None
    try:
        yield
    finally:
        lock.release()


def run_restore(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        with mission_lock(store, store_path(args), mission_id, "a restore"):
            if args.files:
                point = restore_files(store, store_path(args), mission_id, args.point)
            else:
                point = store.write(lambda t: restore_txn(t, mission_id, args.point))
    if args.json:
        print_json({"mission": mission_id, "point": point.id, "restored_to": args.point, "files": args.files})
    else:
        print(
            f"mission {mission_id}: restored to {args.point}{' with its files' if args.files else ''} as new "
            f"point {point.id}; continue with `keel resume {mission_id}`"
        )
    return Exit.OK
