"""The file-changing tools: write_file and apply_diff, with atomic commits and digest reconciliation.

Class choice: both are idempotent by content (the same call leaves the same bytes), but their result
(the diff of the change) depends on what was there before, so a blind re-run after a crash would report
an empty change. They are therefore classed `effectful`: the engine records `preview()` first, which
holds each file's digest before and after plus the diff, and `reconcile()` decides from the digests
alone, answering done/not-done for certain unless someone else changed the file in between.

Writes are atomic per file (temp file in the same folder + fsync + rename + folder fsync); apply_diff
computes every file's new content before it writes any, so a diff that fails anywhere changes nothing.
A write that fails because the sandbox's filesystem is full raises DiskFullError (never a result).
Depends on the stdlib, keel.protocol, the other server/tools modules and the engine's fault points only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from keel.protocol.agent import ToolRunResult
from keel.protocol.diskspace import disk_full, is_disk_full
from keel.protocol.tools import SPECS
from keel.protocol.treepaths import create_temp
from keel.server.engine import faultpoints
from keel.server.tools import udiff
from keel.server.tools.base import Reconciled, ToolClass, ToolContext, ToolError, arg, digest_bytes, failure
from keel.server.tools.paths import normalize, resolve

Changes = dict[str, bytes | None]  # relative path -> new bytes (None = delete)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_copy(path: Path, data: bytes) -> Path:
    """`data` durably in a temp file next to `path`, with `path`'s mode (or 0644 for a new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = create_temp(path)  # `.NAME.XXXXXXXX.keel-tmp`: never part of a snapshot or commit
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
        os.chmod(name, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return Path(name)


def commit(ctx: ToolContext, changes: Changes) -> None:
    """Write every change: all temp files first (nothing visible yet), then the renames and deletions."""
    targets = {rel: resolve(ctx.root, rel, for_write=True) for rel in changes}
    temps: dict[str, Path] = {}
    try:
        for rel, data in changes.items():
            if data is not None:
                temps[rel] = _temp_copy(targets[rel], data)
        faultpoints.pause_here("WRITE_TEMP")  # crash tests: the temp files written, none renamed yet
        for rel, temp in temps.items():
            os.replace(temp, targets[rel])
        for rel, data in changes.items():
            if data is None:
                targets[rel].unlink(missing_ok=True)
    except OSError as exc:
        for temp in temps.values():
            with contextlib.suppress(OSError):
                temp.unlink()
        failed = exc.filename or next(iter(targets.values()), ctx.sandbox)
        if is_disk_full(exc, failed):  # not the call's result: the engine pauses (disk_full) and retries it
            raise disk_full(failed, exc.strerror or str(exc), "the sandbox file") from None
        raise ToolError(f"cannot write {exc.filename or 'the change'}: {exc.strerror}") from None
    for folder in {targets[rel].parent for rel in changes}:
        _fsync_dir(folder)


def current(ctx: ToolContext, rel: str) -> bytes | None:
    """The bytes of `rel` in the sandbox, None if absent; ToolError if it is a folder or unreadable."""
    path = resolve(ctx.root, rel, for_write=True)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ToolError(f"path {rel!r} is a folder, not a file") from None
    except OSError as exc:
        raise ToolError(f"cannot read {rel!r}: {exc.strerror}") from None


def _digest(data: bytes | None) -> str | None:
    return None if data is None else digest_bytes(data)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _strict_text(rel: str, data: bytes | None) -> str | None:
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        raise udiff.DiffError(f"{rel}: the file is not UTF-8 text; a diff cannot be applied to it") from None


def reconcile_files(ctx: ToolContext, files: dict[str, dict[str, str | None]]) -> tuple[bool | None, str]:
    """(True, _) if every file is at its `after` digest, (False, _) if every one is at `before`,
    (None, reason) otherwise."""
    at_after, at_before, other = [], [], []
    for rel, digests in files.items():
        now = _digest(current(ctx, rel))
        if now == digests["after"]:
            at_after.append(rel)
        elif now == digests["before"]:
            at_before.append(rel)
        else:
            other.append(rel)
    if not other and not at_before:
        return True, "every file has the content the call writes"
    if not other and not at_after:
        return False, "every file still has the content it had before the call"
    parts = [f"changed as intended: {at_after}"] if at_after else []
    parts += [f"unchanged: {at_before}"] if at_before else []
    parts += [f"changed by something else: {other}"] if other else []
    return None, "the sandbox does not match the call's before or after state (" + "; ".join(parts) + ")"


def paths_written(tool: str, result: ToolRunResult) -> tuple[str, ...] | None:
    """The sandbox paths a successful call of keel's own file tools wrote or removed; None for any other
    call (a command, a failed write), after which a snapshot walks the whole sandbox."""
    output = result.output if result.ok and isinstance(result.output, dict) else {}
    if tool == "write_file" and isinstance(output.get("path"), str):
        return (output["path"],)
    if tool == "apply_diff" and isinstance(output.get("files"), dict):
        return tuple(output["files"])
    return None


class WriteFile:
    name = "write_file"
    klass: ToolClass = "effectful"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def preview(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        rel = normalize(arg(args, "path", str))
        after = arg(args, "content", str).encode()
        before = current(ctx, rel)
        return {
            "path": rel,
            "before": _digest(before),
            "after": digest_bytes(after),
            "bytes": len(after),
            "diff": udiff.make(rel, _text(before), after.decode()),
        }

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolRunResult:
        try:
            intent = self.preview(ctx, args)
            commit(ctx, {intent["path"]: args["content"].encode()})
        except ToolError as exc:
            return failure(exc)
        return self._result(intent)

    def reconcile(self, ctx: ToolContext, preview: dict[str, Any]) -> Reconciled:
        done, reason = reconcile_files(ctx, {preview["path"]: preview})
        return Reconciled(done, self._result(preview) if done else None, reason)

    @staticmethod
    def _result(intent: dict[str, Any]) -> ToolRunResult:
        return ToolRunResult(
            ok=True,
            output={
                "path": intent["path"],
                "created": intent["before"] is None,
                "bytes": intent["bytes"],
                "diff": intent["diff"],
                "before": intent["before"],  # content digests: the activity view shows both sides of the change
                "after": intent["after"],
            },
        )


class ApplyDiff:
    name = "apply_diff"
    klass: ToolClass = "effectful"
    description = SPECS[name].description
    parameters: dict[str, Any] = SPECS[name].parameters

    def _plan(self, ctx: ToolContext, diff: str) -> tuple[Changes, dict[str, dict[str, str | None]]]:
        originals: dict[str, bytes | None] = {}
        texts: dict[str, str | None] = {}
        for patch in udiff.parse(diff):
            rel = normalize(patch.path)
            if rel not in originals:
                originals[rel] = current(ctx, rel)
                texts[rel] = _strict_text(rel, originals[rel])
            if patch.old_path is None and texts[rel] is not None:
                raise udiff.DiffError(f"{rel}: the diff creates this file, but it already exists")
            if patch.old_path is not None and texts[rel] is None:
                raise udiff.DiffError(f"{rel}: the diff changes this file, but it does not exist")
            result = udiff.apply(texts[rel] or "", patch)
            if patch.new_path is None and result.strip():
                raise udiff.DiffError(f"{rel}: the diff deletes this file, but its hunks leave content behind")
            texts[rel] = None if patch.new_path is None else result
        changes: Changes = {rel: None if text is None else text.encode() for rel, text in texts.items()}
        digests = {rel: {"before": _digest(originals[rel]), "after": _digest(data)} for rel, data in changes.items()}
        return changes, digests

    def preview(self, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        diff = arg(args, "diff", str)
        _, digests = self._plan(ctx, diff)
        return {"files": digests, "diff": diff}

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolRunResult:
        try:
            diff = arg(args, "diff", str)
            changes, digests = self._plan(ctx, diff)
            commit(ctx, changes)
        except ToolError as exc:
            return failure(exc)
        return ToolRunResult(ok=True, output={"files": digests, "diff": diff})

    def reconcile(self, ctx: ToolContext, preview: dict[str, Any]) -> Reconciled:
        done, reason = reconcile_files(ctx, preview["files"])
        result = ToolRunResult(ok=True, output={"files": preview["files"], "diff": preview["diff"]})
        return Reconciled(done, result if done else None, reason)
