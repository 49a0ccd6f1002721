"""The `keel` command line: argument parsing and dispatch to the verbs in server/commands/.

Errors are one clear line on stderr (a traceback only with --debug); exit codes come from server/exits.py.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from keel.protocol import __version__
from keel.protocol.errors import KeelError
from keel.server.commands import VERBS, help_of, module_of
from keel.server.exits import Exit, exit_for


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"keel: error: {message}", file=sys.stderr)
        raise SystemExit(Exit.USAGE)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: every verb is listed, and only the verb named in argv (if any) is built in full,
    importing its module; the others are placeholders that carry their help."""
    parser = _Parser(prog="keel", description="keel — a durable runtime for long-running coding-agent missions.")
    parser.add_argument("--version", action="version", version=f"keel {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", metavar="DIR", help="store folder (default: $KEEL_STORE or ./.keel/store)")
    common.add_argument("--json", action="store_true", help="print data as JSON")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    chosen = next((arg for arg in argv if arg in VERBS), None)
    group = VERBS[chosen].module if chosen else None
    for name, verb in VERBS.items():
        if verb.module != group:
            sub.add_parser(name, help=help_of(name), add_help=False)
    if chosen:
        module_of(chosen).add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
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
            traceback.print_exc()
        print(f"keel: {exc.message}", file=sys.stderr)
        return exit_for(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"keel: internal error: {type(exc).__name__}: {exc} (run with --debug for details)", file=sys.stderr)
        return Exit.FAILURE


if __name__ == "__main__":
    sys.exit(main())
