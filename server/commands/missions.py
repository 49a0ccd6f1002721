"""`keel missions`: the list of the store's missions (read-only, and light: no engine imports)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_exists
from keel.server.exits import Exit
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("missions", parents=[common], help=help_of("missions"))
    p.set_defaults(run=run_missions)


def run_missions(args: argparse.Namespace) -> int:
    records = []
    if store_exists(args):  # no store yet simply means no missions yet
        with open_store(args, readonly=True) as store:
            records = store.read(m.list_missions)
    if args.json:
        print_json(records)
        return Exit.OK
    if not records:
        print("no missions")
    for r in records:
        reason = f" ({r.pause_reason.value})" if r.pause_reason else ""
        print(f"{r.id}  {r.state.value}{reason}  {r.spec.name}  {ago(r.updated_at)}")
    return Exit.OK


def ago(at: float) -> str:
    seconds = max(0, int(time.time() - at))
    if seconds < 90:
        return f"{seconds}s ago"
    if seconds < 5400:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"
