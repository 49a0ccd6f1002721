"""The server's feature modules, registered in this one place.

Each module exposes `register(server)`: it adds its commands and requests and subscribes to mission
changes on `server.hub`. Order matters only for listeners: missionChanged goes out before progress
and questions for the same change.
"""

from __future__ import annotations

from types import ModuleType

from keel.server.lsp.features import (
    activity,
    control,
    missions,
    notices,
    progress,
    providers,
    questions,
    rewind,
    starters,
    subagents,
    supervision,
)

FEATURES: list[ModuleType] = [
    missions,
    control,
    rewind,
    progress,
    questions,
    notices,
    supervision,
    subagents,
    providers,
    activity,
    starters,
]
