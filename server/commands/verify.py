"""`keel verify`: check the store's LMDB structure, then every record and reference; exit 5 on any problem.

The structure (every page LMDB can reach) is walked first, here, with plain file reads: a truncated or
damaged file is reported page by page and its records are not read through LMDB at all.

LMDB keeps no checksums of its own: a damaged B-tree page can make it abort the process (an assertion)
or loop. So the walk runs in a child process with a time limit; a child that dies or overruns becomes a
reported problem ("the LMDB file is damaged"), never a crash or a hang of `keel verify` itself.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.errors import ErrorCode, KeelError
from keel.server.commands import help_of
from keel.server.commands.common import print_json, require_store
from keel.server.exits import Exit
from keel.storage import Store
from keel.storage.errors import CorruptRecordError, StoreDamagedError, render_key
from keel.storage.location import DATA_FILE
from keel.storage.verify import Problem, Report, verify_all, verify_structure

_CHILD = "import sys; from keel.server.commands.verify import child_main; sys.exit(child_main(sys.argv[1]))"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("verify", parents=[common], help=help_of("verify"))
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up (and report the store as damaged) after S seconds (default: 60 s plus 10 s per 100 MB of store)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = require_store(args)
    data = path / DATA_FILE
    if not data.exists():  # a PostgreSQL store: the server keeps its own pages; every record is read and checked
        with Store.open(path, create=False, readonly=True) as store:
            report = verify_all(store)
    else:
        timeout = args.timeout or 60.0 + data.stat().st_size / 10e6
        structure = verify_structure(data)  # plain reads: safe on any damage
        # LMDB would read damaged pages too: then its records are not read
        report = Report(problems=structure) if structure else verify_in_child(path, timeout)
    if args.json:
        print_json({"ok": report.ok, "records": report.records, "problems": report.problems})
    else:
        for problem in report.problems:
            print(f"CORRUPT {problem.db}/{problem.key}: {problem.message}")
        print(f"{report.records} records checked, {len(report.problems)} problems")
    return Exit.OK if report.ok else Exit.INTEGRITY


def verify_in_child(path: Path, timeout: float) -> Report:
    """Run verify_all on `path` in a child process; its death or a timeout is reported as damage."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return _damaged(f"verification did not finish within {timeout:.0f} s (a damaged B-tree can loop)")
    if proc.returncode < 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        name = signal.Signals(-proc.returncode).name
        return _damaged(f"LMDB stopped the reader with {name}: {detail[0]}".rstrip(": "))
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise KeelError(f"verification failed: {tail[0]}") from None
    if "error" in answer:
        error = KeelError(answer["error"]["message"])
        error.code = ErrorCode(answer["error"]["code"])
        raise error
    return msgspec.convert(answer["report"], Report)


def _damaged(message: str) -> Report:
    return Report(problems=[Problem(db="*", key="", message=f"the LMDB file is damaged: {message}")])


def child_main(path: str) -> int:
    """The child's side: open, verify, print one JSON answer on stdout."""
    answer: dict[str, Any]
    try:
        with Store.open(path, create=False, readonly=True) as store:
            answer = {"report": verify_all(store)}
    except (StoreDamagedError, CorruptRecordError) as exc:
        answer = {"report": Report(problems=[_problem_of(exc)])}
    except KeelError as exc:
        answer = {"error": {"code": int(exc.code), "message": exc.message}}
    sys.stdout.buffer.write(msgspec.json.encode(answer))
    return 0


def _problem_of(exc: KeelError) -> Problem:
    if isinstance(exc, CorruptRecordError):
        return Problem(db=exc.db, key=render_key(exc.key), message=exc.reason)
    return Problem(db="*", key="", message=exc.message)
