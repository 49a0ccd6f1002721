"""`keel pause ID` and `keel answer ID TEXT`: durable control requests to a mission's host."""

from __future__ import annotations

import argparse
import time
from typing import Any

from keel.protocol.states import can
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import control
from keel.server.exits import Exit
from keel.server.hoststart import start_host
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("pause", parents=[common], help=help_of("pause"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to this long until the mission is paused"
    )
    p.set_defaults(run=run_pause)
    p = sub.add_parser("answer", parents=[common], help=help_of("answer"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("text", help="the answer")
    p.add_argument("--no-resume", action="store_true", help="record the answer but do not resume")
    p.set_defaults(run=run_answer)


def run_pause(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        record = control.request_pause(store, mission_id, source="cli")
        deadline = time.monotonic() + args.wait
        while can(record.state).pause and time.monotonic() < deadline:  # until the host acted on it
            time.sleep(0.05)
            record = store.read(lambda t: m.get_mission(t, mission_id))
    if args.json:
        print_json({"mission": mission_id, "state": record.state.value})
    else:
        print(f"mission {mission_id}: pause requested ({record.state.value})")
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
