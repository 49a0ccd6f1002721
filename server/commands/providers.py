"""`keel providers [--json]`: every configured provider and endpoint with its health, last error, cooldown
and whether it served the last call — as the running hosts recorded it in the store (DB.PROVIDERS).

Reads configuration from the workspace (`--workspace`, default the current folder) and the user's file;
never reads keys (it only says where a key would come from).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import print_json, store_path
from keel.server.exits import Exit
from keel.server.providers.config import load_provider_config
from keel.server.providers.health import EndpointHealth
from keel.server.providers.view import provider_rows, stored_health
from keel.storage import Store
from keel.storage.location import store_exists


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("providers", parents=[common], help=help_of("providers"))
    p.add_argument("--workspace", metavar="DIR", help="workspace whose .keel/config.toml to read (default: .)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = load_provider_config(Path(args.workspace or os.getcwd()))
    rows = provider_rows(settings, _stored_health(args))
    if args.json:
        print_json({"sources": settings.sources, "endpoints": rows})
        return Exit.OK
    if not rows:
        print("no providers configured (add [[providers]] to .keel/config.toml or ~/.config/keel/config.toml)")
    now = time.time()
    for row in rows:
        flag = "*" if row["active"] else " "
        cool = f"  cooling {row['cooldown_until'] - now:.0f}s" if row["cooldown_until"] > now else ""
        where = "" if row["configured"] else "  (not in configuration)"
        print(
            f"{flag} {row['provider']}/{row['endpoint']}  {row['state']:<12} {row['model']}  {row['url']}{cool}{where}"
        )
        if row["last_error"]:
            print(f"    last error ({row['last_error_kind']}): {row['last_error']}")
    return Exit.OK


def _stored_health(args: argparse.Namespace) -> list[EndpointHealth]:
    path = store_path(args)
    if not store_exists(path):
        return []
    with Store.open(path, create=False, readonly=True) as store:
        return stored_health(store)
