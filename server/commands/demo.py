"""`keel demo`: run the offline crash-and-resume demonstration (see server/engine/demo.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from keel.server.commands import help_of
from keel.server.engine.demo import run_demo


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help=help_of("demo"),
        description="Runs in a temporary folder. With --store DIR the mission is recorded in DIR "
        "and the sample repository is kept, to look at afterwards.",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Only an explicit --store counts: $KEEL_STORE names the person's working store, not a demo's."""
    return run_demo(sys.stdout, Path(args.store) if args.store else None)
