"""Unified diffs: parse them, apply them to text with context checking, and make them from two texts.

The applier checks every context and removed line. A hunk is tried at the line its header names, then
at the nearest other position after the previous hunk (like `patch` with offset, never with fuzz).
A hunk that fits nowhere raises DiffError naming the file, the hunk number and header, and the first
line that differs at the expected position. Line endings: lines compare without their end-of-line;
added lines take the file's own newline style. Depends on the stdlib only.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from keel.server.tools.base import ToolError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"


class DiffError(ToolError):
    """A diff that is malformed or does not apply; the message names the file and the hunk."""


@dataclass
class Hunk:
    header: str
    old_start: int
    new_start: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (" " | "-" | "+", text)
    new_no_eol: bool = False  # "\ No newline at end of file" after the new side's last line

    @property
    def old(self) -> list[str]:
        return [text for op, text in self.lines if op != "+"]

    @property
    def new(self) -> list[str]:
        return [text for op, text in self.lines if op != "-"]


@dataclass
class FilePatch:
    old_path: str | None  # None for a created file
    new_path: str | None  # None for a deleted file
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _header_path(line: str) -> str | None:
    raw = line[4:].split("\t")[0].strip()
    if raw == DEV_NULL:
        return None
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1]
    return raw[2:] if raw.startswith(("a/", "b/")) else raw


def _count(text: str | None) -> int:
    return 1 if text is None else int(text)


def _read_hunk(lines: list[str], i: int, patch: FilePatch) -> int:
    """Parse the hunk whose header is lines[i]; returns the index after it."""
    match = _HUNK.match(lines[i])
    number = len(patch.hunks) + 1
    if not match:
        raise DiffError(f"{patch.path}: hunk {number} header {lines[i].rstrip()!r} is not '@@ -l,s +l,s @@'")
    hunk = Hunk(lines[i].rstrip("\n"), int(match[1]), int(match[3]))
    old_left, new_left = _count(match[2]), _count(match[4])
    i += 1
    while old_left > 0 or new_left > 0:
        if i >= len(lines) or lines[i].startswith("@@"):
            raise DiffError(
                f"{patch.path}: hunk {number} ({hunk.header}) ends early: {old_left} old and "
                f"{new_left} new lines still expected by its header"
            )
        line = lines[i].rstrip("\n").removesuffix("\r")
        op, text = (line[0], line[1:]) if line else (" ", "")
        if op == "\\":
            i += 1
            continue
        if op not in " -+":
            raise DiffError(
                f"{patch.path}: hunk {number} ({hunk.header}) has a line that starts with neither "
                f"' ', '-' nor '+': {line[:80]!r}"
            )
        hunk.lines.append((op, text))
        old_left -= op != "+"
        new_left -= op != "-"
        if old_left < 0 or new_left < 0:
            raise DiffError(f"{patch.path}: hunk {number} ({hunk.header}) has more lines than its header says")
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        hunk.new_no_eol = hunk.lines[-1][0] != "-"
        i += 1
    patch.hunks.append(hunk)
    return i


def parse(diff: str) -> list[FilePatch]:
    """The file patches of a unified diff (plain or git style); DiffError if malformed or empty."""
    lines = diff.splitlines(keepends=True)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            patches.append(FilePatch(_header_path(line), _header_path(lines[i + 1])))
            i += 2
        elif line.startswith("@@"):
            if not patches:
                raise DiffError(f"line {i + 1}: hunk {line.strip()!r} comes before any '--- '/'+++ ' file header")
            i = _read_hunk(lines, i, patches[-1])
        else:
            i += 1  # "diff --git", "index", mode lines and commentary between files
    if not patches:
        raise DiffError("the diff has no '--- a/file' / '+++ b/file' header: not a unified diff")
    for patch in patches:
        if patch.old_path is None and patch.new_path is None:
            raise DiffError("a file header names /dev/null on both sides")
        if not patch.hunks:
            raise DiffError(f"{patch.path}: the diff has a header but no hunks for it")
    return patches


def _fits(lines: list[str], old: list[str], at: int) -> bool:
    return at + len(old) <= len(lines) and all(lines[at + k].rstrip("\r\n") == old[k] for k in range(len(old)))


def _locate(lines: list[str], hunk: Hunk, floor: int, path: str, number: int) -> int:
    old = hunk.old
    expected = max(hunk.old_start - 1 if old else hunk.old_start, floor)
    for delta in range(len(lines) + 1):
        for at in (expected + delta, expected - delta) if delta else (expected,):
            if floor <= at <= len(lines) and _fits(lines, old, at):
                return at
    detail = "it runs past the end of the file"
    for k, want in enumerate(old):
        if expected + k >= len(lines):
            break
        got = lines[expected + k].rstrip("\r\n")
        if got != want:
            detail = f"line {expected + k + 1} is {got[:80]!r} but the hunk expects {want[:80]!r}"
            break
    raise DiffError(
        f"{path}: hunk {number} ({hunk.header}) does not apply: {detail}; "
        "its context was not found anywhere else in the file either"
    )


def apply(text: str, patch: FilePatch) -> str:
    """`text` with every hunk of `patch` applied; DiffError naming the hunk that does not fit."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    pos = 0
    for number, hunk in enumerate(patch.hunks, 1):
        at = _locate(lines, hunk, pos, patch.path, number)
        out += lines[pos:at]
        cursor = at
        for op, body in hunk.lines:
            if op == " ":
                out.append(lines[cursor])
            if op == "+":
                out.append(body + newline)
            cursor += op != "+"
        pos = cursor
        if hunk.new_no_eol and pos == len(lines) and out:
            out[-1] = out[-1].rstrip("\r\n")
    out += lines[pos:]
    for k in range(len(out) - 1):  # a line that lost its end because lines now follow it gets one back
        if not out[k].endswith("\n"):
            out[k] += newline
    return "".join(out)


def make(path: str, before: str | None, after: str | None) -> str:
    """A unified diff of one file from `before` to `after` (None = the file does not exist)."""
    old, new = (before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True)
    lines = difflib.unified_diff(
        old, new, DEV_NULL if before is None else f"a/{path}", DEV_NULL if after is None else f"b/{path}"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
