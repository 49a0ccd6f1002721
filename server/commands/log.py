"""`keel log ID`: what the agent did, on the terminal — the same activity the editor's view shows.

Every step in order (model calls, tool calls with arguments, results and diffs, verifications,
questions and answers, failovers, restarts), filtered by unit, kind or failure; `--follow` keeps printing
new steps until the mission ends; `--json` prints one JSON object per line (the `keel/activity` item).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from keel.server.activity.items import KINDS, ActivityItem
from keel.server.activity.pricing import configured_prices
from keel.server.activity.reader import DEFAULT_LIMIT, MAX_LIMIT, Filter, read_page
from keel.server.commands import help_of
from keel.server.commands.common import open_store
from keel.server.exits import Exit
from keel.storage import missions as m

ENDED = ("completed", "failed", "cancelled")
FOLLOW_POLL_S = 0.2


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("log", parents=[common], help=help_of("log"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("--unit", metavar="U", default="", help="only this unit's steps")
    p.add_argument("--kind", metavar="K", action="append", choices=KINDS, help="only steps of this kind (repeatable)")
    p.add_argument("--failures", action="store_true", help="only what failed")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new steps until the mission ends")
    p.add_argument("--diffs", action="store_true", help="print each file change's diff in full")
    p.set_defaults(run=run_log)


def run_log(args: argparse.Namespace) -> int:
    wanted = Filter(unit=args.unit, kinds=frozenset(args.kind or ()), failures_only=args.failures)
    with open_store(args, readonly=True) as store:
        record = store.read(lambda t: m.get_mission(t, m.resolve_mission_id(t, args.id)))
        prices = configured_prices(Path(record.workspace))
        cursor, limit = "", DEFAULT_LIMIT  # the first screen at once, then longer pages
        while True:
            page = read_page(store, record.id, cursor=cursor, limit=limit, filter=wanted, prices=prices)
            limit = MAX_LIMIT
            for item in page.items:
                _print(item, args)
            sys.stdout.flush()
            cursor = page.cursor
            if page.more:
                continue
            if not args.follow or (page.state in ENDED and not page.items):
                return Exit.OK
            time.sleep(FOLLOW_POLL_S)


def _print(item: ActivityItem, args: argparse.Namespace) -> None:
    if args.json:
        sys.stdout.write(json.dumps(msgspec.to_builtins(item), sort_keys=True) + "\n")
        return
    for line in render(item, diffs=args.diffs):
        sys.stdout.write(line + "\n")


def render(item: ActivityItem, *, diffs: bool = False) -> list[str]:
    """An item as terminal lines: one headline, then indented details."""
    clock = time.strftime("%H:%M:%S", time.localtime(item.at))
    mark = "✗" if item.failed else " "
    lines = [f"{clock} {mark} {item.unit or '-':<12} {item.kind:<12} {item.title}"]
    pad = " " * 11
    if item.args:
        lines.append(f"{pad}args      {json.dumps(item.args, ensure_ascii=False)[:300]}")
    if item.kind == "tool" and item.result:
        lines.append(f"{pad}result    {item.result}")
    if item.duration_ms:
        lines.append(f"{pad}took      {item.duration_ms:.0f} ms")
    if item.kind == "model":
        cost = f", cost {item.cost:g}" if item.cost is not None else ""
        lines.append(f"{pad}tokens    {item.tokens_in} in, {item.tokens_out} out{cost} ({item.status})")
    for change in item.files:
        lines.append(f"{pad}file      {change.path}")
        if diffs:
            lines += [f"{pad}  {line}" for line in change.diff.splitlines()]
    if item.text and item.text not in item.title:
        text = item.text.strip().splitlines()
        lines += [f"{pad}| {line}" for line in text[:12]]
        if len(text) > 12:
            lines.append(f"{pad}| … ({len(text) - 12} more lines; --json shows all)")
    return lines
