"""`keel demo`: run the offline crash-and-resume demonstration (see server/engine/demo.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from keel.server.engine.demo import run_demo


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="show a mission surviving a SIGKILL (offline, < 1 min)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return run_demo(sys.stdout)
