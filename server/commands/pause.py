"""`keel pause ID`, `keel cancel ID`, `keel answer ID TEXT`: durable control requests to a mission's host;
and `keel delete ID`, which forgets a finished mission."""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

from keel.protocol.records import MissionRecord
from keel.protocol.states import MissionState, can
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import control
from keel.server.exits import Exit
from keel.server.hoststart import start_host
from keel.storage import Store
from keel.storage import missions as m

PAUSABLE = frozenset(state for state in MissionState if can(state).pause)
CANCELLABLE = frozenset(state for state in MissionState if can(state).cancel)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("pause", parents=[common], help=help_of("pause"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to this long until the mission is paused"
    )
    p.set_defaults(run=run_pause)
    p = sub.add_parser("cancel", parents=[common], help=help_of("cancel"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to this long until the mission is cancelled"
    )
    p.set_defaults(run=run_cancel)
    p = sub.add_parser("delete", parents=[common], help=help_of("delete"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.set_defaults(run=run_delete)
    p = sub.add_parser("answer", parents=[common], help=help_of("answer"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("text", help="the answer")
    p.add_argument("--no-resume", action="store_true", help="record the answer but do not resume")
    p.set_defaults(run=run_answer)


def run_pause(args: argparse.Namespace) -> int:
    return _control(args, "pause", lambda store, mid: control.request_pause(store, mid, source="cli"), PAUSABLE)


def run_cancel(args: argparse.Namespace) -> int:
    where = store_path(args)
    request = functools.partial(control.request_cancel, source="cli", store_path=where)
    return _control(args, "cancel", request, CANCELLABLE)


def _control(
    args: argparse.Namespace,
    action: str,
    request: Callable[[Store, str], MissionRecord],
    waits: frozenset[MissionState],
) -> int:
    """Record a pause or cancel, then wait up to --wait while the mission is in one of `waits` (until the host
    acted on it)."""
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        record = request(store, mission_id)
        deadline = time.monotonic() + args.wait
        while record.state in waits and time.monotonic() < deadline:
            time.sleep(0.05)
            record = store.read(lambda t: m.get_mission(t, mission_id))
    if args.json:
        print_json({"mission": mission_id, "state": record.state.value})
    else:
        print(f"mission {mission_id}: {action} requested ({record.state.value})")
    return Exit.OK


def run_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        control.delete_mission(store, store_path(args), mission_id)
    if args.json:
        print_json({"deleted": mission_id})
    else:
        print(f"mission {mission_id}: deleted")
    return Exit.OK


def run_answer(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
    control.answer(store_path(args), mission_id, args.text, source="cli", resume=not args.no_resume, start=start_host)
    then = "recorded" if args.no_resume else "recorded; the mission resumes"
    if args.json:
        print_json({"mission": mission_id, "answer": args.text, "resumed": not args.no_resume})
    else:
        print(f"mission {mission_id}: answer {then}")
    return Exit.OK
