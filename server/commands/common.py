"""Helpers every CLI verb shares: opening the store the flags name, printing data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.errors import NotFoundError
from keel.storage import Store
from keel.storage.location import default_store_path


def store_path(args: argparse.Namespace) -> Path:
    """The store's folder, absolute: processes keel starts (hosts, workers in a sandbox) run elsewhere."""
    return (Path(args.store) if getattr(args, "store", None) else default_store_path()).absolute()


def store_exists(args: argparse.Namespace) -> bool:
    return (store_path(args) / "data.mdb").exists()


def require_store(args: argparse.Namespace) -> Path:
    """The store's folder; a missing store is NotFoundError (exit 6), said plainly."""
    path = store_path(args)
    if not (path / "data.mdb").exists():
        raise NotFoundError(f"no keel store at {path} (run a mission first, or pass --store DIR)")
    return path


def open_store(args: argparse.Namespace, *, create: bool = False, readonly: bool = False) -> Store:
    """Open the store the flags name; creating one gives its `.keel/` folder a .gitignore. `readonly`
    (verbs that only look) never waits on a writer, even a frozen one."""
    path = store_path(args) if create else require_store(args)
    return Store.open(path, create=create, readonly=readonly and not create)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True) + "\n")
