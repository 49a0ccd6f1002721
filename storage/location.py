"""Where a store lives: `--store`, else $KEEL_STORE, else `<workspace>/.keel/store`.

The workspace's `.keel/` folder gets its own `.gitignore` (`*`) so that nothing of keel is ever
committed by accident.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_store_path(workspace: str | os.PathLike[str] | None = None) -> Path:
    env = os.environ.get("KEEL_STORE")
    if env:
        return Path(env).absolute()
    return (Path(workspace or Path.cwd()) / ".keel" / "store").absolute()


def prepare_keel_dir(store_path: Path) -> None:
    """Create the store's folder; if it is inside a `.keel` folder, give that folder a .gitignore."""
    store_path.mkdir(parents=True, exist_ok=True)
    keel_dir = store_path.parent
    if keel_dir.name == ".keel":
        ignore = keel_dir / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# keel's durable state; never commit it\n*\n")
