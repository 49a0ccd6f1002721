"""What the editor plugin tests share: README.md's snippet for an editor (read at test time, so that a
README edit that breaks it fails its test), a mission that can be paused and then asks two questions, and the
editor subprocess that drives a plugin against it.

The drivers (tests/neovim/plugin_client.lua, tests/emacs/driver.el) read KEEL_EDITOR_MISSION and write
what they saw as JSON to KEEL_EDITOR_OUT.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lsp.conftest import mission_toml

README = Path(__file__).resolve().parent.parent / "README.md"
ASK_STEPS = [{"sleep": 0.2}] * 15 + [{"ask": q, "choices": ["yes", "no"]} for q in ("Ship it?", "Really?")]


def snippet(editor: str) -> str:
    """The first fenced code block after the line that introduces `editor` (`**Neovim**…` or `### Neovim`)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    heading = re.compile(rf"^(\*\*{re.escape(editor)}\*\*|#+ {re.escape(editor)}\b)")
    start = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    if start is None:
        raise AssertionError(f"README.md has no section introduced by **{editor}** or '### {editor}'")
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    if fence is None:
        raise AssertionError(f"README.md: no fenced code block after line {start + 1} ({editor})")
    end = next((i for i in range(fence + 1, len(lines)) if lines[i].startswith("```")), None)
    if end is None:
        raise AssertionError(f"README.md:{fence + 1}: the {editor} code block is never closed")
    return "\n".join(lines[fence + 1 : end]) + "\n"


@dataclass(frozen=True)
class EditorSession:
    """One editor run in `root`: the README's snippet as its init file, a mission file 'ship' next to it."""

    root: Path
    init: Path
    mission: Path

    @property
    def store(self) -> Path:
        return self.root / ".keel" / "store"

    def run(self, args: list[str], timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        """Runs the editor (`keel` on PATH, HOME in root) and returns it with what the driver saw."""
        out = self.root / "seen.json"
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "KEEL_EDITOR_MISSION": str(self.mission),
            "KEEL_EDITOR_OUT": str(out),
            "HOME": str(self.root),
            **{f"XDG_{d}_HOME": str(self.root / d.lower()) for d in ("CONFIG", "STATE", "DATA", "CACHE")},
        }
        proc = subprocess.run(args, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout)
        return proc, json.loads(out.read_text()) if out.exists() else {}


def editor_session(root: Path, editor: str, init_name: str) -> EditorSession:
    mission = root / "ship.toml"
    mission.write_text(mission_toml("ship", [{"id": "work", "title": "Do the work", "steps": ASK_STEPS}]))
    init = root / init_name
    init.write_text(snippet(editor))
    return EditorSession(root, init, mission)
