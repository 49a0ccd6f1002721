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

A restarted run carries on from its last `save_state` (the agent resumes: `Agent(resumes=True)`): each
save holds where the steps were and their outputs so far, with the step's own value under "value".

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

SAVED_AT = "scripted_at"  # the key of a save's place in the steps


class _Run:
    """Where the agent is in its steps: (step, repetition, inner step). A `save_state` step saves that place
    (after itself) with the outputs so far, so a restarted run carries on from it (`Agent(resumes=True)`)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.outputs: list[Any] = []
        self.at: tuple[int, int, int] = (0, 0, 0)
        if ctx.resumed_at:
            saved = ctx.state if isinstance(ctx.state, dict) else {}
            place = saved.get(SAVED_AT)
            if not (isinstance(place, list) and len(place) == 3 and all(isinstance(n, int) for n in place)):
                raise ValueError(
                    f"unit {ctx.unit.id}: the state saved at entry {ctx.resumed_at} does not say where the "
                    "steps were; it cannot be carried on from"
                )
            self.at = (place[0], place[1], place[2])
            self.outputs = list(saved.get("outputs", []))

    async def save(self, value: Any, after: tuple[int, int, int], outputs: list[Any]) -> None:
        await self.ctx.save_state({SAVED_AT: list(after), "outputs": outputs, "value": value})


async def run_steps(ctx: Context) -> dict[str, Any]:
    run = _Run(ctx)
    steps = ctx.params.get("steps", [])
    first, first_rep, first_inner = run.at
    for index in range(first, len(steps)):
        step = steps[index]
        if not isinstance(step, dict):
            raise ValueError(f"unit {ctx.unit.id} step {index}: expected a table, got {type(step).__name__}")
        if "repeat" in step:  # a long unit in a few lines: its outputs are counted, not kept
            inner_steps = step.get("steps", [])
            start_rep = first_rep if index == first else 0
            for rep in range(start_rep, int(step["repeat"])):
                start_inner = first_inner if index == first and rep == start_rep else 0
                for inner in range(start_inner, len(inner_steps)):
                    await _step(ctx, index, inner_steps[inner], run, (index, rep, inner + 1))
            run.outputs.append({"repeated": int(step["repeat"])})
            continue
        run.outputs.append(await _step(ctx, index, step, run, (index + 1, 0, 0)))
    return {"unit": ctx.unit.id, "steps": len(run.outputs), "outputs": run.outputs}


async def _step(ctx: Context, index: int, step: dict[str, Any], run: _Run, after: tuple[int, int, int]) -> Any:
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
    if "save_state" in step:  # a top-level step's own output (None) is among the outputs it saves
        await run.save(step["save_state"], after, [*run.outputs, None] if after[1:] == (0, 0) else run.outputs)
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
    Agent("scripted", {"*": run_steps}, version="1", resumes=True).run()


if __name__ == "__main__":
    main()
