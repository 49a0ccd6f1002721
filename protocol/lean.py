"""msgspec loaded at less cost, for keel's own processes (commands, hosts, units' workers).

Not for an agent's process: its own code may give msgspec typing_extensions' kinds of TypedDict fields."""

from __future__ import annotations

import importlib
import sys


def import_msgspec() -> None:
    """Import msgspec (every verb reads or writes records with it) without typing_extensions: msgspec
    imports that package when it can only to read its own kinds of TypedDict fields (Required, NotRequired),
    which keel's records never use, and importing it (with the inspect, ast and dis modules it pulls in)
    took a read verb such as `keel missions` a fifth of its start. Python's `typing` gives msgspec all it
    needs. A process that has typing_extensions already, or msgspec, is left as it is; a later import of
    typing_extensions (pygls, for `keel serve`) finds it as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # msgspec's `import` fails: it falls back
    try:
        importlib.import_module("msgspec")
    finally:
        del sys.modules["typing_extensions"]
