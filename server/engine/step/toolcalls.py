"""Tool calls of a unit: permissions, the intent/result protocol for effects, reconciliation, evidence.

Read-only and idempotent tools run and are recorded. An effectful tool first records an intent (its
`preview`), runs, then records the result. An intent found without a result (the host died in between)
is reconciled against the sandbox: the effect is there (record its result), visibly absent (run it), or
undecidable (ask the person "rerun" or "skip"). A verification (`run` with verify=true) whose failure
was a full disk's (the tool raised DiskFullError: nothing of it is journaled) has its intent marked to run
again: it ran to its end, so nothing of it is in doubt but its verdict, and the resume runs the check
again instead of asking. Every entry is recorded through the unit's session (`UnitSteps.record`).
Depends on keel.server.tools, the journal and the engine's interface module; never on the host or
unitrun modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, NoReturn

import msgspec

from keel.protocol import agent as ap
from keel.protocol.diskspace import same_filesystem
from keel.protocol.errors import DiskFullError
from keel.protocol.records import Evidence, JournalEntry, Question
from keel.protocol.rpc import INVALID_PARAMS
from keel.protocol.spec import MissionSpec
from keel.protocol.states import QuestionKind
from keel.server.engine.agentproc import HandlerError, keel_only_env, plain_env
from keel.server.engine.interface import Step, StepResult, UnitSteps
from keel.server.engine.step.effects import decide, effect_of
from keel.server.tools import TOOLS, Tool, ToolContext, ToolError
from keel.server.tools.shell import OWNER_VAR, command_owner, passed_env
from keel.server.tools.writers import paths_written

RERUNNING = "rerunning"  # the summary of an intent recorded again to run an approved rerun


def mission_tool_env(spec: MissionSpec, hide: frozenset[str]) -> dict[str, str]:
    """What a mission's commands get of keel's environment: the allowlist (shell.passed_env) and the names
    its `[permissions] env` lists, never a name of `keel_only_env` (the store's, the providers' keys), then
    its `[env]` values; each command adds its OWNER_VAR tag."""
    return passed_env(spec.permissions.env, plain_env(spec.env), keel_only_env(hide), os.environ)


class ToolCalls:
    def __init__(self, session: UnitSteps) -> None:
        self.session = session
        # changes still being made or recorded, each with the number of the agent run that asked for it
        self._changing: dict[asyncio.Task[Any], int] = {}

    def _context(self) -> ToolContext:
        s = self.session
        owner = {OWNER_VAR: command_owner(s.host.mission_id, s.lane)}
        store, sandbox = s.host.store, s.sandbox
        return ToolContext(
            sandbox=sandbox,
            timeout_s=s.host.spec.permissions.command_timeout_s,
            env={**s.host.tool_env, **owner},  # an allowlist: no provider key, no store credential
            full_disk=lambda: full if (full := store.full_disk()) and same_filesystem(store.path, sandbox) else "",
        )

    async def run(self, call: ap.ToolRunParams, step: Step) -> Any:
        s = self.session
        allowed = s.host.spec.permissions.tools
        if call.tool not in allowed:
            why = f"tool {call.tool!r} is not allowed by this mission's permissions (allowed: {', '.join(allowed)})"
            denied = StepResult({"code": ap.ERR_TOOL_DENIED}, error=why, summary=f"{call.tool} denied")
            return await s.record(step, denied)
        tool = TOOLS.get(call.tool)
        if tool is None:
            why = f"unknown tool {call.tool!r} (known: {', '.join(sorted(TOOLS))})"
            return await s.record(step, StepResult({"code": INVALID_PARAMS}, error=why))
        if tool.klass == "read_only":
            return await self._finish(tool, self._context(), call, step)
        # an agent that dies mid-call cancels its request, but never the recording of a change already made
        task = asyncio.ensure_future(self._locked(tool, call, step))
        self._changing[task] = s.agent_run
        task.add_done_callback(lambda t: self._changing.pop(t, None))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved here if nobody awaits it
        return await asyncio.shield(task)

    async def _locked(self, tool: Tool, call: ap.ToolRunParams, step: Step) -> Any:
        async with self.session.changing():  # this unit's snapshot is never taken in the middle of its change
            return await self._change(tool, call, step)

    async def settle_earlier(self, run: int) -> bool:
        """Wait until no change asked for by an agent run before `run` is still being made or recorded (its
        agent died mid-call: the change goes on, and a restarted agent must be answered its outcome). True if
        there was one to wait for."""
        earlier = [task for task, asked_by in self._changing.items() if asked_by < run]
        if earlier:
            await asyncio.gather(*earlier, return_exceptions=True)
        return bool(earlier)

    async def _change(self, tool: Tool, call: ap.ToolRunParams, step: Step) -> Any:
        ctx = self._context()
        if step.intent is not None:
            return await self._recover(tool, ctx, call, step, step.intent)
        if tool.klass != "effectful":
            return await self._finish(tool, ctx, call, step)
        try:
            preview = tool.preview(ctx, call.args)
        except ToolError as exc:
            return await self._done(tool, call, step, ap.ToolRunResult(ok=False, error=exc.message))
        intent = StepResult(preview, phase="intent", tool_class=tool.klass, summary=_describe(call))
        await self.session.record_intent(step, intent, call.tool)
        return await self._finish(tool, ctx, call, step, preview)

    async def _finish(
        self, tool: Tool, ctx: ToolContext, call: ap.ToolRunParams, step: Step, preview: Any = None
    ) -> Any:
        try:
            result = await tool.run(ctx, call.args)
        except DiskFullError:
            if isinstance(preview, dict) and preview.get("verify"):
                await self._check_again_on_resume(tool, call, step, preview)
            raise
        return await self._done(tool, call, step, result)

    async def _check_again_on_resume(self, tool: Tool, call: ap.ToolRunParams, step: Step, preview: Any) -> None:
        """A verification a full disk failed: its intent is marked to run again, so the resume checks again
        instead of asking whether it happened. Where even that cannot be written (the store is full too), the
        intent stays as it was and the resume asks."""
        summary = f"{_describe(call)}: failed for want of space, run again on resume"
        again = StepResult(preview, phase="intent", tool_class=tool.klass, summary=summary, rerun=True)
        with contextlib.suppress(DiskFullError):
            await self.session.record(step, again)

    async def _done(
        self, tool: Tool, call: ap.ToolRunParams, step: Step, result: ap.ToolRunResult, effect: str = "done"
    ) -> Any:
        s = self.session
        evidence = tuple(evidence_for(s.unit_id, call, result, effect))
        recorded = StepResult(
            msgspec.to_builtins(result),
            tool_class=tool.klass,
            summary=_describe(call),
            evidence=evidence,
            paths=paths_written(call.tool, result),
        )
        return await s.record(step, recorded)

    async def _recover(
        self, tool: Tool, ctx: ToolContext, call: ap.ToolRunParams, step: Step, intent: JournalEntry
    ) -> Any:
        """An intent without a result at this step's number: decided as every effect in doubt is
        (effects.decide), with what the sandbox shows of it (the tool's `reconcile`)."""
        s = self.session
        await s.end_earlier_runs()  # the run that started it makes nothing after it is judged or made again
        verdict = None
        if not intent.rerun_approved:
            verdict = tool.reconcile(ctx, intent.result if isinstance(intent.result, dict) else {})
            s.host.stats["reconciled"] += 1
        seen = None if verdict is None or (verdict.done and verdict.result is None) else verdict.done
        effect = effect_of("tool/run", msgspec.to_builtins(call), str(s.sandbox))
        assert effect is not None
        decision = decide((), effect, "", at=intent, seen=seen)
        if decision.kind == "settle" and verdict is not None and verdict.result is not None:
            return await self._done(tool, call, step, verdict.result, effect="reconciled")
        if decision.kind == "run" and intent.rerun_approved:
            again = StepResult(intent.result, phase="intent", tool_class=tool.klass, summary=RERUNNING)
            await s.record_intent(step, again, call.tool)
            return await self._finish(tool, ctx, call, step, intent.result)
        if decision.kind == "run":  # its intent was recorded by an earlier run: the lease is renewed first
            await s.hold_lease(float("-inf"))
            return await self._finish(tool, ctx, call, step, intent.result)
        why = verdict.reason if verdict is not None and verdict.reason else "the sandbox cannot tell"
        await ask_rerun_or_skip(
            s,
            step,
            f"unit {s.unit_id}: the call {_describe(call)} may or may not have happened before keel stopped "
            f"({why}). Run it again (rerun), or keep going without running it again because it did happen (skip)?",
        )


async def ask_rerun_or_skip(session: UnitSteps, step: Step, text: str) -> NoReturn:
    """An effect in doubt (step.seq holds its intent): the mission waits for a person's "rerun" or "skip"
    (recovery.apply_answer turns the answer into the intent's entry), and the agent is told to stop."""
    question = Question(
        unit=session.unit_id,
        seq=step.seq,
        kind=QuestionKind.UNCERTAIN_EFFECT,
        fingerprint=step.fingerprint,
        lane=session.lane,
        choices=("rerun", "skip"),
        text=text,
    )
    await session.host.wait_for_input(question)
    raise HandlerError(ap.ERR_PAUSING, "the mission waits for a person's decision")


def _describe(call: ap.ToolRunParams) -> str:
    args = call.args
    target = args.get("path") or args.get("cmd") or args.get("pattern") or ""
    return f"{call.tool} {str(target)[:80]}".strip()


def evidence_for(unit: str, call: ap.ToolRunParams, result: ap.ToolRunResult, effect: str = "done") -> list[Evidence]:
    """Every invocation, each file diff it reports, and each verification (run with verify=true).
    `effect`: "done" (it ran), or "reconciled" (after a crash, the sandbox showed it had happened)."""
    now = time.time()
    out = result.output if isinstance(result.output, dict) else {}
    items = [
        Evidence(
            kind="tool",
            at=now,
            unit=unit,
            summary=f"{_describe(call)}: {'ok' if result.ok else 'failed'}",
            data={
                "tool": call.tool,
                "args": _short(call.args),
                "ok": result.ok,
                "error": result.error,
                "effect": effect,
            },
        )
    ]
    diff = out.get("diff")
    if diff:
        items.append(
            Evidence(
                kind="diff",
                at=now,
                unit=unit,
                summary=f"{out.get('path', call.args.get('path', ''))}",
                data={
                    "path": out.get("path", call.args.get("path", "")),
                    "diff": diff,
                    "before": out.get("before"),  # blob digests of the file's content (write_file)
                    "after": out.get("after"),
                },
            )
        )
    if call.args.get("verify"):
        code = out.get("exit_code", out.get("returncode"))
        items.append(
            Evidence(
                kind="verification",
                at=now,
                unit=unit,
                summary=f"{call.args.get('cmd')}: {'passed' if result.ok else 'failed'} (exit {code})",
                data={"cmd": call.args.get("cmd"), "ok": result.ok, "exit_code": code, "output": _tail(out)},
            )
        )
    return items


def _short(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:200] + "…" if isinstance(v, str) and len(v) > 200 else v) for k, v in args.items()}


def _tail(out: dict[str, Any]) -> str:
    text = str(out.get("stdout", "")) + str(out.get("stderr", ""))
    return text[-2000:]
