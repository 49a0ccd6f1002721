"""`keel fork ID POINT`, `keel diff ID POINT [POINT2]` and `keel apply ID [--branch NAME]`.

Fork and diff work on restore points' file snapshots (server/engine/files/trees.py, restore.py); apply brings
a mission's result into the person's working tree (server/engine/apply.py). Each holds the mission's
host lock while it reads or rewrites a sandbox, so no host runs meanwhile.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.commands.points import mission_lock
from keel.server.engine.apply import apply_result
from keel.server.engine.files import trees
from keel.server.engine.restore import SANDBOX, fork, point_files
from keel.server.exits import Exit
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fork", parents=[common], help=help_of("fork"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("point", help="restore point id, e.g. p3")
    p.add_argument("--name", default="", help="the new mission's name (default: the original's)")
    p.set_defaults(run=run_fork)
    p = sub.add_parser("diff", parents=[common], help=help_of("diff"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("point", help="restore point id, e.g. p3")
    p.add_argument("point2", nargs="?", default="", help="second point (default: the sandbox as it is now)")
    p.set_defaults(run=run_diff)
    p = sub.add_parser("apply", parents=[common], help=help_of("apply"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument(
        "--branch",
        default="",
        metavar="NAME",
        help="commit the result on a new branch NAME instead (working tree untouched)",
    )
    p.set_defaults(run=run_apply)


def run_fork(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        with mission_lock(store, store_path(args), mission_id, "a fork"):
            record = fork(store, store_path(args), mission_id, args.point, args.name)
    if args.json:
        print_json(
            {
                "mission": record.id,
                "forked_from": record.forked_from,
                "sandbox": record.sandbox,
                "state": record.state.value,
            }
        )
    else:
        print(
            f"mission {record.id} forked from {mission_id} at {args.point} (paused); "
            f"continue with `keel resume {record.id}`"
        )
    return Exit.OK


def run_diff(args: argparse.Namespace) -> int:
    with open_store(args, readonly=True) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        old, old_blob, old_name = point_files(store, store_path(args), mission_id, args.point)
        new, new_blob, new_name = point_files(store, store_path(args), mission_id, args.point2 or SANDBOX)
        text = trees.unified_diff(old, new, old_blob, new_blob, old_name, new_name)
    if args.json:
        changed = sorted(p for p in set(old) | set(new) if old.get(p) != new.get(p))
        print_json(
            {
                "mission": mission_id,
                "from": old_name,
                "to": new_name,
                "diff": text,
                "files": [
                    {"path": p, "status": "added" if p not in old else "removed" if p not in new else "modified"}
                    for p in changed
                ],
            }
        )
    else:
        sys.stdout.write(text)
    return Exit.OK


def run_apply(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        with mission_lock(store, store_path(args), mission_id, "applying its result"):
            report = apply_result(store, store_path(args), mission_id, branch=args.branch)
    if args.json:
        print_json(report)
        return Exit.OK
    count = len(report.added) + len(report.modified) + len(report.removed)
    where = f"branch {report.branch} ({report.commit[:12]})" if report.branch else f"{report.target} (uncommitted)"
    print(
        f"applied mission {mission_id} to {where}: {len(report.modified)} modified, {len(report.added)} added, "
        f"{len(report.removed)} removed" + ("" if count else " (nothing to apply)")
    )
    return Exit.OK
