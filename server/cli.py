"""The `keel` command line: argument parsing and dispatch to the verbs in server/commands/.

Errors are one clear line on stderr (a traceback only with --debug); exit codes come from server/exits.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from keel.protocol import __version__
from keel.protocol.environblock import blank_secrets
from keel.protocol.errors import KeelError
from keel.server.commands import VERBS, help_of, hosts, module_of
from keel.server.exits import Exit, exit_for


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal's width found as `shutil.get_terminal_size` finds it, without
    importing shutil (argparse makes a formatter for every argument it adds: the import cost every verb ~3 ms)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


def _columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    stdout = sys.__stdout__
    try:
        return (os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0) or 80
    except (ValueError, OSError):
        return 80


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"keel: error: {message}", file=sys.stderr)
        raise SystemExit(Exit.USAGE)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: only the verb named in argv (if any) is built in full, importing its module; the
    others are placeholders that carry their help, for `keel --help` and for a top-level error that lists the
    verbs. When argv starts with the verb, the top level prints neither (its usage names no verb), so the
    placeholders are left out: each is an ArgumentParser, and making them cost a read verb a tenth of its start."""
    parser = _Parser(prog="keel", description="keel — a durable runtime for long-running coding-agent missions.")
    parser.add_argument("--version", action="version", version=f"keel {__version__}")
    common = _Parser(add_help=False)
    common.add_argument("--store", metavar="DIR", help="store folder (default: $KEEL_STORE or ./.keel/store)")
    common.add_argument("--json", action="store_true", help="print data as JSON")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    chosen = next((arg for arg in argv if arg in VERBS), None)
    group = VERBS[chosen].module if chosen else None
    placeholders = VERBS if not argv or argv[0] != chosen else {}
    for name, verb in placeholders.items():
        if verb.module != group:
            sub.add_parser(name, help=help_of(name), add_help=False)
    if chosen:
        module_of(chosen).add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    blank_secrets()  # the commands and agents this process starts cannot read them from its /proc environ
    argv = sys.argv[1:] if argv is None else list(argv)
    if hosts(argv):  # its worker starter loads the units' worker code meanwhile (recovery by hand waits for it)
        from keel.server.engine.units import workerstarter

        workerstarter.warm()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "verb", None):
        parser.print_help()
        return Exit.USAGE
    try:
        return int(args.run(args))
    except BrokenPipeError:
        return Exit.OK
    except KeelError as exc:
        if args.debug:
            _print_traceback()
        print(f"keel: {exc.message}", file=sys.stderr)
        return exit_for(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless --debug
        if args.debug:
            _print_traceback()
        print(f"keel: internal error: {type(exc).__name__}: {exc} (run with --debug for details)", file=sys.stderr)
        return Exit.FAILURE


def _print_traceback() -> None:
    import traceback  # only with --debug: importing it costs every command a few ms

    traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
