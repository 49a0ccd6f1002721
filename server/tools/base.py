"""What every host-side tool is: its context, its protocol, its typed error and the reconcile verdict.

A tool runs inside one mission's sandbox folder. The engine journals every call: read-only tools are
just recorded with their result; effectful tools first record `preview()` (the intent: what the call
is about to do), then run, then record the result. After a crash between intent and result the engine
calls `reconcile()` with the recorded preview to learn whether the effect happened.

Error contract (the engine relies on it):
- `preview()` raises ToolError for arguments that cannot be used (bad path, diff that does not apply);
  nothing has happened then, and the engine answers the agent with `failure(exc)` without an intent.
- `run()` never raises for such problems: it returns ToolRunResult(ok=False, error=...).
- A full disk is not such a problem: `run()` raises DiskFullError (keel.protocol.errors) when a write
  fails with ENOSPC/EDQUOT or a command's failure counts as the sandbox's filesystem being full
  (diskspace.failed_for_space; `ToolContext.full_disk` says when a write of keel's own met it). The
  engine then journals no result and pauses the mission (disk_full); the intent is reconciled after the
  resume.

Depends on keel.protocol only (plus the stdlib); must not depend on storage or the engine.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from keel.protocol.agent import ToolRunResult
from keel.protocol.errors import ErrorCode, KeelError

ToolClass = Literal["read_only", "idempotent", "effectful"]


class ToolError(KeelError):
    """A tool call that cannot be carried out; the message says what was wrong and names the path."""

    code = ErrorCode.TOOL


@dataclass(frozen=True)
class ToolContext:
    """Where and how a tool runs: the sandbox root, the command time limit, the commands' environment."""

    sandbox: Path
    timeout_s: float = 120.0
    env: Mapping[str, str] = field(default_factory=dict)
    # why keel counts the sandbox's filesystem full because a write of its own (the store's) met a full disk
    # there, or "": a command failing meanwhile failed for want of space, whatever space is free after it
    full_disk: Callable[[], str] = field(default=lambda: "")

    @functools.cached_property
    def root(self) -> Path:
        """The sandbox's real path, resolved once per call (every path a tool touches is checked against it)."""
        return self.sandbox.resolve()


@dataclass(frozen=True)
class Reconciled:
    """The verdict on an effectful call whose result was never recorded.

    done=True: the effect is visibly in the sandbox; `result` is what the call would have returned.
    done=False: the effect is visibly absent; running the call now is safe.
    done=None: it cannot be told from the sandbox; `reason` says why, and a person must decide.
    """

    done: bool | None
    result: ToolRunResult | None = None
    reason: str = ""


class Tool(Protocol):
    name: str
    klass: ToolClass
    description: str
    parameters: dict[str, Any]

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolRunResult: ...

    def preview(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]: ...

    def reconcile(self, ctx: ToolContext, preview: dict[str, Any]) -> Reconciled: ...


def failure(exc: ToolError) -> ToolRunResult:
    return ToolRunResult(ok=False, error=exc.message)


def digest_bytes(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def file_digest(path: Path) -> str | None:
    """BLAKE2b of a file's bytes, or None when there is no file at `path`."""
    try:
        return digest_bytes(path.read_bytes())
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ToolError(f"{path.name!r} is a directory, not a file") from None


def arg(args: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    """One argument of the expected JSON type, or a ToolError naming it."""
    if name not in args or args[name] is None:
        if default is ...:
            raise ToolError(f"missing required argument {name!r}")
        return default
    value = args[name]
    if kind is int and isinstance(value, bool):
        raise ToolError(f"argument {name!r} must be an integer, got {value!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise ToolError(f"argument {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


class ReadOnlyTool:
    """Shared behaviour of read-only tools: `compute()` runs in a worker thread (file walks must not
    block the event loop), unless it is `brief` (a read of one small file); nothing to preview; always
    safe to run again."""

    klass: ToolClass = "read_only"

    def compute(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolRunResult:
        try:
            if self.brief(ctx, args):  # cheaper than the two thread hops a worker thread costs
                return ToolRunResult(ok=True, output=self.compute(ctx, args))
            return ToolRunResult(ok=True, output=await asyncio.to_thread(self.compute, ctx, args))
        except ToolError as exc:
            return failure(exc)

    def brief(self, ctx: ToolContext, args: dict[str, Any]) -> bool:
        """Whether `compute` is sure to be brief (one small file), so it runs on the caller's thread."""
        return False

    def preview(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    def reconcile(self, ctx: ToolContext, preview: dict[str, Any]) -> Reconciled:
        return Reconciled(done=False, reason="read-only: running it again is safe")
