"""The read-only tools: read_file, list_files, search. Bounded outputs, never outside the sandbox.

list_files and search skip .git and .keel and do not follow symlinked folders. Depends on the stdlib,
keel.protocol and the other server/tools modules only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keel.protocol.tools import LIST_MAX_RESULTS, READ_MAX_BYTES, SEARCH_MAX_RESULTS, SPECS
from keel.server.tools.base import ReadOnlyTool, ToolContext, ToolError, arg
from keel.server.tools.paths import HIDDEN_DIRS, normalize, relative, resolve

SEARCH_MAX_FILE_BYTES = 2 * 1024 * 1024
SEARCH_LINE_CHARS = 400
BRIEF_READ_BYTES = 64 * 1024  # read_file of a file this small is read on the caller's thread


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over relative POSIX paths: `*` and `?` stay within a folder, `**/` spans
    any number of folders. A pattern without '/' matches the file name in any folder."""
    if "/" not in pattern:
        pattern = "**/" + pattern
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def walk_files(root: Path, start: Path) -> Iterator[Path]:
    """Files under `start` in sorted order, skipping hidden keel/git folders, symlinked folders and
    symlinks that point outside the sandbox."""
    if start.is_file():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in HIDDEN_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not path.is_symlink() or path.resolve().is_relative_to(root):
                yield path


def _existing(ctx: ToolContext, rel: str) -> Path:
    path = resolve(ctx.root, rel)
    if not path.exists():
        raise ToolError(f"path {rel!r} does not exist in the sandbox")
    return path


class ReadFile(ReadOnlyTool):
    name = "read_file"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def brief(self, ctx: ToolContext, args: dict[str, Any]) -> bool:
        """A look at the size only: `compute` checks the path (and says what is wrong at once)."""
        try:
            return os.stat(ctx.sandbox / normalize(str(args.get("path", "")))).st_size <= BRIEF_READ_BYTES
        except (ToolError, OSError):
            return True

    def compute(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        rel = arg(args, "path", str)
        path = _existing(ctx, rel)
        if not path.is_file():
            raise ToolError(f"path {rel!r} is a folder, not a file (use list_files)")
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            raise ToolError(f"file {rel!r} is binary ({len(data)} bytes); read_file reads text only")
        lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
        start = arg(args, "start_line", int, 1)
        end = arg(args, "end_line", int, len(lines))
        if start < 1 or end < start - 1:
            raise ToolError(f"line range {start}..{end} of {rel!r} is empty or reversed")
        cap = min(arg(args, "max_bytes", int, READ_MAX_BYTES), READ_MAX_BYTES)
        text = "".join(lines[start - 1 : end])
        encoded = text.encode()
        truncated = len(encoded) > cap
        if truncated:
            text = encoded[:cap].decode("utf-8", errors="ignore")
        last = min(end, len(lines)) if not truncated else start - 1 + text.count("\n")
        return {
            "path": relative(ctx.root, path),
            "content": text,
            "start_line": start,
            "end_line": last,
            "total_lines": len(lines),
            "truncated": truncated,
        }


class ListFiles(ReadOnlyTool):
    name = "list_files"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def compute(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        start = _existing(ctx, arg(args, "path", str, "."))
        matcher = glob_regex(arg(args, "glob", str, "*"))
        limit = min(arg(args, "max_results", int, LIST_MAX_RESULTS), LIST_MAX_RESULTS)
        files: list[str] = []
        truncated = False
        for path in walk_files(ctx.root, start):
            rel = relative(ctx.root, path)
            if matcher.match(rel):
                if len(files) == limit:
                    truncated = True
                    break
                files.append(rel)
        return {"files": files, "truncated": truncated}


class Search(ReadOnlyTool):
    name = "search"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def compute(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        source = arg(args, "pattern", str)
        try:
            regex = re.compile(source, re.IGNORECASE if arg(args, "ignore_case", bool, False) else 0)
        except re.error as exc:
            raise ToolError(f"pattern {source!r} is not a valid regular expression: {exc}") from None
        start = _existing(ctx, arg(args, "path", str, "."))
        matcher = glob_regex(arg(args, "glob", str, "*"))
        limit = min(arg(args, "max_results", int, SEARCH_MAX_RESULTS), SEARCH_MAX_RESULTS)
        matches: list[dict[str, Any]] = []
        for path in walk_files(ctx.root, start):
            rel = relative(ctx.root, path)
            if not matcher.match(rel) or path.stat().st_size > SEARCH_MAX_FILE_BYTES:
                continue
            data = path.read_bytes()
            if b"\0" in data[:8192]:
                continue
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if regex.search(line):
                    if len(matches) == limit:
                        return {"matches": matches, "truncated": True}
                    matches.append({"path": rel, "line": number, "text": line[:SEARCH_LINE_CHARS]})
        return {"matches": matches, "truncated": False}
