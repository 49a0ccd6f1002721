"""CLI verbs: this table, and one module per group of verbs in this folder.

The table is all that `keel --help` needs. A verb's module (which may pull in the engine, the providers'
HTTP client and keyring, or pygls) is imported only when that verb is parsed or run, so the command line
starts fast. Each module exposes `add_parser(sub, common)`, which adds its verbs with `HELP` from here.
Imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

from keel.protocol.lean import import_msgspec


class Verb(NamedTuple):
    module: str  # under keel.server.commands
    help: str
    # runs a mission's host in this process or a fork of it, unless given one of these options: the command line
    # starts the units' worker starter before anything else (units/workerstarter.py)
    hosts_unless: frozenset[str] | None = None


VERBS: dict[str, Verb] = {
    "run": Verb("run", "start a mission from a mission file", frozenset({"--queue"})),
    "resume": Verb("run", "continue a paused or interrupted mission", frozenset()),
    "pause": Verb("pause", "pause a running mission at a consistent point"),
    "cancel": Verb("pause", "cancel a mission: its host stops its units and it ends cancelled"),
    "answer": Verb("pause", "answer the question a mission waits on", frozenset({"--no-resume"})),
    "delete": Verb("pause", "forget a completed, failed or cancelled mission and its sandbox"),
    "missions": Verb("missions", "list missions"),
    "status": Verb("inspect", "show one mission, or all"),
    "points": Verb("points", "list a mission's restore points"),
    "restore": Verb("points", "rewind a mission to a restore point (a new checkpoint)"),
    "fork": Verb("rewind", "make a new mission from a restore point (the original stays)"),
    "diff": Verb("rewind", "what changed in the sandbox between two restore points"),
    "apply": Verb("rewind", "bring a mission's result into your working tree as uncommitted changes"),
    "demo": Verb("demo", "show a mission surviving a SIGKILL (offline, < 1 min)"),
    "verify": Verb("verify", "check every record of the store"),
    "export": Verb("bundle", "write a mission and its sandbox changes to one bundle file"),
    "import": Verb("bundle", "verify a bundle and add its mission to this store"),
    "gc": Verb(
        "gc",
        "remove blobs and records that no restore point or HEAD reaches, and the sandboxe"
        "s and branches of finished units",
    ),
    "providers": Verb("providers", "show providers, endpoints and their health"),
    "key": Verb("keys", "store or delete a provider's API key in the OS keyring"),
    "serve": Verb("serve", "run the language server on stdio (LSP)"),
    "supervise": Verb("supervise", "start a host here for running missions whose host went silent (shared store)"),
    "worker": Verb("worker", "run units that missions offer to workers (`workers = true`), on this machine"),
    "log": Verb("log", "show what a mission's agents did, step by step"),
    "init": Verb("init", "write a starter .keel/config.toml and mission.toml"),
    "agents": Verb("agents", "list the outside ACP agents (Claude Code, Gemini CLI, Codex) installed here"),
}


def hosts(argv: list[str]) -> bool:
    """Whether the command `argv` (its verb first) may run a mission's host here or in a fork of this process."""
    verb = VERBS.get(argv[0]) if argv else None
    if verb is None or verb.hosts_unless is None:
        return False
    return not (verb.hosts_unless | {"-h", "--help"}).intersection(argv)


def help_of(verb: str) -> str:
    return VERBS[verb].help


def module_of(verb: str) -> ModuleType:
    import_msgspec()
    return importlib.import_module(f"keel.server.commands.{VERBS[verb].module}")
