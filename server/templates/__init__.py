"""The starter files `keel init` writes (and the editors' "Create a Mission File" / "Open Config" write
through the language server): one source for their text, `write_starter` refusing to overwrite.
Depends on the standard library only.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from keel.protocol.errors import KeelError

MISSION = "mission.toml"
CONFIG = ".keel/config.toml"
STARTERS = {"mission": MISSION, "config": CONFIG}


class StarterExistsError(KeelError):
    """A starter file is there already; keel never overwrites a person's file."""


def starter_text(what: str) -> str:
    name = "mission.toml" if what == "mission" else "config.toml"
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


def write_starter(root: Path, what: str) -> Path:
    """Write the starter `what` ("mission" or "config") under `root`; StarterExistsError if it exists.
    Created exclusively (O_EXCL), so a file made at the same moment is not overwritten either."""
    if what not in STARTERS:
        raise ValueError(f"unknown starter {what!r} (known: {', '.join(STARTERS)})")
    path = root / STARTERS[what]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise StarterExistsError(f"{path} already exists; keel leaves it as it is (remove it to start over)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(starter_text(what))
    return path
