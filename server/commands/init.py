"""`keel init`: a starter `.keel/config.toml` (a local OpenAI-compatible model server, no key) and a
commented `mission.toml` for the coder agent, so that a newcomer goes from nothing to `keel run`.
Never overwrites a file: one that exists is named and left alone (exit 2 when nothing was written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from keel.server.commands import help_of
from keel.server.exits import Exit
from keel.server.templates import STARTERS, StarterExistsError, write_starter


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("init", parents=[common], help=help_of("init"))
    p.add_argument("folder", nargs="?", default=".", help="the workspace (default: the current folder)")
    p.set_defaults(run=run_init)


def run_init(args: argparse.Namespace) -> int:
    root = Path(args.folder)
    if not root.is_dir():
        print(f"keel: {root} is not a folder", file=sys.stderr)
        return Exit.USAGE
    written, kept = [], []
    for what in ("config", "mission"):
        try:
            written.append(write_starter(root, what))
        except StarterExistsError as exc:
            kept.append(root / STARTERS[what])
            print(f"keel: {exc.message}", file=sys.stderr)
    for path in written:
        print(f"wrote {path}")
    if written:
        print("next: start a local model server (see the comments in .keel/config.toml), then `keel run mission.toml`")
    return Exit.OK if written else Exit.USAGE
