"""A mission that leaves every kind of activity behind, for the `keel log` and `keel/activity` tests.

Unit `edit` writes a file, patches it, reads it, runs a passing verification, makes one model call
against a real OpenAI-compatible fault server on 127.0.0.1 (priced in the workspace's config), saves its
state and adds a note; unit `bad` (after it) fails a verification. The scripted agent runs it for real.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

PRICE_IN, PRICE_OUT = 2.0, 8.0  # per million tokens; the fault server answers with 7 in + 3 out
DIFF = "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
EDIT_STEPS: list[dict[str, Any]] = [
    {"tool": "write_file", "args": {"path": "a.py", "content": "x = 1\n"}},
    {"tool": "apply_diff", "args": {"diff": DIFF}},
    {"tool": "read_file", "args": {"path": "a.py"}},
    {"tool": "run", "args": {"cmd": f"{shlex.quote(sys.executable)} -m py_compile a.py", "verify": True}},
    {"model": {"messages": [{"role": "user", "content": "say hello"}], "purpose": "greeting"}},
    {"save_state": {"done": 1}},
    {"evidence": {"kind": "note", "summary": "checked by hand"}},
]
BAD_STEPS: list[dict[str, Any]] = [{"tool": "run", "args": {"cmd": "echo broken; exit 3", "verify": True}}]


def toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return json.dumps(value)


def write_activity_mission(root: Path, model_url: str, *, edit_first: list[dict[str, Any]] | None = None) -> Path:
    """`root/activity.toml` and `root/ws/.keel/config.toml` (provider "local" at model_url, priced)."""
    ws = root / "ws"
    (ws / ".keel").mkdir(parents=True, exist_ok=True)
    (ws / ".keel" / "config.toml").write_text(
        "[[providers]]\n"
        'name = "local"\nkind = "openai-compatible"\nmodel = "local-model"\nstream = false\n'
        f"endpoints = [{{ url = {json.dumps(model_url)} }}]\n"
        f"cost = {{ input_per_mtok = {PRICE_IN}, output_per_mtok = {PRICE_OUT} }}\n"
    )
    steps = (edit_first or []) + EDIT_STEPS
    text = "\n".join(
        [
            "[mission]",
            'name = "activity"',
            f"agent = {json.dumps(sys.executable + ' -m keel.agents.scripted')}",
            'workspace = "ws"',
            "",
            "[[units]]",
            'id = "edit"',
            f"params = {{ steps = {toml(steps)} }}",
            "",
            "[[units]]",
            'id = "bad"',
            'after = ["edit"]',
            f"params = {{ steps = {toml(BAD_STEPS)} }}",
            "",
        ]
    )
    path = root / "activity.toml"
    path.write_text(text)
    return path
