"""The coder agent: a tool-using model loop over OpenAI-style function calling, run through the host.

    python -m keel.agents.coder

For each unit it tells the model the mission goal and the unit's title and params, offers the sandbox
tools (read_file, list_files, search, write_file, apply_diff, run), executes the tool calls the model
makes through the host (`tool/run`), and stops when the model answers without tool calls or after
`max_steps` model calls (then the unit fails). With `params.verify = "<cmd>"` a final answer is only
accepted once that command passes; otherwise its output goes back to the model, which carries on.

It never talks HTTP and never sees keys: every model call is the host's `model/complete`, journaled, so
after a crash the host replays the conversation and no token is spent twice. The conversation is saved
with `state/save` after every step, and a restarted run carries on from the last one (the agent resumes:
the host numbers its requests after that save), so a long unit is never replayed from its start.

The tool schemas it offers are keel.protocol.tools' TOOL_SPECS, the same declaration server/tools runs
under (agents never import keel.server). Depends on keel.protocol and the SDK.
"""

from __future__ import annotations

import json
from typing import Any

from keel.agents.sdk import Agent, Context, HostError
from keel.protocol import agent as ap
from keel.protocol.tools import SPECS, TOOL_SPECS

DEFAULT_MAX_STEPS = 30
TOOL_RESULT_CHARS = 24_000  # how much of one tool result goes back to the model
_SPECS = SPECS
_KNOWN = set(_SPECS)

SYSTEM_PROMPT = """You are a careful software engineer working in a workspace through tools.
Mission goal: {goal}
Current unit: {title} (id {unit_id}, kind {kind})
Unit parameters: {params}

Look before you change: read the files you edit. Make small, correct changes with write_file or
apply_diff. Check your work with run (verify=true) when there is a way to. When the unit is done, reply
without tool calls, with a short summary of what you changed and how you checked it."""


class StepLimitError(RuntimeError):
    """The model made `max_steps` calls without giving a final answer."""


def first_messages(ctx: Context) -> list[dict[str, Any]]:
    unit = ctx.unit
    system = SYSTEM_PROMPT.format(
        goal=ctx.goal or "(none given)",
        title=unit.title or unit.id,
        unit_id=unit.id,
        kind=unit.kind,
        params=json.dumps(unit.params, sort_keys=True),
    )
    task = unit.params.get("task") or unit.title or f"Carry out unit {unit.id} for the mission goal."
    return [{"role": "system", "content": system}, {"role": "user", "content": str(task)}]


def resumable_state(ctx: Context) -> dict[str, Any] | None:
    """The saved conversation, when the run carries on from it: the host numbered this run's requests after
    it (`resumed_at`), or holds no journal to replay."""
    state = ctx.state
    replaying = getattr(ctx, "replaying", True)  # SDKs that do not say are treated as replaying: safe
    carries_on = getattr(ctx, "resumed_at", 0) > 0 or replaying is False
    if carries_on and isinstance(state, dict) and isinstance(state.get("messages"), list):
        return state
    return None


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a served assistant message that go back into the conversation."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def _tool_message(call_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    if len(text) > TOOL_RESULT_CHARS:
        text = text[:TOOL_RESULT_CHARS] + f"... [cut: {len(text) - TOOL_RESULT_CHARS} more characters]"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


class Coder:
    """One unit's conversation and what it has done so far."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.max_steps = int(ctx.params.get("max_steps", DEFAULT_MAX_STEPS))
        self.verify_cmd: str | None = ctx.params.get("verify")
        saved = resumable_state(ctx)
        self.messages: list[dict[str, Any]] = saved["messages"] if saved else first_messages(ctx)
        self.step: int = saved.get("step", 0) if saved else 0
        self.changed: list[str] = saved.get("changed", []) if saved else []
        self.verifications: list[dict[str, Any]] = saved.get("verifications", []) if saved else []
        self.finished: str | None = str(saved.get("model", "")) if saved and saved.get("done") else None

    async def run(self) -> dict[str, Any]:
        if self.finished is not None:  # saved as done: what is left is to say so
            return await self.finish(str(self.messages[-1].get("content") or ""), self.finished)
        while self.step < self.max_steps:
            self.step += 1
            reply = await self.ctx.model(
                self.messages, tools=list(TOOL_SPECS), purpose=f"unit {self.ctx.unit.id} step {self.step}"
            )
            message = assistant_message(reply.message)
            self.messages.append(message)
            calls = message.get("tool_calls") or []
            for call in calls:
                self.messages.append(await self.call_tool(call))
            final = not calls and await self.accept_final()
            await self.ctx.save_state(self.state(done=final, model=reply.model))
            if final:
                return await self.finish(str(message.get("content") or ""), reply.model)
        raise StepLimitError(
            f"unit {self.ctx.unit.id}: no final answer after {self.max_steps} model calls "
            "(raise params.max_steps to allow more)"
        )

    async def finish(self, answer: str, model: str) -> dict[str, Any]:
        await self.ctx.evidence(
            "note",
            f"unit {self.ctx.unit.id}: {answer[:200]}",
            {"steps": self.step, "model": model, "changed": self.changed},
        )
        return {
            "answer": answer,
            "steps": self.step,
            "changed": self.changed,
            "verifications": self.verifications,
            "model": model,
        }

    def state(self, *, done: bool, model: str) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "step": self.step,
            "changed": self.changed,
            "verifications": self.verifications,
            "done": done,
            "model": model,
        }

    async def accept_final(self) -> bool:
        """True unless the unit names a verification command and it fails; then the model hears why."""
        if not self.verify_cmd:
            return True
        result = await self._run_tool("run", {"cmd": self.verify_cmd, "verify": True})
        if result.ok:
            return True
        self.messages.append(
            {
                "role": "user",
                "content": (
                    f"The unit's verification `{self.verify_cmd}` failed, so the work is not done yet:\n"
                    + json.dumps({"error": result.error, "output": result.output}, sort_keys=True)[:TOOL_RESULT_CHARS]
                    + "\nFix the problem, then answer again."
                ),
            }
        )
        return False

    async def call_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        """Run one tool call of the model; any problem becomes the tool message the model reads."""
        call_id = str(call.get("id", ""))
        function = call.get("function") or {}
        name = function.get("name", "")
        if name not in _KNOWN:
            return _tool_message(call_id, {"ok": False, "error": f"unknown tool {name!r}; use one of {sorted(_KNOWN)}"})
        try:
            args = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return _tool_message(call_id, {"ok": False, "error": f"arguments of {name} are not valid JSON: {exc}"})
        if not isinstance(args, dict):
            return _tool_message(call_id, {"ok": False, "error": f"arguments of {name} must be a JSON object"})
        unknown = sorted(set(args) - set(_SPECS[name].parameters["properties"]))
        if unknown:
            return _tool_message(call_id, {"ok": False, "error": f"{name} has no argument(s) {unknown}"})
        try:
            result = await self._run_tool(name, args)
        except HostError as exc:
            if exc.code != ap.ERR_TOOL_DENIED:
                raise  # pausing, nondeterminism, ...: the unit stops here
            return _tool_message(call_id, {"ok": False, "error": exc.message})
        return _tool_message(call_id, {"ok": result.ok, "output": result.output, "error": result.error})

    async def _run_tool(self, name: str, args: dict[str, Any]) -> ap.ToolRunResult:
        result = await self.ctx.tool(name, **args)
        output = result.output if isinstance(result.output, dict) else {}
        if result.ok and name == "write_file":
            self._changed([output.get("path", args.get("path", ""))])
        elif result.ok and name == "apply_diff":
            self._changed(sorted(output.get("files", {})))
        elif name == "run" and args.get("verify"):
            self.verifications.append({"cmd": args.get("cmd"), "ok": result.ok, "exit_code": output.get("exit_code")})
        return result

    def _changed(self, paths: list[str]) -> None:
        self.changed.extend(p for p in paths if p and p not in self.changed)


async def code(ctx: Context) -> dict[str, Any]:
    return await Coder(ctx).run()


def main() -> None:
    Agent("coder", {"*": code}, version="1", resumes=True).run()


if __name__ == "__main__":
    main()
