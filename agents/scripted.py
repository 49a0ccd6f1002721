"""The scripted reference agent: runs the declarative steps in a unit's params, deterministically.

    [[units]]
    id = "edit"
    params.steps = [
      { tool = "write_file", args = { path = "a.py", content = "x = 1\n" } },
      { tool = "run", args = { cmd = "python -m py_compile a.py", verify = true } },
      { ask = "Ship it?", choices = ["yes", "no"] },
      { now = true }, { random = true }, { save_state = { done = 1 } }, { sleep = 0.05 },
      { add_units = [ { id = "later", params = { steps = [] } } ] },
      { model = { messages = [ { role = "user", content = "hi" } ] } },
      { evidence = { kind = "note", summary = "checked" } },
      { repeat = 1000, steps = [ { tool = "read_file", args = { path = "a.py" } } ] },
      { shell = "make test" },
    ]

`shell` is a command the agent runs itself, as Codex and Gemini CLI do: asked for first (`effect/ask`,
as the keel tool `run`), run in the agent's own process with /bin/sh in its working folder (the unit's
sandbox), its outcome reported (`effect/done`); one keel refuses is not run.

A failed tool step fails the unit unless it says `allow_failure = true`; `content_times = N` sends its
`content` argument N times over (a big file without a big mission file). Test-only steps: `fail` (raise),
`exit` (the process dies; with `once_file`, only while that file does not exist), `garbage` (write
bytes that are not a frame) and `wait_file` (work until that file exists: a strike's window that no
machine's speed can close). Run it with `python -m keel.agents.scripted`. Depends on keel.protocol and
the SDK only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Literal

from keel.agents.sdk import Agent, Context


async def run_steps(ctx: Context) -> dict[str, Any]:
    outputs: list[Any] = []
    for index, step in enumerate(ctx.params.get("steps", [])):
        if not isinstance(step, dict):
            raise ValueError(f"unit {ctx.unit.id} step {index}: expected a table, got {type(step).__name__}")
        if "repeat" in step:  # a long unit in a few lines: its outputs are counted, not kept
            for _ in range(int(step["repeat"])):
                for inner in step.get("steps", []):
                    await _step(ctx, index, inner)
            outputs.append({"repeated": int(step["repeat"])})
            continue
        outputs.append(await _step(ctx, index, step))
    return {"unit": ctx.unit.id, "steps": len(outputs), "outputs": outputs}


async def _step(ctx: Context, index: int, step: dict[str, Any]) -> Any:
    where = f"unit {ctx.unit.id} step {index}"
    if "tool" in step:
        args = dict(step.get("args", {}))
        if "content_times" in step:
            args["content"] = str(args.get("content", "")) * int(step["content_times"])
        result = await ctx.tool(step["tool"], **args)
        if not result.ok and not step.get("allow_failure", False):
            raise RuntimeError(f"{where}: tool {step['tool']} failed: {result.error or result.output}")
        return {"ok": result.ok}
    if "ask" in step:
        return await ctx.ask(str(step["ask"]), tuple(step.get("choices", ())))
    if "model" in step:
        spec = step["model"]
        reply = await ctx.model(spec.get("messages", []), purpose=spec.get("purpose", ""))
        return reply.message.get("content", "")
    if step.get("now"):
        return await ctx.now()
    if step.get("random"):
        return await ctx.random()
    if "save_state" in step:
        await ctx.save_state(step["save_state"])
        return None
    if "add_units" in step:
        return await ctx.add_units(step["add_units"])
    if "evidence" in step:
        ev = step["evidence"]
        await ctx.evidence(ev.get("kind", "note"), ev.get("summary", ""), ev.get("data"))
        return None
    if "sleep" in step:
        await asyncio.sleep(float(step["sleep"]))
        return None
    if "shell" in step:
        return await _own_command(ctx, f"shell-{index}", str(step["shell"]))
    if "wait_file" in step:  # the agent's own work, nothing journaled, until a test lets it finish
        gate = str(step["wait_file"])
        while not await asyncio.to_thread(os.path.exists, gate):  # noqa: ASYNC110 (a file has no event to await)
            await asyncio.sleep(0.02)
        return None
    return _test_step(where, step)


async def _own_command(ctx: Context, call_id: str, cmd: str) -> Any:
    asked = await ctx.effect("run", cmd, call_id=call_id, detail={"rawInput": {"command": cmd}})
    if not asked.allow:
        return {"allowed": False, "reason": asked.reason}
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        cmd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    status: Literal["completed", "failed"] = "completed" if proc.returncode == 0 else "failed"
    await ctx.effect_done(call_id, status, out.decode(errors="replace")[-2000:])
    return {"allowed": True, "exit_code": proc.returncode}


def _test_step(where: str, step: dict[str, Any]) -> Any:
    if "fail" in step:
        raise RuntimeError(f"{where}: {step['fail']}")
    if "exit" in step:
        once = step.get("once_file")
        if once is None or not Path(once).exists():
            if once is not None:
                Path(once).write_text("died once\n")
            sys.stderr.flush()
            os._exit(int(step["exit"]))
        return None
    if step.get("garbage"):
        sys.__stdout__.buffer.write(b"this is not a frame\r\n\r\n")  # type: ignore[union-attr]
        sys.__stdout__.flush()  # type: ignore[union-attr]
        return None
    raise ValueError(f"{where}: unknown step {sorted(step)}; see keel.agents.scripted for the step kinds")


def main() -> None:
    Agent("scripted", {"*": run_steps}, version="1").run()


if __name__ == "__main__":
    main()
