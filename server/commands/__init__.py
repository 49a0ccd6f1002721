"""CLI verbs, one module each; every module exposes `add_parser(sub, common)` and the handler it binds."""

from __future__ import annotations

from types import ModuleType

from keel.server.commands import bundle, gc, inspect, keys, pause, providers, run, verify

VERBS: list[ModuleType] = [inspect, run, pause, verify, providers, keys, bundle, gc]
