"""The `run` tool: a shell command in the sandbox, in its own process group, with a time limit.

The command sees only the context's environment (plus PATH/HOME/LANG defaults), never the host's:
keel's own process may hold provider keys and the store's credentials in its environment. What of keel's
environment a mission's commands get is an allowlist (`passed_env`): PATH, HOME, LANG, LC_*, TERM,
TMPDIR, TZ, and the names the mission file lists in `[permissions] env`; then its `[env]` values.
On timeout the whole process group is killed with SIGKILL; after a normal exit any background process
the command left in its group is killed too, so nothing outlives the call. Output is kept as a capped
tail of stdout and stderr.

Reconcile: a command's effects cannot be read back from the sandbox, so an interrupted `run` is
unknown (a person decides) unless the call was marked `idempotent`, in which case running it again is
safe.

A command that exits non-zero when the sandbox's filesystem was full raises DiskFullError instead of
returning a result: its stderr says there is no space, the least free space seen while it ran (looked at
every SPACE_POLL_S) or after it is under the margin, or a write of keel's own met a full disk there
meanwhile (diskspace.command_failed_for_space). A command that failed for want of space and then removed
what it wrote (a build deleting its partial output) leaves room behind it, so the space after it is not
enough to tell. The failure is the full disk's, not the command's, so it is not journaled; the mission
pauses with reason disk_full, and after space is freed the intent is reconciled like any interrupted
call (a verification runs again: toolcalls.py). Depends on the stdlib, keel.protocol, server/processes.py
and the other server/tools modules only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from keel.protocol.agent import ToolRunResult
from keel.protocol.diskspace import command_failed_for_space, disk_full, free_or_none
from keel.protocol.tools import SPECS
from keel.server import background
from keel.server.processes import kill_group
from keel.server.tools.base import Reconciled, ToolClass, ToolContext, ToolError, arg, failure
from keel.server.tools.paths import relative, resolve

OUTPUT_TAIL_BYTES = 16 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
PASSED_ENV = ("PATH", "HOME", "LANG", "TERM", "TMPDIR", "TZ")  # keel's, when set; LC_* too (passed_env)
_DRAIN_S = 2.0  # how long to wait for the pipes to close after the process group is gone
OWNER_VAR = "KEEL_COMMAND_OF"  # in every command's environment: whose command it is (processes.kill_tagged)
SPACE_POLL_S = 0.05  # how often the free space of the sandbox's filesystem is looked at while a command runs


class _LeastFree:
    """The least free space seen on the filesystem holding `path` while a command runs, and after it."""

    def __init__(self, path: Path) -> None:
        self.path, self.least = path, free_or_none(path)

    def look(self) -> int | None:
        free = free_or_none(self.path)
        if free is not None and (self.least is None or free < self.least):
            self.least = free
        return self.least

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(SPACE_POLL_S)
            await asyncio.to_thread(self.look)


class _Tail:
    """The last `cap` bytes of a stream, and how many bytes were dropped before them."""

    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.data += chunk
            if len(self.data) > self.cap:
                cut = len(self.data) - self.cap
                del self.data[:cut]
                self.dropped += cut

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def passed_env(
    named: Iterable[str], given: Mapping[str, str], never: Collection[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """What a mission's commands get of keel's own environment (`environ`), by allowlist: PASSED_ENV and
    LC_*, and the names the mission file lists in `[permissions] env`, except any name in `never` (the
    store's settings, the providers' key variables); then the mission's `[env]` values (`given`).
    Nothing else of keel's environment: not KEEL_STORE, not DATABASE_URL, not a password or a token."""
    names = {*PASSED_ENV, *named, *(k for k in environ if k.startswith("LC_"))} - set(never)
    return {**{k: environ[k] for k in sorted(names) if k in environ}, **given}


def command_env(ctx: ToolContext) -> dict[str, str]:
    """The command's whole environment: defaults, then the mission's env. Never os.environ.

    PYTHONDONTWRITEBYTECODE: an edit that keeps a file's size within the same second leaves a stale
    .pyc that Python trusts, so a verification would test the old code (and __pycache__ would clutter
    the workspace diff)."""
    return {
        "PATH": DEFAULT_PATH,
        "HOME": str(ctx.sandbox),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        **ctx.env,
    }


def command_owner(mission_id: str, lane: str = "") -> str:
    """The tag (in `OWNER_VAR`) of the commands a mission's unit runs: `<mission>/<lane>`."""
    return f"{mission_id}/{lane}"


class Run:
    name = "run"
    klass: ToolClass = "effectful"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def preview(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        cmd = arg(args, "cmd", str)
        if not cmd.strip():
            raise ToolError("argument 'cmd' is empty")
        cwd = resolve(ctx.root, arg(args, "cwd", str, "."))
        if not cwd.is_dir():
            raise ToolError(f"cwd {args.get('cwd')!r} is not a folder in the sandbox")
        return {
            "cmd": cmd,
            "cwd": relative(ctx.root, cwd) or ".",
            "verify": arg(args, "verify", bool, False),
            "idempotent": arg(args, "idempotent", bool, False),
        }

    def reconcile(self, ctx: ToolContext, preview: dict[str, Any]) -> Reconciled:
        if preview.get("idempotent"):
            return Reconciled(done=False, reason="the command is marked idempotent: running it again is safe")
        return Reconciled(
            done=None,
            reason=f"command {preview['cmd']!r} may or may not have run; its effects "
            "cannot be read back from the sandbox",
        )

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolRunResult:
        try:
            intent = self.preview(ctx, args)
            limit = min(arg(args, "timeout_s", float, ctx.timeout_s), ctx.timeout_s)
        except ToolError as exc:
            return failure(exc)
        if limit <= 0:
            return ToolRunResult(ok=False, error=f"timeout_s must be positive, got {limit}")
        return await self._execute(ctx, intent, limit)

    async def _execute(self, ctx: ToolContext, intent: dict[str, Any], limit: float) -> ToolRunResult:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            intent["cmd"],
            cwd=ctx.root / intent["cwd"],
            env=command_env(ctx),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        background.lower(proc.pid)  # a command a unit runs is background work, in a session of its own (background.py)
        out, err = _Tail(OUTPUT_TAIL_BYTES), _Tail(OUTPUT_TAIL_BYTES)
        assert proc.stdout is not None and proc.stderr is not None
        readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
        space = _LeastFree(ctx.sandbox)
        watching = asyncio.create_task(space.watch())
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), limit)
        except TimeoutError:
            timed_out = True
        finally:
            watching.cancel()
            kill_group(proc.pid)  # on timeout, cancellation, and leftovers after a normal exit
            await proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(readers, _DRAIN_S)
        output = {
            "cmd": intent["cmd"],
            "cwd": intent["cwd"],
            "exit_code": proc.returncode,
            "timed_out": timed_out,
            "duration_s": round(time.monotonic() - started, 3),
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_dropped_bytes": out.dropped,
            "stderr_dropped_bytes": err.dropped,
            "verify": intent["verify"],
        }
        why = command_failed_for_space(proc.returncode, timed_out, err.text(), space.look(), ctx.full_disk())
        if why:
            raise disk_full(
                ctx.sandbox, f"command {intent['cmd'][:80]!r} exited with code {proc.returncode}: {why}", "the sandbox"
            )
        if timed_out:
            error = f"command timed out after {limit:g} s; its process group was killed"
        elif intent["verify"] and proc.returncode != 0:
            error = f"verification failed: exit code {proc.returncode}"
        else:
            return ToolRunResult(ok=True, output=output)
        return ToolRunResult(ok=False, output=output, error=error)
