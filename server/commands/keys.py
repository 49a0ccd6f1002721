"""`keel key set PROVIDER [--stdin]` and `keel key delete PROVIDER`: API keys in the OS keyring.

`keel key set --signing [--stdin]` sets the bundle signing key (server/signing.py) the same way.

The key is read without echo (getpass) or, for scripts, as one line on stdin; it is stored under
service "keel", username PROVIDER, and is never printed, logged or written to the store.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from keel.protocol.errors import ErrorCode, KeelError
from keel.server.commands import help_of
from keel.server.exits import Exit
from keel.server.providers.secrets import SERVICE, KeyringSecrets
from keel.server.signing import set_signing_key


class KeyUsageError(KeelError):
    code = ErrorCode.USAGE


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("key", parents=[common], help=help_of("key"))
    verbs = p.add_subparsers(dest="key_verb", metavar="set|delete", required=True)
    s = verbs.add_parser("set", parents=[common], help="store PROVIDER's key (prompted without echo)")
    s.add_argument("provider", nargs="?", help="the provider name from [[providers]] name = ...")
    s.add_argument("--stdin", action="store_true", help="read the key as one line from standard input")
    s.add_argument(
        "--signing",
        action="store_true",
        help="set the bundle signing key instead (generated when neither --stdin nor a prompt gives one)",
    )
    s.set_defaults(run=run_set)
    d = verbs.add_parser("delete", parents=[common], help="delete PROVIDER's key")
    d.add_argument("provider")
    d.set_defaults(run=run_delete)


def run_set(args: argparse.Namespace) -> int:
    if args.signing:
        return _set_signing(args)
    if not args.provider:
        raise KeyUsageError("name the provider whose key to store (or pass --signing for the bundle signing key)")
    if args.stdin:
        value = sys.stdin.readline().strip()
    else:
        try:
            value = getpass.getpass(f"API key for {args.provider} (not echoed): ").strip()
        except EOFError:  # no terminal, and standard input ended before a line
            raise KeyUsageError(
                f"no key given for {args.provider}: there is no terminal to type it in and standard input is "
                f"empty; pipe it in: `printf '%s\\n' \"$KEY\" | keel key set {args.provider} --stdin`; nothing stored"
            ) from None
    if not value:
        raise KeyUsageError(f"no key given for {args.provider}; nothing stored")
    KeyringSecrets().set(args.provider, value)
    print(f"stored the key of {args.provider} in the OS keyring (service {SERVICE!r})", file=sys.stderr)
    return Exit.OK


def run_delete(args: argparse.Namespace) -> int:
    if KeyringSecrets().delete(args.provider):
        print(f"deleted the key of {args.provider} from the OS keyring", file=sys.stderr)
        return Exit.OK
    print(f"no key stored for {args.provider}", file=sys.stderr)
    return Exit.NOT_FOUND


def _set_signing(args: argparse.Namespace) -> int:
    """`keel key set --signing [--stdin]`: a given key, or a new random one (printed nowhere)."""
    value = sys.stdin.readline().strip() if args.stdin else None
    if args.stdin and not value:
        raise KeyUsageError("no signing key on standard input; nothing stored")
    where = set_signing_key(value)
    what = "stored the given" if value else "generated a new"
    print(
        f"{what} bundle signing key in {where}; other machines that import your bundles need the same key",
        file=sys.stderr,
    )
    return Exit.OK
