"""`keel serve`: the language server on stdio (docs/lsp.md is its contract)."""

from __future__ import annotations

import argparse
from typing import Any

from keel.server.commands import help_of
from keel.server.lsp.app import serve


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help=help_of("serve"))
    p.add_argument("--log-file", metavar="FILE", help="write the server's log here instead of stderr")
    p.add_argument("--verbose", action="store_true", help="log debug details (including pygls)")
    p.add_argument("--stdio", action="store_true", help="accepted for editors that pass it; stdio is the default")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return serve(args.store, args.log_file, args.verbose)
