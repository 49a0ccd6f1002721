"""`keel verify`: check every record and reference of a store; exit 5 on any problem."""

from __future__ import annotations

import argparse
from typing import Any

from keel.server.commands.common import open_store, print_json
from keel.server.exits import Exit
from keel.storage.verify import verify_all


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("verify", parents=[common], help="check every record of the store")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        report = verify_all(store)
    if args.json:
        print_json({"ok": report.ok, "records": report.records, "problems": report.problems})
    else:
        for problem in report.problems:
            print(f"CORRUPT {problem.db}/{problem.key}: {problem.message}")
        print(f"{report.records} records checked, {len(report.problems)} problems")
    return Exit.OK if report.ok else Exit.INTEGRITY
