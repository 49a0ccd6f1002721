"""CLI verbs, one module each; every module exposes `add_parser(sub, common)` and the handler it binds."""

from __future__ import annotations

from types import ModuleType

from keel.server.commands import (
    bundle,
    demo,
    gc,
    init,
    inspect,
    keys,
    log,
    pause,
    points,
    providers,
    rewind,
    run,
    serve,
    verify,
)

VERBS: list[ModuleType] = [
    run,
    pause,
    inspect,
    log,
    points,
    rewind,
    demo,
    verify,
    bundle,
    gc,
    providers,
    keys,
    serve,
    init,
]
