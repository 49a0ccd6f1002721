"""`keel agents`: which outside ACP agents (Claude Code, Gemini CLI, Codex) are installed and runnable here,
with their versions and, for a missing one, the command that installs it. Runs nothing but `node
--version`. Exit 0 when at least one agent is runnable, 1 otherwise (a script can test for it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from keel.agents.acp.presets import PRESETS, Preset, find
from keel.server.commands import help_of
from keel.server.exits import Exit

MIN_NODE = 20


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("agents", parents=[common], help=help_of("agents"))
    p.set_defaults(run=run_agents)


def run_agents(args: argparse.Namespace) -> int:
    node = node_version()
    rows = [describe(preset, node) for preset in PRESETS.values()]
    if args.json:
        print(json.dumps({"node": node, "agents": rows}, indent=2))
    else:
        print(f"node: {node or 'not found on PATH (the agents need Node.js ' + str(MIN_NODE) + '+)'}")
        for row in rows:
            version = f" {row['version']}" if row["version"] else ""
            print(f"{row['name']:<8} {row['title']:<12} {row['status']:<13} {row['path']}{version}".rstrip())
            if row["status"] != "runnable":
                print(f"{'':<8} {row['fix']}")
        print('use one in a mission file: agent = { acp = "claude" }')
    return Exit.OK if any(r["status"] == "runnable" for r in rows) else Exit.FAILURE


def describe(preset: Preset, node: str) -> dict[str, Any]:
    path = find(preset)
    version = package_version(path) if path else ""
    if path is None:
        status, fix = "not installed", f"install: {preset.install}"
    elif not node_ok(node):
        status, fix = "needs node", f"install Node.js {MIN_NODE} or newer (found: {node or 'none'})"
    else:
        status, fix = "runnable", ""
    return {
        "name": preset.name,
        "title": preset.title,
        "package": preset.package,
        "status": status,
        "path": path or "",
        "version": version,
        "fix": fix,
    }


def node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return ""
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def node_ok(version: str) -> bool:
    try:
        return int(version.lstrip("v").split(".")[0]) >= MIN_NODE
    except ValueError:
        return False


def package_version(executable: str) -> str:
    """The version in the package.json of the npm package the executable belongs to."""
    for folder in Path(executable).resolve().parents:
        manifest = folder / "package.json"
        if manifest.is_file():
            try:
                data = json.loads(manifest.read_text())
            except (OSError, ValueError):
                return ""
            return str(data.get("version", "")) if isinstance(data, dict) else ""
    return ""
