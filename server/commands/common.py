"""Helpers every CLI verb shares: opening the store the flags name, printing data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from keel.storage import Store
from keel.storage.errors import StoreError
from keel.storage.location import default_store_path, prepare_keel_dir


def store_path(args: argparse.Namespace) -> Path:
    return Path(args.store) if getattr(args, "store", None) else default_store_path()


def open_store(args: argparse.Namespace, *, create: bool = False) -> Store:
    path = store_path(args)
    if not create and not (path / "data.mdb").exists():
        raise StoreError(f"no keel store at {path} (run a mission first, or pass --store DIR)")
    if create:
        prepare_keel_dir(path)
    return Store.open(path, create=create)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True) + "\n")
