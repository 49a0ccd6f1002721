"""`keel gc [--keep-last N] [--keep POINT ...] [--dry-run] [--compact]`: remove what no mission reaches any more.

The store's part is storage/gc.py's plan, made in one read transaction and carried out by storage/gcsweep.py
in short write transactions (no other writer waits long for it); then the sandboxes and branches of finished,
merged units go (server/engine/units/unitgc.py); with `--compact` the LMDB file is rewritten without its free
pages (`Store.compact`: LMDB reuses freed pages but never gives them back to the filesystem). This module
parses the policy and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from keel.protocol.errors import ErrorCode, KeelError
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import faultpoints
from keel.server.engine.units import unitgc
from keel.server.exits import Exit
from keel.storage.errors import StoreBusyError
from keel.storage.gc import GcReport
from keel.storage.gcsweep import collect


class GcUsageError(KeelError):
    code = ErrorCode.USAGE


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "gc",
        parents=[common],
        help=help_of("gc"),
    )
    p.add_argument(
        "--keep-last",
        type=int,
        metavar="N",
        help="keep only each mission's last N restore points "
        "(plus the named ones and HEAD's); their whole parent chains stay",
    )
    p.add_argument(
        "--keep", nargs="+", default=[], metavar="POINT", help="restore points to keep: p3, a label, or MISSION:p3"
    )
    p.add_argument("--dry-run", action="store_true", help="report what would be removed; remove nothing")
    p.add_argument(
        "--compact",
        action="store_true",
        help="then rewrite the store's file without its free space (LMDB; no other process may have it open)",
    )
    p.set_defaults(run=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    if args.keep_last is not None and args.keep_last < 0:
        raise GcUsageError(f"--keep-last must be 0 or more (got {args.keep_last})")
    with open_store(args) as store:
        report = collect(
            store,
            keep_last=args.keep_last,
            keep=tuple(args.keep),
            dry_run=args.dry_run,
            planned=lambda _: faultpoints.pause_here("GC_PLANNED"),  # tests: writes between the plan and the sweep
        )
        units = unitgc.collect(store, store_path(args), dry_run=args.dry_run)
        compacted, busy = None, None
        try:
            compacted = store.compact() if args.compact and not args.dry_run else None
        except StoreBusyError as exc:  # what gc did stands; the file is left as it was
            busy = exc
    if args.json:
        sizes = {"compacted": {"bytes_before": compacted[0], "bytes_after": compacted[1]}} if compacted else {}
        print_json({**msgspec.to_builtins(report), "units": msgspec.to_builtins(units), **sizes})
    else:
        _describe(report, units, compacted, args.dry_run)
    if busy is not None:
        raise busy
    return Exit.OK


def _describe(report: GcReport, units: unitgc.UnitGcReport, compacted: tuple[int, int] | None, dry_run: bool) -> None:
    verb = "would remove" if dry_run else "removed"
    print(
        f"gc {verb} {report.blobs_removed} blobs ({report.bytes_freed} bytes), "
        f"{len(report.points_dropped)} restore points, {report.orphan_records} records of deleted missions; "
        f"{report.blobs_kept} blobs kept"
        + (f" ({report.blobs_spared} named again meanwhile)" if report.blobs_spared else "")
    )
    if report.transactions:
        plural = "s" if report.transactions != 1 else ""
        print(f"  in {report.transactions} write transaction{plural}, the longest {report.longest_txn_ms:.0f} ms")
    for point in report.points_dropped:
        print(f"  dropped restore point {point}")
    print("\n".join(unitgc.describe(units)))
    if compacted:
        print(f"compacted the store's file: {compacted[0]} -> {compacted[1]} bytes")
