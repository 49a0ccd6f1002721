"""Tool calls of a unit: permissions, the intent/result protocol for effects, reconciliation, evidence.

Read-only and idempotent tools run and are recorded. An effectful tool first records an intent (its
`preview`), runs, then records the result. An intent found without a result (the host died in between)
is reconciled against the sandbox: the effect is there (record its result), visibly absent (run it), or
undecidable (ask the person "rerun" or "skip"). Depends on keel.server.tools and the journal.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec

from keel.protocol import agent as ap
from keel.protocol.records import Evidence, JournalEntry, Question
from keel.server.engine.agentproc import HandlerError
from keel.server.engine.agentproc import agent_env as scrubbed_env
from keel.server.tools.shell import OWNER_VAR, command_owner
from keel.storage import missions as m

if TYPE_CHECKING:
    from keel.server.engine.unitrun import UnitSession

RERUN_APPROVED = "rerun-approved"
RERUNNING = "rerunning"


class ToolCalls:
    def __init__(self, session: UnitSession) -> None:
        self.session = session
        self._changing: set[asyncio.Task[Any]] = set()  # changes still being made or recorded

    def _context(self) -> Any:
        from keel.server.tools import ToolContext

        host = self.session.host
        if host.tool_env is None:  # the agents' environment: no provider key (api_key_env) reaches a command
            host.tool_env = scrubbed_env(host.spec.env, host.models.hidden_env)
        owner = {OWNER_VAR: command_owner(host.mission_id, self.session.lane)}
        return ToolContext(
            sandbox=self.session.sandbox,
            timeout_s=host.spec.permissions.command_timeout_s,
            env={**host.tool_env, **owner},
        )

    async def run(self, call: ap.ToolRunParams, seq: int, fp: str, intent: JournalEntry | None, begin: float) -> Any:
        from keel.server.tools import TOOLS

        s = self.session
        if call.tool not in s.host.spec.permissions.tools:
            return await s.record(
                seq,
                "tool/run",
                fp,
                {"code": ap.ERR_TOOL_DENIED},
                begin,
                error=f"tool {call.tool!r} is not allowed by this mission's permissions "
                f"(allowed: {', '.join(s.host.spec.permissions.tools)})",
                summary=f"{call.tool} denied",
            )
        tool = TOOLS.get(call.tool)
        if tool is None:
            return await s.record(
                seq,
                "tool/run",
                fp,
                {"code": rpc_invalid()},
                begin,
                error=f"unknown tool {call.tool!r} (known: {', '.join(sorted(TOOLS))})",
            )
        if tool.klass == "read_only":
            return await self._finish(tool, self._context(), call, seq, fp, begin)
        if intent is not None and self._changing:
            settled = await self._settled(seq)
            if settled is not None:
                return settled.result
        # an agent that dies mid-call cancels its request, but never the recording of a change already made
        task = asyncio.ensure_future(self._locked(tool, call, seq, fp, intent, begin))
        self._changing.add(task)
        task.add_done_callback(self._changing.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved here if nobody awaits it
        return await asyncio.shield(task)

    async def _locked(
        self, tool: Any, call: ap.ToolRunParams, seq: int, fp: str, intent: JournalEntry | None, begin: float
    ) -> Any:
        async with self.session.host.files_lock:  # a file snapshot is never taken in the middle of a change
            return await self._change(tool, call, seq, fp, intent, begin)

    async def _settled(self, seq: int) -> JournalEntry | None:
        """An agent restarted while its previous run's change was still being recorded: wait for that, and
        answer from the entry it recorded (a replay), instead of taking the intent for an uncertain effect."""
        from keel.server.engine.unitrun import _answer

        await asyncio.gather(*list(self._changing), return_exceptions=True)
        s = self.session
        mission, lane = s.host.mission_id, s.lane
        entry = await asyncio.to_thread(s.host.store.read, lambda t: m.journal_get(t, mission, lane, seq))
        if entry is None or entry.phase != "done":
            return None
        s.entries[seq] = entry
        s.replayed += 1
        s.host.stats["replayed"] += 1
        return msgspec.structs.replace(entry, result=_answer(entry))

    async def _change(
        self, tool: Any, call: ap.ToolRunParams, seq: int, fp: str, intent: JournalEntry | None, begin: float
    ) -> Any:
        from keel.server.tools import ToolError

        s = self.session
        ctx = self._context()
        if intent is not None:
            return await self._recover(tool, ctx, call, seq, fp, intent, begin)
        if tool.klass != "effectful":
            return await self._finish(tool, ctx, call, seq, fp, begin)
        try:
            preview = tool.preview(ctx, call.args)
        except ToolError as exc:
            result = ap.ToolRunResult(ok=False, error=exc.message)
            return await self._done(tool, call, seq, fp, result, begin)
        await s.record(
            seq, "tool/run", fp, preview, begin, phase="intent", tool_class=tool.klass, summary=_describe(call)
        )
        return await self._finish(tool, ctx, call, seq, fp, begin)

    async def _finish(self, tool: Any, ctx: Any, call: ap.ToolRunParams, seq: int, fp: str, begin: float) -> Any:
        result = await tool.run(ctx, call.args)
        return await self._done(tool, call, seq, fp, result, begin)

    async def _done(
        self,
        tool: Any,
        call: ap.ToolRunParams,
        seq: int,
        fp: str,
        result: ap.ToolRunResult,
        begin: float,
        effect: str = "done",
    ) -> Any:
        s = self.session
        return await s.record(
            seq,
            "tool/run",
            fp,
            msgspec.to_builtins(result),
            begin,
            tool_class=tool.klass,
            summary=_describe(call),
            evidence=evidence_for(s.unit.id, call, result, effect),
        )

    async def _recover(
        self, tool: Any, ctx: Any, call: ap.ToolRunParams, seq: int, fp: str, intent: JournalEntry, begin: float
    ) -> Any:
        s = self.session
        if intent.summary == RERUN_APPROVED:
            await s.record(
                seq, "tool/run", fp, intent.result, begin, phase="intent", tool_class=tool.klass, summary=RERUNNING
            )
            return await self._finish(tool, ctx, call, seq, fp, begin)
        verdict = tool.reconcile(ctx, intent.result if isinstance(intent.result, dict) else {})
        s.host.stats["reconciled"] += 1
        if verdict.done is True and verdict.result is not None:
            return await self._done(tool, call, seq, fp, verdict.result, begin, effect="reconciled")
        if verdict.done is False:
            return await self._finish(tool, ctx, call, seq, fp, begin)
        question = Question(
            unit=s.unit.id,
            seq=seq,
            kind="uncertain-effect",
            fingerprint=fp,
            lane=s.lane,
            choices=("rerun", "skip"),
            text=f"unit {s.unit.id}: the call {_describe(call)} may or may not have happened before keel stopped "
            f"({verdict.reason or 'the sandbox cannot tell'}). Run it again (rerun), or keep going without "
            f"running it again because it did happen (skip)?",
        )
        await s.host.wait_for_input(question)
        raise HandlerError(ap.ERR_PAUSING, "the mission waits for a person's decision")


def rpc_invalid() -> int:
    from keel.protocol.rpc import INVALID_PARAMS

    return INVALID_PARAMS


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
