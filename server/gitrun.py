"""The one way keel runs git: one time limit, no prompt, and a full disk always a DiskFullError.

Every git command keel runs (sandboxes, merges, restores, apply, bundles, the demo) goes through `run`
or `run_bytes`. git reports a full disk in many words ("No space left on device", "Out of diskspace",
"unable to write new index file"), and the full filesystem is often not the one the command ran in:
a worktree's objects, refs and index live in the workspace's .git, which may sit on another disk. So a
failed command is a full disk when git says so, or, for a failure the caller treats as a fault (`fail`
given), when a filesystem it wrote to is all but full; the DiskFullError names the filesystem holding
the path that failed (a path git names, else the .git folders, else the folder it ran in).
Depends on keel.protocol only.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from keel.protocol.diskspace import disk_full, nearly_full, says_no_space
from keel.protocol.errors import ErrorCode, KeelError

#: The time limit of every git command (a commit or merge of a large sandbox on a slow disk included).
TIMEOUT = 120.0

#: Who keel's own commits (unit branches, merges, imported bundles) are made by; never `git config`.
IDENTITY = {
    "GIT_AUTHOR_NAME": "keel",
    "GIT_AUTHOR_EMAIL": "keel@localhost",
    "GIT_COMMITTER_NAME": "keel",
    "GIT_COMMITTER_EMAIL": "keel@localhost",
}

T = TypeVar("T", str, bytes)


class GitTimeoutError(KeelError):
    code = ErrorCode.TOOL


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None, fail: Callable[[str], Exception] | None = None
) -> subprocess.CompletedProcess[str]:
    """`git args` in `cwd`, output as text. A failure raises DiskFullError when it is a full disk, then
    `fail(git's message)` when given; otherwise the caller reads the return code."""
    return _run(cwd, args, True, None, env, fail)


def run_bytes(
    cwd: Path,
    *args: str,
    data: bytes | None = None,
    env: dict[str, str] | None = None,
    fail: Callable[[str], Exception] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`run` with bytes in (`data` on stdin) and out."""
    return _run(cwd, args, False, data, env, fail)


def batch(cwd: Path, *args: str) -> subprocess.Popen[bytes]:
    """A long-lived `git args` (e.g. `cat-file --batch`) that answers requests on its stdin, with pipes;
    the caller reads and writes them and ends it. No time limit: it waits for the caller's requests."""
    return subprocess.Popen(
        ["git", *args],
        cwd=str(cwd),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
    )


def _run(
    cwd: Path,
    args: Sequence[str],
    text: bool,
    data: bytes | None,
    env: dict[str, str] | None,
    fail: Callable[[str], Exception] | None,
) -> subprocess.CompletedProcess[T]:
    try:
        proc: subprocess.CompletedProcess[T] = subprocess.run(
            ["git", *args],
            cwd=str(cwd),
            capture_output=True,
            text=text,
            timeout=TIMEOUT,
            input=data,
            stdin=None if data is not None else subprocess.DEVNULL,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})},
        )
    except subprocess.TimeoutExpired:
        raise GitTimeoutError(f"git {_named(args)} in {cwd} did not finish in {TIMEOUT:.0f} s") from None
    except OSError as exc:
        if says_no_space(exc):
            raise disk_full(cwd, f"git {_named(args)}: {exc}") from None
        raise
    if proc.returncode != 0:
        message = _text(proc.stderr) or _text(proc.stdout)
        output = f"{_text(proc.stderr)}\n{_text(proc.stdout)}"
        full = full_filesystem_path(cwd, output, args, any_failure=fail is not None)
        if full is not None:
            lines = [line for line in output.splitlines() if says_no_space(line)] or message.splitlines()[-1:]
            raise disk_full(full, f"git {_named(args)}: {' '.join(lines)[:300]}")
        if fail is not None:
            raise fail(message[:500])
    return proc


def full_filesystem_path(cwd: Path, output: str, args: Sequence[str] = (), *, any_failure: bool) -> Path | None:
    """Where a failed git command in `cwd` hit a full filesystem, or None when it did not: when git's
    `output` says "no space", the first path it wrote to whose filesystem is all but full (else the first
    it names, else the folder it ran in); for `any_failure`, a written path whose filesystem is all but full
    even when git did not say why. The paths: those git names, absolute paths among its `args` (a new
    worktree's folder), the .git folders of `cwd`, and `cwd`."""
    given = [Path(arg) for arg in args if arg.startswith("/")]
    candidates = [*_named_paths(cwd, output), *given, *git_dirs(cwd), cwd]
    full = next((path for path in candidates if nearly_full(path)), None)
    if says_no_space(output):
        return full or candidates[0]
    return full if any_failure else None


def git_dirs(cwd: Path) -> list[Path]:
    """The git folders a command in `cwd` writes to: a worktree's own folder (from its .git link file)
    and the repository's common folder, or the .git folder itself."""
    dot = cwd / ".git"
    try:
        if dot.is_dir():
            return [dot.resolve()]
        if not dot.is_file():
            return []
        line = dot.read_text(errors="replace").strip()
    except OSError:
        return []
    if not line.startswith("gitdir:"):
        return []
    own = (cwd / line.split(":", 1)[1].strip()).resolve()
    try:
        common = (own / (own / "commondir").read_text().strip()).resolve()
    except OSError:
        return [own]
    return [own, common]


def _named_paths(cwd: Path, output: str) -> list[Path]:
    """Paths git names in its message ('quoted', or bare absolute ones), relative ones taken from `cwd`."""
    found = re.findall(r"'([^'\n]+)'", output) + re.findall(r"(?:^|\s)(/[^\s:'\"]+)", output)
    return [cwd / name if not name.startswith("/") else Path(name) for name in found if "/" in name]


def _named(args: Sequence[str]) -> str:
    return " ".join(args[:2])


def _text(out: str | bytes | None) -> str:
    if out is None:
        return ""
    return (out.decode(errors="replace") if isinstance(out, bytes) else out).strip()
