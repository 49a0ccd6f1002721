"""Helpers every CLI verb shares: opening the store the flags name, printing data."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.errors import NotFoundError
from keel.storage import Store
from keel.storage.location import resolve_store
from keel.storage.location import store_exists as _store_exists


def store_path(args: argparse.Namespace) -> Path:
    """The store's folder, absolute: processes keel starts (hosts, workers in a sandbox) run elsewhere.
    A PostgreSQL URL names a local folder holding only the URL (storage/location.py)."""
    return resolve_store(getattr(args, "store", None))


def store_exists(args: argparse.Namespace) -> bool:
    return _store_exists(store_path(args))


def require_store(args: argparse.Namespace) -> Path:
    """The store's folder; a missing store is NotFoundError (exit 6), said plainly."""
    path = store_path(args)
    if not _store_exists(path):
        raise NotFoundError(f"no keel store at {path} (run a mission first, or pass --store DIR)")
    return path


def open_store(
    args: argparse.Namespace,
    *,
    create: bool = False,
    readonly: bool = False,
    wait: Callable[[str], object] | None = None,
) -> Store:
    """Open the store the flags name; creating one gives its `.keel/` folder a .gitignore. `readonly`
    (verbs that only look) never waits on a writer, even a frozen one. `wait`: a long-running verb's (a
    worker, a supervisor): a database away, also at the first contact, is waited out and said through it."""
    path = store_path(args) if create else require_store(args)
    return Store.open(path, create=create, readonly=readonly and not create, wait=wait)


def print_json(value: Any) -> None:
    import json  # only for --json: the listing verbs start faster without it

    sys.stdout.write(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True) + "\n")
