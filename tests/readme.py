"""README.md's editor snippets, read at test time so that a README edit that breaks one fails its test.

Imports nothing from keel: it only reads README.md.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


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
