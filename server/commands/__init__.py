"""CLI verbs, one module each; every module exposes `add_parser(sub, common)` and the handler it binds."""

from __future__ import annotations

from types import ModuleType

from keel.server.commands import bundle, demo, gc, inspect, keys, pause, points, providers, run, serve, verify

VERBS: list[ModuleType] = [run, pause, inspect, points, demo, verify, bundle, gc, providers, keys, serve]
